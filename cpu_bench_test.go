package ratelimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// BenchmarkRedisCPU measures what a decision costs Redis itself: the
// microseconds of script time per decision from INFO commandstats, summed
// over every master, and so decisions per second per Redis core
// (1e6 / redis-µs/op). It runs 64 goroutines on one redis-server and on a
// 3-master Cluster, over 10,000 ids and on one hot id, batched (the
// default) and not.
//
//	go test -run '^$' -bench RedisCPU -benchtime 3s .
func BenchmarkRedisCPU(b *testing.B) {
	server := redistest.Start(b)
	single := func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: server.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	}
	addrs := redistest.SharedCluster(b)
	cluster := func() redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64, ContextTimeoutEnabled: true})
	}
	for _, where := range []string{"redis-server", "cluster"} {
		for _, ids := range []string{"many-ids", "hot-id"} {
			for _, batch := range []int{ratelimit.DefaultBatch, 1} {
				name := where + "/" + ids + "/batched"
				if batch == 1 {
					name = where + "/" + ids + "/unbatched"
				}
				b.Run(name, func(b *testing.B) {
					mk := single
					if where == "cluster" {
						mk = cluster
					}
					benchCPU(b, mk(), ratelimit.PerMinute(1<<30), ids == "hot-id", ratelimit.WithBatching(batch), ratelimit.WithPrefix(b.Name()))
				})
			}
		}
	}
}

// benchCPU runs Allow against limit from 64 goroutines, over benchIDs or
// on one hot id, and reports Redis µs per decision and decisions per call.
func benchCPU(b *testing.B, client redis.UniversalClient, limit ratelimit.Limit, hot bool, opts ...ratelimit.Option) {
	b.Cleanup(func() { _ = client.Close() })
	l := ratelimit.New(client, append(opts, ratelimit.WithTimeout(10*time.Second))...)
	callsBefore, before, err := commandStats(client)
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		var counted int64
		for i := next.Add(7919); pb.Next(); i++ {
			id := "hot"
			if !hot {
				id = benchIDs[i%int64(len(benchIDs))]
			}
			res, err := l.Allow(ctx, id, limit)
			if err != nil || !res.Allowed || res.Degraded {
				b.Errorf("Allow: %v, allowed %v, degraded %v", err, res.Allowed, res.Degraded)
				return
			}
			counted += res.Count
		}
		sink.Add(counted)
	})
	b.StopTimer()
	calls, after, err := commandStats(client)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric((after-before)/float64(b.N), "redis-µs/op")
	b.ReportMetric(float64(b.N)/(calls-callsBefore), "decisions/call")
}

// commandStats sums the script calls and their microseconds over every
// master of client.
func commandStats(client redis.UniversalClient) (calls, usec float64, err error) {
	cc, ok := client.(*redis.ClusterClient)
	if !ok {
		return scriptStats(client)
	}
	var total, us atomic.Int64
	err = cc.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		c, u, err := scriptStats(node)
		total.Add(int64(c))
		us.Add(int64(u))
		return err
	})
	return float64(total.Load()), float64(us.Load()), err
}

// BenchmarkStrictCost compares what a strict limit costs Redis with the
// sliding window's: script µs per decision, unbatched and batched, over
// 10,000 ids, and the bytes of Redis memory per client the keys take
// (MEMORY USAGE summed over one client's keys).
//
//	go test -run '^$' -bench StrictCost -benchtime 2s .
func BenchmarkStrictCost(b *testing.B) {
	server := redistest.Start(b)
	for _, strict := range []bool{false, true} {
		for _, batch := range []int{1, ratelimit.DefaultBatch} {
			name := map[bool]string{false: "sliding", true: "strict"}[strict] + map[bool]string{true: "/unbatched", false: "/batched"}[batch == 1]
			b.Run(name, func(b *testing.B) {
				client := redis.NewClient(&redis.Options{Addr: server.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
				prefix := b.Name()
				limit := ratelimit.Limit{Rate: 1 << 30, Window: time.Minute, Strict: strict}
				benchCPU(b, client, limit, false, ratelimit.WithBatching(batch), ratelimit.WithPrefix(prefix))
				// Redis memory per client: every key of one client that has
				// used the limit for a full Window, one request per sub-window.
				ctx := context.Background()
				var bytes int64
				for k := int64(0); k <= ratelimit.StrictSubWindows; k++ {
					at := time.UnixMilli(k * limit.Window.Milliseconds() / ratelimit.StrictSubWindows)
					m := ratelimit.New(client, ratelimit.WithPrefix(prefix+"/mem"), ratelimit.WithClock(func() time.Time { return at }))
					if _, err := m.Allow(ctx, "client", limit); err != nil {
						b.Fatal(err)
					}
				}
				keys, err := client.Keys(ctx, "*"+prefix+"/mem*").Result()
				if err != nil {
					b.Fatal(err)
				}
				for _, k := range keys {
					bytes += client.MemoryUsage(ctx, k).Val()
				}
				b.ReportMetric(float64(bytes), "redis-B/client")
			})
		}
	}
}
