package ratelimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// The short form packs a request's counts in one integer only while both
// are below 2^26: a count at or above it comes back in the long form's
// layout, for one request and for a batch in which the other requests'
// counts would pack, and every request is decided on its own counts.
func TestShortFormWideCounts(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"miniredis", func(t *testing.T) string { return miniredis.RunT(t).Addr() }},
		{"RedisServer", func(t *testing.T) string { return redistest.Start(t).Addr }},
	} {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			client := redis.NewClient(&redis.Options{Addr: b.addr(t)})
			t.Cleanup(func() { _ = client.Close() })
			clk := clock.NewFake(time.UnixMilli(1_700_002_800_000 + 15_000)) // a quarter into a minute
			l := New(client, WithClock(clk.Now), WithTimeout(time.Minute))
			limit := PerMinute(1 << 30)
			pos := locate(clk.Now().UnixMilli(), limit)
			// "wide" holds more than 2^26 in both windows, "narrow" a
			// count that packs, "new" nothing.
			stored := map[string][2]int64{"wide": {1<<27 + 5, 1<<26 + 3}, "narrow": {7, 2}, "new": {0, 0}}
			for id, c := range stored {
				keys := l.appendKeys(nil, id, pos)
				for i, n := range c {
					if n > 0 {
						require.NoError(t, client.Set(ctx, keys[i], n, time.Hour).Err())
					}
				}
			}
			for _, ids := range [][]string{{"wide"}, {"narrow", "wide", "new"}} {
				t.Run(fmt.Sprint(len(ids), " requests"), func(t *testing.T) {
					var reqs []*script.Request
					for _, id := range ids {
						reqs = append(reqs, l.newTestDecision(id, limit).reqs...)
					}
					require.True(t, script.ShortCall(reqs, false), "the call is in the short form")
					out := make([]script.Reply, len(reqs))
					require.NoError(t, l.t.Call(ctx, reqs, out))
					for i, id := range ids {
						require.NoError(t, out[i].Err, id)
						require.True(t, out[i].Allowed, id)
						c := stored[id]
						require.Equal(t, c[:], out[i].Counts, "%s: its counts before the request", id)
						c[0]++
						stored[id] = c
						got, err := client.Get(ctx, reqs[i].Keys[0]).Int64()
						require.NoError(t, err)
						require.Equal(t, c[0], got, "%s counted once", id)
					}
				})
			}
		})
	}
}
