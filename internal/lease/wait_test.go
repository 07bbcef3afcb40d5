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
func serveAsync(tb *Table, ctx context.Context, p *plan.Plan) <-chan bool {
	done := make(chan bool, 1)
	go func() { done <- tb.ServePlan(ctx, p, false) }()
	return done
}

// A request that finds its lease short while a refill is in flight waits
// for the refill, and is served from what it brought the moment it
// settles, without a call of its own. (Without the refill's close, it
// would wait out Config.Wait, an hour of the bubble's time.)
func TestServeWaitsForRefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pos := window.Locate(0, 60_000, false, 0, nil)
		tb, ask, grant := emptied(t, time.Hour, pos)
		start := time.Now()
		done := serveAsync(tb, context.Background(), decision(pos, 1))
		synctest.Wait()
		require.Empty(t, done, "it waits for the refill")
		tb.Settle(ask, grant, []Answer{{Allowed: true}}) // Redis leases half of what is left
		require.True(t, <-done)
		require.Zero(t, time.Since(start), "served as the refill settled")
	})
}

// A refill that brought nothing (denied, failed, or its caller left), or
// whose lease moved on, ends the wait too: the request goes its own way,
// at once. Every grant is settled, and Settle ends its refill whatever
// became of its lease.
func TestRefillInVainEndsWait(t *testing.T) {
	pos := window.Locate(0, 60_000, false, 0, nil)
	synctest.Test(t, func(t *testing.T) {
		tb, ask, grant := emptied(t, time.Hour, pos)
		start := time.Now()
		done := serveAsync(tb, context.Background(), decision(pos, 1))
		synctest.Wait()
		tb.Settle(ask, grant, []Answer{{Allowed: false}})
		require.False(t, <-done)
		require.Zero(t, time.Since(start))
	})
	synctest.Test(t, func(t *testing.T) { // the lease moved to the next window meanwhile
		tb, ask, grant := emptied(t, time.Hour, pos)
		start := time.Now()
		done := serveAsync(tb, context.Background(), decision(pos, 1))
		synctest.Wait()
		next := window.Locate(60_000, 60_000, false, 0, nil)
		tb.Take([]Ask{{ID: "hot", Rate: 2000, N: 1, Pos: next, Key: "k2"}}, make([]Grant, 1), false)
		tb.Settle(ask, grant, []Answer{{Allowed: true}})
		require.False(t, <-done)
		require.Zero(t, time.Since(start))
	})
}

// The wait ends at Config.Wait (the Limiter's timeout, which bounds the
// refill's call) or when the caller leaves, whichever is first; then the
// request goes its own way, and a caller who left is not served even if
// the refill has landed. Nothing waits without a timeout, nor a look, nor
// a request that the refill could not serve, nor one when no refill is in
// flight, nor one of a lease whose last refill brought nothing beyond its
// need, nor one with two short leases.
func TestServeWaitIsBounded(t *testing.T) {
	pos := window.Locate(0, 60_000, false, 0, nil)
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, 100*time.Millisecond, pos)
		start := time.Now()
		require.False(t, tb.ServePlan(context.Background(), decision(pos, 1), false))
		require.Equal(t, 100*time.Millisecond, time.Since(start))
	})
	synctest.Test(t, func(t *testing.T) {
		tb, ask, grant := emptied(t, time.Hour, pos)
		ctx, cancel := context.WithCancel(context.Background())
		start := time.Now()
		done := serveAsync(tb, ctx, decision(pos, 1))
		synctest.Wait()
		cancel()
		synctest.Wait()
		tb.Settle(ask, grant, []Answer{{Allowed: true}})
		require.False(t, <-done, "its caller left")
		require.Zero(t, time.Since(start))
	})
	noWait := func(t *testing.T, tb *Table, p *plan.Plan, look bool, why string) {
		start := time.Now()
		require.False(t, tb.ServePlan(context.Background(), p, look), why)
		require.Zero(t, time.Since(start), why)
	}
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, 0, pos)
		noWait(t, tb, decision(pos, 1), false, "no timeout")
	})
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
	other := window.Locate(0, 1_000, false, 0, nil) // a second limit of "hot"
	otherSpan := plan.Span{ID: "hot", Rate: 2000, Cost: 1, Pos: other, Lease: true}
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, time.Hour, pos)
		p := decision(pos, 1)
		p.Spans = append(p.Spans, otherSpan)
		noWait(t, tb, p, false, "another limit has no lease")
	})
	synctest.Test(t, func(t *testing.T) {
		tb, _, _ := emptied(t, time.Hour, pos)
		*tb.entry("hot", other) = lease{rate: 2000, at: other, key: "o", size: 100}
		tb.Take([]Ask{{ID: "hot", Rate: 2000, N: 1, Pos: other, Key: "o"}}, make([]Grant, 1), false) // its refill too
		p := decision(pos, 1)
		p.Spans = append(p.Spans, otherSpan)
		noWait(t, tb, p, false, "two short leases")
	})
}

// settlingCtx is a ctx its caller has left, which settles a refill when
// its Done channel is first asked for: the refill and the ctx end together.
type settlingCtx struct {
	context.Context
	settle func()
	done   chan struct{}
}

func (c *settlingCtx) Done() <-chan struct{} {
	if c.settle != nil {
		c.settle()
		c.settle = nil
	}
	return c.done
}

func (c *settlingCtx) Err() error { return context.Canceled }

// A caller who left is not served from the refill it waited for, even when
// the refill landed as it left (the wait's select may pick either).
func TestLeftCallerNotServed(t *testing.T) {
	pos := window.Locate(0, 60_000, false, 0, nil)
	for range 64 {
		tb, ask, grant := emptied(t, time.Hour, pos)
		ctx := &settlingCtx{Context: context.Background(), done: make(chan struct{})}
		close(ctx.done)
		ctx.settle = func() { tb.Settle(ask, grant, []Answer{{Allowed: true}}) }
		require.False(t, tb.ServePlan(ctx, decision(pos, 1), false))
	}
}

// A decision that panics between TakePlan and Settle (a hook of the
// client, the error handler) abandons its grants in a defer: its refill
// ends, so that no one waits for it, and the lease may refill again.
func TestAbandonEndsRefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pos := window.Locate(0, 60_000, false, 0, nil)
		tb := newTable(t)
		tb.cfg.Wait = time.Hour
		*tb.entry("hot", pos) = lease{rate: 2000, at: pos, key: "k", size: 100}
		var taken Taken
		tb.TakePlan(decision(pos, 1), &taken, false) // the refill
		start := time.Now()
		done := serveAsync(tb, context.Background(), decision(pos, 1))
		synctest.Wait()
		func() {
			defer func() { _ = recover() }()
			defer taken.Abandon()
			panic("a hook")
		}()
		require.False(t, <-done)
		require.Zero(t, time.Since(start), "the wait ended with the abandoned refill")
		ask, grant := []Ask{{ID: "hot", Rate: 2000, N: 1, Pos: pos, Key: "k"}}, make([]Grant, 1)
		tb.Take(ask, grant, false)
		require.NotNil(t, grant[0].refill, "the next request refills")
		taken.Settle(decision(pos, 1), true) // settled already: nothing
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
