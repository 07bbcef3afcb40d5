package httplimit_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
)

// epoch starts a second, a minute and an hour, so that epoch.Add(d) lies d
// into a window of any of those lengths.
var epoch = time.UnixMilli(1_700_002_800_000)

// env is one test's Redis, clock and limiter.
type env struct {
	mr      *miniredis.Miniredis
	clock   *clock.Fake
	limiter *ratelimit.Limiter
}

func newEnv(t *testing.T, opts ...ratelimit.Option) *env {
	t.Helper()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	clk := clock.NewFake(epoch)
	// The timeout is long: these tests count exact decisions, and on a busy
	// machine a slow miniredis must not turn one into a FailOpen pass.
	opts = append([]ratelimit.Option{
		ratelimit.WithClock(clk.Now),
		ratelimit.WithPrefix("test"),
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}),
		ratelimit.WithTimeout(time.Minute),
	}, opts...)
	l := ratelimit.New(client, opts...)
	t.Cleanup(func() { require.NoError(t, l.Close(context.Background())) }) // before the client closes
	return &env{mr: mr, clock: clk, limiter: l}
}

// handler returns the middleware around a handler that answers 200 "ok" and
// counts its calls in *served.
func (e *env) handler(served *int, limit ratelimit.Limit, opts ...httplimit.Option) http.Handler {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*served++
		_, _ = w.Write([]byte("ok"))
	})
	return httplimit.Middleware(e.limiter, limit, opts...)(next)
}

// count returns the count of id against limit now, without adding to it.
func (e *env) count(t *testing.T, id string, limit ratelimit.Limit) int64 {
	t.Helper()
	res, err := e.limiter.Peek(context.Background(), id, limit)
	require.NoError(t, err)
	return res.Count
}

// request builds a GET from remoteAddr with the given header pairs.
func request(remoteAddr string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/things", nil)
	r.RemoteAddr = remoteAddr
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// rateHeaders are the headers the middleware may set, in a fixed order.
var rateHeaders = []string{
	httplimit.HeaderLimit, httplimit.HeaderRemaining, httplimit.HeaderReset,
	httplimit.HeaderPolicy, httplimit.HeaderRateLimit, httplimit.HeaderRetryAfter,
}

// headersOf returns the rate-limit headers of w that are set.
func headersOf(t *testing.T, w *httptest.ResponseRecorder) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, name := range rateHeaders {
		if vs := w.Header().Values(name); len(vs) > 0 {
			require.Len(t, vs, 1, name)
			got[name] = vs[0]
		}
	}
	return got
}

func problemOf(t *testing.T, w *httptest.ResponseRecorder) httplimit.Problem {
	t.Helper()
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var p httplimit.Problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	return p
}

// TestHeadersAtTheLimit walks one client up to and past a limit of 3 per
// minute, 30s into a window, and checks every header of every response.
//
// With c requests in this window and none before, 30s in, the estimate is
// at most k again once the next window has m ms left with floor(c×m/60000)
// <= k, that is m <= floor(((k+1)×60000-1)/c): after a wait of
// 30000 + 60000 - m ms. Reset is that wait for k=0, rounded up to seconds;
// Retry-After and t on the denial are it for k=2. t on an allowed response
// is the wait until the count falls by one (Result.RefillAfter): with none
// in the window before, c requests weigh c-1 a ms into the next window,
// 30001 ms on, so 31 s.
func TestHeadersAtTheLimit(t *testing.T) {
	e := newEnv(t)
	e.clock.Set(epoch.Add(30 * time.Second))
	served := 0
	h := e.handler(&served, ratelimit.PerMinute(3))
	policy := `"3-per-60s";q=3;w=60`
	want := []struct {
		status  int
		headers map[string]string
	}{
		{200, map[string]string{ // count 1: 0 at 30s + 1ms into the next window
			"X-Ratelimit-Limit": "3", "X-Ratelimit-Remaining": "2", "X-Ratelimit-Reset": "31",
			"Ratelimit-Policy": policy, "Ratelimit": `"3-per-60s";r=2;t=31`,
		}},
		{200, map[string]string{ // count 2: m <= 29999, 60001ms; 1 at 30001ms
			"X-Ratelimit-Limit": "3", "X-Ratelimit-Remaining": "1", "X-Ratelimit-Reset": "61",
			"Ratelimit-Policy": policy, "Ratelimit": `"3-per-60s";r=1;t=31`,
		}},
		{200, map[string]string{ // count 3: m <= 19999, 70001ms; 2 at 30001ms
			"X-Ratelimit-Limit": "3", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "71",
			"Ratelimit-Policy": policy, "Ratelimit": `"3-per-60s";r=0;t=31`,
		}},
		{429, map[string]string{ // down to 2 when m <= 59999: 30001ms, so 31s
			"X-Ratelimit-Limit": "3", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "31",
			"Ratelimit-Policy": policy, "Ratelimit": `"3-per-60s";r=0;t=31`, "Retry-After": "31",
		}},
	}
	for i, w := range want {
		got := serve(h, request("192.0.2.1:1234"))
		require.Equal(t, w.status, got.Code, "request %d", i+1)
		require.Equal(t, w.headers, headersOf(t, got), "request %d", i+1)
	}
	require.Equal(t, 3, served)
}

// TestRetryAfterNeverEarly checks, at many points of a window, that
// Retry-After is the true wait rounded up to whole seconds: never earlier
// than RetryAfter, less than a second later, at least 1, and equal to the
// RateLimit field's t.
func TestRetryAfterNeverEarly(t *testing.T) {
	e := newEnv(t)
	limit := ratelimit.Limit{Rate: 4, Window: 10 * time.Second}
	var res ratelimit.Result
	denied := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, _ = httplimit.FromContext(r.Context())
		w.WriteHeader(http.StatusTooManyRequests)
	})
	served := 0
	h := e.handler(&served, limit, httplimit.WithDeniedHandler(denied), httplimit.WithHeaders(httplimit.IETFHeaders))
	offsets := 0
	for offset := time.Duration(0); offset < 20*time.Second; offset += 137 * time.Millisecond {
		e.clock.Set(epoch.Add(offset))
		addr := netip.AddrFrom4([4]byte{198, 51, 100, byte(offset / (137 * time.Millisecond))}).String()
		var w *httptest.ResponseRecorder
		for range limit.Rate + 1 {
			w = serve(h, request(addr+":1"))
		}
		require.Equal(t, http.StatusTooManyRequests, w.Code, "offset %v", offset)
		require.Greater(t, res.RetryAfter, time.Duration(0))
		secs, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
		require.NoError(t, err)
		after := time.Duration(secs) * time.Second
		require.GreaterOrEqual(t, after, res.RetryAfter, "offset %v", offset)
		require.Less(t, after-res.RetryAfter, time.Second, "offset %v", offset)
		require.GreaterOrEqual(t, secs, int64(1))
		require.Equal(t, `"4-per-10s";r=0;t=`+strconv.FormatInt(secs, 10), w.Header().Get("Ratelimit"))
		offsets++
	}
	require.Equal(t, offsets*int(limit.Rate), served)
}

func TestDeniedBody(t *testing.T) {
	e := newEnv(t)
	served := 0
	h := e.handler(&served, ratelimit.PerSecond(1))
	require.Equal(t, http.StatusOK, serve(h, request("192.0.2.1:1")).Code)
	w := serve(h, request("192.0.2.1:1"))
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "nosniff", w.Header().Get("X-Content-Type-Options"))
	require.Equal(t, httplimit.Problem{
		Type: "about:blank", Title: "Too Many Requests", Status: 429,
		Detail: "Rate limit exceeded; retry in 2 s.",
	}, problemOf(t, w))
	require.Equal(t, 1, served)
}

func TestDeniedHandler(t *testing.T) {
	e := newEnv(t)
	denied := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, ok := httplimit.FromContext(r.Context())
		require.True(t, ok)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte("slow down, count " + strconv.FormatInt(res.Count, 10)))
	})
	served := 0
	h := e.handler(&served, ratelimit.PerMinute(1), httplimit.WithDeniedHandler(denied))
	serve(h, request("192.0.2.1:1"))
	w := serve(h, request("192.0.2.1:1"))
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "slow down, count 1", w.Body.String())
	require.Equal(t, "61", w.Header().Get("Retry-After"))
	require.Equal(t, "0", w.Header().Get("X-Ratelimit-Remaining"))
}

// TestRedisDown checks both failure policies with Redis answering errors.
func TestRedisDown(t *testing.T) {
	policyOnly := map[string]string{
		"X-Ratelimit-Limit": "5",
		"Ratelimit-Policy":  `"5-per-60s";q=5;w=60`,
	}
	t.Run("FailClosed answers 503", func(t *testing.T) {
		e := newEnv(t, ratelimit.WithFailurePolicy(ratelimit.FailClosed))
		e.mr.SetError("LOADING Redis is loading the dataset in memory")
		served := 0
		var res ratelimit.Result
		h := e.handler(&served, ratelimit.PerMinute(5))
		w := serve(h, request("192.0.2.1:1"))
		require.Equal(t, http.StatusServiceUnavailable, w.Code)
		require.Equal(t, policyOnly, headersOf(t, w))
		require.Equal(t, 503, problemOf(t, w).Status)
		require.Equal(t, 0, served)

		var gotErr error
		h = e.handler(&served, ratelimit.PerMinute(5),
			httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
				gotErr = err
				res, _ = httplimit.FromContext(r.Context())
				w.WriteHeader(http.StatusTeapot)
			}))
		w = serve(h, request("192.0.2.1:1"))
		require.Equal(t, http.StatusTeapot, w.Code)
		require.ErrorIs(t, gotErr, ratelimit.ErrUnavailable)
		require.True(t, res.Degraded)
		require.False(t, res.Allowed)
	})
	t.Run("FailLocal decides here, with policy headers only", func(t *testing.T) {
		// Two replicas: this server alone allows 2 of the 5.
		e := newEnv(t, ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithReplicas(2))
		e.mr.SetError("LOADING Redis is loading the dataset in memory")
		served := 0
		h := e.handler(&served, ratelimit.PerMinute(5))
		for i := range 4 {
			w := serve(h, request("192.0.2.1:1"))
			want := http.StatusOK
			if i >= 2 {
				want = http.StatusTooManyRequests
			}
			require.Equal(t, want, w.Code, "request %d", i)
			require.Equal(t, policyOnly, headersOf(t, w))
		}
		require.Equal(t, 2, served)
	})
	t.Run("FailOpen lets through with policy headers only", func(t *testing.T) {
		e := newEnv(t, ratelimit.WithFailurePolicy(ratelimit.FailOpen))
		e.mr.SetError("LOADING Redis is loading the dataset in memory")
		served := 0
		h := e.handler(&served, ratelimit.PerMinute(5))
		for range 7 {
			w := serve(h, request("192.0.2.1:1"))
			require.Equal(t, http.StatusOK, w.Code)
			require.Equal(t, policyOnly, headersOf(t, w))
		}
		require.Equal(t, 7, served)
	})
}

func TestInvalidInputIs500(t *testing.T) {
	e := newEnv(t)
	served := 0
	tests := []struct {
		name  string
		limit ratelimit.Limit
		opts  []httplimit.Option
	}{
		{"zero rate", ratelimit.Limit{Window: time.Second}, nil},
		{"cost 0", ratelimit.PerMinute(5), []httplimit.Option{httplimit.WithCost(func(*http.Request) int64 { return 0 })}},
		{"sub-millisecond window", ratelimit.Limit{Rate: 1, Window: time.Microsecond}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(e.handler(&served, tc.limit, tc.opts...), request("192.0.2.1:1"))
			require.Equal(t, http.StatusInternalServerError, w.Code)
			require.Equal(t, httplimit.Problem{Type: "about:blank", Title: "Internal Server Error", Status: 500}, problemOf(t, w))
		})
	}
	require.Equal(t, 0, served)
}

// TestTiers serves a free tier by address and a paid tier by API key from
// one middleware.
func TestTiers(t *testing.T) {
	e := newEnv(t)
	keys := map[string]bool{"paid-1": true}
	known := func(k string) bool { return keys[k] }
	free := ratelimit.Limit{Name: "free", Rate: 2, Window: time.Minute}
	paid := ratelimit.Limit{Name: "paid", Rate: 5, Window: time.Minute}
	served := 0
	h := e.handler(&served, free,
		httplimit.WithKeys(httplimit.APIKey("X-API-Key", known)),
		httplimit.WithPlanFunc(func(r *http.Request) []ratelimit.Limit {
			if known(r.Header.Get("X-API-Key")) {
				return []ratelimit.Limit{paid}
			}
			return nil
		}))
	tests := []struct {
		name, apiKey  string
		status        int
		policy, state string
	}{
		{"free 1", "", 200, `"free";q=2;w=60`, `"free";r=1;t=61`},
		{"paid 1", "paid-1", 200, `"paid";q=5;w=60`, `"paid";r=4;t=61`},
		{"free 2", "", 200, `"free";q=2;w=60`, `"free";r=0;t=61`}, // the count falls by one as it did at 1 (RefillAfter)
		{"unknown key counts as free", "made-up", 429, `"free";q=2;w=60`, `"free";r=0;t=61`},
		{"paid 2", "paid-1", 200, `"paid";q=5;w=60`, `"paid";r=3;t=61`},
	}
	for _, tc := range tests {
		w := serve(h, request("192.0.2.1:1", "X-API-Key", tc.apiKey))
		require.Equal(t, tc.status, w.Code, tc.name)
		require.Equal(t, tc.policy, w.Header().Get("Ratelimit-Policy"), tc.name)
		require.Equal(t, tc.state, w.Header().Get("Ratelimit"), tc.name)
	}
	require.Equal(t, int64(2), e.count(t, httplimit.HashedKey("paid-1"), paid))
	require.Equal(t, int64(2), e.count(t, "ip:192.0.2.1", free))
}

func TestSkipAndAllowList(t *testing.T) {
	e := newEnv(t)
	served := 0
	limit := ratelimit.PerMinute(2)
	h := e.handler(&served, limit,
		httplimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		httplimit.WithTrustedProxies("X-Forwarded-For", netip.MustParsePrefix("10.0.0.0/8")),
		httplimit.WithAllowList(netip.MustParsePrefix("192.0.2.0/24")))
	health := func(addr string) *http.Request {
		r := request(addr)
		r.URL.Path = "/healthz"
		return r
	}
	tests := []struct {
		name    string
		r       *http.Request
		status  int
		headers bool
	}{
		{"health check is skipped", health("198.51.100.1:1"), 200, false},
		{"health check again", health("198.51.100.1:1"), 200, false},
		{"health check a third time", health("198.51.100.1:1"), 200, false},
		{"allow-listed peer", request("192.0.2.9:1"), 200, false},
		{"allow-listed client behind a trusted proxy", request("10.0.0.1:1", "X-Forwarded-For", "192.0.2.9"), 200, false},
		{"spoofed allow-listed address from an untrusted peer", request("198.51.100.1:1", "X-Forwarded-For", "192.0.2.9"), 200, true},
		{"counted", request("198.51.100.1:1"), 200, true},
		{"denied: the skipped requests did not count", request("198.51.100.1:1"), 429, true},
	}
	for _, tc := range tests {
		w := serve(h, tc.r)
		require.Equal(t, tc.status, w.Code, tc.name)
		_, has := w.Header()["X-Ratelimit-Limit"]
		require.Equal(t, tc.headers, has, tc.name)
	}
	require.Equal(t, 7, served)
	require.Equal(t, int64(2), e.count(t, "ip:198.51.100.1", limit))
	require.Equal(t, int64(0), e.count(t, "ip:192.0.2.9", limit))
}

func TestCost(t *testing.T) {
	e := newEnv(t)
	served := 0
	costs := map[string]int64{"/cheap": 1, "/search": 3, "/export": 11}
	h := e.handler(&served, ratelimit.PerMinute(10),
		httplimit.WithCost(func(r *http.Request) int64 { return costs[r.URL.Path] }))
	tests := []struct {
		path      string
		status    int
		remaining string
		retry     string
	}{
		{"/search", 200, "7", ""},
		{"/search", 200, "4", ""},
		{"/search", 200, "1", ""},
		{"/search", 429, "1", "67"},
		{"/cheap", 200, "0", ""},
		{"/export", 429, "0", ""}, // above the rate: never passes, so no Retry-After
	}
	for i, tc := range tests {
		r := request("192.0.2.1:1")
		r.URL.Path = tc.path
		w := serve(h, r)
		require.Equal(t, tc.status, w.Code, "request %d", i)
		require.Equal(t, tc.remaining, w.Header().Get("X-Ratelimit-Remaining"), "request %d", i)
		require.Equal(t, tc.retry, w.Header().Get("Retry-After"), "request %d", i)
		if tc.path == "/export" {
			require.Contains(t, problemOf(t, w).Detail, "cannot succeed by waiting")
		}
	}
	require.Equal(t, 4, served)
}

// TestCostAboveRateInvitesNoRetry checks that a request that can never pass
// gets a 429 that names no moment to retry at: no Retry-After, no
// X-RateLimit-Reset and no t in RateLimit, whether the client has used
// nothing yet (its reset would read 0, "retry now") or some of its quota.
func TestCostAboveRateInvitesNoRetry(t *testing.T) {
	e := newEnv(t)
	e.clock.Set(epoch.Add(30 * time.Second))
	served := 0
	costs := map[string]int64{"/small": 3, "/huge": 11}
	h := e.handler(&served, ratelimit.PerMinute(10),
		httplimit.WithCost(func(r *http.Request) int64 { return costs[r.URL.Path] }))
	call := func(path string) *httptest.ResponseRecorder {
		r := request("192.0.2.1:1")
		r.URL.Path = path
		return serve(h, r)
	}
	policy := `"10-per-60s";q=10;w=60`

	w := call("/huge")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, map[string]string{
		"X-Ratelimit-Limit": "10", "X-Ratelimit-Remaining": "10",
		"Ratelimit-Policy": policy, "Ratelimit": `"10-per-60s";r=10`,
	}, headersOf(t, w))
	require.Contains(t, problemOf(t, w).Detail, "cannot succeed by waiting")

	require.Equal(t, http.StatusOK, call("/small").Code)
	w = call("/huge")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, map[string]string{
		"X-Ratelimit-Limit": "10", "X-Ratelimit-Remaining": "7",
		"Ratelimit-Policy": policy, "Ratelimit": `"10-per-60s";r=7`,
	}, headersOf(t, w))
	require.Equal(t, 1, served)
	require.Equal(t, int64(3), e.count(t, "ip:192.0.2.1", ratelimit.PerMinute(10)))
}

func TestHeaderSets(t *testing.T) {
	tests := []struct {
		name string
		set  httplimit.HeaderSet
		want []string
	}{
		{"both", httplimit.XRateLimitHeaders | httplimit.IETFHeaders, rateHeaders},
		{"X-RateLimit only", httplimit.XRateLimitHeaders, []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Retry-After"}},
		{"IETF only", httplimit.IETFHeaders, []string{"Ratelimit-Policy", "Ratelimit", "Retry-After"}},
		{"none", 0, []string{"Retry-After"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			served := 0
			h := e.handler(&served, ratelimit.PerMinute(1), httplimit.WithHeaders(tc.set))
			serve(h, request("192.0.2.1:1"))
			w := serve(h, request("192.0.2.1:1"))
			require.Equal(t, http.StatusTooManyRequests, w.Code)
			var got []string
			for _, name := range rateHeaders {
				if w.Header().Get(name) != "" {
					got = append(got, name)
				}
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// ctxUser is the context key an authentication middleware would use.
type ctxUser struct{}

func TestIdentity(t *testing.T) {
	limit := ratelimit.PerMinute(100)
	known := func(k string) bool { return k == "secret-key" }
	withUser := func(r *http.Request, id any) *http.Request {
		return r.WithContext(context.WithValue(r.Context(), ctxUser{}, id))
	}
	keys := httplimit.WithKeys(httplimit.UserID(ctxUser{}), httplimit.APIKey("x-api-key", known))
	tests := []struct {
		name string
		opts []httplimit.Option
		r    *http.Request
		want string
	}{
		{"IPv4 peer", nil, request("203.0.113.7:5555"), "ip:203.0.113.7"},
		{"IPv6 peer grouped by /64", nil, request("[2001:db8:1:2:aaaa::1]:5555"), "ip6:2001:db8:1:2::/64"},
		{"IPv4-mapped peer", nil, request("[::ffff:203.0.113.7]:5555"), "ip:203.0.113.7"},
		{"custom IPv6 prefix", []httplimit.Option{httplimit.WithIPv6Prefix(56)}, request("[2001:db8:1:2ff::1]:1"), "ip6:2001:db8:1:200::/56"},
		{"unix socket peer", nil, request("@"), httplimit.UnknownClient},
		{"known API key, hashed", []httplimit.Option{keys}, request("203.0.113.7:1", "X-Api-Key", "secret-key"),
			"key:" + "85dbe15d75ef9308c7ae0f33c7a324cc"},
		{"unknown API key falls back to the address", []httplimit.Option{keys}, request("203.0.113.7:1", "X-Api-Key", "guess"), "ip:203.0.113.7"},
		{"user id first", []httplimit.Option{keys}, withUser(request("203.0.113.7:1", "X-Api-Key", "secret-key"), "u-42"), "user:u-42"},
		{"integer user id", []httplimit.Option{keys}, withUser(request("203.0.113.7:1"), int64(42)), "user:42"},
		{"empty user id falls through", []httplimit.Option{keys}, withUser(request("203.0.113.7:1"), ""), "ip:203.0.113.7"},
		{"custom key function", []httplimit.Option{httplimit.WithKeys(func(r *http.Request) string { return "org:" + r.Header.Get("X-Org") })},
			request("203.0.113.7:1", "X-Org", "7"), "org:7"},
		{"route and identity", []httplimit.Option{httplimit.WithRoute(func(r *http.Request) string { return "GET /a|b" })},
			request("203.0.113.7:1"), "GET /a%7Cb|ip:203.0.113.7"},
		{"empty route", []httplimit.Option{httplimit.WithRoute(func(r *http.Request) string { return "" })},
			request("203.0.113.7:1"), "ip:203.0.113.7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			served := 0
			w := serve(e.handler(&served, limit, tc.opts...), tc.r)
			require.Equal(t, http.StatusOK, w.Code)
			require.Equal(t, int64(1), e.count(t, tc.want, limit))
		})
	}
}

func TestHashedKey(t *testing.T) {
	// sha256("secret-key") = 85dbe15d75ef9308c7ae0f33c7a324cc…, computed apart from the code.
	require.Equal(t, "key:85dbe15d75ef9308c7ae0f33c7a324cc", httplimit.HashedKey("secret-key"))
}

// TestRouteWithServeMux counts each ServeMux pattern apart, with the
// pattern the mux will choose, so that /items/1 and /items/2 share one.
func TestRouteWithServeMux(t *testing.T) {
	e := newEnv(t)
	limit := ratelimit.PerMinute(100)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /search", func(w http.ResponseWriter, r *http.Request) {})
	h := httplimit.Middleware(e.limiter, limit, httplimit.WithRoute(func(r *http.Request) string {
		_, pattern := mux.Handler(r)
		return pattern
	}))(mux)
	for _, path := range []string{"/items/1", "/items/2", "/search", "/items/3"} {
		r := request("203.0.113.7:1")
		r.URL.Path = path
		require.Equal(t, http.StatusOK, serve(h, r).Code)
	}
	require.Equal(t, int64(3), e.count(t, "GET /items/{id}|ip:203.0.113.7", limit))
	require.Equal(t, int64(1), e.count(t, "GET /search|ip:203.0.113.7", limit))
}

func TestFromContext(t *testing.T) {
	e := newEnv(t)
	var got ratelimit.Result
	var ok bool
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got, ok = httplimit.FromContext(r.Context()) })
	h := httplimit.Middleware(e.limiter, ratelimit.PerMinute(10))(next)
	serve(h, request("203.0.113.7:1"))
	require.True(t, ok)
	require.Equal(t, public(ratelimit.Result{
		Allowed: true, Count: 1, Limit: ratelimit.PerMinute(10), Remaining: 9,
		ResetAfter: 60001 * time.Millisecond,
	}), public(got))
	_, ok = httplimit.FromContext(context.Background())
	require.False(t, ok)
}

// Configuration errors never panic: New reports each, naming it, and
// Middleware answers every request with 500 instead of leaving the API
// unlimited.
func TestConfigurationErrors(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = dead.Close() })
	l := ratelimit.New(dead)
	tests := []struct {
		name    string
		limiter *ratelimit.Limiter
		limit   ratelimit.Limit
		opt     httplimit.Option
		says    string
	}{
		{"nil limiter", nil, ratelimit.PerMinute(1), nil, "the Limiter is nil"},
		{"invalid limit", l, ratelimit.PerMinute(0), nil, "rate 0 is below 1"},
		{"proxies with another header", l, ratelimit.PerMinute(1), httplimit.WithTrustedProxies("X-Real-IP", netip.MustParsePrefix("10.0.0.0/8")), "reads X-Forwarded-For or Forwarded"},
		{"proxies without ranges", l, ratelimit.PerMinute(1), httplimit.WithTrustedProxies("X-Forwarded-For"), "no proxy range"},
		{"invalid proxy range", l, ratelimit.PerMinute(1), httplimit.WithTrustedProxies("Forwarded", netip.Prefix{}), "invalid prefix"},
		{"client IP header that is a list", l, ratelimit.PerMinute(1), httplimit.WithClientIPHeader("x-forwarded-for"), "holds one address"},
		{"empty client IP header", l, ratelimit.PerMinute(1), httplimit.WithClientIPHeader(""), "holds one address"},
		{"IPv6 prefix 0", l, ratelimit.PerMinute(1), httplimit.WithIPv6Prefix(0), "1 to 128 bits, not 0"},
		{"IPv6 prefix 129", l, ratelimit.PerMinute(1), httplimit.WithIPv6Prefix(129), "1 to 128 bits, not 129"},
		{"invalid allow-list range", l, ratelimit.PerMinute(1), httplimit.WithAllowList(netip.Prefix{}), "WithAllowList was given an invalid prefix"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := httplimit.New(tc.limiter, tc.limit, tc.opt)
			require.Nil(t, mw)
			require.ErrorContains(t, err, tc.says)
			require.Regexp(t, "^httplimit: ", err.Error())

			served := false
			h := httplimit.Middleware(tc.limiter, tc.limit, tc.opt)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true }))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			require.Equal(t, http.StatusInternalServerError, rec.Code)
			require.False(t, served)
		})
	}
}

// APIKey with no header name reads X-API-Key; with no way to recognise keys
// it recognises none, and every request falls through to the address.
func TestAPIKeyDefaults(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-API-Key", "k")
	require.Equal(t, httplimit.HashedKey("k"), httplimit.APIKey("", func(string) bool { return true })(r))
	require.Equal(t, "", httplimit.APIKey("X-API-Key", nil)(r))
}

// TestSpoofersShareACount sends a fresh forwarding header with every request
// and checks that the client is still counted once, by its real address.
func TestSpoofersShareACount(t *testing.T) {
	proxies := netip.MustParsePrefix("10.0.0.0/8")
	tests := []struct {
		name string
		opts []httplimit.Option
		peer string
		fake func(i int) []string // header pairs the client sends
		hop  []string             // header pairs the trusted proxy appends
	}{
		{"no proxy trusted", nil, "203.0.113.7:1", func(i int) []string {
			a := "198.51.100." + strconv.Itoa(i)
			return []string{"X-Forwarded-For", a, "Forwarded", "for=" + a, "X-Real-IP", a, "CF-Connecting-IP", a}
		}, nil},
		{"X-Forwarded-For behind a trusted proxy",
			[]httplimit.Option{httplimit.WithTrustedProxies("X-Forwarded-For", proxies)}, "10.0.0.1:1",
			func(i int) []string {
				return []string{"X-Forwarded-For", "198.51.100." + strconv.Itoa(i) + ", 10.0.0.9"}
			},
			[]string{"X-Forwarded-For", "203.0.113.7"}},
		{"Forwarded behind a trusted proxy",
			[]httplimit.Option{httplimit.WithTrustedProxies("Forwarded", proxies)}, "10.0.0.1:1",
			func(i int) []string { return []string{"Forwarded", "for=198.51.100." + strconv.Itoa(i)} },
			[]string{"Forwarded", "for=203.0.113.7;proto=https"}},
		{"X-Real-IP from a trusted edge, spoofed on a direct connection",
			[]httplimit.Option{httplimit.WithClientIPHeader("X-Real-IP", proxies)}, "203.0.113.7:1",
			func(i int) []string { return []string{"X-Real-IP", "198.51.100." + strconv.Itoa(i)} }, nil},
	}
	limit := ratelimit.PerMinute(5)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			served := 0
			h := e.handler(&served, limit, tc.opts...)
			for i := range 20 {
				serve(h, request(tc.peer, append(tc.fake(i), tc.hop...)...))
			}
			require.Equal(t, 5, served)
			require.Equal(t, int64(5), e.count(t, "ip:203.0.113.7", limit))
		})
	}
}

// TestIPv6RotationSharesACount sends from 20 addresses of one /64 and checks
// that they share one count, while the next /64 has its own.
func TestIPv6RotationSharesACount(t *testing.T) {
	e := newEnv(t)
	served := 0
	limit := ratelimit.PerMinute(10)
	h := e.handler(&served, limit,
		httplimit.WithTrustedProxies("X-Forwarded-For", netip.MustParsePrefix("fd00::/8")))
	for i := range 20 {
		a := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2, byte(i), 0xaa, 0, 0, 0, 0, 0, byte(i + 1)})
		peer := "[" + a.String() + "]:1"
		if i%2 == 1 { // half of them through the proxy
			w := serve(h, request("[fd00::1]:443", "X-Forwarded-For", a.String()))
			require.Equal(t, i < 10, w.Code == http.StatusOK, "request %d", i)
			continue
		}
		w := serve(h, request(peer))
		require.Equal(t, i < 10, w.Code == http.StatusOK, "request %d", i)
	}
	require.Equal(t, 10, served)
	require.Equal(t, int64(10), e.count(t, "ip6:2001:db8:1:2::/64", limit))
	require.Equal(t, http.StatusOK, serve(h, request("[2001:db8:1:3::1]:1")).Code)
}
