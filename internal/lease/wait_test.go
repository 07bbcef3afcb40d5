package lease

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// emptied returns a table whose lease of "hot" at pos (rate 2,000, Cap 100)
// has run out, with a refill of it taken and not settled: ask and grant,
// for Settle.
func emptied(t *testing.T, wait time.Duration, pos window.Position) (tb *Table, ask []Ask, grant []Grant) {
	tb = newTable(t)
	tb.cfg.Wait = wait
	e := tb.entry("hot", pos)
	*e = lease{rate: 2000, at: pos, key: "k", size: 100}
	ask, grant = []Ask{{ID: "hot", Rate: 2000, N: 1, Pos: pos, Key: "k"}}, make([]Grant, 1)
	tb.Take(ask, grant, false)
	require.NotNil(t, grant[0].refill)
	require.Equal(t, int64(99), grant[0].refill.more, "Cap less its own need")
	return tb, ask, grant
}

// decision returns the plan of a request of cost n by "hot" on the limit
// its span leases.
func decision(pos window.Position, n int64) *plan.Plan {
	return &plan.Plan{Spans: []plan.Span{{ID: "hot", Rate: 2000, Cost: n, Pos: pos, Lease: true}}, Replies: make([]script.Reply, 1)}
}

// serveAsync runs ServePlan of p on another goroutine of the bubble.
func serveAsync(tb *Table, ctx context.Context, p *plan.Plan) <-chan error {
	done := make(chan error, 1)
	go func() {
		served, err := tb.ServePlan(ctx, p, false)
		if err == nil && !served {
			err = errNotServed
		}
		done <- err
	}()
	return done
}

var errNotServed = errors.New("not served")

// A request that finds its lease short while a refill is in flight waits
// for the refill, and is served from what it brought the moment it
// settles, without a call of its own. With no bound but its ctx, a refill
// that never ended would hold it for good: the bubble would deadlock.
func TestServeWaitsForRefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pos := window.Locate(0, 60_000, false, 0, nil)
		tb, ask, grant := emptied(t, 0, pos)
		start := time.Now()
		done := serveAsync(tb, context.Background(), decision(pos, 1))
		synctest.Wait()
		require.Empty(t, done, "it waits for the refill")
		tb.Settle(ask, grant, []Answer{{Allowed: true}}) // Redis leases half of what is left
		require.NoError(t, <-done)
		require.Zero(t, time.Since(start), "served as the refill settled")
	})
}

// The refill's call failed while its caller waited: those waiting for it
// get its error, for the failure policy, rather than spend the Limiter's
// timeout again on a call of their own. A refill whose caller left, or
// that was denied, lets them go on.
func TestFailedRefillEndsWait(t *testing.T) {
	pos := window.Locate(0, 60_000, false, 0, nil)
	down := errors.New("redis down")
	synctest.Test(t, func(t *testing.T) {
		tb, ask, grant := emptied(t, 0, pos)
		done := serveAsync(tb, context.Background(), decision(pos, 1))
		synctest.Wait()
		tb.Settle(ask, grant, []Answer{{Err: down}})
		require.ErrorIs(t, <-done, down)
	})
	synctest.Test(t, func(t *testing.T) {
		tb, ask, grant := emptied(t, 0, pos)
		done := serveAsync(tb, context.Background(), decision(pos, 1))
		synctest.Wait()
		tb.Settle(ask, grant, []Answer{{Allowed: false}}) // denied, or its caller left
		require.ErrorIs(t, <-done, errNotServed)
	})
	synctest.Test(t, func(t *testing.T) { // the lease moved to the next window meanwhile
		tb, ask, grant := emptied(t, 0, pos)
		done := serveAsync(tb, context.Background(), decision(pos, 1))
		synctest.Wait()
		next := window.Locate(60_000, 60_000, false, 0, nil)
		tb.Take([]Ask{{ID: "hot", Rate: 2000, N: 1, Pos: next, Key: "k2"}}, make([]Grant, 1), false)
		tb.Settle(ask, grant, []Answer{{Allowed: true}})
		require.ErrorIs(t, <-done, errNotServed)
	})
}

// Taken.Failed hands the call's error to the refill's waiters, but not
// when the refill's caller left: that says nothing of Redis.
func TestTakenFailed(t *testing.T) {
	pos := window.Locate(0, 60_000, false, 0, nil)
	down := errors.New("redis down")
	for _, left := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			tb := newTable(t)
			*tb.entry("hot", pos) = lease{rate: 2000, at: pos, key: "k", size: 100}
			p := decision(pos, 1)
			var taken Taken
			tb.TakePlan(p, &taken, false)
			p.Reqs = []*script.Request{{Keys: []string{"k", "k0"}}}
			done := serveAsync(tb, context.Background(), decision(pos, 1))
			synctest.Wait()
			taken.Failed(p, down, left)
			taken.Settle(p, true) // settled once: nothing more
			if left {
				require.ErrorIs(t, <-done, errNotServed)
			} else {
				require.ErrorIs(t, <-done, down)
			}
		})
	}
}

// The wait ends at Config.Wait (the Limiter's timeout, which bounds the
// refill's call) or when the caller leaves, whichever is first; then the
// request goes its own way. A look does not wait, nor does a request that
// the refill could not serve, nor one when no refill is in flight, nor
// one of a lease whose last refill brought nothing beyond its need.
func TestServeWaitIsBounded(t *testing.T) {
	pos := window.Locate(0, 60_000, false, 0, nil)
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, 100*time.Millisecond, pos)
		start := time.Now()
		served, err := tb.ServePlan(context.Background(), decision(pos, 1), false)
		require.False(t, served)
		require.NoError(t, err)
		require.Equal(t, 100*time.Millisecond, time.Since(start))
	})
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, 0, pos)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		served, err := tb.ServePlan(ctx, decision(pos, 1), false)
		require.False(t, served)
		require.NoError(t, err, "its call tells the caller it left")
		require.Equal(t, 30*time.Millisecond, time.Since(start))
	})
	noWait := func(t *testing.T, tb *Table, p *plan.Plan, look bool, why string) {
		start := time.Now()
		served, err := tb.ServePlan(context.Background(), p, look)
		require.False(t, served, why)
		require.NoError(t, err, why)
		require.Zero(t, time.Since(start), why)
	}
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, time.Hour, pos)
		noWait(t, tb, decision(pos, 1), true, "a look")
		noWait(t, tb, decision(pos, 100), false, "more than the refill may bring")
	})
	synctest.Test(t, func(t *testing.T) {
		tb := newTable(t)
		tb.cfg.Wait = time.Hour
		*tb.entry("hot", pos) = lease{rate: 2000, at: pos, key: "k", size: 100} // empty, no refill
		noWait(t, tb, decision(pos, 1), false, "no refill")
	})
	synctest.Test(t, func(t *testing.T) {
		tb, ask, grant := emptied(t, time.Hour, pos)
		tb.Settle(ask, grant, []Answer{{Allowed: false}}) // denied: the lease is dry
		tb.Take(ask, grant, false)                        // the next refill
		require.NotNil(t, grant[0].refill)
		noWait(t, tb, decision(pos, 1), false, "a dry lease")
	})
	synctest.Test(t, func(t *testing.T) { // two limits, one of them with no lease at all
		tb, _, _ := emptied(t, time.Hour, pos)
		p := decision(pos, 1)
		other := window.Locate(0, 1_000, false, 0, nil)
		p.Spans = append(p.Spans, plan.Span{ID: "hot", Rate: 50, Cost: 1, Pos: other, Lease: true})
		noWait(t, tb, p, false, "another limit has no lease")
	})
}

// A decision that panics between TakePlan and Settle (a hook of the
// client, the error handler) abandons its grants in a defer: its refill
// ends, so that no one waits for it, and the lease may refill again.
func TestAbandonEndsRefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pos := window.Locate(0, 60_000, false, 0, nil)
		tb := newTable(t)
		*tb.entry("hot", pos) = lease{rate: 2000, at: pos, key: "k", size: 100}
		var done <-chan error
		func() {
			defer func() { _ = recover() }()
			var taken Taken
			defer taken.Abandon()
			tb.TakePlan(decision(pos, 1), &taken, false)
			done = serveAsync(tb, context.Background(), decision(pos, 1))
			synctest.Wait()
			panic("a hook")
		}()
		require.ErrorIs(t, <-done, errNotServed)
		ask, grant := []Ask{{ID: "hot", Rate: 2000, N: 1, Pos: pos, Key: "k"}}, make([]Grant, 1)
		tb.Take(ask, grant, false)
		require.NotNil(t, grant[0].refill, "the next request refills")
	})
}

// A request placed in a window before its lease's (its caller read the
// clock, then waited or was slow) goes to Redis unleased: the current
// lease is neither given back nor replaced.
func TestStaleAskKeepsLease(t *testing.T) {
	tb := newTable(t)
	now := window.Locate(60_000, 60_000, false, 0, nil)
	*tb.entry("hot", now) = lease{rate: 2000, at: now, key: "k", left: 40, size: 100}
	before := window.Locate(59_999, 60_000, false, 0, nil)
	ask, grant := []Ask{{ID: "hot", Rate: 2000, N: 1, Pos: before, Key: "k0"}}, make([]Grant, 1)
	gives := tb.Take(ask, grant, false)
	require.Empty(t, gives)
	require.Equal(t, int64(1), grant[0].Need)
	require.Equal(t, int64(1), grant[0].Most, "nothing leased in a past window")
	tb.Settle(ask, grant, []Answer{{Allowed: true}})
	leases, units := tb.Held()
	require.Equal(t, 1, leases)
	require.Equal(t, int64(40), units)
}
