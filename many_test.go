package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

func TestAllowManyMiniredis(t *testing.T) {
	t.Parallel()
	runAllowMany(t, miniredisEnv)
}

func TestAllowManyRedisServer(t *testing.T) {
	t.Parallel()
	runAllowMany(t, serverEnv(t))
}

func TestAllowManyRedisCluster(t *testing.T) {
	t.Parallel()
	mk := clusterEnv(t)
	runAllowMany(t, mk)
	t.Run("SlotsAndCalls", func(t *testing.T) { testAllowManySlots(t, mk(t)) })
}

// runAllowMany runs every test of AllowMany's meaning against one kind of
// Redis. On the Cluster, the ids of most tests ("user", "tenant") are in
// different slots: each is decided in a call of its own, and a refusal is
// given back.
func runAllowMany(t *testing.T, mk newEnv) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, env)
	}{
		{"AllOrNothing", testAllowManyAllOrNothing},
		{"OwnCosts", testAllowManyOwnCosts},
		{"ZeroCost", testAllowManyZeroCost},
		{"Shadow", testAllowManyShadow},
		{"OneIDTwoWindows", testAllowManyOneIDTwoWindows},
		{"InvalidInput", testAllowManyInvalidInput},
		{"RefundPerID", testAllowManyRefundPerID},
		{"Concurrent", testAllowManyConcurrent},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, mk(t)) })
	}
}

// userAndTenant is a request of a user of a tenant: cost 1 under each, a
// limit of 3 a minute for the user and 10 for the tenant.
func userAndTenant() []ratelimit.Quota {
	return []ratelimit.Quota{
		{ID: "user", Limit: ratelimit.PerMinute(3), Cost: 1},
		{ID: "tenant", Limit: ratelimit.PerMinute(10), Cost: 1},
	}
}

func testAllowManyAllOrNothing(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	e.clock.Set(epoch.Add(30 * time.Second))
	i := e.windowIndex(time.Minute)
	for n := int64(1); n <= 3; n++ {
		rs, err := l.AllowMany(ctx, userAndTenant())
		require.NoError(t, err)
		require.Len(t, rs, 2)
		require.True(t, rs[0].Allowed && rs[1].Allowed)
		require.Equal(t, n, rs[0].Count)
		require.Equal(t, 3-n, rs[0].Remaining)
		require.Equal(t, n, rs[1].Count)
		require.Equal(t, 10-n, rs[1].Remaining)
	}
	// The user's limit refuses: the tenant counts nothing either.
	rs, err := l.AllowMany(ctx, userAndTenant())
	require.NoError(t, err)
	require.False(t, rs[0].Allowed)
	require.False(t, rs[1].Allowed)
	require.Equal(t, int64(3), rs[0].Count)
	require.Positive(t, rs[0].RetryAfter, "the user's limit is the one that waits")
	require.Equal(t, int64(3), rs[1].Count)
	require.Zero(t, rs[1].RetryAfter, "the tenant's limit admits the request already")
	require.Equal(t, ratelimit.Binding(rs).Limit, rs[0].Limit)
	ratelimit.Settle(l) // on a Cluster, the tenant's slot gives back in the background
	require.Equal(t, int64(3), e.get(t, "user", time.Minute, i))
	require.Equal(t, int64(3), e.get(t, "tenant", time.Minute, i), "a refused request is counted under no id")
}

func testAllowManyOwnCosts(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	e.clock.Set(epoch.Add(10 * time.Second))
	i := e.windowIndex(time.Minute)
	quotas := []ratelimit.Quota{
		{ID: "user", Limit: ratelimit.PerMinute(10), Cost: 4},
		{ID: "tenant", Limit: ratelimit.PerMinute(10), Cost: 2},
	}
	rs, err := l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	require.True(t, rs[0].Allowed)
	require.Equal(t, []int64{4, 2}, []int64{rs[0].Count, rs[1].Count})
	require.Equal(t, []int64{6, 8}, []int64{rs[0].Remaining, rs[1].Remaining})
	require.Equal(t, int64(4), e.get(t, "user", time.Minute, i))
	require.Equal(t, int64(2), e.get(t, "tenant", time.Minute, i))
	// A second time both fit (the user at 8 of 10, the tenant at 4); a
	// third time the user's 4 do not fit the 2 left.
	_, err = l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	rs, err = l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	require.False(t, rs[0].Allowed)
	ratelimit.Settle(l) // on a Cluster, the tenant's slot gives back in the background
	require.Equal(t, int64(8), e.get(t, "user", time.Minute, i))
	require.Equal(t, int64(4), e.get(t, "tenant", time.Minute, i))
}

// A Cost of 0 counts nothing and refuses only an id already above its
// rate, as Envoy's hits_addend of 0 does.
func testAllowManyZeroCost(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	e.clock.Set(epoch.Add(20 * time.Second))
	i := e.windowIndex(time.Minute)
	quotas := []ratelimit.Quota{
		{ID: "user", Limit: ratelimit.PerMinute(5), Cost: 0},
		{ID: "tenant", Limit: ratelimit.PerMinute(100), Cost: 1},
	}
	rs, err := l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	require.True(t, rs[0].Allowed)
	require.Equal(t, int64(0), rs[0].Count)
	require.Equal(t, int64(0), e.get(t, "user", time.Minute, i))

	e.set(t, "user", time.Minute, 5, 0) // at its rate, not above it
	rs, err = l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	require.True(t, rs[0].Allowed)
	require.Equal(t, []int64{5, 0}, []int64{rs[0].Count, rs[0].Remaining})
	require.Equal(t, int64(2), e.get(t, "tenant", time.Minute, i))

	e.set(t, "user", time.Minute, 6, 0) // charged past it
	rs, err = l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	require.False(t, rs[0].Allowed)
	require.Equal(t, int64(6), rs[0].Count)
	require.Positive(t, rs[0].RetryAfter)
	ratelimit.Settle(l) // on a Cluster, the tenant's slot gives back in the background
	require.Equal(t, int64(6), e.get(t, "user", time.Minute, i))
	require.Equal(t, int64(2), e.get(t, "tenant", time.Minute, i), "refused: the tenant counts nothing")
}

// A Shadow quota decides nothing, and is counted when it alone admits its
// cost, as in AllowAll.
func testAllowManyShadow(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	e.clock.Set(epoch.Add(5 * time.Second))
	i := e.windowIndex(time.Minute)
	shadow := ratelimit.PerMinute(1)
	shadow.Shadow = true
	quotas := []ratelimit.Quota{
		{ID: "user", Limit: ratelimit.PerMinute(10), Cost: 1},
		{ID: "tenant", Limit: shadow, Cost: 1},
	}
	for n := int64(1); n <= 2; n++ {
		rs, err := l.AllowMany(ctx, quotas)
		require.NoError(t, err)
		require.True(t, rs[0].Allowed && rs[1].Allowed)
		require.Equal(t, n > 1, rs[1].Shadowed, "decision %d", n)
		require.Equal(t, n, e.get(t, "user", time.Minute, i))
	}
	require.Equal(t, int64(1), e.get(t, "tenant", time.Minute, i), "counted when it alone admitted")
}

func testAllowManyOneIDTwoWindows(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	e.clock.Set(epoch.Add(500 * time.Millisecond))
	quotas := []ratelimit.Quota{
		{ID: "user", Limit: ratelimit.PerSecond(2), Cost: 1},
		{ID: "user", Limit: ratelimit.PerMinute(3), Cost: 1},
	}
	for range 2 {
		rs, err := l.AllowMany(ctx, quotas)
		require.NoError(t, err)
		require.True(t, rs[0].Allowed)
	}
	rs, err := l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	require.False(t, rs[0].Allowed)
	require.Equal(t, int64(2), e.get(t, "user", time.Minute, e.windowIndex(time.Minute)))
}

func testAllowManyInvalidInput(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	tooMany := make([]ratelimit.Quota, 17)
	for i := range tooMany {
		tooMany[i] = ratelimit.Quota{ID: fmt.Sprint("id", i), Limit: ratelimit.PerMinute(10), Cost: 1}
	}
	for _, tc := range []struct {
		name   string
		quotas []ratelimit.Quota
		is     error
		says   string
	}{
		{"none", nil, ratelimit.ErrInvalidLimit, "no quotas"},
		{"too many", tooMany, ratelimit.ErrInvalidLimit, "17 quotas"},
		{"empty id", []ratelimit.Quota{{ID: "a", Limit: ratelimit.PerMinute(1), Cost: 1}, {Limit: ratelimit.PerMinute(1), Cost: 1}}, ratelimit.ErrInvalidID, "quota 1"},
		{"bad limit", []ratelimit.Quota{{ID: "a", Limit: ratelimit.Limit{Rate: 0, Window: time.Second}, Cost: 1}}, ratelimit.ErrInvalidLimit, "quota 0: invalid limit: rate 0"},
		{"negative cost", []ratelimit.Quota{{ID: "a", Limit: ratelimit.PerMinute(1), Cost: -1}}, ratelimit.ErrInvalidCost, "cost -1"},
		{"cost past 2^53", []ratelimit.Quota{{ID: "a", Limit: ratelimit.PerMinute(1), Cost: 1<<53 + 1}}, ratelimit.ErrInvalidCost, "2^53"},
		{"one count twice", []ratelimit.Quota{{ID: "a", Limit: ratelimit.PerMinute(1), Cost: 1}, {ID: "a", Limit: ratelimit.PerMinute(5), Cost: 1}}, ratelimit.ErrInvalidLimit, "quotas 0 and 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.AllowMany(ctx, tc.quotas)
			require.ErrorIs(t, err, tc.is)
			require.ErrorContains(t, err, tc.says)
		})
	}
	require.Empty(t, e.keys(t), "nothing is written for invalid input")
	_, err := ratelimit.New(nil).AllowMany(ctx, userAndTenant())
	require.ErrorIs(t, err, ratelimit.ErrNilClient)
}

// Each id's Results refund under that id, and only there.
func testAllowManyRefundPerID(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	e.clock.Set(epoch.Add(15 * time.Second))
	i := e.windowIndex(time.Minute)
	quotas := []ratelimit.Quota{
		{ID: "user", Limit: ratelimit.PerMinute(10), Cost: 3},
		{ID: "tenant", Limit: ratelimit.PerMinute(10), Cost: 3},
	}
	rs, err := l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	require.ErrorIs(t, l.Refund(ctx, "user", rs, 1), ratelimit.ErrInvalidCost, "the tenant's Result is not the user's")
	require.NoError(t, l.Refund(ctx, "user", rs[:1], 2))
	require.NoError(t, l.Refund(ctx, "tenant", rs[1:], 3))
	require.Equal(t, int64(1), e.get(t, "user", time.Minute, i))
	require.Equal(t, int64(0), e.get(t, "tenant", time.Minute, i))
}

// Racing requests leave exact counts: the user's limit admits exactly its
// rate, and the tenant counts exactly what was admitted (on a Cluster,
// once the refused requests' give-backs have landed).
func testAllowManyConcurrent(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	e.clock.Set(epoch.Add(40 * time.Second))
	i := e.windowIndex(time.Minute)
	quotas := []ratelimit.Quota{
		{ID: "user", Limit: ratelimit.PerMinute(20), Cost: 1},
		{ID: "tenant", Limit: ratelimit.PerMinute(1000), Cost: 1},
	}
	var allowed atomic.Int64
	var first firstError
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 8 {
				rs, err := l.AllowMany(ctx, quotas)
				if err != nil {
					first.report(err)
					return
				}
				if rs[0].Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, first.get())
	require.Equal(t, int64(20), allowed.Load())
	ratelimit.Settle(l) // the give-backs, on a Cluster
	require.Equal(t, int64(20), e.get(t, "user", time.Minute, i))
	require.Equal(t, int64(20), e.get(t, "tenant", time.Minute, i))
}

// sameSlot returns an id whose keys are in the slot of id's, on a Cluster.
func sameSlot(t *testing.T, id string) string {
	want := transport.HashSlot("{" + id + "}")
	for n := 0; n < 1_000_000; n++ {
		if other := fmt.Sprint("other-", n); transport.HashSlot("{"+other+"}") == want {
			return other
		}
	}
	t.Fatal("no id found in the slot of", id)
	return ""
}

// On a Cluster, ids of one slot are decided in one script call, atomically;
// ids of several slots in a call per slot, and a refusal gives back what
// the other slots counted, in one more call, in the background.
func testAllowManySlots(t *testing.T, e env) {
	calls := &scriptCalls{}
	e.client = hookedClient(t, e.client, calls)
	l := e.limiter()
	ctx := context.Background()
	e.clock.Set(epoch.Add(30 * time.Second))
	i := e.windowIndex(time.Minute)
	cc := e.client.(*redis.ClusterClient)
	slot := func(id string) int64 {
		n, err := cc.ClusterKeySlot(ctx, e.key(id, time.Minute, i)).Result()
		require.NoError(t, err)
		return n
	}
	user, tenant := "user", "tenant"
	require.NotEqual(t, slot(user), slot(tenant), "the test needs ids of two slots")
	mate := sameSlot(t, user)
	require.Equal(t, slot(user), slot(mate), "transport.Slot agrees with CLUSTER KEYSLOT")

	call := func(quotas []ratelimit.Quota) ([]ratelimit.Result, int64) {
		t.Helper()
		before := calls.n.Load()
		rs, err := l.AllowMany(ctx, quotas)
		require.NoError(t, err)
		return rs, calls.n.Load() - before
	}
	limit := ratelimit.PerMinute(1)
	_, n := call([]ratelimit.Quota{{ID: user, Limit: limit, Cost: 1}, {ID: mate, Limit: ratelimit.PerMinute(5), Cost: 1}})
	require.Equal(t, int64(1), n, "one slot, one call")
	rs, n := call([]ratelimit.Quota{{ID: user, Limit: limit, Cost: 1}, {ID: mate, Limit: ratelimit.PerMinute(5), Cost: 1}})
	require.False(t, rs[1].Allowed)
	require.Equal(t, int64(1), n, "refused in that one call: nothing to give back")
	require.Equal(t, int64(1), e.get(t, mate, time.Minute, i))

	before := calls.n.Load()
	rs, _ = call([]ratelimit.Quota{{ID: tenant, Limit: ratelimit.PerMinute(5), Cost: 1}, {ID: user, Limit: limit, Cost: 1}})
	require.False(t, rs[0].Allowed)
	// The give-back goes in the background, which the caller does not
	// wait for, and Close does.
	require.NoError(t, l.Close(ctx))
	require.Equal(t, int64(3), calls.n.Load()-before, "a call per slot, and the tenant's give-back")
	require.Equal(t, int64(0), e.get(t, tenant, time.Minute, i), "given back")
	require.Equal(t, int64(1), e.get(t, user, time.Minute, i))
}

// When Redis cannot decide, the failure policy decides every quota alike;
// FailLocal all or nothing against each quota's share. The clock is held
// still: on the real one, a minute's end between the calls would let the
// last one in.
func TestAllowManyFailurePolicies(t *testing.T) {
	ctx := context.Background()
	for _, p := range policyCases {
		t.Run(p.name, func(t *testing.T) {
			h := &errorLog{}
			l := ratelimit.New(downClient(t), p.with(ratelimit.WithErrorHandler(h.handle),
				ratelimit.WithClock(clock.NewFake(epoch.Add(30*time.Second)).Now))...)
			quotas := []ratelimit.Quota{
				{ID: "user", Limit: ratelimit.PerMinute(8), Cost: 1}, // a share of 2 under FailLocal
				{ID: "tenant", Limit: ratelimit.PerMinute(100), Cost: 1},
			}
			rs, err := l.AllowMany(ctx, quotas)
			for i, r := range rs {
				require.NoError(t, p.degraded(quotas[i].Limit, r, err), "quota %d", i)
			}
			require.Equal(t, "user", h.seen()[0], "reported for the first quota's id")
			if p.policy != ratelimit.FailLocal {
				return
			}
			_, err = l.AllowMany(ctx, quotas)
			require.NoError(t, err)
			rs, err = l.AllowMany(ctx, quotas)
			require.NoError(t, err)
			require.False(t, rs[0].Allowed, "the user's share of 2 is used")
			require.Equal(t, int64(2), rs[1].Count, "and the tenant counted only the two admitted")
		})
	}
}

// A caller whose ctx is done gets its error and no decision.
func TestAllowManyCallerGone(t *testing.T) {
	e := miniredisEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.limiter().AllowMany(ctx, userAndTenant())
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
}

// FailLocal's all or nothing holds under racing decisions of one process:
// exactly the share is admitted, and no count is lost.
func TestAllowManyFailLocalConcurrent(t *testing.T) {
	l := ratelimit.New(downClient(t), ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	quotas := []ratelimit.Quota{
		{ID: "a", Limit: ratelimit.PerHour(100), Cost: 1},
		{ID: "b", Limit: ratelimit.PerHour(1_000_000), Cost: 1},
	}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if rs, err := l.AllowMany(context.Background(), quotas); err == nil && rs[0].Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(100), allowed.Load())
	rs, err := l.AllowMany(context.Background(), quotas[1:])
	require.NoError(t, err)
	require.Equal(t, int64(101), rs[0].Count, "b counted the 100 admitted, and this one")
}

// A caller whose deadline passes while a Cluster's slots decide gets its
// ctx's error, and no decision.
func TestAllowManyCallerLeavesCluster(t *testing.T) {
	t.Parallel()
	e := clusterEnv(t)(t)
	slow := onCommand("evalsha", func() { time.Sleep(500 * time.Millisecond) }, nil) // a slow server, 10 times the caller's deadline; not a wait
	e.client = hookedClient(t, e.client, slow)
	l := e.limiter()
	mate := sameSlot(t, "user")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	rs, err := l.AllowMany(ctx, []ratelimit.Quota{
		{ID: "user", Limit: ratelimit.PerMinute(5), Cost: 1},
		{ID: mate, Limit: ratelimit.PerMinute(5), Cost: 1},
		{ID: "tenant", Limit: ratelimit.PerMinute(5), Cost: 1},
	})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	for _, r := range rs {
		require.False(t, r.Allowed)
	}
	// The calls go on, and then the give-backs: Close waits for them.
	require.NoError(t, l.Close(context.Background()))
}
