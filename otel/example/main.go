// Command example serves a rate-limited /hello and the limiter's metrics in
// Prometheus text format on /metrics, through OpenTelemetry:
//
//	cd otel && go run ./example
//	for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code} ' localhost:8080/hello; done
//	curl -s localhost:8080/metrics | grep ^ratelimit_
//
// /hello allows 5 requests a second per client address. The counts live in
// an embedded miniredis, or in the Redis at REDIS_ADDR when it is set; ADDR
// is the address to listen on (default localhost:8080). It stops on Ctrl-C
// or SIGTERM.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
	ratelimitotel "github.com/slidingwindow/ratelimit/otel"
)

func main() {
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "localhost:8080"
	}
	client, where, stopRedis := connect()
	defer stopRedis()

	// The exporter is a Reader of the MeterProvider and a Collector of a
	// registry of its own, which /metrics serves.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(
		sdkmetric.WithReader(exporter),
		sdkmetric.WithResource(resource.NewSchemaless(attribute.String("service.name", "ratelimit-example"))),
	)
	defer func() { _ = mp.Shutdown(context.Background()) }()

	obs, err := ratelimitotel.NewObserver(mp)
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.New(client, ratelimit.WithPrefix("example-otel"), ratelimit.WithObserver(obs), ratelimit.WithDenyCache(10_000))
	if _, err := obs.ObserveLimiter(limiter); err != nil {
		log.Fatal(err)
	}

	limit := ratelimit.PerSecond(5)
	limit.Name = "hello" // the ratelimit_policy label, and the policy's name in the headers
	limited := httplimit.Middleware(limiter, limit)

	mux := http.NewServeMux()
	mux.Handle("GET /hello", limited(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	fmt.Printf("Listening on %s, counting in %s. Try:\n\n", base, where)
	fmt.Printf("  for i in $(seq 8); do curl -s -o /dev/null -w '%%{http_code} ' %s/hello; done\n", base)
	fmt.Printf("  curl -s %s/metrics | grep ^ratelimit_\n\n", base)

	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		log.Fatal(err)
	case <-ctx.Done():
	}
	stop()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Printf("shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		log.Printf("serve: %v", err)
	}
	if err := limiter.Close(shutdownCtx); err != nil { // after the server: no call runs
		log.Printf("closing the limiter: %v", err)
	}
}

// connect returns a client of the Redis at REDIS_ADDR, or of an embedded
// miniredis when it is unset, a description of which, and a function that
// closes both. ContextTimeoutEnabled lets the client stop at the deadline
// the Limiter gives each decision.
func connect() (*redis.Client, string, func()) {
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, DialerRetries: 1})
		return client, "Redis at " + addr, func() { _ = client.Close() }
	}
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatalf("miniredis: %v", err)
	}
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, DialerRetries: 1})
	return client, "an embedded miniredis (set REDIS_ADDR for a real Redis)", func() {
		_ = client.Close()
		mr.Close()
	}
}
