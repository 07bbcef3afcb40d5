package main

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
)

// The study's sliding, strict and count-denied deciders decide every
// request of a random trace as the library itself does, on a Redis
// (miniredis) with a clock moved to each request's time: window.go's
// arithmetic is the library's.
func TestDecidersAreTheLibrarys(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	const rate, w = 20, 1000 // ms
	for _, tc := range []struct {
		name        string
		strict      bool
		countDenied bool
		gap         int64 // the most ms between two requests
		new         func(limit) decider
	}{
		{"sliding", false, false, 60, func(l limit) decider { return &sliding{limit: l} }},
		{"strict", true, false, 60, func(l limit) decider { return &strict{limit: l, s: l.w / subWindows} }},
		// slower: a client that keeps above its limit stays denied in this mode
		{"count-denied", false, true, 200, func(l limit) decider { return &sliding{limit: l, countDenied: true} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var now time.Time
			l := ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithClock(func() time.Time { return now }),
				ratelimit.WithCountDenied(tc.countDenied), ratelimit.WithTimeout(time.Minute))
			lim := ratelimit.Limit{Rate: rate, Window: w * time.Millisecond, Strict: tc.strict}
			d := tc.new(limit{rate: rate, w: w})
			rng := rand.New(rand.NewPCG(1, 2))
			allowed, denied := 0, 0
			for at := int64(0); at < 30*w; at += rng.Int64N(tc.gap) {
				n := 1 + rng.Int64N(3)
				now = time.UnixMilli(at)
				res, err := l.AllowN(context.Background(), "client", lim, n)
				if err != nil || res.Degraded {
					t.Fatalf("at %d ms: %+v, %v", at, res, err)
				}
				if got := d.allow(at, n); got != res.Allowed {
					t.Fatalf("at %d ms, cost %d: the study's decider says %v, the library %v", at, n, got, res.Allowed)
				}
				if res.Allowed {
					allowed++
				} else {
					denied++
				}
			}
			if allowed < 100 || denied < 100 {
				t.Fatalf("the trace decided too little either way: %d allowed, %d denied", allowed, denied)
			}
		})
	}
}
