package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
)

// The examples run on an in-process miniredis and a clock that stands
// still, so that their output is the same on every run.
func exampleClient() (*redis.Client, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return client, func() { client.Close(); mr.Close() }
}

func fixedClock() time.Time { return epoch.Add(250 * time.Millisecond) } // 250ms into a second

func ExampleLimiter_Allow() {
	client, stop := exampleClient()
	defer stop()
	limiter := ratelimit.New(client, ratelimit.WithClock(fixedClock))

	for range 4 {
		res, err := limiter.Allow(context.Background(), "user-42", ratelimit.PerSecond(3))
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Printf("allowed=%v count=%d remaining=%d retry-after=%v\n",
			res.Allowed, res.Count, res.Remaining, res.RetryAfter)
	}
	// Output:
	// allowed=true count=1 remaining=2 retry-after=0s
	// allowed=true count=2 remaining=1 retry-after=0s
	// allowed=true count=3 remaining=0 retry-after=0s
	// allowed=false count=3 remaining=0 retry-after=751ms
}

// AllowN charges a request by its cost, say the rows of a bulk export.
func ExampleLimiter_AllowN() {
	client, stop := exampleClient()
	defer stop()
	limiter := ratelimit.New(client, ratelimit.WithClock(fixedClock))
	rows := ratelimit.PerMinute(1000)

	for _, n := range []int64{600, 300, 200, 5000} {
		res, err := limiter.AllowN(context.Background(), "tenant-7", rows, n)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		retry := res.RetryAfter.String()
		if res.RetryAfter == ratelimit.InfDuration {
			retry = "never" // the cost is above the rate
		}
		fmt.Printf("cost %4d: allowed=%-5v count=%d retry-after=%s\n", n, res.Allowed, res.Count, retry)
	}
	// Output:
	// cost  600: allowed=true  count=600 retry-after=0s
	// cost  300: allowed=true  count=900 retry-after=0s
	// cost  200: allowed=false count=900 retry-after=1m6.351s
	// cost 5000: allowed=false count=900 retry-after=never
}

// With Redis unreachable, FailOpen lets requests through and FailClosed
// turns them away; either way the Result says it was Degraded and the error
// handler hears of the Redis error.
func ExampleWithFailurePolicy() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	defer client.Close()
	mr.Close() // Redis is down

	quiet := ratelimit.WithErrorHandler(func(context.Context, string, error) {})
	for _, policy := range []ratelimit.FailurePolicy{ratelimit.FailOpen, ratelimit.FailClosed} {
		limiter := ratelimit.New(client, ratelimit.WithFailurePolicy(policy), quiet)
		res, err := limiter.Allow(context.Background(), "user-42", ratelimit.PerSecond(3))
		fmt.Printf("%s: allowed=%v degraded=%v unavailable-error=%v\n",
			policy, res.Allowed, res.Degraded, errors.Is(err, ratelimit.ErrUnavailable))
	}
	// Output:
	// FailOpen: allowed=true degraded=true unavailable-error=false
	// FailClosed: allowed=false degraded=true unavailable-error=true
}

// Peek tells where a client stands without using up anything.
func ExampleLimiter_Peek() {
	client, stop := exampleClient()
	defer stop()
	limiter := ratelimit.New(client, ratelimit.WithClock(fixedClock))
	limit := ratelimit.PerSecond(3)
	ctx := context.Background()

	limiter.Allow(ctx, "user-42", limit)
	res, _ := limiter.Peek(ctx, "user-42", limit)
	fmt.Printf("count=%d remaining=%d\n", res.Count, res.Remaining)
	res, _ = limiter.Peek(ctx, "user-42", limit)
	fmt.Printf("count=%d remaining=%d\n", res.Count, res.Remaining)
	// Output:
	// count=1 remaining=2
	// count=1 remaining=2
}

// Limits kept in configuration read as String prints them, or in
// ulule/limiter's short form.
func ExampleParseLimit() {
	for _, s := range []string{"100/1m", "10/1s strict shadow", "1000-H", "10/1s bogus"} {
		limit, err := ratelimit.ParseLimit(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(limit)
	}
	// Output:
	// 100/1m0s
	// 10/1s strict shadow
	// 1000/1h0m0s
	// ratelimit: invalid limit "10/1s bogus": unknown flag "bogus": want strict, shadow or leased
}
