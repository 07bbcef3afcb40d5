package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

// admit is one admitted request: when, and its cost.
type admit struct {
	at   int64 // Unix ms
	cost int64
}

// neverOver runs servers Limiters (as many servers) on e, each with
// goroutines goroutines deciding requests of one hot id against limit on
// e's clock, which moves in steps of 1 to 40 thousandths of its window between rounds of
// decisions (every decision of a round sees one time), for spanning
// windows of limit. It returns what was admitted, and how many of the
// decisions came from leases.
func neverOver(t *testing.T, e env, limit ratelimit.Limit, servers, goroutines, rounds int, seed uint64) ([]admit, int64) {
	t.Helper()
	var fromLease atomic.Int64
	obs := ratelimit.ObserverFunc(func(_ context.Context, ev *ratelimit.Event) {
		if ev.Source == ratelimit.SourceLease {
			fromLease.Add(1)
		}
	})
	limiters := make([]*ratelimit.Limiter, servers)
	for i := range limiters {
		limiters[i] = leasing(t, e, ratelimit.WithObserver(obs))
	}
	var (
		mu     sync.Mutex
		admits []admit
		errs   firstError
	)
	rng := rand.New(rand.NewPCG(seed, 1))
	ctx := context.Background()
	// Steps of 1 to 40 thousandths of the window: a real server expires
	// keys in real time, two windows after they were written, and a
	// window of a minute outlasts the run however slow the machine.
	step := limit.Window / 1000
	for range rounds {
		now := e.clock.Add(time.Duration(1+rng.IntN(40)) * step).UnixMilli()
		var wg sync.WaitGroup
		for s, l := range limiters {
			for g := range goroutines {
				r := rand.New(rand.NewPCG(seed, uint64(now)<<8|uint64(s)<<4|uint64(g)))
				wg.Go(func() {
					for range 1 + r.IntN(4) {
						cost := int64(1 + r.IntN(3))
						res, err := l.AllowN(ctx, "hot", limit, cost)
						if err != nil {
							errs.report(err)
							return
						}
						if res.Allowed {
							mu.Lock()
							admits = append(admits, admit{now, cost})
							mu.Unlock()
						}
					}
				})
			}
		}
		wg.Wait()
		require.NoError(t, errs.get())
	}
	slices.SortFunc(admits, func(a, b admit) int { return int(a.at - b.at) })
	return admits, fromLease.Load()
}

// overSliding returns the first admission at which what was admitted breaks
// the sliding rule of limit: the cost admitted in its window up to then,
// plus floor(the cost admitted in the window before × the ms left of this
// one / the window), above Rate.
func overSliding(adm []admit, limit ratelimit.Limit) error {
	w := limit.Window.Milliseconds()
	in := map[int64]int64{} // window index: cost admitted so far
	for i, a := range adm {
		idx := a.at / w
		in[idx] += a.cost
		if i+1 < len(adm) && adm[i+1].at == a.at {
			continue // the same moment: check once all of it is in
		}
		left := w - (a.at - idx*w)
		if got := in[idx] + in[idx-1]*left/w; got > limit.Rate {
			return fmt.Errorf("at %d ms (window %d, %d ms left): %d admitted in the window and %d in the one before weigh %d, above %d",
				a.at, idx, left, in[idx], in[idx-1], got, limit.Rate)
		}
	}
	return nil
}

// overStrict returns the first admission at which the cost admitted in the
// Window up to and including it is above Rate.
func overStrict(adm []admit, limit ratelimit.Limit) error {
	w := limit.Window.Milliseconds()
	var sum int64
	start := 0
	for i, a := range adm {
		sum += a.cost
		for adm[start].at <= a.at-w {
			sum -= adm[start].cost
			start++
		}
		if i+1 < len(adm) && adm[i+1].at == a.at {
			continue
		}
		if sum > limit.Rate {
			return fmt.Errorf("%d admitted in the %v up to %d ms, above %d", sum, limit.Window, a.at, limit.Rate)
		}
	}
	return nil
}

// runNeverOver checks that leased limits never admit more than the sliding
// (or strict) rule allows for what was admitted, over many windows, with
// several servers racing for one hot id; an unleased limit, which meets the
// rule by construction, checks the checker.
func runNeverOver(t *testing.T, mk newEnv) {
	for _, c := range []struct {
		name  string
		limit ratelimit.Limit
		opts  []ratelimit.Option
	}{
		{"Sliding", ratelimit.Limit{Rate: 600, Window: time.Minute, Leased: true}, nil},
		{"Strict", ratelimit.Limit{Rate: 600, Window: time.Minute, Strict: true, Leased: true}, nil},
		{"DenyCache", ratelimit.Limit{Rate: 600, Window: time.Minute, Leased: true}, []ratelimit.Option{ratelimit.WithDenyCache(100)}},
		{"SlidingUnleased", ratelimit.Limit{Rate: 600, Window: time.Minute}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := mk(t)
			e.opts = c.opts
			adm, fromLease := neverOver(t, e, c.limit, 4, 4, depth(t, 300), 7)
			var total int64
			for _, a := range adm {
				total += a.cost
			}
			t.Logf("%d admitted (%d units) over %d ms, %d decisions from leases", len(adm), total, adm[len(adm)-1].at-adm[0].at, fromLease)
			if c.limit.Strict {
				require.NoError(t, overStrict(adm, c.limit))
			} else {
				require.NoError(t, overSliding(adm, c.limit))
			}
			// Demand was far above the rate (about 16 × 2.5 × 2 units a round
			// of ~W/50), so the limit must have been filled, not merely
			// left alone: at least half the rate over each of the windows.
			windows := (adm[len(adm)-1].at - adm[0].at) / c.limit.Window.Milliseconds()
			require.Greater(t, total, windows*c.limit.Rate/2)
			if c.limit.Leased {
				require.Positive(t, fromLease, "no decision came from a lease")
			} else {
				require.Zero(t, fromLease)
			}
		})
	}
}

func TestLeaseNeverOverMiniredis(t *testing.T) {
	t.Parallel()
	runNeverOver(t, miniredisEnv)
}

func TestLeaseNeverOverRedisServer(t *testing.T) {
	t.Parallel()
	runNeverOver(t, serverEnv(t))
}

func TestLeaseNeverOverRedisCluster(t *testing.T) {
	t.Parallel()
	runNeverOver(t, clusterEnv(t))
}

// The checkers fail what breaks the rules.
func TestOverCheckers(t *testing.T) {
	limit := ratelimit.Limit{Rate: 10, Window: time.Second}
	// 10 at the end of window 0, then 5 at 0.5 s into window 1: 5 + 10/2 = 10.
	ok := []admit{{999, 10}, {1500, 5}}
	require.NoError(t, overSliding(ok, limit))
	require.ErrorContains(t, overSliding([]admit{{999, 10}, {1500, 6}}, limit), "above 10")
	require.Error(t, overStrict(ok, limit), "15 in the second up to 1500 ms")
	require.NoError(t, overStrict([]admit{{999, 10}, {1999, 10}}, limit))
}

// leasing returns e.limiter(opts...), whose leases the test's cleanup
// drops before e's client closes.
func leasing(t *testing.T, e env, opts ...ratelimit.Option) *ratelimit.Limiter {
	l := e.limiter(opts...)
	t.Cleanup(func() { ratelimit.DropLeases(l) })
	return l
}

// leasingByHand is leasing with no sweeper goroutine: the test sweeps with
// SweepLeases, so that nothing gives back behind its back between a step
// and what it reads of Redis.
func leasingByHand(t *testing.T, e env, opts ...ratelimit.Option) *ratelimit.Limiter {
	return leasing(t, e, append(opts, ratelimit.SweepByHand())...)
}

// hookedLimiter returns leasing's Limiter on e's client, hooked to count
// script calls.
func hookedLimiter(t *testing.T, e env, opts ...ratelimit.Option) (*ratelimit.Limiter, *scriptCalls) {
	var calls scriptCalls
	e.client = hookedClient(t, e.client, &calls)
	return leasing(t, e, opts...), &calls
}

// sources records the Source of each decision.
type sources struct {
	mu  sync.Mutex
	got []ratelimit.Source
}

func (s *sources) Observe(_ context.Context, e *ratelimit.Event) {
	s.mu.Lock()
	s.got = append(s.got, e.Source)
	s.mu.Unlock()
}

func (s *sources) take() []ratelimit.Source {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := s.got
	s.got = nil
	return got
}

func runLeaseSemantics(t *testing.T, mk newEnv) {
	ctx := context.Background()
	leased := ratelimit.Limit{Rate: 1000, Window: time.Minute, Leased: true}

	t.Run("ServesFromLease", func(t *testing.T) {
		e := mk(t)
		var src sources
		l, calls := hookedLimiter(t, e, ratelimit.WithObserver(&src))
		for range 200 {
			r, err := l.Allow(ctx, "hot", leased)
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
		got := src.take()
		require.Equal(t, ratelimit.SourceRedis, got[0], "the first decision takes a lease")
		require.Equal(t, ratelimit.SourceLease, got[len(got)-1], "then leases serve")
		// Leases double while they run out, up to Rate/20 = 50: 1, 2, 4, 8,
		// 16, 32, 50, 50, ... so 200 decisions take about 8 calls.
		require.Less(t, calls.n.Load(), int64(12))
		require.Equal(t, 200-int(calls.n.Load()), count(got, ratelimit.SourceLease))
		// Redis counted no less than was admitted, and no more than the
		// leases this process holds.
		n, err := e.client.Get(ctx, e.key("hot", time.Minute, e.windowIndex(time.Minute))).Int64()
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, int64(200))
		require.LessOrEqual(t, n, int64(200+50))
	})

	t.Run("ExactNearTheLimit", func(t *testing.T) {
		e := mk(t)
		l := leasing(t, e)
		limit := ratelimit.Limit{Rate: 50, Window: time.Minute, Leased: true}
		other := leasing(t, e)
		allowed := 0
		for i := range 120 {
			lim := l
			if i%2 == 1 {
				lim = other
			}
			r, err := lim.Allow(ctx, "hot", limit)
			require.NoError(t, err)
			if r.Allowed {
				allowed++
			}
		}
		// Two servers share 50; what one holds unused the other cannot
		// have, and it is given back only when the window ends.
		require.LessOrEqual(t, allowed, 50)
		require.GreaterOrEqual(t, allowed, 45, "leases near the limit are small")
	})

	t.Run("GivesBackAtWindowEnd", func(t *testing.T) {
		e := mk(t)
		l := leasingByHand(t, e)
		allowTimes(t, l, "hot", leased, 20)
		w := e.windowIndex(time.Minute)
		key := e.key("hot", time.Minute, w)
		held, err := e.client.Get(ctx, key).Int64()
		require.NoError(t, err)
		require.Greater(t, held, int64(20), "leases ahead of use")
		e.clock.Add(time.Minute)
		_, err = l.Allow(ctx, "hot", leased)
		require.NoError(t, err)
		n, err := e.client.Get(ctx, key).Int64()
		require.NoError(t, err)
		require.Equal(t, int64(20), n, "what was not used went back with the next decision")
	})

	t.Run("GivesBackWhenQuiet", func(t *testing.T) {
		e := mk(t)
		l := leasingByHand(t, e)
		allowTimes(t, l, "hot", leased, 20)
		key := e.key("hot", time.Minute, e.windowIndex(time.Minute))
		held, err := e.client.Get(ctx, key).Int64()
		require.NoError(t, err)
		require.Greater(t, held, int64(20))
		for range ratelimit.IdleSweeps {
			ratelimit.SweepLeases(l)
		}
		n, err := e.client.Get(ctx, key).Int64()
		require.NoError(t, err)
		require.Equal(t, int64(20), n)
	})

	t.Run("Peek", func(t *testing.T) {
		e := mk(t)
		l, calls := hookedLimiter(t, e)
		allowTimes(t, l, "hot", leased, 10)
		before := calls.n.Load()
		r, err := l.Peek(ctx, "hot", leased)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.Equal(t, int64(10), r.Count, "the shared count at the last lease and this process's use since")
		require.Equal(t, before, calls.n.Load(), "answered from the lease")
		// Without a lease it reads Redis, and writes nothing.
		r, err = leasing(t, e).Peek(ctx, "hot", leased)
		require.NoError(t, err)
		require.GreaterOrEqual(t, r.Count, int64(10), "what this process's leases counted")
	})

	t.Run("Reset", func(t *testing.T) {
		e := mk(t)
		l := leasingByHand(t, e)
		allowTimes(t, l, "hot", leased, 10)
		require.NoError(t, l.Reset(ctx, "hot", leased))
		r, err := l.Allow(ctx, "hot", leased)
		require.NoError(t, err)
		require.Equal(t, int64(1), r.Count, "the lease went with the keys")
		for range ratelimit.IdleSweeps {
			ratelimit.SweepLeases(l)
		}
		n, err := e.client.Get(ctx, e.key("hot", time.Minute, e.windowIndex(time.Minute))).Int64()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "nothing of the dropped lease was given back")
	})

	t.Run("AllowAllAllOrNothing", func(t *testing.T) {
		e := mk(t)
		l := leasingByHand(t, e)
		tight := ratelimit.Limit{Rate: 3, Window: time.Second}
		plan := []ratelimit.Limit{leased, tight}
		for i := range 5 {
			rs, err := l.AllowAll(ctx, "hot", plan, 1)
			require.NoError(t, err)
			require.Equal(t, i < 3, rs[0].Allowed, "decision %d", i)
		}
		// Only the 3 admitted requests used the lease: the denied ones
		// gave their units back to it.
		r, err := l.Peek(ctx, "hot", leased)
		require.NoError(t, err)
		require.Equal(t, int64(3), r.Count)
		for range ratelimit.IdleSweeps {
			ratelimit.SweepLeases(l)
		}
		n, err := e.client.Get(ctx, e.key("hot", time.Minute, e.windowIndex(time.Minute))).Int64()
		require.NoError(t, err)
		require.Equal(t, int64(3), n)
	})

	t.Run("AllowManyFromLeases", func(t *testing.T) {
		e := mk(t)
		var calls scriptCalls
		e.client = hookedClient(t, e.client, &calls)
		l := leasingByHand(t, e)
		quotas := []ratelimit.Quota{{ID: "hot", Limit: leased, Cost: 1}, {ID: "tenant", Limit: leased, Cost: 1}}
		for range 200 {
			rs, err := l.AllowMany(ctx, quotas)
			require.NoError(t, err)
			require.True(t, rs[0].Allowed)
		}
		// Leases of each id double while they run out, up to Rate/20 = 50,
		// as AllowN's do: a few calls a quota, not one a decision.
		require.Less(t, calls.n.Load(), int64(30))
		for range ratelimit.IdleSweeps {
			ratelimit.SweepLeases(l)
		}
		ratelimit.Settle(l)
		for _, id := range []string{"hot", "tenant"} {
			require.Equal(t, int64(200), e.get(t, id, time.Minute, e.windowIndex(time.Minute)), "%s: what was admitted, once the leases went back", id)
		}
	})

	t.Run("AllowManyConcurrent", func(t *testing.T) {
		// Many goroutines at once, on leases of short windows of real time,
		// renewed all the while: a decision whose lease was short when asked
		// and held its cost once a refill landed sends nothing (it once sent
		// an empty call, and panicked within a second).
		e := mk(t)
		l := leasing(t, e, ratelimit.WithClock(time.Now))
		quotas := []ratelimit.Quota{{ID: "hot", Limit: ratelimit.Limit{Rate: 1000, Window: 100 * time.Millisecond, Leased: true}, Cost: 1}}
		var failed firstError
		var wg sync.WaitGroup
		stop := time.Now().Add(500 * time.Millisecond)
		for range 16 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					_, err := l.AllowMany(ctx, quotas)
					failed.report(err)
				}
			})
		}
		wg.Wait()
		require.NoError(t, failed.get())
	})

	t.Run("AllowManyRefusedGivesBackToTheLease", func(t *testing.T) {
		e := mk(t)
		l := leasingByHand(t, e)
		tight := ratelimit.Limit{Rate: 3, Window: time.Second}
		quotas := []ratelimit.Quota{{ID: "hot", Limit: leased, Cost: 1}, {ID: "user", Limit: tight, Cost: 1}}
		for i := range 5 {
			rs, err := l.AllowMany(ctx, quotas)
			require.NoError(t, err)
			require.Equal(t, i < 3, rs[0].Allowed, "decision %d", i)
		}
		ratelimit.Settle(l) // on a Cluster, a refused slot's give-backs
		for range ratelimit.IdleSweeps {
			ratelimit.SweepLeases(l)
		}
		ratelimit.Settle(l)
		require.Equal(t, int64(3), e.get(t, "hot", time.Minute, e.windowIndex(time.Minute)), "the refused decisions counted nothing")
	})

	t.Run("Shadow", func(t *testing.T) {
		e := mk(t)
		l := leasing(t, e, ratelimit.WithShadow(true))
		limit := ratelimit.Limit{Rate: 5, Window: time.Minute, Leased: true}
		shadowed := 0
		for range 8 {
			r, err := l.Allow(ctx, "hot", limit)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			if r.Shadowed {
				shadowed++
			}
		}
		require.Equal(t, 3, shadowed)
	})

	t.Run("OneLeasedLimitInAllowAll", func(t *testing.T) {
		e := mk(t)
		l := leasing(t, e)
		for i := range 5 {
			rs, err := l.AllowAll(ctx, "hot", []ratelimit.Limit{leased}, 1)
			require.NoError(t, err)
			require.True(t, rs[0].Allowed)
			require.Equal(t, int64(i+1), rs[0].Count)
			rs, err = l.PeekAll(ctx, "hot", []ratelimit.Limit{leased})
			require.NoError(t, err)
			require.True(t, rs[0].Allowed)
		}
	})

	t.Run("MixedCountIsTheLeases", func(t *testing.T) {
		e := mk(t)
		l := leasing(t, e)
		plan := []ratelimit.Limit{leased, {Rate: 1 << 20, Window: time.Second}}
		for i := range 41 {
			rs, err := l.AllowAll(ctx, "hot", plan, 1)
			require.NoError(t, err)
			require.True(t, rs[0].Allowed)
			// One process alone: the count as of its last lease and its
			// use since is all that was admitted.
			require.Equal(t, int64(i+1), rs[0].Count, "decision %d", i)
		}
	})

	t.Run("CostAboveRateNeverPasses", func(t *testing.T) {
		e := mk(t)
		l := leasing(t, e)
		allowTimes(t, l, "hot", leased, 10)
		r, err := l.AllowN(ctx, "hot", leased, leased.Rate+1)
		require.NoError(t, err)
		require.False(t, r.Allowed)
		require.Equal(t, ratelimit.InfDuration, r.RetryAfter)
	})

	t.Run("ResetDropsWaitingGiveBacks", func(t *testing.T) {
		e := mk(t)
		l := leasingByHand(t, e, ratelimit.WithMaxLeases(1))
		allowTimes(t, l, "a", leased, 2)    // leases of 1, then 2: one unit left
		_, err := l.Allow(ctx, "b", leased) // evicts a's lease: its unit waits to go back
		require.NoError(t, err)
		require.NoError(t, l.Reset(ctx, "a", leased))
		_, err = l.Allow(ctx, "a", leased)
		require.NoError(t, err)
		ratelimit.SweepLeases(l)
		n, err := e.client.Get(ctx, e.key("a", time.Minute, e.windowIndex(time.Minute))).Int64()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "a give-back of what Reset deleted lowered the new count")
	})

	t.Run("ChargeEndsTheLease", func(t *testing.T) {
		e := mk(t)
		l := leasingByHand(t, e)
		allowTimes(t, l, "hot", leased, 20)
		rs, err := l.Charge(ctx, "hot", []ratelimit.Limit{leased}, 5000)
		require.NoError(t, err)
		require.False(t, rs[0].Allowed)
		r, err := l.Allow(ctx, "hot", leased)
		require.NoError(t, err)
		require.False(t, r.Allowed, "what the lease held does not serve after the charge")
		require.Equal(t, int64(20+5000), e.get(t, "hot", time.Minute, e.windowIndex(time.Minute)), "and went back")
	})

	t.Run("HeldLeaseServesWhileRedisIsDown", func(t *testing.T) {
		e := mk(t)
		var src sources
		var down atomic.Bool
		e.client = hookedClient(t, e.client, hookFunc(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if down.Load() {
				cmd.SetErr(errDown)
				return errDown
			}
			return next(ctx, cmd)
		}))
		l := leasing(t, e, ratelimit.WithObserver(&src), ratelimit.WithFailurePolicy(ratelimit.FailClosed),
			ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
		allowTimes(t, l, "hot", leased, 20)
		down.Store(true)
		src.take()
		served := 0
		for {
			r, err := l.Allow(ctx, "hot", leased)
			if err != nil {
				require.ErrorIs(t, err, ratelimit.ErrUnavailable)
				require.True(t, r.Degraded)
				break
			}
			require.True(t, r.Allowed)
			served++
		}
		got := src.take()
		require.Equal(t, served, count(got, ratelimit.SourceLease))
		require.Equal(t, ratelimit.SourcePolicy, got[len(got)-1], "a lease that cannot be taken is a Redis failure")
		require.Positive(t, served, "the lease held served")
	})
}

var errDown = errors.New("redis is down (test)")

func count(got []ratelimit.Source, s ratelimit.Source) int {
	n := 0
	for _, g := range got {
		if g == s {
			n++
		}
	}
	return n
}

// The lease table is bounded: a lease evicted to make room gives back what
// it held, so that Redis ends with exactly what was admitted.
func TestLeaseTableBounded(t *testing.T) {
	t.Parallel()
	e := miniredisEnv(t)
	const max, ids = 20, 70
	l := leasingByHand(t, e, ratelimit.WithMaxLeases(max)) // as 10,000 would, sooner
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 1000, Window: time.Minute, Leased: true}
	for i := range ids {
		for range 2 { // leases of 1, then of 2: one unit left
			r, err := l.Allow(ctx, fmt.Sprint("id-", i), limit)
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
	}
	require.LessOrEqual(t, ratelimit.LeaseCount(l), max)
	require.Equal(t, ratelimit.LeaseCount(l), l.Stats().Leases)
	ratelimit.SweepLeases(l) // sends the evicted leases' give-backs
	w := e.windowIndex(time.Minute)
	given, unused := 0, int64(0)
	for i := range ids {
		n, err := e.client.Get(ctx, e.key(fmt.Sprint("id-", i), time.Minute, w)).Int64()
		require.NoError(t, err)
		require.Contains(t, []int64{2, 3}, n, "id-%d", i)
		if n == 2 {
			given++
		}
		unused += n - 2 // two admitted
	}
	require.GreaterOrEqual(t, given, ids-max, "the evicted leases gave back their unit")
	require.Equal(t, unused, l.Stats().LeasedUnits, "what Redis counted and no decision used is what the leases hold")
}

// Stats tells what the leases hold and what they gave back: a hot id's
// lease grows; a Charge drains it, giving back what it held in the charge's
// own call.
func TestLeaseStats(t *testing.T) {
	t.Parallel()
	e := miniredisEnv(t)
	l := leasingByHand(t, e)
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 1000, Window: time.Minute, Leased: true}
	const admitted = 20
	allowTimes(t, l, "hot", limit, admitted)
	w := e.windowIndex(time.Minute)
	counted, err := e.client.Get(ctx, e.key("hot", time.Minute, w)).Int64()
	require.NoError(t, err)
	st := l.Stats()
	require.Equal(t, 1, st.Leases)
	require.Positive(t, st.LeasedUnits, "the lease grew past what was used")
	require.Equal(t, counted-admitted, st.LeasedUnits, "counted in Redis and not used")
	require.Zero(t, st.LeaseUnitsGivenBack)

	_, err = l.Charge(ctx, "hot", []ratelimit.Limit{limit}, 1)
	require.NoError(t, err)
	after, err := e.client.Get(ctx, e.key("hot", time.Minute, w)).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(admitted+1), after, "the charge's call gave the lease back")
	held := st.LeasedUnits
	st = l.Stats()
	require.Zero(t, st.Leases)
	require.Zero(t, st.LeasedUnits)
	require.Equal(t, held, st.LeaseUnitsGivenBack)
	require.Zero(t, st.LeaseUnitsLost)
}

func TestLeaseMiniredis(t *testing.T) {
	t.Parallel()
	runLeaseSemantics(t, miniredisEnv)
}

func TestLeaseRedisServer(t *testing.T) {
	t.Parallel()
	runLeaseSemantics(t, serverEnv(t))
}

func TestLeaseRedisCluster(t *testing.T) {
	t.Parallel()
	runLeaseSemantics(t, clusterEnv(t))
}

// allowTimes makes n decisions of id against limit on l, each without error.
func allowTimes(t *testing.T, l *ratelimit.Limiter, id string, limit ratelimit.Limit, n int) {
	t.Helper()
	for range n {
		_, err := l.Allow(context.Background(), id, limit)
		require.NoError(t, err)
	}
}
