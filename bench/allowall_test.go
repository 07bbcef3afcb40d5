package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
)

// planLimits are the limits of a plan with up to four windows, each loose
// enough that no request of the benchmark is denied.
var planLimits = []ratelimit.Limit{
	ratelimit.PerSecond(1_000_000),
	ratelimit.PerMinute(1_000_000),
	ratelimit.PerHour(1_000_000),
	{Rate: 1_000_000, Window: 24 * time.Hour},
}

// sink keeps the compiler from dropping the decisions.
var sink atomic.Int64

// BenchmarkAllowAll decides requests against k = 1 to 4 limits, either in
// one AllowAll (one script call, atomic: counted under every limit or none)
// or in k AllowN calls (k script calls; a request denied by a later limit
// is already counted under the earlier ones). An op is one decision of k
// limits, so ns/op and allocs/op compare the two directly. It runs with one
// goroutine (c=1: a round trip per call) and with 64 (c=64: Redis is the
// wall, and concurrent decisions share script calls by the library's
// default batching), on the library's defaults but for OursTimeout, over
// 10,000 ids.
//
// It needs a Redis: its own redis-server on a free loopback port, or the
// one at REDIS_ADDR (keys are prefixed and deleted; the Redis metrics,
// read from INFO, then include whatever else that server runs). Metrics:
// decisions/s, redis-µs/decision (EVALSHA time from INFO commandstats),
// calls/decision (script calls) and redis-cpu-µs/decision (INFO cpu).
//
//	cd bench && go test -run '^$' -bench AllowAll -benchtime 2s
func BenchmarkAllowAll(b *testing.B) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = startRedis(b)
	}
	opts := redis.Options{Addr: addr}
	client := redis.NewClient(&opts)
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil {
		b.Fatalf("Redis at %s: %v", addr, err)
	}
	for k := 1; k <= len(planLimits); k++ {
		limits := planLimits[:k]
		for _, conc := range []int{1, 64} {
			for _, mode := range []string{"allowall", "separate"} {
				b.Run(fmt.Sprintf("k=%d/c=%d/%s", k, conc, mode), func(b *testing.B) {
					benchmarkPlan(b, client, limits, conc, mode == "allowall")
				})
			}
		}
	}
}

func benchmarkPlan(b *testing.B, client *redis.Client, limits []ratelimit.Limit, conc int, together bool) {
	ctx := context.Background()
	prefix := fmt.Sprintf("bench-allowall-%d-", time.Now().UnixNano())
	b.Cleanup(func() { deleteKeys(b, client, prefix) })
	l := ratelimit.New(client, ratelimit.WithPrefix(prefix+"rl"), ratelimit.WithTimeout(OursTimeout))
	ids := IDs(prefix, 10_000)
	decide := func(id string) (bool, error) {
		if together {
			res, err := l.AllowAll(ctx, id, limits, 1)
			if err != nil || res[0].Degraded {
				return false, fmt.Errorf("AllowAll: %w, degraded %v", err, err == nil && res[0].Degraded)
			}
			return res[0].Allowed, nil
		}
		allowed := true
		for _, limit := range limits {
			res, err := l.AllowN(ctx, id, limit, 1)
			if err != nil || res.Degraded {
				return false, fmt.Errorf("AllowN: %w, degraded %v", err, err == nil && res.Degraded)
			}
			allowed = allowed && res.Allowed
		}
		return allowed, nil
	}
	before, err := readRedisStats(ctx, client)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if conc == 1 {
		var allowed int64
		for i := 0; b.Loop(); i++ {
			ok, err := decide(ids[i%len(ids)])
			if err != nil || !ok {
				b.Fatalf("decision %d: allowed %v, %v", i, ok, err)
			}
			allowed++
		}
		sink.Add(allowed)
	} else {
		// RunParallel starts parallelism × GOMAXPROCS goroutines.
		b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			var allowed int64
			for i := int(next.Add(7919)); pb.Next(); i++ {
				ok, err := decide(ids[i%len(ids)])
				if err != nil || !ok {
					b.Errorf("allowed %v, %v", ok, err)
					return
				}
				allowed++
			}
			sink.Add(allowed)
		})
	}
	b.StopTimer()
	after, err := readRedisStats(ctx, client)
	if err != nil {
		b.Fatal(err)
	}
	n := float64(b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric((after.scriptUs-before.scriptUs)/n, "redis-µs/decision")
	b.ReportMetric((after.scriptCalls-before.scriptCalls)/n, "calls/decision")
	b.ReportMetric((after.cpuUs-before.cpuUs)/n, "redis-cpu-µs/decision")
}
