// Package ratelimit limits the rate of requests per client across any number
// of application servers that share one Redis, with the sliding window
// counter algorithm.
//
// For each client id and window length, Redis holds two integers: the
// requests counted in the current window and in the previous one. A request
// is allowed when
//
//	current + floor(previous × (window - elapsed) / window) + cost <= rate
//
// where elapsed is how far the clock is into the current window: the
// previous window's count fades out as the current window fills. The
// decision and the write are one Lua script, run atomically by Redis in one
// round trip, so concurrent servers can never admit more than the limit
// between them. A Result reports the estimate, the remaining quota, and
// exact waits until a retry would pass and until the count is back to 0.
// Limits with the same window on one id share one count; give separate
// budgets separate ids.
//
// When Redis fails, a FailurePolicy decides (FailOpen by default) within a
// bounded time (WithTimeout), and the error goes to an error handler.
//
//	client := redis.NewClient(&redis.Options{
//		Addr:                  "localhost:6379",
//		ContextTimeoutEnabled: true,                   // go-redis stops at the Limiter's timeout
//		DialTimeout:           500 * time.Millisecond, // a down Redis costs a decision at most this
//		DialerRetries:         1,                      // not 5 dials per call
//	})
//	limiter := ratelimit.New(client)
//	res, err := limiter.Allow(ctx, "user-42", ratelimit.PerMinute(100))
//	if err != nil { ... }
//	if !res.Allowed { ... answer 429, retry after res.RetryAfter ... }
//
// On shutdown, after the servers that call it have stopped, Close the
// Limiter: it gives back what leased limits hold and waits for its work in
// the background.
//
// Of the go-redis client's options, four matter here. ContextTimeoutEnabled:
// true lets the client stop at the deadline each decision carries (without
// it, the Limiter gives the client's sockets that deadline: see
// WithTimeout). A short DialTimeout (go-redis's
// default is 5s) bounds a connection attempt to a server that is gone, and
// DialerRetries: 1 keeps go-redis from dialing it 5 times per call.
// MaxRetries can be anything: the script is sent as a command go-redis never
// retries, so a lost reply is never a second count.
//
// For HTTP services, package
// [github.com/slidingwindow/ratelimit/httplimit] puts a Limiter in front of
// any net/http handler, with the rate-limit headers, client-IP rules and
// 429/503 answers. For users' own tests, package
// [github.com/slidingwindow/ratelimit/ratelimittest] gives a Limiter on an
// in-process Redis and a clock the test moves: no Redis server, no sleeps.
package ratelimit
