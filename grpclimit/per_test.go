package grpclimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
)

// apiKey counts a call by its x-api-key metadata, "" without one.
func apiKey(ctx context.Context, _ string) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-api-key"); len(v) > 0 && v[0] != "" {
		return "key:" + v[0]
	}
	return ""
}

// The twin of httplimit's TestLimitsPerKeyAndIP: each API key 4 a minute
// and each client address 3, decided at once; a call the address's limit
// denies is counted under neither, and the metadata lists both policies.
func TestLimitsPerKeyAndIP(t *testing.T) {
	perKey := ratelimit.Limit{Name: "per-key", Rate: 4, Window: time.Minute}
	e := newEnv(t, perKey, []grpclimit.Option{
		grpclimit.WithKeys(apiKey),
		grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, ratelimit.PerMinute(3)),
	})
	conn := e.dial(client)
	var got []codes.Code
	for _, key := range []string{"alpha", "alpha", "beta", "beta", "alpha"} {
		o := call(t, conn, "A", "x-api-key", key)
		got = append(got, o.code)
		if o.code == codes.ResourceExhausted {
			md := rateHeaders(o.header)
			require.Equal(t, []string{`"per-key";q=4;w=60`, `"per-ip";q=3;w=60`}, md.Get(grpclimit.HeaderPolicy))
			require.Equal(t, "3", md.Get(grpclimit.HeaderLimit)[0], "the binding limit: the address's")
			require.Equal(t, `"per-ip";r=0;t=61`, md.Get(grpclimit.HeaderRateLimit)[1])
		}
	}
	require.Equal(t, []codes.Code{codes.OK, codes.OK, codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}, got)
	ctx := context.Background()
	count := func(id string, limit ratelimit.Limit) int64 {
		res, err := e.limiter.Peek(ctx, id, limit)
		require.NoError(t, err)
		return res.Count
	}
	require.Equal(t, int64(2), count("key:alpha", perKey))
	require.Equal(t, int64(1), count("key:beta", perKey), "beta's denial was counted under neither")
	require.Equal(t, int64(3), count("per-ip|ip:203.0.113.7", ratelimit.PerMinute(3)), "httplimit's id for the address")
}

// An identity's unnamed limits are named after it, as httplimit names
// them: "per-ip", or with several "per-ip-3-per-60s".
func TestLimitsPerNames(t *testing.T) {
	e := newEnv(t, ratelimit.PerSecond(10), []grpclimit.Option{
		grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, ratelimit.PerMinute(3), ratelimit.PerHour(50)),
	})
	o := call(t, e.dial(client), "A")
	require.Equal(t, codes.OK, o.code)
	require.Equal(t, []string{`"10-per-1s";q=10;w=1`, `"per-ip-3-per-60s";q=3;w=60`, `"per-ip-50-per-3600s";q=50;w=3600`},
		rateHeaders(o.header).Get(grpclimit.HeaderPolicy))
}

// What NewUnary refuses of WithLimitsPer, naming it, as httplimit does.
func TestLimitsPerConfigurationErrors(t *testing.T) {
	l := ratelimit.New(nil)
	for says, opts := range map[string][]grpclimit.Option{
		"the identity has no name": {grpclimit.WithLimitsPer("", grpclimit.ClientAddress, ratelimit.PerMinute(1))},
		"the KeyFunc is nil":       {grpclimit.WithLimitsPer("per-ip", nil, ratelimit.PerMinute(1))},
		"holds '|'":                {grpclimit.WithLimitsPer("per|ip", grpclimit.ClientAddress, ratelimit.PerMinute(1))},
		`WithLimitsPer("per-ip") given twice`: {grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, ratelimit.PerMinute(1)),
			grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, ratelimit.PerHour(1))},
		"would share one count": {grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, ratelimit.PerMinute(1), ratelimit.PerMinute(2))},
		`two limits are named "per-ip"`: {grpclimit.WithLimits(ratelimit.Limit{Name: "per-ip", Rate: 1, Window: time.Hour}),
			grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, ratelimit.PerMinute(1))},
	} {
		_, err := grpclimit.NewUnary(l, ratelimit.PerSecond(10), opts...)
		require.ErrorContains(t, err, says)
	}
}

// The twin of httplimit's TestLimitsPerReviewed.
func TestLimitsPerReviewed(t *testing.T) {
	zero := grpclimit.WithCost(func(context.Context, string) int64 { return 0 })
	e := newEnv(t, ratelimit.PerMinute(1), []grpclimit.Option{zero, grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, ratelimit.PerMinute(1))})
	require.Equal(t, []codes.Code{codes.Internal, codes.Internal, codes.Internal}, callCodes(t, e.dial(client), "A", 3))

	l := ratelimit.New(nil)
	var nine []ratelimit.Limit
	for i := range 9 {
		nine = append(nine, ratelimit.Limit{Rate: 10, Window: time.Duration(i+1) * time.Second})
	}
	_, err := grpclimit.NewUnary(l, nine[0], grpclimit.WithLimits(nine[1:]...), grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, nine...))
	require.ErrorContains(t, err, "18 limits in all, more than 16")
	_, err = grpclimit.NewUnary(l, ratelimit.Limit{}, grpclimit.WithConcurrency(ratelimit.Concurrency{Max: 1, Lease: time.Minute}), zero)
	require.ErrorContains(t, err, "WithCost with WithConcurrency alone")
}

// The twin of httplimit's TestLimitsPerRouteNamedAsIdentity: with
// WithMethodLimits, a further identity's ids carry the method for a method
// counted apart, "<method>|per-ip|<address>", and "|" for the others,
// "|per-ip|<address>", so that none is the id of a method's own calls,
// "<method>|<identity>", whatever the identity is named.
func TestLimitsPerWithMethodLimits(t *testing.T) {
	perIP := ratelimit.PerMinute(3)
	e := newEnv(t, ratelimit.PerMinute(100), []grpclimit.Option{
		grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{"/test.Echo/A": {ratelimit.PerMinute(50)}}),
		grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, perIP),
	})
	conn := e.dial(client)
	require.Equal(t, codes.OK, call(t, conn, "A").code)
	require.Equal(t, codes.OK, call(t, conn, "B").code)
	require.Equal(t, codes.OK, call(t, conn, "B").code)
	count := func(id string) int64 {
		res, err := e.limiter.Peek(context.Background(), id, perIP)
		require.NoError(t, err)
		return res.Count
	}
	require.Equal(t, int64(1), count("/test.Echo/A|per-ip|ip:203.0.113.7"), "the method counted apart")
	require.Equal(t, int64(2), count("|per-ip|ip:203.0.113.7"), "the others")
	require.Zero(t, count("per-ip|ip:203.0.113.7"), "no id without the method's place")
}

// The twin of httplimit's TestLimitsPerLeased: a Leased limit of a further
// identity is decided from its lease.
func TestLimitsPerLeased(t *testing.T) {
	perIP := ratelimit.PerMinute(1000)
	perIP.Leased = true
	e := newEnv(t, ratelimit.PerMinute(100), []grpclimit.Option{grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, perIP)})
	conn := e.dial(client)
	for range 20 {
		require.Equal(t, codes.OK, call(t, conn, "A").code)
	}
	st := e.limiter.Stats()
	require.Positive(t, st.Leases, "the per-ip limit holds a lease")
	res, err := e.limiter.Peek(context.Background(), "per-ip|ip:203.0.113.7", ratelimit.PerMinute(1000))
	require.NoError(t, err)
	require.Equal(t, 20+st.LeasedUnits, res.Count, "Redis counted what was admitted and what the lease holds")
}
