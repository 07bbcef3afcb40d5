// Command probe makes one AllowAll of two limits against the Redis at
// REDIS_ADDR, after a warm-up one, between two calls of marker: what
// callpath reads from a Delve trace of it (see ../main.go).
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
)

// marker marks the start and the end of the traced decision.
//
//go:noinline
func marker() {}

func main() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		log.Fatal("probe: set REDIS_ADDR to a Redis it may write ratelimit:{probe}:… keys to")
	}
	// A timeout a traced program cannot miss: under Delve every call stops
	// at a breakpoint.
	l := ratelimit.New(redis.NewClient(&redis.Options{Addr: addr}), ratelimit.WithTimeout(time.Minute))
	limits := []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(100)}
	ctx := context.Background()
	if _, err := l.AllowAll(ctx, "probe-warm", limits, 1); err != nil { // connections made, script loaded
		log.Fatal(err)
	}
	marker()
	results, err := l.AllowAll(ctx, "probe", limits, 1)
	marker()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("allowed:", results[0].Allowed)
}
