// Command http serves a small API behind the rate-limit middleware. Each
// client is held to two limits at once, decided in one script call: a
// "burst" of 5 requests a second and an "hourly" quota of 100, counted by
// client address; paying clients, counted by API key, get 50 a second and
// 10000 an hour. Every address, whatever key it sends, is also held to 20
// requests a second ("per-ip", WithLimitsPer), decided with the plan in the
// same call. The free plan also tries a third limit, 30 a minute, in
// shadow mode: it is counted and logged when it would have denied, but it
// never denies and no header mentions it. The counts live in an embedded
// in-process Redis (miniredis), or a real one when REDIS_ADDR is set:
//
//	go run ./examples/http
//	REDIS_ADDR=localhost:6379 go run ./examples/http -addr :9090
//
// Behind a reverse proxy, name the proxies' ranges so that the client's
// address is read from X-Forwarded-For, and from nowhere else:
//
//	go run ./examples/http -trusted-proxies 10.0.0.0/8,fd00::/8
//
// It stops cleanly on Ctrl-C (SIGINT) or SIGTERM, letting requests in flight
// finish.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// paidKeys are the API keys of paying customers. A real service would look
// them up in its account store, through a cache.
var paidKeys = map[string]bool{"demo-paid-key": true}

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	trusted := flag.String("trusted-proxies", "", "comma-separated CIDR ranges of reverse proxies whose X-Forwarded-For to believe")
	flag.Parse()

	client, where, stopRedis := connect()
	defer stopRedis()
	limiter := ratelimit.New(client, ratelimit.WithPrefix("example-http"))

	known := func(key string) bool { return paidKeys[key] }
	// The free plan: the limit given to New, "burst", and the two of
	// WithLimits beside it, the last a trial: counted, never enforced,
	// never in a header.
	freeBurst := ratelimit.Limit{Name: "burst", Rate: 5, Window: time.Second}
	freeHourly := ratelimit.Limit{Name: "hourly", Rate: 100, Window: time.Hour}
	trial := ratelimit.Limit{Name: "per-minute", Rate: 30, Window: time.Minute, Shadow: true}
	paid := []ratelimit.Limit{
		{Name: "burst", Rate: 50, Window: time.Second},
		{Name: "hourly", Rate: 10000, Window: time.Hour},
	}
	opts := []httplimit.Option{
		httplimit.WithLimits(freeHourly, trial),
		// Authenticated traffic by API key; the rest, and unknown keys, by address.
		httplimit.WithKeys(httplimit.APIKey("X-API-Key", known)),
		httplimit.WithPlanFunc(func(r *http.Request) []ratelimit.Limit {
			if known(r.Header.Get("X-API-Key")) {
				return paid
			}
			return nil // the free plan
		}),
		httplimit.WithShadowHandler(func(r *http.Request, res ratelimit.Result) {
			log.Printf("shadow: %q would have denied %s %s (count %d of %d)",
				res.Limit.Name, r.Method, r.URL.Path, res.Count, res.Limit.Rate)
		}),
		httplimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		// Every address as well, paid keys included: one decision with the plan's.
		httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.Limit{Rate: 20, Window: time.Second}),
	}
	if *trusted != "" {
		proxies, err := parsePrefixes(*trusted)
		if err != nil {
			log.Fatalf("-trusted-proxies: %v", err)
		}
		opts = append(opts, httplimit.WithTrustedProxies("X-Forwarded-For", proxies...))
	}
	limit, err := httplimit.New(limiter, freeBurst, opts...)
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", hello)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })

	srv := &http.Server{Addr: *addr, Handler: limit(mux), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	base := "http://" + hostPort(ln.Addr())
	fmt.Printf("Listening on %s, counting in %s. Try:\n\n", base, where)
	fmt.Printf("  curl -i %s/hello                                  # free: 5 a second and 100 an hour per address\n", base)
	fmt.Printf("  curl -i -H 'X-API-Key: demo-paid-key' %s/hello    # paid: 50 a second and 10000 an hour per key, 20 a second per address\n", base)
	fmt.Printf("  for i in $(seq 6); do curl -s -o /dev/null -w '%%{http_code} ' %s/hello; done\n\n", base)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		log.Fatal(err)
	case <-ctx.Done():
	}
	stop() // a second Ctrl-C ends the program at once
	fmt.Println("Shutting down...")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Printf("shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		log.Printf("serve: %v", err)
	}
	// Once no handler runs: give back what leases hold, and wait for the
	// Limiter's work in the background, before the Redis client closes.
	if err := limiter.Close(shutdownCtx); err != nil {
		log.Printf("closing the limiter: %v", err)
	}
}

// hello answers with the caller's tier and, when Redis decided, what is left
// of each enforced limit, as the RateLimit header shows it. A Degraded
// Result (Redis down, FailOpen) has no real count, so, as the middleware's
// headers do, it reports none rather than a made-up one; a shadowed limit
// is not the client's business.
func hello(w http.ResponseWriter, r *http.Request) {
	tier := "free"
	if paidKeys[r.Header.Get("X-API-Key")] {
		tier = "paid"
	}
	body := map[string]any{"message": "hello", "tier": tier}
	if results, ok := httplimit.FromContextAll(r.Context()); ok {
		remaining := map[string]int64{}
		for _, res := range results {
			if !res.Degraded && !res.Limit.Shadow {
				remaining[res.Limit.Name] = res.Remaining
			}
		}
		if len(remaining) > 0 {
			body["remaining"] = remaining
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// connect returns a client of the Redis at REDIS_ADDR, or of an embedded
// miniredis when it is unset, a description of which, and a function that
// closes both. ContextTimeoutEnabled lets the client stop at the deadline
// the Limiter gives each decision. miniredis keeps expired windows until it
// stops (it does not run TTLs on the wall clock), which a demo can afford.
func connect() (redis.UniversalClient, string, func()) {
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

// parsePrefixes parses "10.0.0.0/8,fd00::/8"; a bare address is a /32 or /128.
func parsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p)
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a CIDR range nor an address", f)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// hostPort returns a listening address as a client would dial it: an
// unspecified host becomes localhost.
func hostPort(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}
