package httplimit_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// A request holds a slot while its handler runs: with 1 slot, a second
// request of the same client while the first runs is a 429 naming the
// concurrency limit, counted by neither limit; the slot is free again once
// the handler returns, panics, or the client goes away.
func TestWithConcurrency(t *testing.T) {
	e := newEnv(t)
	c := ratelimit.Concurrency{Max: 1, Lease: time.Minute, Name: "exports"}
	rate := ratelimit.Limit{Rate: 100, Window: time.Minute, Name: "burst"}
	entered, leave := make(chan struct{}), make(chan struct{})
	h := httplimit.Middleware(e.limiter, rate, httplimit.WithConcurrency(c))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("do") {
		case "hold":
			entered <- struct{}{}
			<-leave
		case "panic":
			panic("the handler failed")
		case "wait-for-client":
			entered <- struct{}{}
			<-r.Context().Done()
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	req := func(do string) *http.Request {
		r := request("203.0.113.7:1")
		q := r.URL.Query()
		q.Set("do", do)
		r.URL.RawQuery = q.Encode()
		return r
	}

	done := make(chan int)
	go func() { done <- serve(h, req("hold")).Code }()
	<-entered
	w := serve(h, req(""))
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "60", w.Header().Get(httplimit.HeaderRetryAfter), "until the held lease ends, a minute away")
	require.Equal(t, `"burst";q=100;w=60, "exports";q=1;qu="concurrent-requests"`, w.Header().Get(httplimit.HeaderPolicy))
	require.Contains(t, w.Header().Get(httplimit.HeaderRateLimit), `"exports";r=0;t=`)
	require.Equal(t, "1", w.Header().Get(httplimit.HeaderLimit), "the concurrency limit binds")
	require.Equal(t, int64(1), e.count(t, "ip:203.0.113.7", rate), "the refused request is not counted by the plan")
	close(leave)
	require.Equal(t, http.StatusOK, <-done)

	w = serve(h, req(""))
	require.Equal(t, http.StatusOK, w.Code, "released when the handler returned")
	require.Contains(t, w.Header().Get(httplimit.HeaderRateLimit), `"exports";r=0`)

	func() {
		defer func() { require.NotNil(t, recover()) }()
		serve(h, req("panic"))
	}()
	require.Equal(t, http.StatusOK, serve(h, req("")).Code, "released when the handler panicked")

	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- serve(h, req("wait-for-client").WithContext(ctx)).Code }()
	<-entered
	cancel()
	<-done
	require.Equal(t, http.StatusOK, serve(h, req("")).Code, "released when the client went away")
	s := e.limiter.Stats()
	require.Equal(t, s.SlotsAcquired, s.SlotsReleased, "every slot given back")
}

func TestWithConcurrencyInvalid(t *testing.T) {
	e := newEnv(t)
	_, err := httplimit.New(e.limiter, ratelimit.PerMinute(1), httplimit.WithConcurrency(ratelimit.Concurrency{Max: 0, Lease: time.Second}))
	require.ErrorContains(t, err, "WithConcurrency")
	require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
}

func TestWithConcurrencyNameCollision(t *testing.T) {
	e := newEnv(t)
	_, err := httplimit.New(e.limiter, ratelimit.Limit{Rate: 10, Window: time.Second, Name: "exports"},
		httplimit.WithConcurrency(ratelimit.Concurrency{Max: 2, Lease: time.Second, Name: "exports"}))
	require.ErrorContains(t, err, "both named")
}

// WithConcurrency alone, with the zero Limit: requests hold slots and are
// decided by no rate plan; no rate header, no Result in the context.
func TestConcurrencyAlone(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	var fromCtx []bool
	var mu sync.Mutex
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := httplimit.FromContext(r.Context())
		mu.Lock()
		fromCtx = append(fromCtx, ok)
		mu.Unlock()
		started <- struct{}{}
		<-release
	})
	mw, err := httplimit.New(e.limiter, ratelimit.Limit{}, httplimit.WithConcurrency(ratelimit.Concurrency{Name: "exports", Max: 2, Lease: time.Minute}))
	require.NoError(t, err)
	h := mw(next)
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Go(func() { codes[i] = serve(h, request("192.0.2.1:1234")).Code })
	}
	<-started
	<-started
	w := serve(h, request("192.0.2.1:1234")) // a third at once: full
	close(release)
	wg.Wait()
	require.Equal(t, []int{200, 200}, codes)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	hs := headersOf(t, w)
	require.Equal(t, `"exports";q=2;qu="concurrent-requests"`, hs[httplimit.HeaderPolicy])
	require.Equal(t, "2", hs[httplimit.HeaderLimit])
	require.Equal(t, []bool{false, false}, fromCtx, "no rate decision to return")
	require.Equal(t, http.StatusOK, serve(h, request("192.0.2.1:1234")).Code, "the slots came back")

	for _, opts := range [][]httplimit.Option{
		nil, // no concurrency limit: the zero Limit is none
		{httplimit.WithConcurrency(ratelimit.Concurrency{Max: 2, Lease: time.Minute}), httplimit.WithLimits(ratelimit.PerMinute(5))},
	} {
		_, err := httplimit.New(e.limiter, ratelimit.Limit{}, opts...)
		require.ErrorContains(t, err, "zero Limit")
	}
}
