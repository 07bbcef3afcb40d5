package httplimit_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// A login endpoint that counts failed attempts only: 5 failures a minute
// are allowed, successes never count, and a 6th failure is a 429.
func TestCountIfLogin(t *testing.T) {
	e := newEnv(t)
	login := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Password") != "right" {
			http.Error(w, "wrong password", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("welcome"))
	})
	h := httplimit.Middleware(e.limiter, ratelimit.PerMinute(5),
		httplimit.WithCountIf(func(_ *http.Request, status int) bool { return status == http.StatusUnauthorized }))(login)
	attempt := func(password string) int {
		return serve(h, request("203.0.113.7:1", "Password", password)).Code
	}
	for i := range 20 {
		require.Equal(t, http.StatusOK, attempt("right"), "success %d never counts", i)
	}
	for i := range 5 {
		require.Equal(t, http.StatusUnauthorized, attempt("wrong"), "failure %d", i)
	}
	require.Equal(t, http.StatusTooManyRequests, attempt("wrong"), "the 6th failure")
	require.Equal(t, http.StatusTooManyRequests, attempt("right"), "locked: 5 failures in the minute")
	e.clock.Add(2 * time.Minute)
	require.Equal(t, http.StatusOK, attempt("right"))
}

// An API that does not count the requests it failed (5xx); the status is
// the one written, 200 when none is, and a 1xx is not the final status.
func TestCountIfServerErrors(t *testing.T) {
	e := newEnv(t)
	status := http.StatusOK
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusEarlyHints)
		if status != http.StatusOK {
			w.WriteHeader(status)
		}
	})
	var seen []int
	h := httplimit.Middleware(e.limiter, ratelimit.PerMinute(3),
		httplimit.WithCountIf(func(_ *http.Request, s int) bool { seen = append(seen, s); return s < 500 }))(api)
	status = http.StatusServiceUnavailable
	for range 10 {
		serve(h, request("192.0.2.1:1"))
	}
	status = http.StatusOK
	for range 3 {
		serve(h, request("192.0.2.1:1")) // 103 and nothing else: a 200
	}
	require.Equal(t, http.StatusTooManyRequests, serve(h, request("192.0.2.1:1")).Code, "the 5xx were not counted")
	require.Equal(t, http.StatusServiceUnavailable, seen[0])
	require.Equal(t, http.StatusOK, seen[len(seen)-1])
	require.Len(t, seen, 13, "a 429 is not the handler's: never refunded, never asked")
}

// Charge adds what a handler learns it costs to the client's counts, under
// the request's plan.
func TestCharge(t *testing.T) {
	e := newEnv(t)
	limit := ratelimit.PerMinute(10)
	var chargeErr error
	h := httplimit.Middleware(e.limiter, limit)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chargeErr = httplimit.Charge(r, 4) // 1 up front, 4 more once known
	}))
	require.Equal(t, http.StatusOK, serve(h, request("203.0.113.7:1")).Code)
	require.NoError(t, chargeErr)
	require.Equal(t, http.StatusOK, serve(h, request("203.0.113.7:1")).Code)
	w := serve(h, request("203.0.113.7:1"))
	require.Equal(t, http.StatusTooManyRequests, w.Code, "10 counted: 5 a request")
	require.Error(t, httplimit.Charge(httptest.NewRequest(http.MethodGet, "/", nil), 1), "not through the middleware")
	h = httplimit.Middleware(e.limiter, limit)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chargeErr = httplimit.Charge(r, 0)
	}))
	serve(h, request("198.51.100.1:1"))
	require.True(t, errors.Is(chargeErr, ratelimit.ErrInvalidCost))
}

// A handler that panics answers 500, if anything: WithCountIf sees 500, so
// an API that does not count its failures does not count it.
func TestCountIfPanic(t *testing.T) {
	e := newEnv(t)
	h := httplimit.Middleware(e.limiter, ratelimit.PerMinute(2),
		httplimit.WithCountIf(func(_ *http.Request, s int) bool { return s < 500 }))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(http.ErrAbortHandler)
	}))
	for range 5 {
		require.PanicsWithValue(t, http.ErrAbortHandler, func() { serve(h, request("192.0.2.9:1")) })
	}
	r, err := e.limiter.Peek(context.Background(), httplimit.ClientKey(netip.MustParseAddr("192.0.2.9"), 64), ratelimit.PerMinute(2))
	require.NoError(t, err)
	require.Zero(t, r.Count, "no panic was counted")
	// The same with a rule that counts everything: counted, under that key.
	all := httplimit.Middleware(e.limiter, ratelimit.PerMinute(2),
		httplimit.WithCountIf(func(*http.Request, int) bool { return true }))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(http.ErrAbortHandler)
	}))
	require.Panics(t, func() { serve(all, request("192.0.2.10:1")) })
	r, err = e.limiter.Peek(context.Background(), httplimit.ClientKey(netip.MustParseAddr("192.0.2.10"), 64), ratelimit.PerMinute(2))
	require.NoError(t, err)
	require.Equal(t, int64(1), r.Count)
}

// readerFromRecorder is a ResponseWriter with net/http's io.ReaderFrom,
// which sends a file with sendfile; it records what reached ReadFrom.
type readerFromRecorder struct {
	*httptest.ResponseRecorder
	readFrom int64
}

func (w *readerFromRecorder) ReadFrom(src io.Reader) (int64, error) {
	n, err := io.Copy(w.ResponseRecorder, src)
	w.readFrom += n
	return n, err
}

// WithCountIf's status writer keeps the wrapped writer's io.ReaderFrom: a
// handler's io.Copy from an *os.File reaches it (net/http's sendfile), and
// the status it records is 200.
func TestCountIfKeepsReaderFrom(t *testing.T) {
	e := newEnv(t)
	body := strings.Repeat("a file's bytes\n", 1000)
	path := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	var seen int
	h := httplimit.Middleware(e.limiter, ratelimit.PerMinute(5),
		httplimit.WithCountIf(func(_ *http.Request, s int) bool { seen = s; return true }))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		require.NoError(t, err)
		defer f.Close()
		_, err = io.Copy(w, f)
		require.NoError(t, err)
	}))
	w := &readerFromRecorder{ResponseRecorder: httptest.NewRecorder()}
	h.ServeHTTP(w, request("192.0.2.11:1"))
	require.Equal(t, int64(len(body)), w.readFrom, "the copy went through the wrapped ReadFrom")
	require.Equal(t, body, w.Body.String())
	require.Equal(t, http.StatusOK, seen)

	// A writer without ReadFrom gets the bytes through Write.
	plain := httptest.NewRecorder()
	h.ServeHTTP(plain, request("192.0.2.11:1"))
	require.Equal(t, body, plain.Body.String())
}
