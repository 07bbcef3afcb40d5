package ratelimit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// countBackends are the servers the tests of this file run on: the script
// on miniredis's Lua and on a real redis-server.
var countBackends = []struct {
	name string
	addr func(t *testing.T) string
}{
	{"miniredis", func(t *testing.T) string { return miniredis.RunT(t).Addr() }},
	{"RedisServer", func(t *testing.T) string { return redistest.Start(t).Addr }},
}

// A batch that carries a charge that would take a count past 2^53 fails
// that charge alone, with ErrInvalidCost and nothing of it written: the
// other decisions and charges of the call are made by Redis, and neither
// the error handler nor the breaker hears of it.
func TestBatchWithChargePast2To53(t *testing.T) {
	t.Parallel()
	for _, b := range countBackends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			client, hook, clk := heldClient(t, b.addr(t))
			var mu sync.Mutex
			var handled []error
			l := New(client, WithClock(clk.Now), WithTimeout(time.Minute),
				WithErrorHandler(func(_ context.Context, _ string, err error) {
					mu.Lock()
					defer mu.Unlock()
					handled = append(handled, err)
				}))
			limit := PerMinute(10)
			key := func(id string) string { return l.appendKeys(nil, id, locate(clk.Now().UnixMilli(), limit))[0] }
			for _, id := range []string{"big", "charged"} {
				require.NoError(t, client.Set(ctx, key(id), 1, time.Hour).Err())
			}
			charges := map[string]int64{"big": 1 << 53, "charged": 1<<53 - 1}
			decide := func(ctx context.Context, id string) (Result, error) {
				if n, ok := charges[id]; ok {
					rs, err := l.Charge(ctx, id, []Limit{limit}, n)
					return rs[0], err
				}
				return l.Allow(ctx, id, limit)
			}
			ids := []string{"a", "big", "charged", "c"}
			queued, held := batchAfterHeldWith(t, l, hook, decide, ids, ctx, nil)
			for _, o := range held {
				require.NoError(t, o.err)
				require.True(t, o.res.Allowed && !o.res.Degraded, "%+v", o)
			}
			o := queued["big"]
			require.ErrorIs(t, o.err, ErrInvalidCost)
			require.ErrorContains(t, o.err, "charge 9007199254740992 would take the count of limit 10/1m0s past 2^53 (it holds 1)")
			got, err := client.Get(ctx, key("big")).Result()
			require.NoError(t, err)
			require.Equal(t, "1", got, "nothing of the charge written")
			o = queued["charged"]
			require.NoError(t, o.err)
			require.Equal(t, int64(1<<53), o.res.Count, "a charge to 2^53 exactly is counted")
			for _, id := range []string{"a", "c"} {
				o := queued[id]
				require.NoError(t, o.err, id)
				require.False(t, o.res.Degraded, id)
				require.True(t, o.res.Allowed, id)
				require.Equal(t, int64(1), o.res.Count, id)
			}
			res, err := l.Allow(ctx, "big", limit)
			require.NoError(t, err)
			require.False(t, res.Degraded, "the key still holds a count")
			require.Equal(t, int64(2), res.Count)
			mu.Lock()
			defer mu.Unlock()
			require.Empty(t, handled)
			require.Zero(t, l.t.Failures(), "Redis answered")
		})
	}
}

// In one call whose requests share a key, each charge is held to the count
// the ones before it wrote: a charge that fits once another was refused
// is counted, and a refused one writes nothing for the next to see.
func TestChargesPast2To53InOneCall(t *testing.T) {
	t.Parallel()
	for _, b := range countBackends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			client := redis.NewClient(&redis.Options{Addr: b.addr(t)})
			t.Cleanup(func() { _ = client.Close() })
			clk := clock.NewFake(time.UnixMilli(1_700_002_800_000 + 15_000))
			l := New(client, WithClock(clk.Now), WithTimeout(time.Minute))
			sliding, strict := PerMinute(10), Limit{Rate: 10, Window: time.Hour, Strict: true}
			limits := []Limit{sliding, strict}
			charge := func(n int64) *script.Request {
				d := &decision{cost: n, limits: limits, results: make([]Result, len(limits)), kind: EventCharge}
				return l.build(d, "u", clk.Now().UnixMilli())[0]
			}
			// 2^53 - 2 fits; 3 more would pass 2^53; 2 more fit; then 1 more
			// would pass it; and a cost above 2^53, which Go would refuse,
			// the script refuses too.
			costs := []int64{1<<53 - 2, 3, 2, 1, 1<<53 + 1}
			var reqs []*script.Request
			for _, n := range costs {
				reqs = append(reqs, charge(n))
			}
			require.True(t, script.Repeats(reqs))
			out := make([]script.Reply, len(reqs))
			require.NoError(t, l.t.Call(ctx, reqs, out))
			for i, want := range []struct {
				ok   bool
				seen int64 // each limit's current count before the request
			}{{true, 0}, {false, 1<<53 - 2}, {true, 1<<53 - 2}, {false, 1 << 53}, {false, 1 << 53}} {
				r := out[i]
				if want.ok {
					require.NoError(t, r.Err, "charge %d", costs[i])
				} else {
					require.ErrorIs(t, r.Err, ErrInvalidCost, "charge %d", costs[i])
					require.ErrorContains(t, r.Err, "limit 10/1m0s past 2^53", "the first limit that would pass it is named")
				}
				require.Equal(t, want.seen, r.Counts[0], "charge %d", costs[i])
				require.Equal(t, want.seen, r.Counts[2], "charge %d: the strict limit's current sub-window", costs[i])
			}
			for _, k := range append(reqs[0].Keys[:1:1], reqs[0].Keys[2]) {
				got, err := client.Get(ctx, k).Int64()
				require.NoError(t, err)
				require.Equal(t, int64(1<<53), got, k)
			}
		})
	}
}
