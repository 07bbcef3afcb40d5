package transport

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// sendBatch sends the requests of several decisions in one batch, as a
// batcher does: to tr's one server when node is nil, else to node, a master
// of tr's Cluster, as a cross-slot batch of a server made anew. It returns
// what each decision got.
func sendBatch(tr *Transport, node *redis.Client, decisions [][]*script.Request) []batchReply {
	srv := tr.one
	if node != nil {
		srv = tr.newServer(node.Options().Addr, node, true, true)
	}
	ctx := context.Background()
	batch := make([]*pending, len(decisions))
	for i, reqs := range decisions {
		batch[i] = newPending(ctx, ctx, reqs)
	}
	srv.batch.send(batch)
	out := make([]batchReply, len(batch))
	for i, p := range batch {
		out[i] = <-p.done
	}
	return out
}

// masterOf returns the client of the Cluster master that serves r.
func masterOf(t *testing.T, cc *redis.ClusterClient, r *script.Request) *redis.Client {
	t.Helper()
	node, err := cc.MasterForKey(context.Background(), r.Keys[0])
	require.NoError(t, err)
	return node
}

// A batch sent to a Cluster master that does not serve its keys (as after a
// resharding or a failover the client has not seen yet) is refused before
// the script writes anything, and goes again one decision per call through
// the Cluster client: every decision is made, and counted exactly once.
func TestClusterBatchRefusedGoesAgain(t *testing.T) {
	t.Parallel()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.SharedCluster(t), ContextTimeoutEnabled: true})
	tr := newTestTransport(t, cc)
	ctx := context.Background()

	// ids by master, and a master that serves none of some ids
	byNode := map[*redis.Client][]string{}
	for i := 0; len(byNode) < 3 || fewest(byNode) < 3; i++ {
		id := fmt.Sprint(t.Name(), "/id-", i)
		node := masterOf(t, cc, oneRequest(id, 10))
		byNode[node] = append(byNode[node], id)
	}
	var home, elsewhere *redis.Client
	for node := range byNode {
		if home == nil {
			home = node
		} else if elsewhere == nil {
			elsewhere = node
		}
	}
	for _, tc := range []struct {
		name string
		ids  []string // the batch: which master serves which id
	}{
		{"first id elsewhere (MOVED)", []string{byNode[elsewhere][0], byNode[home][0], byNode[home][1]}},
		{"a later id elsewhere (non local key)", []string{byNode[home][2], byNode[elsewhere][1], byNode[elsewhere][2]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			decisions := decisionsOf(tc.ids...)
			for i, r := range sendBatch(tr, home, decisions) {
				require.NoError(t, r.err, tc.ids[i])
				require.Len(t, r.replies, 1)
				require.True(t, r.replies[0].Allowed, tc.ids[i])
				require.Equal(t, int64(0), r.replies[0].Counts[0], "%s was counted before", tc.ids[i])
			}
			for i, id := range tc.ids {
				n, err := cc.Get(ctx, decisions[i][0].Keys[0]).Int64()
				require.NoError(t, err)
				require.Equal(t, int64(1), n, "%s counted once", id)
			}
			require.False(t, tr.crossOff.Load(), "a refused batch does not turn cluster batching off")
		})
	}
}

// fewest returns the fewest ids any master serves in m.
func fewest(m map[*redis.Client][]string) int {
	least := -1
	for _, ids := range m {
		if least < 0 || len(ids) < least {
			least = len(ids)
		}
	}
	return least
}

// A stored value is a count only if INCRBY would take it: anything else, and
// a key of another type, fails the request that reads it alone, with
// ErrBadReply naming the limit, in a batch of five on one server and on a
// Cluster master; it writes nothing and leaves the key as it was, and the
// other requests of the batch are decided as usual. (One call, under each
// way the Limiter asks, is the root's TestForeignValues.)
func TestForeignValuesInABatch(t *testing.T) {
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
	limits := []struct {
		name    string
		request func(id string) *script.Request
	}{
		{"10/1m0s", func(id string) *script.Request { return oneRequest(id, 10) }},
		{"10/1m0s strict", func(id string) *script.Request { return strictRequest(id, 10, 60_000) }},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			client := b.client(t)
			tr := newTestTransport(t, client)
			for _, f := range redistest.Foreigners {
				for _, limit := range limits {
					t.Run(f.Name+"/"+limit.name, func(t *testing.T) {
						testForeignInABatch(t, tr, client, f, limit.name, limit.request)
					})
				}
			}
		})
	}
}

func testForeignInABatch(t *testing.T, tr *Transport, client redis.UniversalClient, f redistest.Foreign, limit string, request func(id string) *script.Request) {
	ctx := context.Background()
	bad := t.Name() + "/bad"
	keys := request(bad).Keys
	// the current window's key, and an older one that the limit still reads
	for _, key := range []string{keys[0], keys[len(keys)-1]} {
		t.Run(fmt.Sprint("key ", key[len(key)-2:]), func(t *testing.T) {
			require.NoError(t, client.Del(ctx, keys...).Err())
			require.NoError(t, f.Store(ctx, client, key))
			before, err := f.Dump(ctx, client, key)
			require.NoError(t, err)

			// A batch of five, the bad id in the middle, on one server or
			// one Cluster master; the others' ids are the subtest's own.
			var ids []string
			var node *redis.Client
			if cc, ok := client.(*redis.ClusterClient); ok {
				node = masterOf(t, cc, request(bad))
				ids = sameMaster(t, cc, bad, t.Name(), request, 4)
			} else {
				require.NotNil(t, tr.one.batch)
				ids = []string{t.Name() + "/a", t.Name() + "/b", bad, t.Name() + "/c", t.Name() + "/d"}
			}
			var decisions [][]*script.Request
			for _, id := range ids {
				decisions = append(decisions, []*script.Request{request(id)})
			}
			for i, r := range sendBatch(tr, node, decisions) {
				require.NoError(t, r.err, "the call itself")
				if ids[i] == bad {
					require.ErrorIs(t, r.replies[0].Err, script.ErrBadReply)
					require.ErrorContains(t, r.replies[0].Err, limit)
					require.False(t, r.replies[0].Allowed)
					continue
				}
				require.NoError(t, r.replies[0].Err, ids[i])
				require.True(t, r.replies[0].Allowed, ids[i])
				n, err := client.Get(ctx, decisions[i][0].Keys[0]).Int64()
				require.NoError(t, err)
				require.Equal(t, int64(1), n, "%s counted once", ids[i])
			}

			after, err := f.Dump(ctx, client, key)
			require.NoError(t, err)
			require.Equal(t, before, after, "the batch changed the key")
			ttl, err := client.PTTL(ctx, key).Result()
			require.NoError(t, err)
			require.Equal(t, time.Duration(-1), ttl, "the batch gave the key a TTL")
			n, err := client.Exists(ctx, keys...).Result()
			require.NoError(t, err)
			require.Equal(t, int64(1), n, "the batch wrote another key")
		})
	}
}

// sameMaster returns id and n ids that start with prefix whose keys, as
// request makes them, are on id's Cluster master, with id in the middle.
func sameMaster(t *testing.T, cc *redis.ClusterClient, id, prefix string, request func(id string) *script.Request, n int) []string {
	t.Helper()
	home := masterOf(t, cc, request(id)).Options().Addr
	var ids []string
	for i := 0; len(ids) < n; i++ {
		if other := fmt.Sprint(prefix, "/id-", i); masterOf(t, cc, request(other)).Options().Addr == home {
			ids = append(ids, other)
		}
	}
	return append(append(ids[:n/2:n/2], id), ids[n/2:]...)
}

// In one call whose requests share a key, each charge is held to the count
// the ones before it wrote: a charge that fits once another was refused
// is counted, and a refused one writes nothing for the next to see.
func TestChargesPast2To53InOneCall(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			client := redis.NewClient(&redis.Options{Addr: b.addr(t)})
			tr := newTestTransport(t, client)
			charge := func(n int64) *script.Request {
				r := joined(oneRequest("u", 10), strictRequest("u", 10, time.Hour.Milliseconds()))
				r.Cost, r.Mode = n, script.ModeCharge
				return r
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
			require.NoError(t, tr.Do(ctx, reqs, out))
			for i, want := range []struct {
				ok   bool
				seen int64 // each limit's current count before the request
			}{{true, 0}, {false, 1<<53 - 2}, {true, 1<<53 - 2}, {false, 1 << 53}, {false, 1 << 53}} {
				r := out[i]
				if want.ok {
					require.NoError(t, r.Err, "charge %d", costs[i])
				} else {
					require.ErrorIs(t, r.Err, script.ErrInvalidCost, "charge %d", costs[i])
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

// The short form packs a request's counts in one integer only while both
// are below 2^26: a count at or above it comes back in the long form's
// layout, for one request and for a batch in which the other requests'
// counts would pack, and every request is decided on its own counts.
func TestShortFormWideCounts(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			client := redis.NewClient(&redis.Options{Addr: b.addr(t)})
			tr := newTestTransport(t, client)
			request := func(id string) *script.Request { return oneRequest(id, 1<<30) }
			// "wide" holds more than 2^26 in both windows, "narrow" a
			// count that packs, "new" nothing.
			stored := map[string][2]int64{"wide": {1<<27 + 5, 1<<26 + 3}, "narrow": {7, 2}, "new": {0, 0}}
			for id, c := range stored {
				keys := request(id).Keys
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
						reqs = append(reqs, request(id))
					}
					require.True(t, script.ShortCall(reqs, false), "the call is in the short form")
					out := make([]script.Reply, len(reqs))
					require.NoError(t, tr.Do(ctx, reqs, out))
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
