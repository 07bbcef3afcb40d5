package otel_test

import (
	"context"
	"fmt"
	"log"
	"slices"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/slidingwindow/ratelimit"
	ratelimitotel "github.com/slidingwindow/ratelimit/otel"
)

// An Observer on a MeterProvider (here with a ManualReader; in a service,
// an OTLP or Prometheus exporter), passed to the Limiter, and the Limiter
// passed back for the gauges.
func ExampleNewObserver() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := ratelimitotel.NewObserver(mp)
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(client, ratelimit.WithObserver(obs))
	if _, err := obs.ObserveLimiter(limiter); err != nil {
		log.Fatal(err)
	}

	limit := ratelimit.PerMinute(2)
	limit.Name = "api"
	for range 3 {
		if _, err := limiter.Allow(context.Background(), "user-42", limit); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range data.DataPoints {
				lines = append(lines, fmt.Sprintf("%s{%s} %d", m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value))
			}
		case metricdata.Histogram[float64]:
			for _, dp := range data.DataPoints {
				lines = append(lines, fmt.Sprintf("%s count %d", m.Name, dp.Count))
			}
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// ratelimit.decisions{ratelimit.outcome=allowed,ratelimit.policy=api,ratelimit.shadow=false,ratelimit.source=redis} 2
	// ratelimit.decisions{ratelimit.outcome=denied,ratelimit.policy=api,ratelimit.shadow=false,ratelimit.source=redis} 1
	// ratelimit.near_limit{ratelimit.policy=api} 1
	// ratelimit.redis.duration count 3
}
