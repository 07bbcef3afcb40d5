package ratelimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
)

// refusingClient returns a client of an address where nothing listens: a
// Redis down all along, which refuses connections (no dial keeps retrying).
// Port 1 is below the ephemeral ports the tests' servers take: the port of
// a server closed at once could be taken by another test's running in
// parallel, which then answered.
func refusingClient(t *testing.T) *redis.Client {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// With Redis down all along, FailLocal makes the decisions of the sliding
// window in this process, with each limit's share for one of 3 replicas: the
// reference model, run with Rate/3, agrees on every field but Limit (the
// caller's) and Degraded (true).
func TestFailLocalMatchesModel(t *testing.T) {
	t.Parallel()
	const replicas = 3
	client := refusingClient(t)
	clk := clock.NewFake(epoch)
	l := ratelimit.New(client, ratelimit.WithClock(clk.Now),
		ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithReplicas(replicas),
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	m := newModel()
	share := func(limit ratelimit.Limit) ratelimit.Limit {
		return ratelimit.Limit{Rate: max(1, limit.Rate/replicas), Window: limit.Window}
	}
	ctx := context.Background()
	var allowed, denied int
	for step, o := range randomTrace(5, 3000, tinyWindows) {
		clk.Set(time.UnixMilli(o.at))
		where := fmt.Sprintf("step %d %v", step, o)
		var want, got ratelimit.Result
		var err error
		switch o.kind {
		case opReset: // fails with Redis down; the local windows keep their counts
			require.Error(t, l.Reset(ctx, o.id, o.limit), where)
			continue
		case opPeek:
			want = m.peek(o.id, share(o.limit), o.at)
			got, err = l.Peek(ctx, o.id, o.limit)
		case opAllow:
			want = m.allowN(o.id, share(o.limit), o.at, o.cost)
			got, err = l.AllowN(ctx, o.id, o.limit, o.cost)
			if got.Allowed {
				allowed++
			} else {
				denied++
			}
		}
		require.NoError(t, err, where)
		want.Limit, want.Degraded = o.limit, true
		require.Equal(t, want, ratelimit.Public(got), where)
	}
	require.Greater(t, allowed, 300)
	require.Greater(t, denied, 300)
}

// The same with decisions of several limits: on the differential tests'
// mixed trace (AllowN, AllowAll, Peek, PeekAll of sliding, strict and
// Shadow limits), FailLocal decides all or nothing against each limit's
// share, as the model does with the shares for limits.
func TestFailLocalMatchesModelMixed(t *testing.T) {
	t.Parallel()
	const replicas = 3
	client := refusingClient(t)
	clk := clock.NewFake(epoch)
	l := ratelimit.New(client, ratelimit.WithClock(clk.Now),
		ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithReplicas(replicas),
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	share := func(limit ratelimit.Limit) ratelimit.Limit {
		limit.Rate, limit.Name = max(1, limit.Rate/replicas), ""
		return limit
	}
	m := newModel()
	ctx := context.Background()
	for step, o := range mixedTrace(6, 3000, tinyPool, "") {
		clk.Set(time.UnixMilli(o.at))
		where := fmt.Sprintf("step %d %v", step, o)
		if o.kind == opReset { // fails with Redis down; the local windows keep their counts
			require.Error(t, l.Reset(ctx, o.id, o.limit), where)
			continue
		}
		got, err := do(ctx, l, o)
		require.NoError(t, err, where)
		shared := o
		shared.limit = share(o.limit)
		shared.limits = nil
		for _, limit := range o.limits {
			shared.limits = append(shared.limits, share(limit))
		}
		want, err := m.apply(shared)
		require.NoError(t, err, where)
		limits := o.limits
		if limits == nil {
			limits = []ratelimit.Limit{o.limit}
		}
		for i := range want {
			want[i].Limit, want[i].Degraded = limits[i], true
		}
		require.Equal(t, want, ratelimit.PublicAll(got), where)
	}
	s := m.tally
	t.Logf("%+v", s)
	require.Greater(t, s.allowed, 300)
	require.Greater(t, s.denied, 300)
	require.Greater(t, s.partial, 30)
	require.Greater(t, s.strict, 30)
	require.Greater(t, s.shadowed, 30)
}

// Four replicas on FailLocal, each with its own process-local windows,
// together admit about the limit while Redis is down: each its quarter.
func TestFailLocalShares(t *testing.T) {
	t.Parallel()
	client := refusingClient(t)
	clk := clock.NewFake(epoch)
	limit := ratelimit.PerMinute(100)
	total := 0
	for range 4 {
		l := ratelimit.New(client, ratelimit.WithClock(clk.Now),
			ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithReplicas(4),
			ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
		for range 60 {
			res, err := l.Allow(context.Background(), "id", limit)
			require.NoError(t, err)
			require.True(t, res.Degraded)
			if res.Allowed {
				total++
			}
		}
	}
	require.Equal(t, 100, total)
}

// A caller that read the clock before another, across a window's end, and
// reaches FailLocal's table after it, is decided in the later window: it
// does not count itself in the earlier one over what the later caller
// counted, which would forget that count. It is decided where the later
// caller counted, not at an earlier moment that weighs the previous window
// more, in the same window too: its Count is what that caller left, never
// above the share (it was 3 of a share of 2, at the start of the window).
func TestFailLocalLateCaller(t *testing.T) {
	t.Parallel()
	client := refusingClient(t)
	clk := clock.NewFake(epoch)
	l := ratelimit.New(client, ratelimit.WithClock(clk.Now), ratelimit.WithFailurePolicy(ratelimit.FailLocal),
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	ctx := context.Background()
	limit := ratelimit.PerSecond(2)
	at := func(ms int64) {
		clk.Set(time.UnixMilli(epoch.UnixMilli()/1000*1000 + ms))
	}
	allow := func() ratelimit.Result {
		r, err := l.Allow(ctx, "id", limit)
		require.NoError(t, err)
		require.True(t, r.Degraded)
		return r
	}
	at(1900)
	require.True(t, allow().Allowed)
	require.True(t, allow().Allowed)
	at(2100) // 0 + floor(2 × 0.9) + 1 fits 2
	require.True(t, allow().Allowed)
	at(1950) // the late caller: 1 + floor(2 × 1) + 1 does not
	late := allow()
	require.False(t, late.Allowed, "%+v", late)
	require.Equal(t, int64(2), late.Count, "as the later caller left it: 1 + floor(2 × 0.9)")
	at(2100)
	require.False(t, allow().Allowed, "the later window's count stands")
	at(2900) // 1 + floor(2 × 0.1) + 1 fits 2
	require.True(t, allow().Allowed)
	at(2100) // the late caller in the same window
	late = allow()
	require.False(t, late.Allowed, "%+v", late)
	require.Equal(t, int64(2), late.Count, "2 + floor(2 × 0.1) where the later caller counted, not 2 + floor(2 × 0.9)")
}
