// Command concurrency serves an export endpoint whose requests take
// seconds, and lets each user run at most 2 of them at once, across every
// server sharing the Redis (ratelimit.Concurrency through
// httplimit.WithConcurrency), besides a rate limit of 10 exports a minute.
// The user is the X-User header. A server that dies mid-export cannot keep
// its slots: they return when their lease ends. The counts live in an
// embedded in-process Redis (miniredis), or a real one when REDIS_ADDR is
// set:
//
//	go run ./examples/concurrency
//	for i in 1 2 3; do curl -s -o /dev/null -w '%{http_code} %header{retry-after}\n' -H 'X-User: alice' localhost:8080/export & done; wait
//
// prints 200 twice (after the export's 3 s) and 429 with a Retry-After
// once, at once. It stops on Ctrl-C (SIGINT) or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	work := flag.Duration("work", 3*time.Second, "how long an export takes")
	flag.Parse()

	client, where, stop := connect()
	defer stop()
	limiter := ratelimit.New(client, ratelimit.WithPrefix("example-concurrency"))
	// A lease a little longer than the slowest export: a slot a dead server held
	// returns within it, and a client refused is told to retry within it.
	exports := ratelimit.Concurrency{Max: 2, Lease: 10 * time.Second, Name: "exports"}
	perMinute := ratelimit.Limit{Name: "per-minute", Rate: 10, Window: time.Minute}
	mw, err := httplimit.New(limiter, perMinute,
		httplimit.WithKeys(func(r *http.Request) string {
			if u := r.Header.Get("X-User"); u != "" {
				return "user:" + u
			}
			return "" // by address
		}),
		httplimit.WithConcurrency(exports))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /export", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // the export's work; a client that leaves frees its slot
		case <-time.After(*work):
		case <-r.Context().Done():
			return
		}
		fmt.Fprintln(w, "export done")
	})))
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		<-ctx.Done()
		shutdown, done := context.WithTimeout(context.Background(), 10*time.Second)
		defer done()
		_ = srv.Shutdown(shutdown) // the exports under way finish, and release their slots
		if err := limiter.Close(shutdown); err != nil {
			log.Printf("closing the limiter: %v", err)
		}
	}()
	log.Printf("exports on %s: 2 at once and 10 a minute per user (X-User), counted in %s", *addr, where)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
	<-closed
}

// connect returns a client of the Redis at REDIS_ADDR, or of an embedded
// miniredis when it is not set.
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
