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
)

// A stored value is a count only if INCRBY would take it: anything else, and
// a key of another type, fails the request that reads it alone, with
// ErrBadReply naming the limit, writes nothing and leaves the key as it
// was, whichever way the Limiter asks. That the other requests of a batch
// carrying it are decided as usual is internal/transport's
// TestForeignValuesInABatch.
func TestForeignValues(t *testing.T) {
	t.Parallel()
	backends := []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"miniredis", func(t *testing.T) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
		}},
		{"RedisServer", func(t *testing.T) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: redistest.Start(t).Addr})
		}},
		{"RedisCluster", func(t *testing.T) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.SharedCluster(t)})
		}},
	}
	limits := []Limit{PerMinute(10), {Rate: 10, Window: time.Minute, Strict: true}}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			client := b.client(t)
			t.Cleanup(func() { _ = client.Close() })
			for _, f := range redistest.Foreigners {
				for _, limit := range limits {
					t.Run(f.Name+"/"+limit.String(), func(t *testing.T) {
						testForeignValue(t, client, f, limit)
					})
				}
			}
		})
	}
}

func testForeignValue(t *testing.T, client redis.UniversalClient, f redistest.Foreign, limit Limit) {
	ctx := context.Background()
	clk := clock.NewFake(time.UnixMilli(1_700_002_800_000))
	var handled []error
	l := New(client, WithClock(clk.Now), WithPrefix(t.Name()), WithTimeout(time.Minute), WithFailurePolicy(FailClosed),
		WithErrorHandler(func(_ context.Context, _ string, err error) { handled = append(handled, err) }))
	pos := locate(clk.Now().UnixMilli(), &limit)
	keys := l.keys.Append(nil, "bad", pos)
	// the current window's key, and an older one that the limit still reads
	for _, key := range []string{keys[0], keys[len(keys)-1]} {
		t.Run(fmt.Sprint("key ", key[len(key)-2:]), func(t *testing.T) {
			require.NoError(t, client.Del(ctx, keys...).Err())
			require.NoError(t, f.Store(ctx, client, key))
			before, err := f.Dump(ctx, client, key)
			require.NoError(t, err)
			unchanged := func(how string) {
				t.Helper()
				after, err := f.Dump(ctx, client, key)
				require.NoError(t, err)
				require.Equal(t, before, after, "%s changed the key", how)
				ttl, err := client.PTTL(ctx, key).Result()
				require.NoError(t, err)
				require.Equal(t, time.Duration(-1), ttl, "%s gave the key a TTL", how)
				n, err := client.Exists(ctx, keys...).Result()
				require.NoError(t, err)
				require.Equal(t, int64(1), n, "%s wrote another key", how)
			}

			// One call, under each way of asking.
			handled = nil
			res, err := l.Allow(ctx, "bad", limit)
			require.ErrorIs(t, err, ErrUnavailable)
			require.ErrorIs(t, err, ErrBadReply)
			require.ErrorContains(t, err, limit.String())
			require.True(t, res.Degraded)
			_, err = l.Peek(ctx, "bad", limit)
			require.ErrorIs(t, err, ErrBadReply)
			_, err = l.AllowAll(ctx, "bad", []Limit{{Rate: 5, Window: time.Hour}, limit}, 1)
			require.ErrorIs(t, err, ErrBadReply)
			require.Len(t, handled, 3)
			unchanged("one call")
		})
	}
}
