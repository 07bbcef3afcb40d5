package otel_test

import (
	"context"
	"errors"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/slidingwindow/ratelimit"
	ratelimitotel "github.com/slidingwindow/ratelimit/otel"
)

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// env is a Limiter on miniredis, at a clock that stands still, observed
// into a ManualReader.
type env struct {
	mr      *miniredis.Miniredis
	client  *redis.Client
	clk     *fakeClock
	reader  *sdkmetric.ManualReader
	obs     *ratelimitotel.Observer
	limiter *ratelimit.Limiter
}

func newEnv(t *testing.T, opts ...ratelimit.Option) *env {
	t.Helper()
	mr := miniredis.RunT(t)
	return newEnvOn(t, mr, redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1}), opts...)
}

func newEnvOn(t *testing.T, mr *miniredis.Miniredis, client *redis.Client, opts ...ratelimit.Option) *env {
	t.Helper()
	t.Cleanup(func() { _ = client.Close() })
	e := &env{mr: mr, client: client, clk: newFakeClock(epoch), reader: sdkmetric.NewManualReader()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	var err error
	e.obs, err = ratelimitotel.NewObserver(mp)
	require.NoError(t, err)
	opts = append([]ratelimit.Option{
		ratelimit.WithClock(e.clk.Now),
		ratelimit.WithObserver(e.obs),
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}),
	}, opts...)
	e.limiter = ratelimit.New(client, opts...)
	t.Cleanup(func() { // before the client closes: leases go back, the sweeper ends
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.limiter.Close(ctx)
	})
	return e
}

func (e *env) allow(t *testing.T, limit ratelimit.Limit, times int) (allowed int) {
	t.Helper()
	for range times {
		res, err := e.limiter.Allow(context.Background(), "client", limit)
		require.NoError(t, err)
		if res.Allowed {
			allowed++
		}
	}
	return allowed
}

// metrics is one collection, each data point keyed by its attributes as
// "outcome=denied,policy=api,shadow=false,source=redis" (without the
// "ratelimit." of the keys).
type metrics struct {
	sums       map[string]map[string]int64
	gauges     map[string]map[string]int64
	histCounts map[string]map[string]uint64
	histSums   map[string]map[string]float64
}

func collect(t testing.TB, r *sdkmetric.ManualReader) metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	m := metrics{
		sums: map[string]map[string]int64{}, gauges: map[string]map[string]int64{},
		histCounts: map[string]map[string]uint64{}, histSums: map[string]map[string]float64{},
	}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, ratelimitotel.ScopeName, sm.Scope.Name)
		for _, md := range sm.Metrics {
			switch data := md.Data.(type) {
			case metricdata.Sum[int64]:
				require.True(t, data.IsMonotonic, md.Name)
				m.sums[md.Name] = map[string]int64{}
				for _, dp := range data.DataPoints {
					m.sums[md.Name][key(dp.Attributes)] = dp.Value
				}
			case metricdata.Gauge[int64]:
				m.gauges[md.Name] = map[string]int64{}
				for _, dp := range data.DataPoints {
					m.gauges[md.Name][key(dp.Attributes)] = dp.Value
				}
			case metricdata.Histogram[float64]:
				require.Equal(t, "s", md.Unit)
				m.histCounts[md.Name] = map[string]uint64{}
				m.histSums[md.Name] = map[string]float64{}
				for _, dp := range data.DataPoints {
					m.histCounts[md.Name][key(dp.Attributes)] = dp.Count
					m.histSums[md.Name][key(dp.Attributes)] = dp.Sum
				}
			default:
				t.Fatalf("%s: unexpected data %T", md.Name, md.Data)
			}
		}
	}
	return m
}

func key(set attribute.Set) string {
	return strings.ReplaceAll(set.Encoded(attribute.DefaultEncoder()), "ratelimit.", "")
}

func (m metrics) decisions() map[string]int64 { return m.sums[ratelimitotel.DecisionsName] }
func (m metrics) nearLimit() map[string]int64 { return m.sums[ratelimitotel.NearLimitName] }
func (m metrics) redisCalls() map[string]uint64 {
	return m.histCounts[ratelimitotel.RedisDurationName]
}

// Redis decides: allowed and denied under the limit's name, a duration per
// call, and near_limit for the admitted request that reached 80% of the
// rate.
func TestAllowedAndDenied(t *testing.T) {
	e := newEnv(t)
	limit := ratelimit.PerSecond(3)
	limit.Name = "api"
	require.Equal(t, 3, e.allow(t, limit, 5))

	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{
		"outcome=allowed,policy=api,shadow=false,source=redis": 3,
		"outcome=denied,policy=api,shadow=false,source=redis":  2,
	}, m.decisions())
	require.Equal(t, map[string]uint64{"": 5}, m.redisCalls())
	require.Greater(t, m.histSums[ratelimitotel.RedisDurationName][""], 0.0)
	// Counts 1, 2, 3 of 3: only 3 is at or above 2.4.
	require.Equal(t, map[string]int64{"policy=api": 1}, m.nearLimit())
}

// A limit with no Name has no policy attribute.
func TestUnnamedLimit(t *testing.T) {
	e := newEnv(t)
	e.allow(t, ratelimit.PerSecond(1), 2)
	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{
		"outcome=allowed,shadow=false,source=redis": 1,
		"outcome=denied,shadow=false,source=redis":  1,
	}, m.decisions())
	require.Equal(t, map[string]int64{"": 1}, m.nearLimit())
}

// The deny cache's denials are source=cache, with no Redis call.
func TestDenyCache(t *testing.T) {
	e := newEnv(t, ratelimit.WithDenyCache(100))
	_, err := e.obs.ObserveLimiter(e.limiter)
	require.NoError(t, err)
	limit := ratelimit.PerSecond(2)
	limit.Name = "api"
	require.Equal(t, 2, e.allow(t, limit, 5))

	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{
		"outcome=allowed,policy=api,shadow=false,source=redis": 2,
		"outcome=denied,policy=api,shadow=false,source=redis":  1,
		"outcome=denied,policy=api,shadow=false,source=cache":  2,
	}, m.decisions())
	require.Equal(t, map[string]uint64{"": 3}, m.redisCalls())
	require.Equal(t, map[string]int64{"": 1}, m.gauges[ratelimitotel.DenyCacheEntriesName])
	require.Equal(t, map[string]int64{"": 0}, m.gauges[ratelimitotel.BreakerOpenName])
}

// With Redis gone, the failure policy decides (source=policy) and each call
// is recorded with error.type=unavailable, until the breaker opens: then no
// call is made, and none is recorded.
func TestRedisDown(t *testing.T) {
	for _, tc := range []struct {
		policy  ratelimit.FailurePolicy
		outcome string
	}{
		{ratelimit.FailOpen, "allowed"},
		{ratelimit.FailClosed, "denied"},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			e := newEnv(t, ratelimit.WithFailurePolicy(tc.policy), ratelimit.WithCircuitBreaker(5, time.Hour))
			_, err := e.obs.ObserveLimiter(e.limiter)
			require.NoError(t, err)
			e.mr.Close()
			limit := ratelimit.PerSecond(10)
			limit.Name = "api"
			for range 8 {
				res, _ := e.limiter.Allow(context.Background(), "client", limit)
				require.True(t, res.Degraded)
			}

			m := collect(t, e.reader)
			require.Equal(t, map[string]int64{
				"outcome=" + tc.outcome + ",policy=api,shadow=false,source=policy": 8,
			}, m.decisions())
			require.Equal(t, map[string]uint64{"error.type=unavailable": 5}, m.redisCalls())
			require.Empty(t, m.nearLimit(), "a degraded Result says nothing of usage")
			require.Equal(t, map[string]int64{"": 1}, m.gauges[ratelimitotel.BreakerOpenName])
		})
	}
}

// A Redis that never answers is a timeout.
func TestTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	client := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	e := newEnvOn(t, nil, client, ratelimit.WithTimeout(20*time.Millisecond))
	res, err := e.limiter.Allow(context.Background(), "client", ratelimit.PerSecond(10))
	require.NoError(t, err)
	require.True(t, res.Degraded)

	m := collect(t, e.reader)
	require.Equal(t, map[string]uint64{"error.type=timeout": 1}, m.redisCalls())
	require.GreaterOrEqual(t, m.histSums[ratelimitotel.RedisDurationName]["error.type=timeout"], 0.020)
}

// Replies the script never gives, and errors Redis sends, each get their
// error.type.
func TestErrorReplies(t *testing.T) {
	for _, tc := range []struct {
		reply, want string
	}{
		{"+OK\r\n", "bad_reply"},
		{"*1\r\n:1\r\n", "bad_reply"},
		{"-BUSY Redis is busy running a script\r\n", "unavailable"},
		{"-LOADING Redis is loading the dataset in memory\r\n", "unavailable"},
		{"-ERR something else\r\n", "other"},
	} {
		t.Run(tc.want+"/"+strings.TrimSpace(tc.reply), func(t *testing.T) {
			addr := fakeRedis(t, map[string]string{"evalsha": tc.reply, "eval": tc.reply})
			e := newEnvOn(t, nil, redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1}))
			e.allow(t, ratelimit.PerSecond(10), 1)
			require.Equal(t, map[string]uint64{"error.type=" + tc.want: 1}, collect(t, e.reader).redisCalls())
		})
	}
}

// In shadow mode the caller is allowed, and the metrics say what would have
// happened: denied, with shadow=true.
func TestShadowMode(t *testing.T) {
	e := newEnv(t, ratelimit.WithShadow(true))
	limit := ratelimit.PerSecond(2)
	limit.Name = "api"
	require.Equal(t, 4, e.allow(t, limit, 4))

	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{
		"outcome=allowed,policy=api,shadow=true,source=redis": 2,
		"outcome=denied,policy=api,shadow=true,source=redis":  2,
	}, m.decisions())
	require.Equal(t, map[string]int64{"policy=api": 1}, m.nearLimit(), "a request shadow mode let through is over, not near")
}

// A Shadow limit among enforced ones: its would-be denials are the
// decision's outcome, under its name; an allowed decision is the enforced
// limit's, which decided it (ratelimit.Binding passes over Shadow limits).
func TestShadowLimit(t *testing.T) {
	e := newEnv(t)
	burst := ratelimit.PerSecond(10)
	burst.Name = "burst"
	trial := ratelimit.PerMinute(3)
	trial.Name, trial.Shadow = "trial", true
	for range 5 {
		results, err := e.limiter.AllowAll(context.Background(), "client", []ratelimit.Limit{burst, trial}, 1)
		require.NoError(t, err)
		require.True(t, results[0].Allowed)
	}

	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{
		"outcome=allowed,policy=burst,shadow=true,source=redis": 3,
		"outcome=denied,policy=trial,shadow=true,source=redis":  2,
	}, m.decisions())
	require.Equal(t, map[string]int64{"policy=trial": 1}, m.nearLimit())
	require.Equal(t, map[string]uint64{"": 5}, m.redisCalls(), "one call per decision, the shadow limit's request with it")
}

// An enforced limit that denies names the decision, even when a Shadow
// limit would have denied it too: the enforced one decided.
func TestShadowLimitBesideADenial(t *testing.T) {
	e := newEnv(t)
	burst := ratelimit.PerSecond(2)
	burst.Name = "burst"
	trial := ratelimit.PerMinute(2)
	trial.Name, trial.Shadow = "trial", true
	for i := range 3 {
		results, err := e.limiter.AllowAll(context.Background(), "client", []ratelimit.Limit{burst, trial}, 1)
		require.NoError(t, err)
		require.Equal(t, i < 2, results[0].Allowed)
		require.Equal(t, i == 2, results[1].Shadowed)
	}
	require.Equal(t, map[string]int64{
		"outcome=allowed,policy=burst,shadow=true,source=redis": 2,
		"outcome=denied,policy=burst,shadow=true,source=redis":  1,
	}, collect(t, e.reader).decisions())
}

// Under ratelimit.WithShadow the decision is named by ratelimit.Binding's
// Result: every Result reads Allowed, and the least remaining is a limit
// that would have denied.
func TestShadowModeSeveralLimits(t *testing.T) {
	e := newEnv(t, ratelimit.WithShadow(true))
	minute := ratelimit.PerMinute(100)
	minute.Name = "minute"
	second := ratelimit.PerSecond(2)
	second.Name = "second"
	for range 3 {
		results, err := e.limiter.AllowAll(context.Background(), "client", []ratelimit.Limit{minute, second}, 1)
		require.NoError(t, err)
		require.Equal(t, ratelimit.Binding(results).Shadowed, results[1].Shadowed)
	}
	require.Equal(t, map[string]int64{
		"outcome=allowed,policy=second,shadow=true,source=redis": 2,
		"outcome=denied,policy=second,shadow=true,source=redis":  1,
	}, collect(t, e.reader).decisions())
}

// Of several limits, the one that decided names the decision: the
// tightest while allowed, the one that denied after.
func TestSeveralLimits(t *testing.T) {
	e := newEnv(t)
	second := ratelimit.PerSecond(2)
	second.Name = "second"
	minute := ratelimit.PerMinute(100)
	minute.Name = "minute"
	for range 3 {
		_, err := e.limiter.AllowAll(context.Background(), "client", []ratelimit.Limit{minute, second}, 1)
		require.NoError(t, err)
	}
	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{
		"outcome=allowed,policy=second,shadow=false,source=redis": 2,
		"outcome=denied,policy=second,shadow=false,source=redis":  1,
	}, m.decisions())
	require.Equal(t, map[string]int64{"policy=second": 1}, m.nearLimit())
}

// Each Result near its limit counts under its own name, whichever decided.
func TestNearLimitPerResult(t *testing.T) {
	e := newEnv(t)
	minute := ratelimit.PerMinute(2)
	minute.Name = "minute"
	second := ratelimit.PerSecond(2)
	second.Name = "second"
	for range 2 {
		_, err := e.limiter.AllowAll(context.Background(), "client", []ratelimit.Limit{minute, second}, 1)
		require.NoError(t, err)
	}
	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{"outcome=allowed,policy=minute,shadow=false,source=redis": 2}, m.decisions(), "a tie goes to the first")
	require.Equal(t, map[string]int64{"policy=minute": 1, "policy=second": 1}, m.nearLimit())
}

// A look is a decision, with what a request would get, but counts nothing
// and so is never near the limit.
func TestPeek(t *testing.T) {
	e := newEnv(t)
	limit := ratelimit.PerSecond(1)
	limit.Name = "api"
	e.allow(t, limit, 1)
	_, err := e.limiter.Peek(context.Background(), "client", limit)
	require.NoError(t, err)
	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{
		"outcome=allowed,policy=api,shadow=false,source=redis": 1,
		"outcome=denied,policy=api,shadow=false,source=redis":  1,
	}, m.decisions())
	require.Equal(t, map[string]int64{"policy=api": 1}, m.nearLimit())
	require.Equal(t, map[string]uint64{"": 2}, m.redisCalls())
}

// A Charge and a Refund are no decisions: only their Redis calls are
// recorded.
func TestChargeAndRefund(t *testing.T) {
	e := newEnv(t)
	limit := ratelimit.PerSecond(1)
	limit.Name = "api"
	ctx := context.Background()
	r, err := e.limiter.Allow(ctx, "client", limit)
	require.NoError(t, err)
	_, err = e.limiter.Charge(ctx, "client", []ratelimit.Limit{limit}, 5) // pushes it over
	require.NoError(t, err)
	require.NoError(t, e.limiter.Refund(ctx, "client", []ratelimit.Result{r}, 1))
	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{"outcome=allowed,policy=api,shadow=false,source=redis": 1}, m.decisions())
	require.Equal(t, map[string]int64{"policy=api": 1}, m.nearLimit())
	require.Equal(t, map[string]uint64{"": 3}, m.redisCalls())
}

// A decision from a lease is counted under source=lease.
func TestLeaseSource(t *testing.T) {
	e := newEnv(t)
	limit := ratelimit.Limit{Rate: 100, Window: time.Minute, Name: "api", Leased: true}
	require.Equal(t, 4, e.allow(t, limit, 4))
	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{
		"outcome=allowed,policy=api,shadow=false,source=redis": 3, // leases of 1, 1 and 2
		"outcome=allowed,policy=api,shadow=false,source=lease": 1,
	}, m.decisions())
}

// The near-limit fraction is the Observer's option; counts move with the
// clock, which the test moves by hand.
func TestNearLimitFraction(t *testing.T) {
	mr := miniredis.RunT(t)
	reader := sdkmetric.NewManualReader()
	obs, err := ratelimitotel.NewObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), ratelimitotel.WithNearLimit(0.5))
	require.NoError(t, err)
	clk := newFakeClock(epoch)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	l := ratelimit.New(client, ratelimit.WithClock(clk.Now), ratelimit.WithObserver(obs))
	limit := ratelimit.PerSecond(4)
	limit.Name = "api"
	allow := func(n int64) {
		t.Helper()
		_, err := l.AllowN(context.Background(), "client", limit, n)
		require.NoError(t, err)
	}
	allow(1) // 1
	allow(1) // 2: near
	allow(2) // 4: near
	clk.Add(2 * time.Second)
	allow(1) // 1 in a fresh window
	require.Equal(t, map[string]int64{"policy=api": 2}, collect(t, reader).nearLimit())
}

func TestInvalidNearLimit(t *testing.T) {
	mp := sdkmetric.NewMeterProvider()
	for _, f := range []float64{0, -0.1, 1.01, math.NaN(), math.Inf(1)} {
		_, err := ratelimitotel.NewObserver(mp, ratelimitotel.WithNearLimit(f))
		require.Error(t, err, "%v", f)
	}
	_, err := ratelimitotel.NewObserver(mp, ratelimitotel.WithNearLimit(1))
	require.NoError(t, err)
}

// Two Limiters observed apart by their attributes; a Registration
// unregistered stops reporting.
func TestGauges(t *testing.T) {
	e := newEnv(t, ratelimit.WithDenyCache(1000))
	other := ratelimit.New(e.client, ratelimit.WithPrefix("other"), ratelimit.WithObserver(e.obs))
	_, err := e.obs.ObserveLimiter(e.limiter, attribute.String("ratelimit.limiter", "api"))
	require.NoError(t, err)
	reg, err := e.obs.ObserveLimiter(other, attribute.String("ratelimit.limiter", "other"))
	require.NoError(t, err)
	for _, id := range []string{"a", "b", "c"} {
		for range 2 {
			_, err := e.limiter.Allow(context.Background(), id, ratelimit.PerSecond(1))
			require.NoError(t, err)
		}
	}
	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{"limiter=api": 3, "limiter=other": 0}, m.gauges[ratelimitotel.DenyCacheEntriesName])
	require.Equal(t, map[string]int64{"limiter=api": 0, "limiter=other": 0}, m.gauges[ratelimitotel.BreakerOpenName])

	require.NoError(t, reg.Unregister())
	m = collect(t, e.reader)
	require.Equal(t, map[string]int64{"limiter=api": 3}, m.gauges[ratelimitotel.DenyCacheEntriesName])

	_, err = e.obs.ObserveLimiter(nil)
	require.Error(t, err)
}

// Names past the first 1000 share OverflowPolicy; names seen before keep
// theirs. Observers run on many goroutines at once.
func TestPolicyOverflow(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := ratelimitotel.NewObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	require.NoError(t, err)
	observe := func(name string) {
		limit := ratelimit.PerSecond(10)
		limit.Name = name
		obs.Observe(context.Background(), &ratelimit.Event{
			Cost: 1, Allowed: true, Duration: time.Millisecond,
			Results: []ratelimit.Result{{Allowed: true, Count: 1, Remaining: 9, Limit: limit}},
		})
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range ratelimitotel.MaxPolicies + 10 {
				observe("p" + strconv.Itoa((i+g)%(ratelimitotel.MaxPolicies+10)))
			}
		})
	}
	wg.Wait()
	decisions := collect(t, reader).decisions()
	require.Len(t, decisions, ratelimitotel.MaxPolicies+1)
	require.Equal(t, int64(10*8), decisions["outcome=allowed,policy="+ratelimitotel.OverflowPolicy+",shadow=false,source=redis"])
	var total int64
	for _, n := range decisions {
		total += n
	}
	require.Equal(t, int64(8*(ratelimitotel.MaxPolicies+10)), total)
}

// An Event with no Results (which the core never sends) records nothing.
func TestNoResults(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := ratelimitotel.NewObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	require.NoError(t, err)
	obs.Observe(context.Background(), &ratelimit.Event{Duration: time.Millisecond, Err: errors.New("x")})
	require.Empty(t, collect(t, reader).decisions())
}

// An Acquire is counted in ratelimit.acquisitions by outcome, source and
// the Concurrency's name, and is no decision.
func TestAcquisitions(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := ratelimit.Concurrency{Max: 1, Lease: time.Minute, Name: "exports"}
	s, err := e.limiter.Acquire(ctx, "client", c)
	require.NoError(t, err)
	require.True(t, s.Acquired)
	_, err = e.limiter.Acquire(ctx, "client", c)
	require.NoError(t, err)
	m := collect(t, e.reader)
	require.Equal(t, map[string]int64{
		"outcome=acquired,policy=exports,source=redis": 1,
		"outcome=refused,policy=exports,source=redis":  1,
	}, m.sums[ratelimitotel.AcquisitionsName])
	require.Empty(t, m.decisions())
	require.Equal(t, map[string]uint64{"": 2}, m.redisCalls())
}
