package otel_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/slidingwindow/ratelimit"
	ratelimitotel "github.com/slidingwindow/ratelimit/otel"
)

// events are decisions as the core hands them over: allowed, near the
// limit, denied by Redis, denied by the deny cache.
func events() []*ratelimit.Event {
	limit := ratelimit.PerMinute(100)
	limit.Name = "api"
	result := func(allowed bool, count int64) []ratelimit.Result {
		return []ratelimit.Result{{Allowed: allowed, Count: count, Remaining: max(0, 100-count), Limit: limit}}
	}
	return []*ratelimit.Event{
		{Cost: 1, Allowed: true, Results: result(true, 10), Source: ratelimit.SourceRedis, Duration: 180 * time.Microsecond},
		{Cost: 1, Allowed: true, Results: result(true, 90), Source: ratelimit.SourceRedis, Duration: 210 * time.Microsecond},
		{Cost: 1, Allowed: false, Results: result(false, 100), Source: ratelimit.SourceRedis, Duration: 190 * time.Microsecond},
		{Cost: 1, Allowed: false, Results: result(false, 100), Source: ratelimit.SourceCache},
	}
}

// BenchmarkObserve is the Observer's cost per decision, with the SDK
// (what a service pays) and with the no-op MeterProvider (the adapter's own
// work). After the loop, the decisions counted must be b.N.
func BenchmarkObserve(b *testing.B) {
	evs := events()
	b.Run("sdk", func(b *testing.B) {
		reader := sdkmetric.NewManualReader()
		obs, err := ratelimitotel.NewObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			obs.Observe(ctx, evs[n%len(evs)])
			n++
		}
		b.StopTimer()
		if got := sumDecisions(b, reader); got != int64(n) {
			b.Fatalf("counted %d decisions of %d", got, n)
		}
	})
	b.Run("sdk/parallel", func(b *testing.B) {
		reader := sdkmetric.NewManualReader()
		obs, err := ratelimitotel.NewObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			n := 0
			for pb.Next() {
				obs.Observe(ctx, evs[n%len(evs)])
				n++
			}
		})
		b.StopTimer()
		if got := sumDecisions(b, reader); got != int64(b.N) {
			b.Fatalf("counted %d decisions of %d", got, b.N)
		}
	})
	b.Run("noop", func(b *testing.B) {
		obs, err := ratelimitotel.NewObserver(noop.NewMeterProvider())
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			obs.Observe(ctx, evs[n%len(evs)])
			n++
		}
	})
}

func sumDecisions(b *testing.B, reader *sdkmetric.ManualReader) int64 {
	var total int64
	for _, n := range collect(b, reader).decisions() {
		total += n
	}
	return total
}

// BenchmarkAllow is a decision without and with the Observer, on
// miniredis (which interprets the script slowly, in Go) and on a
// redis-server of the benchmark's own on a loopback port (skipped if none is
// installed): the difference is what observing adds to a round trip. Ids
// rotate over 1000 clients, each well within its limit.
func BenchmarkAllow(b *testing.B) {
	b.Run("miniredis", func(b *testing.B) {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			b.Fatal(err)
		}
		defer mr.Close()
		benchmarkAllow(b, mr.Addr())
	})
	b.Run("redis-server", func(b *testing.B) {
		benchmarkAllow(b, startRedisServer(b))
	})
}

func benchmarkAllow(b *testing.B, addr string) {
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer client.Close()
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = "client-" + strconv.Itoa(i)
	}
	limit := ratelimit.PerMinute(1 << 36)
	limit.Name = "api"
	for _, bc := range []struct {
		name string
		opts []ratelimit.Option
	}{
		{"without", nil},
		{"with", []ratelimit.Option{ratelimit.WithObserver(mustObserver(b))}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			// A generous timeout keeps a slow call on a busy machine from
			// being a degraded decision.
			opts := append(bc.opts, ratelimit.WithPrefix("bench-"+bc.name), ratelimit.WithTimeout(5*time.Second))
			l := ratelimit.New(client, opts...)
			ctx := context.Background()
			b.ReportAllocs()
			allowed, n := 0, 0
			for b.Loop() {
				res, err := l.Allow(ctx, ids[n%len(ids)], limit)
				if err != nil {
					b.Fatal(err)
				}
				if res.Allowed && !res.Degraded {
					allowed++
				}
				n++
			}
			if allowed != n {
				b.Fatalf("%d of %d allowed by Redis", allowed, n)
			}
		})
	}
}

func mustObserver(b *testing.B) *ratelimitotel.Observer {
	obs, err := ratelimitotel.NewObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))
	if err != nil {
		b.Fatal(err)
	}
	return obs
}
