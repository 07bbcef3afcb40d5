package ratelimit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

func runChargeRefund(t *testing.T, mk newEnv) {
	ctx := context.Background()
	minute := ratelimit.PerMinute(10)
	ms := time.Millisecond

	t.Run("ChargeCountsWhateverTheCounts", func(t *testing.T) {
		e := mk(t)
		l := e.limiter()
		second := ratelimit.Limit{Rate: 100, Window: time.Second}
		plan := []ratelimit.Limit{minute, second}
		rs, err := l.Charge(ctx, "u", plan, 6)
		require.NoError(t, err)
		require.Equal(t, []ratelimit.Result{
			// 6 weigh 0 in the next window once floor(6 × left/W) is 0
			{Allowed: true, Count: 6, Limit: minute, Remaining: 4, ResetAfter: (60000 + 50001) * ms},
			{Allowed: true, Count: 6, Limit: second, Remaining: 94, ResetAfter: (1000 + 834) * ms},
		}, ratelimit.PublicAll(rs))
		rs, err = l.Charge(ctx, "u", plan, 9) // above the minute's rate: counted all the same
		require.NoError(t, err)
		require.Equal(t, []ratelimit.Result{
			// a cost of 1 passes once 15 weigh 9: floor(15 × (60000-e)/60000) <= 9 from
			// e = 20001 into the next window; they weigh 0 from e = 56001
			{Allowed: false, Count: 15, Limit: minute, Remaining: 0, RetryAfter: (60000 + 20001) * ms, ResetAfter: (60000 + 56001) * ms},
			{Allowed: false, Count: 15, Limit: second, Remaining: 85, ResetAfter: (1000 + 934) * ms},
		}, ratelimit.PublicAll(rs))
		r, err := l.Allow(ctx, "u", minute)
		require.NoError(t, err)
		require.False(t, r.Allowed, "later requests are denied until the window slides past")
		require.Equal(t, int64(15), e.get(t, "u", time.Minute, e.windowIndex(time.Minute)))
	})

	t.Run("ChargeShadowLimit", func(t *testing.T) {
		e := mk(t)
		l := e.limiter()
		shadow := ratelimit.Limit{Rate: 3, Window: time.Second, Shadow: true}
		rs, err := l.Charge(ctx, "u", []ratelimit.Limit{minute, shadow}, 4)
		require.NoError(t, err)
		require.True(t, rs[0].Allowed, "a Shadow limit decides nothing")
		require.True(t, rs[1].Shadowed, "it would have denied a cost of 1")
		require.Equal(t, int64(4), rs[1].Count, "and is charged too")
	})

	t.Run("ChargeInvalid", func(t *testing.T) {
		e := mk(t)
		l := e.limiter()
		for _, tc := range []struct {
			limits []ratelimit.Limit
			n      int64
			is     error
		}{
			{nil, 1, ratelimit.ErrInvalidLimit},
			{[]ratelimit.Limit{minute, minute}, 1, ratelimit.ErrInvalidLimit},
			{[]ratelimit.Limit{minute}, 0, ratelimit.ErrInvalidCost},
			{[]ratelimit.Limit{{Rate: 0, Window: time.Second}}, 1, ratelimit.ErrInvalidLimit},
		} {
			_, err := l.Charge(ctx, "u", tc.limits, tc.n)
			require.ErrorIs(t, err, tc.is)
		}
		_, err := l.Charge(ctx, "", []ratelimit.Limit{minute}, 1)
		require.ErrorIs(t, err, ratelimit.ErrInvalidID)
		require.Empty(t, e.keys(t), "nothing written")
	})

	// A count stays a count: a charge that would take a key past 2^53 (the
	// most a key holds and still holds a count) is refused whole, and the
	// id's later decisions are made as before, not Degraded.
	t.Run("ChargePast2To53", func(t *testing.T) {
		second := ratelimit.Limit{Rate: 100, Window: time.Second}
		strict := ratelimit.Limit{Rate: 10, Window: time.Hour, Strict: true}
		for _, over := range []ratelimit.Limit{minute, strict} {
			t.Run(over.String(), func(t *testing.T) {
				e := mk(t)
				h := &errorLog{}
				l := e.limiter(ratelimit.WithErrorHandler(h.handle))
				r, err := l.Allow(ctx, "u", over)
				require.NoError(t, err)
				require.True(t, r.Allowed)
				before := e.keys(t)
				// The other limit's key is new and could take it: nothing is
				// counted there either.
				_, err = l.Charge(ctx, "u", []ratelimit.Limit{second, over}, 1<<53)
				require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
				require.ErrorContains(t, err, "limit "+over.String()+" past 2^53")
				require.Equal(t, before, e.keys(t), "nothing written")
				r, err = l.Allow(ctx, "u", over)
				require.NoError(t, err)
				require.False(t, r.Degraded, "the key still holds a count")
				require.True(t, r.Allowed)
				require.Equal(t, int64(2), r.Count)
				require.Empty(t, h.all(), "the caller's input, not a Redis failure")

				// To 2^53 exactly is a count.
				rs, err := l.Charge(ctx, "u", []ratelimit.Limit{over}, 1<<53-2)
				require.NoError(t, err)
				require.Equal(t, int64(1<<53), rs[0].Count)
				r, err = l.Allow(ctx, "u", over)
				require.NoError(t, err)
				require.False(t, r.Degraded)
				require.False(t, r.Allowed)
				_, err = l.Charge(ctx, "u", []ratelimit.Limit{over}, 1)
				require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
				r, err = l.Allow(ctx, "u", over)
				require.NoError(t, err)
				require.False(t, r.Degraded)
				require.Equal(t, int64(1<<53), r.Count)
			})
		}
	})

	// A cost above 2^53 is above every Rate and past what any key holds:
	// refused before Redis is asked.
	t.Run("CostPast2To53", func(t *testing.T) {
		e := mk(t)
		l := e.limiter()
		for _, n := range []int64{1<<53 + 1, 1<<63 - 1} {
			_, err := l.AllowN(ctx, "u", minute, n)
			require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
			require.ErrorContains(t, err, "above 2^53")
			_, err = l.AllowAll(ctx, "u", []ratelimit.Limit{minute, ratelimit.PerSecond(5)}, n)
			require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
			_, err = l.Charge(ctx, "u", []ratelimit.Limit{minute}, n)
			require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
		}
		require.Empty(t, e.keys(t), "nothing written")
		_, err := ratelimit.New(e.client, ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix(e.prefix),
			ratelimit.WithCountDenied(true)).AllowN(ctx, "u", minute, 1<<53+1)
		require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
		require.Empty(t, e.keys(t), "nothing written under WithCountDenied either")
	})

	t.Run("RefundNoResults", func(t *testing.T) {
		e := mk(t)
		l := e.limiter()
		_, err := l.Charge(ctx, "u", nil, 1)
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit, "as a Charge with no limits")
		require.ErrorIs(t, l.Refund(ctx, "u", nil, 1), ratelimit.ErrInvalidLimit)
		require.ErrorIs(t, l.Refund(ctx, "u", []ratelimit.Result{}, 1), ratelimit.ErrInvalidLimit)
		require.Empty(t, e.keys(t))
	})

	t.Run("RefundUndoes", func(t *testing.T) {
		for _, limit := range []ratelimit.Limit{minute, {Rate: 10, Window: time.Minute, Strict: true}} {
			e := mk(t)
			l := e.limiter()
			_, err := l.AllowN(ctx, "u", limit, 2)
			require.NoError(t, err)
			e.clock.Add(limit.Window / 4)
			before, err := l.Peek(ctx, "u", limit)
			require.NoError(t, err)
			r, err := l.AllowN(ctx, "u", limit, 5)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			require.NoError(t, l.Refund(ctx, "u", []ratelimit.Result{r}, 5))
			after, err := l.Peek(ctx, "u", limit)
			require.NoError(t, err)
			require.Equal(t, before, after, "%v: as if the refunded cost had never been counted", limit)
			// In the next window, where it sits in the previous count.
			r, err = l.AllowN(ctx, "u", limit, 4)
			require.NoError(t, err)
			e.clock.Add(limit.Window)
			before, err = l.Peek(ctx, "u", limit)
			require.NoError(t, err)
			require.NoError(t, l.Refund(ctx, "u", []ratelimit.Result{r}, 4))
			after, err = l.Peek(ctx, "u", limit)
			require.NoError(t, err)
			require.Less(t, after.Count, before.Count, "%v", limit)
			e.clock.Add(-limit.Window)
			back, err := l.Peek(ctx, "u", limit)
			require.NoError(t, err)
			require.Equal(t, int64(2), back.Count, "%v: the 4 are gone from the window they were counted in", limit)
		}
	})

	t.Run("RefundAcrossTheSpan", func(t *testing.T) {
		e := mk(t)
		l := e.limiter()
		r, err := l.AllowN(ctx, "u", minute, 3)
		require.NoError(t, err)
		w := e.windowIndex(time.Minute)
		e.clock.Add(time.Minute) // w+1: still read
		require.NoError(t, l.Refund(ctx, "u", []ratelimit.Result{r}, 1))
		require.Equal(t, int64(2), e.get(t, "u", time.Minute, w))
		e.clock.Add(time.Minute) // w+2: slid out, nothing to give back
		require.NoError(t, l.Refund(ctx, "u", []ratelimit.Result{r}, 1))
		require.Equal(t, int64(2), e.get(t, "u", time.Minute, w))
	})

	t.Run("RefundInvalid", func(t *testing.T) {
		e := mk(t)
		l := e.limiter(ratelimit.WithFailurePolicy(ratelimit.FailOpen))
		tight := ratelimit.PerMinute(1)
		allowed, err := l.Allow(ctx, "u", tight)
		require.NoError(t, err)
		denied, err := l.Allow(ctx, "u", tight)
		require.NoError(t, err)
		require.False(t, denied.Allowed)
		peek, err := l.Peek(ctx, "u", tight)
		require.NoError(t, err)
		other, err := e.limiter().Allow(ctx, "v", minute)
		require.NoError(t, err)
		for name, tc := range map[string]struct {
			id string
			rs []ratelimit.Result
			n  int64
		}{
			"denied":        {"u", []ratelimit.Result{denied}, 1},
			"peek":          {"u", []ratelimit.Result{peek}, 1},
			"a literal":     {"u", []ratelimit.Result{{Allowed: true, Count: 1, Limit: tight}}, 1},
			"more":          {"u", []ratelimit.Result{allowed}, 2},
			"another id":    {"v", []ratelimit.Result{allowed}, 1},
			"other Limiter": {"v", []ratelimit.Result{other}, 1},
			"below 1":       {"u", []ratelimit.Result{allowed}, 0},
		} {
			require.ErrorIs(t, l.Refund(ctx, tc.id, tc.rs, tc.n), ratelimit.ErrInvalidCost, name)
		}
		// Results that name another count than the one counted, or one
		// count twice, are bad limits, as AllowAll's two limits of one
		// window are.
		edited := allowed
		edited.Limit = ratelimit.Limit{}
		otherWindow := allowed
		otherWindow.Limit.Window = time.Hour
		// An invalid Limit anywhere is ErrInvalidLimit, as every method
		// says; a Rate of 0 once passed, naming the same count.
		zeroRate := allowed
		zeroRate.Limit.Rate = 0
		for name, rs := range map[string][]ratelimit.Result{
			"one count twice":       {allowed, allowed},
			"Limit emptied":         {edited},
			"another window":        {otherWindow},
			"rate 0":                {zeroRate},
			"an invalid one beside": {allowed, {Limit: ratelimit.Limit{Rate: 1, Window: time.Microsecond}}},
		} {
			require.ErrorIs(t, l.Refund(ctx, "u", rs, 1), ratelimit.ErrInvalidLimit, name)
		}
		require.EqualError(t, l.Refund(ctx, "u", []ratelimit.Result{allowed}, 2),
			"ratelimit: invalid cost: refund of 2 is more than the 1 that limit 1/1m0s counted")
		require.Equal(t, int64(1), e.get(t, "u", time.Minute, e.windowIndex(time.Minute)), "nothing written")
		require.ErrorIs(t, l.Refund(ctx, "", []ratelimit.Result{allowed}, 1), ratelimit.ErrInvalidID)
		// A Result's Rate changed names the same count: the refund goes to
		// the count the decision counted in.
		rate := allowed
		rate.Limit.Rate = 7
		require.NoError(t, l.Refund(ctx, "u", []ratelimit.Result{rate}, 1))
		require.Equal(t, int64(0), e.get(t, "u", time.Minute, e.windowIndex(time.Minute)))
	})

	t.Run("RefundsRacingDecisions", func(t *testing.T) {
		e := mk(t)
		l := e.limiter()
		limit := ratelimit.PerMinute(1 << 20)
		var wg sync.WaitGroup
		var failed firstError
		for range 8 {
			wg.Go(func() {
				for range 50 {
					r, err := l.AllowN(ctx, "hot", limit, 3)
					if err == nil {
						err = l.Refund(ctx, "hot", []ratelimit.Result{r}, 2)
					}
					failed.report(err)
				}
			})
		}
		wg.Wait()
		require.NoError(t, failed.get())
		require.Equal(t, int64(8*50), e.get(t, "hot", time.Minute, e.windowIndex(time.Minute)))
	})

	t.Run("Observed", func(t *testing.T) {
		e := mk(t)
		calls := &callObserver{}
		l := e.limiter(ratelimit.WithObserver(calls))
		r, err := l.AllowN(ctx, "u", minute, 3)
		require.NoError(t, err)
		require.NoError(t, l.Refund(ctx, "u", []ratelimit.Result{r}, 2))
		_, err = l.Charge(ctx, "u", []ratelimit.Limit{minute}, 4)
		require.NoError(t, err)
		require.NoError(t, l.GiveBack(ctx, "u", []ratelimit.Limit{minute}, 1))
		require.Equal(t, []ratelimit.EventKind{ratelimit.EventDecision, ratelimit.EventRefund, ratelimit.EventCharge, ratelimit.EventGiveBack}, calls.kinds)
		require.Equal(t, []int64{3, 2, 4, 1}, calls.costs)
		require.Equal(t, []bool{false, true, true, true}, calls.call, "a charge, a refund and a give-back go to ObserveCall")

		// An Observer that is no CallObserver, written to count decisions,
		// sees only the decision.
		var kinds []ratelimit.EventKind
		l = e.limiter(ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, ev *ratelimit.Event) {
			kinds = append(kinds, ev.Kind)
		})))
		r, err = l.AllowN(ctx, "w", minute, 3)
		require.NoError(t, err)
		require.NoError(t, l.Refund(ctx, "w", []ratelimit.Result{r}, 2))
		_, err = l.Charge(ctx, "w", []ratelimit.Limit{minute}, 4)
		require.NoError(t, err)
		require.Equal(t, []ratelimit.EventKind{ratelimit.EventDecision}, kinds)
	})

	t.Run("DenyCache", func(t *testing.T) {
		e := mk(t)
		var src ratelimit.Source
		l := e.limiter(ratelimit.WithDenyCache(100), ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, ev *ratelimit.Event) {
			src = ev.Source
		})))
		_, err := l.Charge(ctx, "u", []ratelimit.Limit{minute}, 12)
		require.NoError(t, err)
		r, err := l.Allow(ctx, "u", minute)
		require.NoError(t, err)
		require.False(t, r.Allowed)
		require.Equal(t, ratelimit.SourceCache, src, "the cache learned from the charge")
		full, err := l.AllowN(ctx, "v", minute, 10)
		require.NoError(t, err)
		_, err = l.Allow(ctx, "v", minute)
		require.NoError(t, err)
		require.NoError(t, l.Refund(ctx, "v", []ratelimit.Result{full}, 5))
		r, err = l.Allow(ctx, "v", minute)
		require.NoError(t, err)
		require.True(t, r.Allowed, "the refund made room, and the cache forgot the denial")
		require.Equal(t, ratelimit.SourceRedis, src)
	})

	t.Run("RedisDown", func(t *testing.T) {
		e := mk(t)
		var handled []error
		l := ratelimit.New(downClient(t), ratelimit.WithErrorHandler(func(_ context.Context, _ string, err error) { handled = append(handled, err) }),
			ratelimit.WithClock(e.clock.Now))
		_, err := l.Charge(ctx, "u", []ratelimit.Limit{minute}, 1)
		require.Error(t, err, "a charge that cannot reach Redis returns the error, under FailOpen too")
		require.False(t, errors.Is(err, ratelimit.ErrInvalidCost))
		require.Len(t, handled, 1)
	})
}

func TestChargeRefundMiniredis(t *testing.T) {
	t.Parallel()
	runChargeRefund(t, miniredisEnv)
}

func TestChargeRefundRedisServer(t *testing.T) {
	t.Parallel()
	runChargeRefund(t, serverEnv(t))
}

func TestChargeRefundRedisCluster(t *testing.T) {
	t.Parallel()
	runChargeRefund(t, clusterEnv(t))
}

func TestChargeRefundBatched(t *testing.T) {
	t.Parallel()
	runChargeRefund(t, withOpts(miniredisEnv, ratelimit.WithBatching(64)))
}

// callObserver records the Kind and Cost of every Event it sees, and whether
// it came through ObserveCall.
type callObserver struct {
	kinds []ratelimit.EventKind
	costs []int64
	call  []bool
}

func (o *callObserver) Observe(_ context.Context, e *ratelimit.Event) { o.add(e, false) }

func (o *callObserver) ObserveCall(_ context.Context, e *ratelimit.Event) { o.add(e, true) }

func (o *callObserver) add(e *ratelimit.Event, call bool) {
	o.kinds, o.costs, o.call = append(o.kinds, e.Kind), append(o.costs, e.Cost), append(o.call, call)
}

// GiveBack lowers each limit's current window, never below 0, without the
// Results of what was counted; its input is checked as AllowAll's.
func TestGiveBack(t *testing.T) {
	for _, b := range singleServers(t) {
		t.Run(b.name, func(t *testing.T) {
			e := b.mk(t)
			l := e.limiter()
			ctx := context.Background()
			e.clock.Set(epoch.Add(10 * time.Second))
			i := e.windowIndex(time.Minute)
			limits := []ratelimit.Limit{ratelimit.PerMinute(10), {Rate: 10, Window: time.Minute, Strict: true}}
			_, err := l.AllowAll(ctx, "u", limits, 5)
			require.NoError(t, err)
			require.NoError(t, l.GiveBack(ctx, "u", limits, 3))
			require.Equal(t, int64(2), e.get(t, "u", time.Minute, i))
			rs, err := l.PeekAll(ctx, "u", limits)
			require.NoError(t, err)
			require.Equal(t, []int64{2, 2}, []int64{rs[0].Count, rs[1].Count})
			require.NoError(t, l.GiveBack(ctx, "u", limits, 9))
			require.Equal(t, int64(0), e.get(t, "u", time.Minute, i), "never below 0")
			require.NoError(t, l.GiveBack(ctx, "nobody", limits, 1))
			require.ErrorIs(t, l.GiveBack(ctx, "u", limits, 0), ratelimit.ErrInvalidCost)
			require.ErrorIs(t, l.GiveBack(ctx, "", limits, 1), ratelimit.ErrInvalidID)
			require.ErrorIs(t, l.GiveBack(ctx, "u", nil, 1), ratelimit.ErrInvalidLimit)
		})
	}
}
