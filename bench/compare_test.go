package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkAllow runs every contender where every request is allowed
// (10,000 ids, a limit no id reaches), BenchmarkDeny where one id is over
// its limit. Both need a Redis: REDIS_ADDR=127.0.0.1:6379 go test -bench .
// Keys get a prefix of their own and are deleted afterwards; nothing is
// flushed. run.sh is the fuller comparison: one process per contender,
// rounds, latency percentiles and memory.
func BenchmarkAllow(b *testing.B) { benchmarkScenario(b, "allowed") }

// BenchmarkDeny is BenchmarkAllow's other half: one abusive id, nearly
// every request denied.
func BenchmarkDeny(b *testing.B) { benchmarkScenario(b, "denied") }

// skipNote prints once why the benchmarks skip: go test prints b.Skip's
// reason only with -v.
var skipNote sync.Once

func benchmarkScenario(b *testing.B, scenario string) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		const why = "REDIS_ADDR is unset: set it to a redis-server's address (host:port) to run the comparison"
		skipNote.Do(func() { fmt.Fprintln(os.Stderr, "bench: skipping the benchmarks:", why) })
		b.Skip(why)
	}
	s, err := LookupScenario(scenario)
	if err != nil {
		b.Fatal(err)
	}
	opts := redis.Options{Addr: addr}
	client := redis.NewClient(&opts)
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil {
		b.Fatalf("Redis at %s: %v", addr, err)
	}
	for _, c := range Contenders() {
		if c.Offline && s.MinDenied > 0 {
			continue
		}
		b.Run(c.Name, func(b *testing.B) {
			prefix := fmt.Sprintf("bench-%d-", time.Now().UnixNano())
			b.Cleanup(func() { deleteKeys(b, client, prefix) })
			d, err := c.New(ctx, Env{Client: client, Options: opts, Limit: s.Limit, Now: time.Now})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { closeDecider(d) })
			ids := IDs(prefix, s.IDs)
			var allowed, denied, degraded, failed atomic.Int64
			var goroutine atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(goroutine.Add(1)*7919) % len(ids)
				var yes, no, worse, errs int64
				for pb.Next() {
					ok, err := d.Allow(ctx, ids[i])
					if i++; i == len(ids) {
						i = 0
					}
					switch {
					case errors.Is(err, ErrDegraded):
						worse++
					case err != nil:
						errs++
					case ok:
						yes++
					default:
						no++
					}
				}
				allowed.Add(yes)
				denied.Add(no)
				degraded.Add(worse)
				failed.Add(errs)
			})
			b.StopTimer()
			n := allowed.Load() + denied.Load()
			if degraded.Load() > 0 {
				b.Fatalf("%d decisions degraded: the failure policy decided, not Redis", degraded.Load())
			}
			if failed.Load() > 0 {
				b.Fatalf("%d calls failed", failed.Load())
			}
			if n > 0 {
				b.ReportMetric(float64(allowed.Load())/float64(n), "allowed/op")
			}
			res := RunResult{Decisions: n, Allowed: allowed.Load(), Denied: denied.Load()}
			// Too few decisions to judge (b.N starts at 1): a GCRA or window
			// lets the first few through.
			if problem := check(res, s, c.Offline); problem != "" && n >= 1000 {
				b.Fatal(problem)
			}
		})
	}
}

// deleteKeys deletes the keys that contain prefix.
func deleteKeys(tb testing.TB, client *redis.Client, prefix string) {
	ctx := context.Background()
	iter := client.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		tb.Errorf("scanning for keys to delete: %v", err)
		return
	}
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		if err := client.Del(ctx, keys[:n]...).Err(); err != nil {
			tb.Errorf("deleting keys: %v", err)
			return
		}
		keys = keys[n:]
	}
}
