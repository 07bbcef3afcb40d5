package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// burst and hourly are the two-limit plan most of these tests use.
var (
	burst  = ratelimit.Limit{Name: "burst", Rate: 2, Window: time.Second}
	hourly = ratelimit.Limit{Name: "hourly", Rate: 5, Window: time.Hour}
)

// twoLimits returns the middleware of the plan "burst" (2 a second) and
// "hourly" (5 an hour) around a handler that counts its calls.
func (e *env) twoLimits(served *int, opts ...httplimit.Option) http.Handler {
	return e.handler(served, burst, append([]httplimit.Option{httplimit.WithLimits(hourly)}, opts...)...)
}

// counts returns id's counts under limits now, without adding to them.
func (e *env) counts(t *testing.T, id string, limits ...ratelimit.Limit) []int64 {
	t.Helper()
	results, err := e.limiter.PeekAll(context.Background(), id, limits)
	require.NoError(t, err)
	out := make([]int64, len(results))
	for i, res := range results {
		out[i] = res.Count
	}
	return out
}

// TestTwoLimitsAtTheLimits walks one client into a burst limit of 2 a
// second, and later into an hourly limit of 5, half a second into a second
// and 30 minutes into an hour, and checks every header of every response,
// and that a request one limit denies is counted under neither.
//
// With c requests in the current window and none before, e ms into a window
// of w ms, the count is 0 again once the next window is m ms old with
// floor(c×(w-m)/w) = 0, that is m > w×(c-1)/c: after w - e + m ms. The
// burst's count of 2 at 500ms is 0 after 500+501ms, 2s rounded up; the
// hourly count of 2 at 1800.5s after 1799.5s+1800.001s, 3600s; of 5 at
// 1804.5s after 1795.5s+2880.001s, 4676s. A denied request passes once the
// estimate is below the rate again: 1ms into the next window, so 501ms
// (1s) for the burst and 1795.501s for the hourly limit at 1804.5s.
func TestTwoLimitsAtTheLimits(t *testing.T) {
	e := newEnv(t)
	start := epoch.Add(30*time.Minute + 500*time.Millisecond)
	served := 0
	h := e.twoLimits(&served)
	policy := `"burst";q=2;w=1, "hourly";q=5;w=3600`
	steps := []struct {
		at      time.Duration // after start
		status  int
		headers map[string]string
		counts  []int64 // burst, hourly after the request
	}{
		{0, 200, map[string]string{
			"X-Ratelimit-Limit": "2", "X-Ratelimit-Remaining": "1", "X-Ratelimit-Reset": "1",
			"Ratelimit-Policy": policy, "Ratelimit": `"burst";r=1;t=1, "hourly";r=4;t=1800`,
		}, []int64{1, 1}},
		{0, 200, map[string]string{
			"X-Ratelimit-Limit": "2", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "2",
			"Ratelimit-Policy": policy, "Ratelimit": `"burst";r=0;t=1, "hourly";r=3;t=1800`,
		}, []int64{2, 2}},
		{0, 429, map[string]string{ // the burst denies: not counted under the hourly limit
			"X-Ratelimit-Limit": "2", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "1",
			"Ratelimit-Policy": policy, "Ratelimit": `"burst";r=0;t=1, "hourly";r=3;t=3600`, "Retry-After": "1",
		}, []int64{2, 2}},
		{2 * time.Second, 200, nil, []int64{1, 3}},
		{2 * time.Second, 200, nil, []int64{2, 4}},
		{4 * time.Second, 200, map[string]string{ // the hourly limit binds: 0 left, 1 more in 1796 s (t), all 5 in 4676 s
			"X-Ratelimit-Limit": "5", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "4676",
			"Ratelimit-Policy": policy, "Ratelimit": `"burst";r=1;t=1, "hourly";r=0;t=1796`,
		}, []int64{1, 5}},
		{4 * time.Second, 429, map[string]string{ // the hourly limit denies: not counted under the burst
			"X-Ratelimit-Limit": "5", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "1796",
			"Ratelimit-Policy": policy, "Ratelimit": `"burst";r=1;t=1, "hourly";r=0;t=1796`, "Retry-After": "1796",
		}, []int64{1, 5}},
	}
	for i, s := range steps {
		e.clock.Set(start.Add(s.at))
		w := serve(h, request("192.0.2.1:1"))
		require.Equal(t, s.status, w.Code, "request %d", i+1)
		if s.headers != nil {
			require.Equal(t, s.headers, headersOf(t, w), "request %d", i+1)
		}
		require.Equal(t, s.counts, e.counts(t, "ip:192.0.2.1", burst, hourly), "request %d", i+1)
	}
	require.Equal(t, 5, served)
}

// TestPlanResults checks what FromContext and FromContextAll give a handler
// of a two-limit plan, and that the Limiter's Observer sees the policies'
// names.
func TestPlanResults(t *testing.T) {
	var names []string
	e := newEnv(t, ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, ev *ratelimit.Event) {
		names = names[:0]
		for _, res := range ev.Results {
			names = append(names, res.Limit.Name)
		}
	})))
	var one ratelimit.Result
	var all []ratelimit.Result
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ok bool
		one, ok = httplimit.FromContext(r.Context())
		require.True(t, ok)
		all, ok = httplimit.FromContextAll(r.Context())
		require.True(t, ok)
		all[0].Count = 99 // the caller's own copy
		all, _ = httplimit.FromContextAll(r.Context())
	})
	h := httplimit.Middleware(e.limiter, burst, httplimit.WithLimits(hourly))(next)
	serve(h, request("192.0.2.1:1"))

	want := []ratelimit.Result{
		{Allowed: true, Count: 1, Limit: burst, Remaining: 1, ResetAfter: 1001 * time.Millisecond},
		{Allowed: true, Count: 1, Limit: hourly, Remaining: 4, ResetAfter: 3600001 * time.Millisecond},
	}
	require.Equal(t, want, public(all...))
	require.Equal(t, want[:1], public(one), "the binding Result: the least remaining")
	require.Equal(t, []string{"burst", "hourly"}, names)

	_, ok := httplimit.FromContextAll(context.Background())
	require.False(t, ok)
}

// TestPlanPerTier gives a free tier, counted by address, and a paid tier,
// counted by API key, plans of two limits each.
func TestPlanPerTier(t *testing.T) {
	e := newEnv(t)
	e.clock.Set(epoch.Add(30*time.Minute + 500*time.Millisecond))
	known := func(k string) bool { return k == "paid-1" }
	free := []ratelimit.Limit{
		{Name: "burst", Rate: 1, Window: time.Second},
		{Name: "hourly", Rate: 2, Window: time.Hour},
	}
	paid := []ratelimit.Limit{
		{Name: "paid-burst", Rate: 3, Window: time.Second},
		{Name: "paid-hourly", Rate: 100, Window: time.Hour},
	}
	served := 0
	h := e.handler(&served, ratelimit.PerMinute(1000),
		httplimit.WithKeys(httplimit.APIKey("X-API-Key", known)),
		httplimit.WithPlanFunc(func(r *http.Request) []ratelimit.Limit {
			if known(r.Header.Get("X-API-Key")) {
				return paid
			}
			return free
		}))
	freePolicy := `"burst";q=1;w=1, "hourly";q=2;w=3600`
	paidPolicy := `"paid-burst";q=3;w=1, "paid-hourly";q=100;w=3600`
	tests := []struct {
		name, apiKey  string
		at            time.Duration
		status        int
		policy, state string
	}{
		{"free 1", "", 0, 200, freePolicy, `"burst";r=0;t=1, "hourly";r=1;t=1800`},
		{"free 2: burst", "", 0, 429, freePolicy, `"burst";r=0;t=1, "hourly";r=1;t=1800`},
		{"paid 1", "paid-1", 0, 200, paidPolicy, `"paid-burst";r=2;t=1, "paid-hourly";r=99;t=1800`},
		{"free 3, a second later", "", time.Second, 200, freePolicy, `"burst";r=0;t=1, "hourly";r=0;t=1799`},
		{"free 4: hourly", "", 3 * time.Second, 429, freePolicy, `"burst";r=1;t=0, "hourly";r=0;t=1797`},
		{"an unknown key counts as free", "made-up", 3 * time.Second, 429, freePolicy, `"burst";r=1;t=0, "hourly";r=0;t=1797`},
		{"paid 2", "paid-1", 3 * time.Second, 200, paidPolicy, `"paid-burst";r=2;t=1, "paid-hourly";r=98;t=1797`},
	}
	start := e.clock.Now()
	for _, tc := range tests {
		e.clock.Set(start.Add(tc.at))
		w := serve(h, request("192.0.2.1:1", "X-API-Key", tc.apiKey))
		require.Equal(t, tc.status, w.Code, tc.name)
		require.Equal(t, tc.policy, w.Header().Get("Ratelimit-Policy"), tc.name)
		require.Equal(t, tc.state, w.Header().Get("Ratelimit"), tc.name)
	}
	require.Equal(t, 4, served)
	require.Equal(t, []int64{2}, e.counts(t, "ip:192.0.2.1", ratelimit.PerHour(2)))
	require.Equal(t, []int64{2}, e.counts(t, httplimit.HashedKey("paid-1"), ratelimit.PerHour(100)))
}

// TestPlanPerRoute gives /search a plan of its own, counted apart with
// WithRoute, and every other route the default plan.
func TestPlanPerRoute(t *testing.T) {
	e := newEnv(t)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /search", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {})
	search := []ratelimit.Limit{
		{Name: "search-burst", Rate: 1, Window: time.Second},
		{Name: "search-hourly", Rate: 3, Window: time.Hour},
	}
	route := func(r *http.Request) string { _, p := mux.Handler(r); return p }
	h := httplimit.Middleware(e.limiter, ratelimit.Limit{Name: "minute", Rate: 100, Window: time.Minute},
		httplimit.WithLimits(ratelimit.Limit{Name: "hourly", Rate: 1000, Window: time.Hour}),
		httplimit.WithRoute(route),
		httplimit.WithPlanFunc(func(r *http.Request) []ratelimit.Limit {
			if route(r) == "GET /search" {
				return search
			}
			return nil // the default plan
		}))(mux)
	get := func(path string) *httptest.ResponseRecorder {
		r := request("203.0.113.7:1")
		r.URL.Path = path
		return serve(h, r)
	}
	w := get("/search")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, `"search-burst";q=1;w=1, "search-hourly";q=3;w=3600`, w.Header().Get("Ratelimit-Policy"))
	w = get("/search")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "2", w.Header().Get("Retry-After")) // 1ms into the next second
	for _, path := range []string{"/items/1", "/items/2"} {
		w = get(path)
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, `"minute";q=100;w=60, "hourly";q=1000;w=3600`, w.Header().Get("Ratelimit-Policy"))
	}
	require.Equal(t, []int64{1, 1}, e.counts(t, "GET /search|ip:203.0.113.7", ratelimit.PerSecond(1), ratelimit.PerHour(3)))
	require.Equal(t, []int64{2, 2}, e.counts(t, "GET /items/{id}|ip:203.0.113.7", ratelimit.PerMinute(100), ratelimit.PerHour(1000)))
}

// TestPlanConfigurationErrors: New rejects, naming the argument at fault
// (New's limit, one of WithLimits', or the plan they make), a default plan
// that ratelimit.ValidateLimits rejects, a zero Limit in it, and two limits
// of one name; a plan chosen per request with the same fault goes to the
// error handler, naming WithPlanFunc.
func TestPlanConfigurationErrors(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = dead.Close() })
	l := ratelimit.New(dead)
	main := ratelimit.PerMinute(100)
	many := make([]ratelimit.Limit, 16) // and main: 17
	for i := range many {
		many[i] = ratelimit.Limit{Rate: 1, Window: time.Duration(i+2) * time.Second}
	}
	tests := []struct {
		name  string
		limit ratelimit.Limit // given to New
		opts  []httplimit.Option
		says  string
	}{
		{"same window", main, []httplimit.Option{httplimit.WithLimits(ratelimit.PerMinute(10))},
			`New with WithLimits: ratelimit: invalid limit: limits 100/1m0s and 10/1m0s have the same window and would share one count`},
		{"same name", named(main, "p"), []httplimit.Option{httplimit.WithLimits(named(ratelimit.PerHour(10), "p"))},
			`New with WithLimits: ratelimit: invalid limit: two limits are named "p" (100/1m0s and 10/1h0m0s)`},
		{"same name once sent", named(main, "a\tb"), []httplimit.Option{httplimit.WithLimits(named(ratelimit.PerHour(10), "a\nb"))},
			`two limits are named "a_b"`},
		{"a zero Limit beside the main one", main, []httplimit.Option{httplimit.WithLimits(ratelimit.Limit{})},
			`httplimit: WithLimits' limit number 1: ratelimit: invalid limit: it is the zero Limit`},
		{"a zero Limit given to New", ratelimit.Limit{}, nil,
			`httplimit: New's limit: ratelimit: invalid limit: it is the zero Limit`},
		{"a zero Limit given to New, with WithLimits", ratelimit.Limit{}, []httplimit.Option{httplimit.WithLimits(ratelimit.PerHour(10))},
			`httplimit: New's limit: ratelimit: invalid limit: it is the zero Limit`},
		{"an invalid limit", main, []httplimit.Option{httplimit.WithLimits(ratelimit.PerHour(10), ratelimit.Limit{Name: "daily", Window: time.Hour})},
			`httplimit: WithLimits' limit number 2: ratelimit: invalid limit: rate 0 is below 1`},
		// The main limit at fault is named as such, not blamed on WithLimits.
		{"an invalid limit given to New, with WithLimits", ratelimit.PerMinute(0), []httplimit.Option{httplimit.WithLimits(ratelimit.PerHour(10))},
			`httplimit: New's limit: ratelimit: invalid limit: rate 0 is below 1`},
		{"too many", main, []httplimit.Option{httplimit.WithLimits(many...)},
			`New with WithLimits: ratelimit: invalid limit: 17 limits, more than 16`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := httplimit.New(l, tc.limit, tc.opts...)
			require.Nil(t, mw)
			require.ErrorContains(t, err, tc.says)
			require.Regexp(t, "^httplimit: ", err.Error())
			require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
			if strings.HasPrefix(tc.says, "httplimit: New's limit:") {
				require.NotContains(t, err.Error(), "WithLimits", "the fault is New's limit alone")
			}
		})
	}

	t.Run("the same window and strict is another count", func(t *testing.T) {
		strict := ratelimit.Limit{Rate: 10, Window: time.Minute, Strict: true}
		_, err := httplimit.New(l, main, httplimit.WithLimits(strict))
		require.NoError(t, err)
	})

	for _, tc := range []struct {
		name string
		plan []ratelimit.Limit
		says string
	}{
		{"a plan chosen per request", []ratelimit.Limit{named(ratelimit.PerHour(5), "a"), named(ratelimit.PerHour(50), "b")},
			`httplimit: WithPlanFunc's plan: ratelimit: invalid limit: limits 5/1h0m0s and 50/1h0m0s have the same window`},
		{"a zero Limit in a plan is no stand-in for the main one", []ratelimit.Limit{{}, hourly},
			`httplimit: WithPlanFunc's plan: ratelimit: invalid limit: limit number 1 is the zero Limit`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			var got error
			served := 0
			h := e.handler(&served, ratelimit.PerMinute(100),
				httplimit.WithPlanFunc(func(*http.Request) []ratelimit.Limit { return tc.plan }),
				httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
					got = err
					w.WriteHeader(http.StatusInternalServerError)
				}))
			w := serve(h, request("192.0.2.1:1"))
			require.Equal(t, http.StatusInternalServerError, w.Code)
			require.ErrorIs(t, got, ratelimit.ErrInvalidLimit)
			require.ErrorContains(t, got, tc.says)
			require.Empty(t, headersOf(t, w))
			require.Equal(t, 0, served)
			require.Equal(t, int64(0), e.count(t, "ip:192.0.2.1", hourly))
		})
	}
}

// named returns limit with its Name set to name.
func named(limit ratelimit.Limit, name string) ratelimit.Limit {
	limit.Name = name
	return limit
}

// twin returns a second middleware on the same Redis and clock, with a
// Limiter of its own (another prefix), to enforce what another middleware
// shadows, and a function that returns id's count under limit there.
func (e *env) twin(t *testing.T, served *int, limit ratelimit.Limit, opts ...httplimit.Option) (http.Handler, func(id string, limit ratelimit.Limit) int64) {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: e.mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	l := ratelimit.New(client, ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix("twin"),
		ratelimit.WithTimeout(time.Minute), ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { *served++ })
	count := func(id string, limit ratelimit.Limit) int64 {
		res, err := l.Peek(context.Background(), id, limit)
		require.NoError(t, err)
		require.False(t, res.Degraded)
		return res.Count
	}
	return httplimit.Middleware(l, limit, opts...)(next), count
}

// TestShadowPolicy sends the same traffic through a plan with a shadowed
// policy and through a twin that enforces that policy alone, and checks
// that the shadowed policy never answers 429 and sends no header, that it
// counts exactly what the enforced twin counts, and that the shadow handler
// is called exactly when the twin denies, with the twin's figures.
func TestShadowPolicy(t *testing.T) {
	tests := []struct {
		name     string
		main     ratelimit.Limit // given to Middleware, named "main"
		shadowed ratelimit.Limit // named "trial" and Shadow, beside it
		trialIs  int             // the trial policy's place in the plan
		opts     []httplimit.Option
	}{
		{"a shadowed burst beside a loose limit", ratelimit.PerMinute(1000), ratelimit.PerSecond(3), 1, nil},
		{"a shadowed minute beside an enforced burst, which denies too", ratelimit.PerSecond(2), ratelimit.PerMinute(5), 1, nil},
		{"the only policy, shadowed", ratelimit.Limit{}, ratelimit.PerSecond(3), 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.clock.Set(epoch.Add(250 * time.Millisecond))
			var calls []ratelimit.Result
			onShadow := httplimit.WithShadowHandler(func(r *http.Request, res ratelimit.Result) {
				all, ok := httplimit.FromContextAll(r.Context())
				require.True(t, ok, "the Results are set before the hook runs")
				require.Contains(t, all, res)
				calls = append(calls, res)
			})
			var trialResult ratelimit.Result
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				all, _ := httplimit.FromContextAll(r.Context())
				trialResult = all[tc.trialIs]
			})
			denied := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				next.ServeHTTP(w, r)
				w.WriteHeader(http.StatusTooManyRequests)
			})
			trial := named(tc.shadowed, "trial")
			trial.Shadow = true
			var h http.Handler
			if tc.main == (ratelimit.Limit{}) {
				h = httplimit.Middleware(e.limiter, trial, httplimit.WithDeniedHandler(denied), onShadow)(next)
			} else {
				h = httplimit.Middleware(e.limiter, named(tc.main, "main"),
					httplimit.WithLimits(trial), httplimit.WithDeniedHandler(denied), onShadow)(next)
			}
			twinServed := 0
			var twinResult ratelimit.Result
			twin, twinCount := e.twin(t, &twinServed, tc.shadowed, httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				twinResult, _ = httplimit.FromContext(r.Context())
				w.WriteHeader(http.StatusTooManyRequests)
			})))

			twinDenials, mainDenials := 0, 0
			start := e.clock.Now()
			for step := range 40 {
				e.clock.Set(start.Add(time.Duration(step) * 137 * time.Millisecond))
				for range step%3 + 1 {
					before := len(calls)
					w := serve(h, request("192.0.2.1:1"))
					tw := serve(twin, request("192.0.2.1:1"))

					if w.Code == http.StatusTooManyRequests {
						mainDenials++
						require.NotEqual(t, ratelimit.Limit{}, tc.main, "a shadowed policy alone never denies")
						require.Equal(t, "main", w.Header().Get("Ratelimit")[1:5], "only the enforced policy denies")
					}
					for name, vs := range w.Header() {
						for _, v := range vs {
							require.NotContains(t, v, "trial", "header %s", name)
						}
					}
					if tc.main == (ratelimit.Limit{}) {
						require.Empty(t, headersOf(t, w), "a plan of shadowed policies sends no header")
					} else {
						require.Equal(t, "main", w.Header().Get("Ratelimit-Policy")[1:5])
					}

					// The shadowed policy is decided as its twin is.
					twinDenied := tw.Code == http.StatusTooManyRequests
					require.Equal(t, twinDenied, trialResult.Shadowed)
					if twinDenied {
						twinDenials++
						require.Len(t, calls, before+1, "the shadow handler is called for this denial")
						got := calls[before]
						require.Equal(t, "trial", got.Limit.Name)
						require.True(t, got.Shadowed)
						require.Equal(t, twinResult.Count, got.Count)
						require.Equal(t, twinResult.Remaining, got.Remaining)
						require.Equal(t, twinResult.RetryAfter, got.RetryAfter)
						require.Equal(t, twinResult.ResetAfter, got.ResetAfter)
					} else {
						require.Len(t, calls, before, "no shadow handler call without a denial")
					}
					require.Equal(t, twinCount("ip:192.0.2.1", tc.shadowed), e.count(t, "ip:192.0.2.1", tc.shadowed))
				}
			}
			require.Positive(t, twinDenials, "the traffic goes past the shadowed limit")
			require.Len(t, calls, twinDenials)
			if strings.Contains(tc.name, "denies too") {
				require.Positive(t, mainDenials)
			} else {
				require.Zero(t, mainDenials)
			}
		})
	}
}

// TestWholeLimiterShadow: under ratelimit.WithShadow the middleware never
// answers 429; a request the plan would have denied goes through with no
// rate-limit header, its Results Shadowed, and the shadow handler sees the
// binding Result (FromContext's, ratelimit.Binding's), the limit that would
// have denied, once. Counts are those of an enforcing twin.
func TestWholeLimiterShadow(t *testing.T) {
	e := newEnv(t, ratelimit.WithShadow(true))
	start := epoch.Add(30*time.Minute + 500*time.Millisecond)
	e.clock.Set(start)
	var calls []ratelimit.Result
	var got ratelimit.Result
	served := 0
	// "trial" is shadowed too, and never would have denied: the shadow
	// handler is not called for it, and its Result is not Shadowed.
	trial := ratelimit.Limit{Name: "trial", Rate: 100, Window: time.Minute, Shadow: true}
	h := httplimit.Middleware(e.limiter, burst, httplimit.WithLimits(hourly, trial),
		httplimit.WithShadowHandler(func(r *http.Request, res ratelimit.Result) { calls = append(calls, res) }),
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		got, _ = httplimit.FromContext(r.Context())
		all, _ := httplimit.FromContextAll(r.Context())
		require.Equal(t, ratelimit.Binding(all), got, "FromContext is ratelimit.Binding's, under WithShadow too")
	}))
	twinServed := 0
	twin, twinCount := e.twin(t, &twinServed, burst, httplimit.WithLimits(hourly))

	for i := range 3 {
		w := serve(h, request("192.0.2.1:1"))
		tw := serve(twin, request("192.0.2.1:1"))
		require.Equal(t, http.StatusOK, w.Code, "request %d", i+1)
		if tw.Code == http.StatusOK {
			require.Equal(t, headersOf(t, tw)["Ratelimit"], headersOf(t, w)["Ratelimit"])
			require.Empty(t, calls)
			continue
		}
		require.Equal(t, 2, i, "the third request would have been denied")
		require.Empty(t, headersOf(t, w), "no header for a decision shadow mode let through")
		require.True(t, got.Allowed)
		require.True(t, got.Shadowed)
		require.Equal(t, "burst", got.Limit.Name, "the binding Result is the burst's, which denied")
		require.Equal(t, 501*time.Millisecond, got.RetryAfter)
		require.Equal(t, []ratelimit.Result{got}, calls)
	}
	require.Equal(t, 3, served)
	require.Equal(t, 2, twinServed)
	require.Equal(t, []int64{2, 2}, e.counts(t, "ip:192.0.2.1", burst, hourly))
	require.Equal(t, int64(2), twinCount("ip:192.0.2.1", hourly))
}

// TestPlanRedisDown: a plan Redis could not decide gets the policy headers
// only, every policy listed, under FailOpen (passes) and FailClosed (503).
func TestPlanRedisDown(t *testing.T) {
	policyOnly := map[string]string{
		"X-Ratelimit-Limit": "2", // the binding limit: the least remaining, the burst's full rate
		"Ratelimit-Policy":  `"burst";q=2;w=1, "hourly";q=5;w=3600`,
	}
	tests := []struct {
		policy ratelimit.FailurePolicy
		status int
	}{
		{ratelimit.FailOpen, http.StatusOK},
		{ratelimit.FailClosed, http.StatusServiceUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.policy.String(), func(t *testing.T) {
			e := newEnv(t, ratelimit.WithFailurePolicy(tc.policy))
			e.mr.SetError("LOADING Redis is loading the dataset in memory")
			served := 0
			w := serve(e.twoLimits(&served), request("192.0.2.1:1"))
			require.Equal(t, tc.status, w.Code)
			require.Equal(t, policyOnly, headersOf(t, w))
		})
	}
}

// An empty plan from WithPlanFunc (nil or no limit) is the default plan,
// the limit given to New and WithLimits', never "not limited": a tier
// missing from a map must not make an unlimited API. grpclimit's
// TestEmptyPlanIsTheDefaultPlan is the same rule.
func TestEmptyPlanIsTheDefaultPlan(t *testing.T) {
	e := newEnv(t)
	burst := ratelimit.Limit{Name: "burst", Rate: 2, Window: time.Second}
	daily := ratelimit.Limit{Name: "daily", Rate: 100, Window: 24 * time.Hour}
	var seen []ratelimit.Limit
	h := httplimit.Middleware(e.limiter, burst, httplimit.WithLimits(daily),
		httplimit.WithPlanFunc(func(r *http.Request) []ratelimit.Limit {
			if r.URL.Path == "/a" {
				return nil
			}
			return []ratelimit.Limit{}
		}))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs, ok := httplimit.FromContextAll(r.Context())
		require.True(t, ok)
		seen = seen[:0]
		for _, res := range rs {
			seen = append(seen, res.Limit)
		}
	}))
	for _, path := range []string{"/a", "/b"} {
		r := request("192.0.2.1:1")
		r.URL.Path = path
		require.Equal(t, http.StatusOK, serve(h, r).Code, path)
		require.Equal(t, []ratelimit.Limit{burst, daily}, seen, path)
	}
	require.Equal(t, http.StatusTooManyRequests, serve(h, request("192.0.2.1:1")).Code,
		"both paths drew on the default plan's one count")
}
