// Command probe makes one operation against the Redis at REDIS_ADDR, after
// a warm-up one, between two calls of marker: what callpath reads from a
// Delve trace of it (see ../main.go). PROBE_OP names the operation:
// allowall (the default: an AllowAll of two limits), allow, allowmany,
// charge, refund, giveback or acquire.
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

// marker marks the start and the end of the traced operation.
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
	op, ok := ops[os.Getenv("PROBE_OP")]
	if !ok {
		log.Fatalf("probe: PROBE_OP %q is none of allowall, allow, allowmany, charge, refund, giveback, acquire", os.Getenv("PROBE_OP"))
	}
	if err := op(ctx, l, "probe-warm", limits, func() {}); err != nil { // connections made, scripts loaded
		log.Fatal(err)
	}
	if err := op(ctx, l, "probe", limits, marker); err != nil {
		log.Fatal(err)
	}
	fmt.Println("done")
}

// ops are the operations the probe traces: each runs its operation
// between two calls of mark, after what it needs (the decision a refund
// gives back).
var ops = map[string]func(ctx context.Context, l *ratelimit.Limiter, id string, limits []ratelimit.Limit, mark func()) error{
	"": func(ctx context.Context, l *ratelimit.Limiter, id string, limits []ratelimit.Limit, mark func()) error {
		return allowAll(ctx, l, id, limits, mark)
	},
	"allowall": allowAll,
	"allow": func(ctx context.Context, l *ratelimit.Limiter, id string, limits []ratelimit.Limit, mark func()) error {
		mark()
		_, err := l.Allow(ctx, id, limits[0])
		mark()
		return err
	},
	"allowmany": func(ctx context.Context, l *ratelimit.Limiter, id string, limits []ratelimit.Limit, mark func()) error {
		quotas := []ratelimit.Quota{{ID: id, Limit: limits[0], Cost: 1}, {ID: id + "-tenant", Limit: limits[1], Cost: 1}}
		mark()
		_, err := l.AllowMany(ctx, quotas)
		mark()
		return err
	},
	"charge": func(ctx context.Context, l *ratelimit.Limiter, id string, limits []ratelimit.Limit, mark func()) error {
		mark()
		_, err := l.Charge(ctx, id, limits, 1)
		mark()
		return err
	},
	"refund": func(ctx context.Context, l *ratelimit.Limiter, id string, limits []ratelimit.Limit, mark func()) error {
		results, err := l.AllowAll(ctx, id, limits, 2)
		if err != nil {
			return err
		}
		mark()
		err = l.Refund(ctx, id, results, 1)
		mark()
		return err
	},
	"giveback": func(ctx context.Context, l *ratelimit.Limiter, id string, limits []ratelimit.Limit, mark func()) error {
		mark()
		err := l.GiveBack(ctx, id, limits, 1)
		mark()
		return err
	},
	"acquire": func(ctx context.Context, l *ratelimit.Limiter, id string, limits []ratelimit.Limit, mark func()) error {
		mark()
		s, err := l.Acquire(ctx, id, ratelimit.Concurrency{Max: 10, Lease: time.Minute})
		mark()
		if err == nil {
			err = s.Release(ctx)
		}
		return err
	},
}

func allowAll(ctx context.Context, l *ratelimit.Limiter, id string, limits []ratelimit.Limit, mark func()) error {
	mark()
	_, err := l.AllowAll(ctx, id, limits, 1)
	mark()
	return err
}
