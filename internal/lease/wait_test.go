package lease

import (
	"context"
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
	require.True(t, grant[0].refill)
	return tb, ask, grant
}

// decision returns the plan of a request of cost n by "hot" on the limit
// its span leases.
func decision(pos window.Position, n int64) *plan.Plan {
	return &plan.Plan{Spans: []plan.Span{{ID: "hot", Rate: 2000, Cost: n, Pos: pos, Lease: true}}, Replies: make([]script.Reply, 1)}
}

// A request that finds its lease short while a refill is in flight waits
// for the refill, and is served from what it brought, without a call of
// its own.
func TestServeWaitsForRefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pos := window.Locate(0, 60_000, false, 0, nil)
		tb, ask, grant := emptied(t, time.Second, pos)
		served := make(chan bool, 1)
		go func() { served <- tb.ServePlan(context.Background(), decision(pos, 1), false) }()
		synctest.Wait()
		require.Empty(t, served, "it waits for the refill")
		tb.Settle(ask, grant, []Answer{{Allowed: true}}) // Redis leases half of what is left
		require.True(t, <-served)
	})
}

// The wait ends at Config.Wait (the Limiter's timeout, which bounds the
// refill's call) or when the caller leaves, whichever is first; then the
// request goes its own way. A look does not wait, nor does a request that
// no lease could hold, nor one when no refill is in flight.
func TestServeWaitIsBounded(t *testing.T) {
	pos := window.Locate(0, 60_000, false, 0, nil)
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, 100*time.Millisecond, pos)
		start := time.Now()
		require.False(t, tb.ServePlan(context.Background(), decision(pos, 1), false))
		require.Equal(t, 100*time.Millisecond, time.Since(start))
	})
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, 0, pos)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		require.False(t, tb.ServePlan(ctx, decision(pos, 1), false))
		require.Equal(t, 30*time.Millisecond, time.Since(start))
	})
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, time.Hour, pos)
		start := time.Now()
		require.False(t, tb.ServePlan(context.Background(), decision(pos, 1), true), "a look")
		require.False(t, tb.ServePlan(context.Background(), decision(pos, Cap(2000)+1), false), "more than a lease holds")
		require.Zero(t, time.Since(start))
	})
	synctest.Test(t, func(t *testing.T) {
		tb := newTable(t)
		tb.cfg.Wait = time.Hour
		*tb.entry("hot", pos) = lease{rate: 2000, at: pos, key: "k", size: 100} // empty, no refill
		start := time.Now()
		require.False(t, tb.ServePlan(context.Background(), decision(pos, 1), false))
		require.Zero(t, time.Since(start))
	})
}

// A refill that fails still ends the wait: every grant is settled, and
// Settle closes its refill's channel, whatever became of the lease (here:
// moved to the next window while the refill was in flight).
func TestFailedRefillEndsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pos := window.Locate(0, 60_000, false, 0, nil)
		tb, ask, grant := emptied(t, 0, pos)
		served := make(chan bool, 1)
		go func() { served <- tb.ServePlan(context.Background(), decision(pos, 1), false) }()
		synctest.Wait()
		next := window.Locate(60_000, 60_000, false, 0, nil)
		tb.Take([]Ask{{ID: "hot", Rate: 2000, N: 1, Pos: next, Key: "k2"}}, make([]Grant, 1), false)
		tb.Settle(ask, grant, []Answer{{Allowed: false}})
		require.False(t, <-served)
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
