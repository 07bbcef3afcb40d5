package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// A free tier counted by client address behind a load balancer, and a paid
// tier counted by API key, from one middleware.
func ExampleMiddleware() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	// A fixed clock, 30s into a minute, so that the output below is exact.
	now := time.UnixMilli(1_700_002_830_000)
	limiter := ratelimit.New(client, ratelimit.WithClock(func() time.Time { return now }))

	paidKeys := map[string]bool{"k-123": true}
	known := func(key string) bool { return paidKeys[key] }
	free := ratelimit.Limit{Name: "free", Rate: 2, Window: time.Minute}
	paid := []ratelimit.Limit{{Name: "paid", Rate: 100, Window: time.Minute}}
	mw := httplimit.Middleware(limiter, free,
		httplimit.WithTrustedProxies("X-Forwarded-For", netip.MustParsePrefix("10.0.0.0/8")),
		httplimit.WithKeys(httplimit.APIKey("X-API-Key", known)),
		httplimit.WithPlanFunc(func(r *http.Request) []ratelimit.Limit {
			if known(r.Header.Get("X-API-Key")) {
				return paid
			}
			return nil // the default plan: the free tier
		}),
		httplimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
	)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))

	for _, apiKey := range []string{"", "", "", "k-123"} {
		r := httptest.NewRequest(http.MethodGet, "/hello", nil)
		r.RemoteAddr = "10.0.0.2:50000"                         // the load balancer
		r.Header.Set("X-Forwarded-For", "1.2.3.4, 203.0.113.7") // a spoof, then the real client
		if apiKey != "" {
			r.Header.Set("X-API-Key", apiKey)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "free";r=1;t=31
	// 200 "free";r=0;t=31
	// 429 "free";r=0;t=31
	// 200 "paid";r=99;t=31
}

// A burst limit and an hourly quota, decided together: the third request
// within a second is denied by the burst limit, and not counted under the
// hourly one.
func ExampleWithLimits() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	// A fixed clock, 30 minutes and half a second into an hour, so that the
	// output below is exact.
	now := time.UnixMilli(1_700_004_600_500)
	limiter := ratelimit.New(client, ratelimit.WithClock(func() time.Time { return now }))

	burst := ratelimit.Limit{Name: "burst", Rate: 2, Window: time.Second}
	hourly := ratelimit.Limit{Name: "hourly", Rate: 100, Window: time.Hour}
	mw, err := httplimit.New(limiter, burst, httplimit.WithLimits(hourly))
	if err != nil {
		panic(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))

	var w *httptest.ResponseRecorder
	for range 3 {
		w = httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/hello", nil))
		fmt.Println(w.Code, w.Header().Get("RateLimit"))
	}
	fmt.Println("Retry-After:", w.Header().Get("Retry-After"))
	fmt.Println("RateLimit-Policy:", w.Header().Get("RateLimit-Policy"))
	// Output:
	// 200 "burst";r=1;t=1, "hourly";r=99;t=1800
	// 200 "burst";r=0;t=1, "hourly";r=98;t=1800
	// 429 "burst";r=0;t=1, "hourly";r=98;t=3600
	// Retry-After: 1
	// RateLimit-Policy: "burst";q=2;w=1, "hourly";q=100;w=3600
}

// Tiers' plans checked once, at start-up, rather than on the first request
// of each tier: a plan New or WithPlanFunc would reject is reported here,
// and a checked plan says what its headers will announce.
func ExampleNewPlan() {
	tiers := map[string][]ratelimit.Limit{
		"free": {{Name: "burst", Rate: 5, Window: time.Second}, {Name: "hourly", Rate: 100, Window: time.Hour}},
		"paid": {{Name: "burst", Rate: 50, Window: time.Second}, {Name: "burst", Rate: 10000, Window: time.Hour}},
	}
	plans := map[string]*httplimit.Plan{}
	for _, tier := range []string{"free", "paid"} {
		pl, err := httplimit.NewPlan(tiers[tier]...)
		if err != nil {
			fmt.Printf("%s: %v\n", tier, err)
			continue
		}
		plans[tier] = pl
		fmt.Printf("%s: %q\n", tier, pl.Policies())
	}
	_ = httplimit.WithPlanFunc(func(r *http.Request) []ratelimit.Limit {
		if pl, ok := plans[r.Header.Get("X-Tier")]; ok {
			return pl.Limits()
		}
		return nil // the default plan
	})
	// Output:
	// free: ["\"burst\";q=5;w=1" "\"hourly\";q=100;w=3600"]
	// paid: ratelimit: invalid limit: two limits are named "burst" (50/1s and 10000/1h0m0s); the rate-limit headers could not tell them apart
}
