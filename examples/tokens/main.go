// Command tokens serves a token-metered endpoint, as an AI gateway meters a
// model: each client may use 1,000 tokens a minute, but a completion's
// tokens are known only once it is generated. The request takes its
// estimate (max_tokens, 100 by default) up front with AllowN, and once the
// work is done the difference is charged (it used more) or refunded (it
// used less), so that the client's count is what it really used. The
// counts live in an embedded in-process Redis (miniredis), or a real one
// when REDIS_ADDR is set:
//
//	go run ./examples/tokens
//	curl -i 'localhost:8080/complete?max_tokens=300&used=120'   # 300 taken, 180 refunded
//	curl -i 'localhost:8080/complete?max_tokens=100&used=700'   # 100 taken, 600 charged
//	curl -i 'localhost:8080/complete?max_tokens=300'            # 429: 820 used, 300 do not fit
//	curl -i 'localhost:8080/complete?max_tokens=2000'           # 429, no Retry-After: 2,000 never fit
//
// The "used" parameter stands in for the tokens a model would generate.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
)

// tokens is each client's budget.
var tokens = ratelimit.Limit{Rate: 1000, Window: time.Minute, Name: "tokens"}

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	flag.Parse()
	redisAddr := os.Getenv("REDIS_ADDR")
	if redisAddr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		defer mr.Close()
		redisAddr = mr.Addr()
	}
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, DialerRetries: 1})
	defer func() { _ = client.Close() }()
	limiter := ratelimit.New(client)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /complete", func(w http.ResponseWriter, r *http.Request) { complete(limiter, w, r) })
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("listening on %s (Redis at %s)", *addr, redisAddr)
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}

// complete takes the estimate, does the work, and settles the difference.
func complete(limiter *ratelimit.Limiter, w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	client, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		client = r.RemoteAddr
	}
	estimate := param(r, "max_tokens", 100)
	res, err := limiter.AllowN(ctx, client, tokens, estimate)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest) // an invalid max_tokens
		return
	}
	if !res.Allowed {
		if res.RetryAfter == ratelimit.InfDuration {
			// No wait makes it fit: name no time to retry at.
			http.Error(w, fmt.Sprintf("%d tokens never fit in %d a minute", estimate, tokens.Rate), http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(res.RetryAfter.Seconds())), 10))
		http.Error(w, fmt.Sprintf("%d tokens used of %d a minute; %d do not fit", res.Count, tokens.Rate, estimate), http.StatusTooManyRequests)
		return
	}
	used := max(0, param(r, "used", estimate)) // the model's work, simulated
	// The work is done: settle it even if the client has left.
	done := context.WithoutCancel(ctx)
	var settle error
	switch {
	case used > estimate:
		_, settle = limiter.Charge(done, client, []ratelimit.Limit{tokens}, used-estimate)
	case used < estimate:
		settle = limiter.Refund(done, client, []ratelimit.Result{res}, estimate-used)
	}
	if settle != nil {
		log.Printf("settling %s's tokens: %v", client, settle) // the work is done: answer all the same
	}
	now, _ := limiter.Peek(ctx, client, tokens)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int64{"estimated": estimate, "used": used, "count": now.Count, "remaining": now.Remaining})
}

// param returns the integer query parameter name, or def.
func param(r *http.Request, name string, def int64) int64 {
	n, err := strconv.ParseInt(r.URL.Query().Get(name), 10, 64)
	if err != nil {
		return def
	}
	return n
}
