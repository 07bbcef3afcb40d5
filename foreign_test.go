package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// foreign is something another program left under a key the Limiter reads.
type foreign struct {
	name  string
	store func(ctx context.Context, c redis.UniversalClient, key string) error
	// dump returns what the key holds, to check that nothing changed it.
	dump func(ctx context.Context, c redis.UniversalClient, key string) (string, error)
}

// foreignString is a string value that INCRBY would refuse, or that is not
// a count in [0, 2^53] (Lua's tonumber takes some of them).
func foreignString(v string) foreign {
	return foreign{
		name: strconv.Quote(v),
		store: func(ctx context.Context, c redis.UniversalClient, key string) error {
			return c.Set(ctx, key, v, 0).Err()
		},
		dump: func(ctx context.Context, c redis.UniversalClient, key string) (string, error) {
			return c.Get(ctx, key).Result()
		},
	}
}

var foreigners = []foreign{
	foreignString("5.0"), foreignString("1e3"), foreignString(" 7"), foreignString("7 "),
	foreignString("0x10"), foreignString("-0"), foreignString(""), foreignString("abc"),
	foreignString("-5"), foreignString("1.5"), foreignString("007"), foreignString("9007199254740993"),
	{
		name: "hash",
		store: func(ctx context.Context, c redis.UniversalClient, key string) error {
			return c.HSet(ctx, key, "f", "1").Err()
		},
		dump: func(ctx context.Context, c redis.UniversalClient, key string) (string, error) {
			m, err := c.HGetAll(ctx, key).Result()
			return fmt.Sprint(m), err
		},
	},
	{
		name: "list",
		store: func(ctx context.Context, c redis.UniversalClient, key string) error {
			return c.RPush(ctx, key, "1", "2").Err()
		},
		dump: func(ctx context.Context, c redis.UniversalClient, key string) (string, error) {
			l, err := c.LRange(ctx, key, 0, -1).Result()
			return fmt.Sprint(l), err
		},
	},
}

// A stored value is a count only if INCRBY would take it: anything else, and
// a key of another type, fails the request that reads it alone, with
// ErrBadReply naming the limit, writes nothing and leaves the key as it
// was; the other requests of the same call are decided as usual. On one
// call, a batch on one server and a batch on a Cluster master.
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
			for _, f := range foreigners {
				for _, limit := range limits {
					t.Run(f.name+"/"+limit.String(), func(t *testing.T) {
						testForeignValue(t, client, f, limit)
					})
				}
			}
		})
	}
}

func testForeignValue(t *testing.T, client redis.UniversalClient, f foreign, limit Limit) {
	ctx := context.Background()
	clk := clock.NewFake(time.UnixMilli(1_700_002_800_000))
	var handled []error
	l := New(client, WithClock(clk.Now), WithPrefix(t.Name()), WithTimeout(time.Minute), WithFailurePolicy(FailClosed),
		WithErrorHandler(func(_ context.Context, _ string, err error) { handled = append(handled, err) }))
	pos := locate(clk.Now().UnixMilli(), limit)
	keys := l.appendKeys(nil, "bad", pos)
	// the current window's key, and an older one that the limit still reads
	for _, key := range []string{keys[0], keys[len(keys)-1]} {
		t.Run(fmt.Sprint("key ", key[len(key)-2:]), func(t *testing.T) {
			require.NoError(t, client.Del(ctx, keys...).Err())
			require.NoError(t, f.store(ctx, client, key))
			before, err := f.dump(ctx, client, key)
			require.NoError(t, err)
			unchanged := func(how string) {
				t.Helper()
				after, err := f.dump(ctx, client, key)
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

			// A batch of five, the bad id in the middle, on one server or
			// one Cluster master.
			ids := []string{"a", "b", "bad", "c", "d"}
			var node *redis.Client
			if cc, ok := client.(*redis.ClusterClient); ok {
				ids = sameMaster(t, l, cc, "bad", limit, 4)
				var err error
				node, err = cc.MasterForKey(ctx, keys[0])
				require.NoError(t, err)
			} else {
				require.True(t, l.t.HasBatcher())
			}
			var batch [][]*script.Request
			for _, id := range ids {
				batch = append(batch, l.newTestDecision(id, limit).reqs)
			}
			for i, r := range l.t.SendBatch(ctx, node, batch) {
				require.NoError(t, r.Err, "the call itself")
				if ids[i] == "bad" {
					require.ErrorIs(t, r.Replies[0].Err, ErrBadReply)
					require.ErrorContains(t, r.Replies[0].Err, limit.String())
					require.False(t, r.Replies[0].Allowed)
					continue
				}
				require.NoError(t, r.Replies[0].Err, ids[i])
				require.True(t, r.Replies[0].Allowed, ids[i])
			}
			for _, id := range ids {
				if id == "bad" {
					continue
				}
				res, err := l.Peek(ctx, id, limit)
				require.NoError(t, err)
				require.Equal(t, int64(1), res.Count, "%s counted once", id)
				require.NoError(t, l.Reset(ctx, id, limit))
			}
			unchanged("a batch")
		})
	}
}

// sameMaster returns id and n more ids whose keys for limit are on id's
// Cluster master, with id in the middle.
func sameMaster(t *testing.T, l *Limiter, cc *redis.ClusterClient, id string, limit Limit, n int) []string {
	t.Helper()
	ctx := context.Background()
	master := func(id string) string {
		d := l.newTestDecision(id, limit)
		node, err := cc.MasterForKey(ctx, d.reqs[0].Keys[0])
		require.NoError(t, err)
		return node.Options().Addr
	}
	home := master(id)
	var ids []string
	for i := 0; len(ids) < n; i++ {
		if other := fmt.Sprint("id-", i); master(other) == home {
			ids = append(ids, other)
		}
	}
	return append(append(ids[:n/2:n/2], id), ids[n/2:]...)
}
