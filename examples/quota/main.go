// Command quota meters tokens per tenant per calendar month, as a billing
// plan does: each tenant may use 1,000 tokens a month, starting again at
// midnight on the 1st in the tenant's own time zone, and no more than 2
// requests a second. A request needs the burst limit's room and one token
// of the month; once the work is done, the tokens it really used are
// charged with Charge (a request may take the month past its budget: the
// next ones are refused until the month ends). The counts live in an
// embedded in-process Redis (miniredis), or a real one when REDIS_ADDR is
// set:
//
//	go run ./examples/quota
//	curl -s -H 'X-Tenant: acme' 'localhost:8080/complete?used=400'  # 200: acme (New York) has used 400 of 1,000 this month
//	curl -s -H 'X-Tenant: acme' 'localhost:8080/complete?used=700'  # 200: charged after the work, 1,100 used
//	curl -i -H 'X-Tenant: acme' 'localhost:8080/complete?used=10'   # 429: Retry-After is the seconds to the 1st, New York time
//	curl -s -H 'X-Tenant: globex' 'localhost:8080/complete'         # 200: globex's month is its own, in Kolkata
//	for i in 1 2 3; do curl -s -o /dev/null -w '%{http_code} ' -H 'X-Tenant: globex' localhost:8080/complete; done  # 200 429 429: 2 a second
//
// The "used" parameter stands in for the tokens a model would generate
// (1 when it is absent).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
	_ "time/tzdata" // the tenants' zones, wherever the program runs

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
)

// tenants are the tenants this server knows, each with its time zone.
var tenants = map[string]string{"acme": "America/New_York", "globex": "Asia/Kolkata"}

// burst holds each tenant to 2 requests in any second.
var burst = ratelimit.Limit{Rate: 2, Window: time.Second, Name: "burst"}

// budget is a tenant's tokens per calendar month in its zone.
func budget(zone *time.Location) ratelimit.Limit {
	return ratelimit.Limit{Rate: 1000, Calendar: ratelimit.Monthly, Location: zone, Name: "monthly-tokens"}
}

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
	s, err := newServer(ratelimit.New(client))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /complete", s.complete)
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

// server meters the tenants' requests.
type server struct {
	limiter *ratelimit.Limiter
	zones   map[string]*time.Location // each tenant's, loaded once
}

func newServer(limiter *ratelimit.Limiter) (*server, error) {
	s := &server{limiter: limiter, zones: map[string]*time.Location{}}
	for tenant, name := range tenants {
		zone, err := time.LoadLocation(name)
		if err != nil {
			return nil, err
		}
		s.zones[tenant] = zone
	}
	return s, nil
}

// complete admits a request against the burst limit and the month's
// budget, does the work, then charges the tokens it used.
func (s *server) complete(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get("X-Tenant")
	zone, ok := s.zones[tenant]
	if !ok {
		http.Error(w, "unknown tenant: set X-Tenant to acme or globex", http.StatusForbidden)
		return
	}
	month := budget(zone)
	// All or nothing: a request the burst limit refuses takes no token,
	// and one the month refuses takes no room in the burst limit.
	results, err := s.limiter.AllowMany(r.Context(), []ratelimit.Quota{
		{ID: tenant, Limit: burst, Cost: 1},
		{ID: tenant, Limit: month, Cost: 1},
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if binding := ratelimit.Binding(results); !binding.Allowed {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((binding.RetryAfter+time.Second-1)/time.Second), 10))
		http.Error(w, fmt.Sprintf("%s: %d of %d used", binding.Limit.Name, binding.Count, binding.Limit.Rate), http.StatusTooManyRequests)
		return
	}
	used := max(1, param(r, "used", 1)) // the model's work, simulated
	// The work is done: charge what it used beyond the token admitted,
	// even if the client has left.
	if used > 1 {
		if _, err := s.limiter.Charge(context.WithoutCancel(r.Context()), tenant, []ratelimit.Limit{month}, used-1); err != nil {
			log.Printf("charging %s's tokens: %v", tenant, err) // the work is done: answer all the same
		}
	}
	now, err := s.limiter.Peek(r.Context(), tenant, month)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	start, end := month.Calendar.Bounds(s.limiter.Now(), zone)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"tenant": tenant, "used": used, "month_used": now.Count, "month_left": now.Remaining,
		"month": start.Format(time.RFC3339) + "/" + end.Format(time.RFC3339),
	})
}

// param returns the integer query parameter name, or def.
func param(r *http.Request, name string, def int64) int64 {
	n, err := strconv.ParseInt(r.URL.Query().Get(name), 10, 64)
	if err != nil {
		return def
	}
	return n
}
