// Command userinstall is what .ci/run builds in a module of its own outside
// the repository, after `go get`ting this repository's modules from a
// module proxy directory made from the working tree: a user's first program
// with the core, the OpenTelemetry adapter and the gRPC interceptors. It
// decides a few requests against an embedded miniredis, with the metrics on,
// and prints what it saw.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
	ratelimitotel "github.com/slidingwindow/ratelimit/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func main() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()

	reader := sdkmetric.NewManualReader()
	obs, err := ratelimitotel.NewObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(client, ratelimit.WithObserver(obs))
	limit := ratelimit.Limit{Rate: 2, Window: 60e9, Name: "hello"}
	if _, err := grpclimit.NewUnary(limiter, limit); err != nil {
		log.Fatal(err)
	}
	for i := range 3 {
		res, err := limiter.Allow(context.Background(), "user-1", limit)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("request %d: allowed %v, remaining %d\n", i+1, res.Allowed, res.Remaining)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			fmt.Printf("metric %s\n", m.Name)
		}
	}
}
