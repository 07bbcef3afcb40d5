package httplimit_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// perKeyAndIP is the policy of public APIs: each API key 4 a minute, and
// each client address 3 a minute, whatever key it sends.
func perKeyAndIP(e *env, served *int, opts ...httplimit.Option) http.Handler {
	known := func(k string) bool { return k == "alpha" || k == "beta" }
	return e.handler(served, ratelimit.Limit{Name: "per-key", Rate: 4, Window: time.Minute}, append([]httplimit.Option{
		httplimit.WithKeys(httplimit.APIKey("X-API-Key", known)),
		httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(3)),
	}, opts...)...)
}

// One address with two keys: the address's limit binds first, and a
// request it denies is counted under neither identity.
func TestLimitsPerKeyAndIP(t *testing.T) {
	e := newEnv(t)
	e.clock.Set(epoch.Add(30 * time.Second))
	served := 0
	h := perKeyAndIP(e, &served)
	var codes []int
	// The key's item: its own count (beta 1, alpha 2), t until it is 0.
	keyItems := map[string]string{"beta": `"per-key";r=3;t=31`, "alpha": `"per-key";r=2;t=61`}
	for _, key := range []string{"alpha", "alpha", "beta", "beta", "alpha"} {
		w := serve(h, request("192.0.2.1:1234", "X-API-Key", key))
		codes = append(codes, w.Code)
		if w.Code == http.StatusTooManyRequests {
			hs := headersOf(t, w)
			require.Equal(t, `"per-key";q=4;w=60, "per-ip";q=3;w=60`, hs[httplimit.HeaderPolicy])
			// 3 this minute, 30 s in: one more fits 1 ms into the next minute
			require.Equal(t, keyItems[key]+`, "per-ip";r=0;t=31`, hs[httplimit.HeaderRateLimit])
			require.Equal(t, []string{"3", "0", "31", "31"}, []string{hs[httplimit.HeaderLimit], hs[httplimit.HeaderRemaining],
				hs[httplimit.HeaderReset], hs[httplimit.HeaderRetryAfter]}, "the binding limit: the address's")
		}
	}
	require.Equal(t, []int{200, 200, 200, 429, 429}, codes)
	require.Equal(t, 3, served)
	require.Equal(t, int64(2), e.count(t, httplimit.HashedKey("alpha"), ratelimit.Limit{Rate: 4, Window: time.Minute}))
	require.Equal(t, int64(1), e.count(t, httplimit.HashedKey("beta"), ratelimit.Limit{Rate: 4, Window: time.Minute}), "beta's denial was counted under neither")
	require.Equal(t, int64(3), e.count(t, "per-ip|ip:192.0.2.1", ratelimit.PerMinute(3)))

	// Another address with beta: its own address's count, beta's key count.
	w := serve(h, request("192.0.2.2:1234", "X-API-Key", "beta"))
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, `"per-key";r=2;t=31, "per-ip";r=2;t=31`, headersOf(t, w)[httplimit.HeaderRateLimit])
}

// A request with no identity of a WithLimitsPer's kind is decided without
// its limits, never under another identity; FromContextAll has the Results
// of the identities it had.
func TestLimitsPerIdentityAbsent(t *testing.T) {
	e := newEnv(t)
	type orgKey struct{}
	org := httplimit.UserID(orgKey{}) // "user:<id>" of the context's value: here an org
	var got [][]ratelimit.Result
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		all, ok := httplimit.FromContextAll(r.Context())
		require.True(t, ok)
		got = append(got, all)
	})
	mw, err := httplimit.New(e.limiter, ratelimit.PerMinute(10),
		httplimit.WithLimitsPer("per-org", org, ratelimit.PerMinute(5)),
		httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerHour(100)))
	require.NoError(t, err)
	h := mw(next)
	r := request("192.0.2.1:1234")
	serve(h, r)
	serve(h, r.WithContext(context.WithValue(r.Context(), orgKey{}, "acme")))
	require.Len(t, got, 2)
	names := func(rs []ratelimit.Result) (out []string) {
		for _, res := range rs {
			out = append(out, httplimit.PolicyName(res.Limit))
		}
		return out
	}
	require.Equal(t, []string{`"10-per-60s"`, `"per-ip"`}, names(got[0]), "no org: its limit left out")
	require.Equal(t, []string{`"10-per-60s"`, `"per-org"`, `"per-ip"`}, names(got[1]))
	require.Equal(t, int64(2), e.count(t, "ip:192.0.2.1", ratelimit.PerMinute(10)))
	require.Equal(t, int64(1), e.count(t, "per-org|user:acme", ratelimit.PerMinute(5)))
	require.Equal(t, int64(2), e.count(t, "per-ip|ip:192.0.2.1", ratelimit.PerHour(100)))
}

// WithCountIf gives back under every identity; Charge charges every one.
func TestLimitsPerCountIfAndCharge(t *testing.T) {
	e := newEnv(t)
	status := http.StatusOK
	charge := int64(0)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if charge > 0 {
			require.NoError(t, httplimit.Charge(r, charge))
		}
		w.WriteHeader(status)
	})
	known := func(k string) bool { return k == "alpha" }
	mw, err := httplimit.New(e.limiter, ratelimit.Limit{Name: "per-key", Rate: 100, Window: time.Minute},
		httplimit.WithKeys(httplimit.APIKey("", known)),
		httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(100)),
		httplimit.WithCountIf(func(_ *http.Request, s int) bool { return s < 500 }))
	require.NoError(t, err)
	h := mw(next)
	counts := func() []int64 {
		return []int64{e.count(t, httplimit.HashedKey("alpha"), ratelimit.PerMinute(100)), e.count(t, "per-ip|ip:192.0.2.1", ratelimit.PerMinute(100))}
	}
	r := request("192.0.2.1:1234", "X-API-Key", "alpha")
	serve(h, r)
	require.Equal(t, []int64{1, 1}, counts())
	status = http.StatusBadGateway
	serve(h, r)
	require.Equal(t, []int64{1, 1}, counts(), "a 502 is given back under both")
	status, charge = http.StatusOK, 5
	serve(h, r)
	require.Equal(t, []int64{7, 7}, counts(), "1 and the charge of 5, under both")
}

// What New refuses of WithLimitsPer, naming it.
func TestLimitsPerConfigurationErrors(t *testing.T) {
	e := newEnv(t)
	for says, opts := range map[string][]httplimit.Option{
		"the identity has no name": {httplimit.WithLimitsPer("", httplimit.ClientAddress, ratelimit.PerMinute(1))},
		"the KeyFunc is nil":       {httplimit.WithLimitsPer("per-ip", nil, ratelimit.PerMinute(1))},
		`WithLimitsPer("per-ip") given twice`: {httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(1)),
			httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerHour(1))},
		"no limits":             {httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress)},
		"would share one count": {httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(1), ratelimit.PerMinute(2))},
		`two limits are named "per-ip"`: {httplimit.WithLimits(ratelimit.Limit{Name: "per-ip", Rate: 1, Window: time.Hour}),
			httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(1))},
	} {
		_, err := httplimit.New(e.limiter, ratelimit.PerSecond(10), opts...)
		require.ErrorContains(t, err, says)
	}
}

// Two identities against two stacked middlewares, on one interleaved run
// of two addresses and two keys: WithLimitsPer makes one Redis call per
// request where the stack makes two, and counts no request that a limit
// denied, where the stack's outer middleware counts the requests its inner
// one then denies.
func TestLimitsPerAgainstStacked(t *testing.T) {
	known := func(k string) bool { return k == "alpha" || k == "beta" }
	perKey := ratelimit.Limit{Name: "per-key", Rate: 3, Window: time.Minute}
	perIP := ratelimit.Limit{Name: "per-ip", Rate: 4, Window: time.Minute}
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

	stacked := newEnv(t)
	outer, err := httplimit.New(stacked.limiter, perIP) // by address
	require.NoError(t, err)
	inner, err := httplimit.New(stacked.limiter, perKey, httplimit.WithKeys(httplimit.APIKey("", known)))
	require.NoError(t, err)
	one := newEnv(t)
	both, err := httplimit.New(one.limiter, perKey, httplimit.WithKeys(httplimit.APIKey("", known)),
		httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, perIP))
	require.NoError(t, err)

	run := func(h http.Handler) (served map[string]int) {
		served = map[string]int{}
		for i := range 24 {
			addr, key := []string{"192.0.2.1", "192.0.2.2"}[i%2], []string{"alpha", "beta"}[i/2%2]
			if serve(h, request(addr+":1234", "X-API-Key", key)).Code == http.StatusOK {
				served[addr]++
				served[key]++
			}
		}
		return served
	}
	before := [2]int{stacked.mr.CommandCount(), one.mr.CommandCount()}
	servedStacked, servedOne := run(outer(inner(ok))), run(both(ok))
	calls := [2]int{stacked.mr.CommandCount() - before[0], one.mr.CommandCount() - before[1]}
	t.Logf("Redis commands: stacked %d, one decision %d; served stacked %v, one decision %v", calls[0], calls[1], servedStacked, servedOne)
	require.Less(t, calls[1], calls[0])
	var outerCounted, outerServed int64
	for _, addr := range []string{"192.0.2.1", "192.0.2.2"} {
		require.Equal(t, int64(servedOne[addr]), one.count(t, "per-ip|ip:"+addr, perIP), "one decision: the address counts what was served")
		outerCounted += stacked.count(t, "ip:"+addr, perIP)
		outerServed += int64(servedStacked[addr])
	}
	require.Greater(t, outerCounted, outerServed, "stacked: the outer counts what the inner denied")
	for _, key := range []string{"alpha", "beta"} {
		require.Equal(t, int64(servedOne[key]), one.count(t, httplimit.HashedKey(key), perKey))
	}
}

// An identity's unnamed limits are named after it: "per-ip", or with
// several "per-ip-3-per-60s", as grpclimit names them.
func TestLimitsPerNames(t *testing.T) {
	e := newEnv(t)
	served := 0
	h := e.handler(&served, ratelimit.PerSecond(10),
		httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(3), ratelimit.PerHour(50)))
	w := serve(h, request("192.0.2.1:1234"))
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, `"10-per-1s";q=10;w=1, "per-ip-3-per-60s";q=3;w=60, "per-ip-50-per-3600s";q=50;w=3600`, headersOf(t, w)[httplimit.HeaderPolicy])
}

// What the review of WithLimitsPer found: a cost below 1 is an error (500)
// as with one identity, never a free look; more than 16 limits in all, or
// options that need a rate plan beside WithConcurrency alone, are refused
// by New.
func TestLimitsPerReviewed(t *testing.T) {
	e := newEnv(t)
	served := 0
	zero := httplimit.WithCost(func(*http.Request) int64 { return 0 })
	h := e.handler(&served, ratelimit.PerMinute(1), zero, httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(1)))
	for range 3 {
		require.Equal(t, http.StatusInternalServerError, serve(h, request("192.0.2.1:1234")).Code)
	}
	require.Zero(t, served)

	var nine []ratelimit.Limit
	for i := range 9 {
		nine = append(nine, ratelimit.Limit{Rate: 10, Window: time.Duration(i+1) * time.Second})
	}
	_, err := httplimit.New(e.limiter, nine[0], httplimit.WithLimits(nine[1:]...), httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, nine...))
	require.ErrorContains(t, err, "18 limits in all, more than 16")

	slots := httplimit.WithConcurrency(ratelimit.Concurrency{Max: 1, Lease: time.Minute})
	_, err = httplimit.New(e.limiter, ratelimit.Limit{}, slots, zero)
	require.ErrorContains(t, err, "WithCost with WithConcurrency alone")
}

// With WithRoute, a further identity's ids never meet the plan's ids of a
// route named as the identity is: a route "per-ip" counts its plan under
// "per-ip|<address>" (and its per-ip identity under
// "per-ip|per-ip|<address>"), and the per-ip identity of a request of no
// route under "|per-ip|<address>". Before, that identity counted under
// "per-ip|<address>" too: three requests to /a used up the per-ip limit of
// requests to /b, whose first request was a 429.
func TestLimitsPerRouteNamedAsIdentity(t *testing.T) {
	e := newEnv(t)
	served := 0
	route := httplimit.WithRoute(func(r *http.Request) string {
		if r.URL.Path == "/a" {
			return "per-ip"
		}
		return ""
	})
	plan := ratelimit.Limit{Name: "plan", Rate: 100, Window: time.Minute}
	h := e.handler(&served, plan, route, httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(3)))
	get := func(path string) int {
		r := request("192.0.2.7:1234")
		r.URL.Path = path
		return serve(h, r).Code
	}
	for range 3 {
		require.Equal(t, http.StatusOK, get("/a"))
	}
	require.Equal(t, http.StatusOK, get("/b"), "the first request to /b")
	require.Equal(t, int64(3), e.count(t, "per-ip|ip:192.0.2.7", plan), "route per-ip's plan")
	require.Equal(t, int64(3), e.count(t, "per-ip|per-ip|ip:192.0.2.7", ratelimit.PerMinute(3)), "route per-ip's per-ip identity")
	require.Equal(t, int64(1), e.count(t, "|per-ip|ip:192.0.2.7", ratelimit.PerMinute(3)), "no route's per-ip identity")
}

// A Leased limit of a further identity is decided from its lease, not in
// Redis on every request: WithLimitsPer once turned leasing off.
func TestLimitsPerLeased(t *testing.T) {
	e := newEnv(t)
	served := 0
	perIP := ratelimit.PerMinute(1000)
	perIP.Leased = true
	h := e.handler(&served, ratelimit.PerMinute(100), httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, perIP))
	for range 20 {
		require.Equal(t, http.StatusOK, serve(h, request("192.0.2.1:1234")).Code)
	}
	require.Equal(t, 20, served)
	require.Positive(t, e.limiter.Stats().Leases, "the per-ip limit holds a lease")
	held := e.limiter.Stats().LeasedUnits
	require.Positive(t, held)
	require.Equal(t, 20+held, e.count(t, "per-ip|ip:192.0.2.1", ratelimit.PerMinute(1000)), "Redis counted what was admitted and what the lease holds")
}
