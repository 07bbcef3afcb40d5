// Package ratelimit limits the rate of requests per client across any number
// of application servers that share one Redis, with the sliding window
// counter algorithm.
//
// For each client id and limit, Redis holds two integers: the requests
// counted in the current window and in the previous one. A request is
// allowed when
//
//	current + floor(previous × (window - elapsed) / window) + cost <= rate
//
// where elapsed is how far the clock is into the current window: the
// previous window's count fades out as the current window fills. The
// decision and the write are one Lua script, run atomically by Redis in one
// round trip, so concurrent servers can never admit more than the limit
// between them. A Result reports the estimate, the remaining quota, and
// exact waits until a retry would pass and until the count is back to 0.
//
// When Redis fails, a FailurePolicy decides (FailOpen by default) within a
// bounded time (WithTimeout), and the error goes to an error handler.
//
//	limiter := ratelimit.New(redisClient)
//	res, err := limiter.Allow(ctx, "user-42", ratelimit.PerMinute(100))
//	if err != nil { ... }
//	if !res.Allowed { ... answer 429, retry after res.RetryAfter ... }
package ratelimit
