// Command quickstart shows the sliding window deciding requests around a
// window boundary. It runs against an embedded in-process Redis (miniredis),
// or a real one when REDIS_ADDR is set:
//
//	go run ./examples/quickstart
//	REDIS_ADDR=localhost:6379 go run ./examples/quickstart
//
// The requests are placed on a simulated clock, so the trace is the same on
// every run and needs no waiting.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
)

func main() {
	client, where, stop := connect()
	defer stop()

	// A simulated clock that starts on a whole second, so that offsets read
	// as positions in the one-second windows.
	now := time.Now().Truncate(time.Second).Add(time.Second)
	limiter := ratelimit.New(client,
		ratelimit.WithPrefix("quickstart"),
		ratelimit.WithClock(func() time.Time { return now }),
		ratelimit.WithFailurePolicy(ratelimit.FailClosed))
	limit := ratelimit.PerSecond(5)
	id := "demo-" + strconv.FormatInt(time.Now().UnixNano(), 36) // fresh counts every run

	fmt.Printf("Limit %d requests per second for client %q, on %s.\n", limit.Rate, id, where)
	fmt.Println("A fixed window would allow 5 more at 1.000s; the sliding window")
	fmt.Println("lets the 5 requests made at 0.800s fade out over the next second.")
	fmt.Println()
	fmt.Println("  time    decision  count  remaining  retry-after  reset-after")
	start := now
	for _, at := range []time.Duration{
		800, 800, 800, 800, 800, 900, 1000, 1199, 1200, 1400, 1600, 1601, 1800, 2000, 2999,
	} {
		now = start.Add(at * time.Millisecond)
		res, err := limiter.Allow(context.Background(), id, limit)
		if err != nil {
			log.Fatalf("Allow: %v", err)
		}
		decision := "allowed"
		if !res.Allowed {
			decision = "DENIED"
		}
		fmt.Printf("%7.3fs  %-8s  %5d  %9d  %11v  %11v\n",
			(at * time.Millisecond).Seconds(), decision, res.Count, res.Remaining, res.RetryAfter, res.ResetAfter)
	}
}

// connect returns a client of the Redis at REDIS_ADDR, or of a miniredis
// started here, with a word on which it is. ContextTimeoutEnabled lets the
// client stop at the deadline the Limiter gives each decision.
func connect() (redis.UniversalClient, string, func()) {
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, DialerRetries: 1})
		return client, "Redis at " + addr, func() { _ = client.Close() }
	}
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatalf("start miniredis: %v", err)
	}
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, DialerRetries: 1})
	return client, "an embedded miniredis (set REDIS_ADDR to use a real Redis)", func() {
		_ = client.Close()
		mr.Close()
	}
}
