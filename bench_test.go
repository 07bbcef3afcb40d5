package ratelimit_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// benchIDs are the clients a benchmark spreads its requests over, so that
// it measures real reads and writes of many keys, not one hot key.
var benchIDs = func() []string {
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = "client-" + strconv.Itoa(i)
	}
	return ids
}()

// sink keeps the compiler from dropping the decisions.
var sink atomic.Int64

func BenchmarkAllow(b *testing.B) {
	b.Run("miniredis", func(b *testing.B) {
		mr := miniredis.RunT(b)
		benchAllow(b, newClient(b, &redis.Options{Addr: mr.Addr()}))
	})
	b.Run("redis-server", func(b *testing.B) {
		s := redistest.Start(b)
		benchAllow(b, newClient(b, &redis.Options{Addr: s.Addr, PoolSize: 64, ContextTimeoutEnabled: true}))
	})
	b.Run("redis-server/batching", func(b *testing.B) {
		s := redistest.Start(b)
		benchAllow(b, newClient(b, &redis.Options{Addr: s.Addr, PoolSize: 64, ContextTimeoutEnabled: true}), ratelimit.WithBatching(128))
	})
	// go-redis's defaults: the client ignores ctx deadlines, so the Limiter
	// watches the deadline from a goroutine of its own.
	b.Run("redis-server/client-defaults", func(b *testing.B) {
		s := redistest.Start(b)
		benchAllow(b, newClient(b, &redis.Options{Addr: s.Addr, PoolSize: 64}))
	})
}

// benchAllow runs Allow from parallel goroutines over benchIDs, with a
// limit high enough that every request is allowed and so written. A
// degraded decision fails the benchmark: it would measure the failure
// policy, not Redis. The timeout is long for that reason only; a decision
// costs the same whatever the timeout.
func benchAllow(b *testing.B, client *redis.Client, opts ...ratelimit.Option) {
	l := ratelimit.New(client, append(opts, ratelimit.WithTimeout(10*time.Second))...)
	limit := ratelimit.PerMinute(1 << 30)
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32) // 64 goroutines on 2 cores: enough in flight to keep Redis busy
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		var allowed int64
		for i := next.Add(7919); pb.Next(); i++ {
			res, err := l.Allow(ctx, benchIDs[i%int64(len(benchIDs))], limit)
			if err != nil || !res.Allowed || res.Degraded {
				b.Errorf("Allow: %v, allowed %v, degraded %v", err, res.Allowed, res.Degraded)
				return
			}
			allowed += res.Count
		}
		sink.Add(allowed)
	})
	b.StopTimer()
	reportRedisTime(b, client)
}

// reportRedisTime reports the Redis time the scripts took per decision, and
// decisions per script call, from the server's INFO commandstats.
func reportRedisTime(b *testing.B, client *redis.Client) {
	calls, usec, err := scriptStats(client)
	if err != nil || calls == 0 {
		return // miniredis has no commandstats
	}
	b.ReportMetric(usec/float64(b.N), "redis-µs/op")
	b.ReportMetric(float64(b.N)/calls, "decisions/call")
}

// scriptStats returns how many EVALSHA and EVAL calls the server has run,
// and the microseconds it spent on them, from INFO commandstats.
func scriptStats(client redis.UniversalClient) (calls, usec float64, err error) {
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		for _, name := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
				var c, u float64
				if _, err := fmt.Sscanf(rest, "calls=%g,usec=%g,", &c, &u); err != nil {
					return 0, 0, fmt.Errorf("commandstats line %q: %w", line, err)
				}
				calls, usec = calls+c, usec+u
			}
		}
	}
	return calls, usec, nil
}

// BenchmarkDenied is one abusive client hammering far past its limit, from
// parallel goroutines: every decision but the first few is a denial.
func BenchmarkDenied(b *testing.B) {
	s := redistest.Start(b)
	for _, tc := range []struct {
		name string
		opts []ratelimit.Option
	}{
		{"redis-server", nil},
		{"redis-server+denycache", []ratelimit.Option{ratelimit.WithDenyCache(10_000)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client := newClient(b, &redis.Options{Addr: s.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
			l := ratelimit.New(client, append(tc.opts, ratelimit.WithTimeout(10*time.Second))...)
			limit := ratelimit.PerHour(10)
			b.ReportAllocs()
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var denied int64
				for pb.Next() {
					res, err := l.Allow(context.Background(), "abuser", limit)
					if err != nil || res.Degraded {
						b.Errorf("Allow: %v, degraded %v", err, res.Degraded)
						return
					}
					if !res.Allowed {
						denied++
					}
				}
				sink.Add(denied)
			})
		})
	}
}

// BenchmarkLeased decides one hot id's requests against a Leased limit from
// parallel goroutines: after the first leases, almost every decision is made
// from this process's lease, without Redis.
func BenchmarkLeased(b *testing.B) {
	s := redistest.Start(b)
	client := newClient(b, &redis.Options{Addr: s.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	l := ratelimit.New(client, ratelimit.WithTimeout(10*time.Second))
	b.Cleanup(func() { ratelimit.DropLeases(l) })
	limit := ratelimit.Limit{Rate: 1 << 40, Window: time.Second, Leased: true}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := l.Allow(ctx, "hot", limit)
			if err != nil || !r.Allowed {
				b.Errorf("%+v, %v", r, err)
				return
			}
		}
	})
}

// BenchmarkSlots weighs what a concurrency slot costs Redis against what a
// rate decision does: one goroutine, each op an Acquire and its Release
// (two script calls), or one Allow (one), on redis-server, with the
// scripts' time inside Redis per op (redis-µs/op).
func BenchmarkSlots(b *testing.B) {
	client := redistest.Start(b).Client(b)
	l := ratelimit.New(client, ratelimit.WithTimeout(10*time.Second), ratelimit.WithBatching(1))
	ctx := context.Background()
	b.Run("acquire+release", func(b *testing.B) {
		c := ratelimit.Concurrency{Max: 1 << 20, Lease: time.Minute}
		before, usec, _ := scriptStats(client)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s, err := l.Acquire(ctx, benchIDs[i%len(benchIDs)], c)
			if err != nil || !s.Acquired {
				b.Fatalf("Acquire: %v, %+v", err, s)
			}
			if err := s.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		after, usecAfter, _ := scriptStats(client)
		b.ReportMetric((usecAfter-usec)/float64(b.N), "redis-µs/op")
		b.ReportMetric((after-before)/float64(b.N), "calls/op")
	})
	b.Run("allow", func(b *testing.B) {
		limit := ratelimit.PerMinute(1 << 30)
		before, usec, _ := scriptStats(client)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if res, err := l.Allow(ctx, benchIDs[i%len(benchIDs)], limit); err != nil || !res.Allowed {
				b.Fatalf("Allow: %v, %+v", err, res)
			}
		}
		after, usecAfter, _ := scriptStats(client)
		b.ReportMetric((usecAfter-usec)/float64(b.N), "redis-µs/op")
		b.ReportMetric((after-before)/float64(b.N), "calls/op")
	})
}
