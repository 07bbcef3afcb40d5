package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
	"github.com/throttled/throttled/v2"
	goredisstore "github.com/throttled/throttled/v2/store/goredisstore.v9"
	"github.com/ulule/limiter/v3"
	redisstore "github.com/ulule/limiter/v3/drivers/store/redis"
)

// Contenders returns every registered contender, in the order the table
// lists them. To add one, add an entry here: a name, a line for the legend,
// and a constructor (see Env for what it is given).
func Contenders() []Contender {
	return []Contender{
		{
			Name:    "noop",
			About:   "no Redis, no work: what the harness itself costs (not a rate limiter)",
			Offline: true,
			New: func(context.Context, Env) (Decider, error) {
				return DeciderFunc(func(context.Context, string) (bool, error) { return true, nil }), nil
			},
		},
		{
			Name: "ours",
			About: "this library with its defaults (but a 3s timeout, as every ours*): ratelimit.New(client).Allow on go-redis's " +
				"default client; concurrent decisions share script calls (batching, up to 64 per call, the default)",
			Clocked: true,
			New: func(_ context.Context, env Env) (Decider, error) {
				return newOurs(env.Client, env), nil
			},
		},
		{
			Name:    "ours/nobatch",
			About:   "ours with ratelimit.WithBatching(1): one script call per decision, the default before batching was",
			Clocked: true,
			New: func(_ context.Context, env Env) (Decider, error) {
				return newOurs(env.Client, env, ratelimit.WithBatching(1)), nil
			},
		},
		{
			Name: "ours/ctxclient",
			About: "ours on a client made with ContextTimeoutEnabled, so that the Limiter " +
				"leaves its deadline to go-redis instead of watching it in a goroutine",
			Clocked: true,
			New: func(_ context.Context, env Env) (Decider, error) {
				client := ctxClient(env)
				return closers{newOurs(client, env), []io.Closer{client}}, nil
			},
		},
		{
			Name: "ours+autopipe",
			About: "this library on go-redis's AutoPipeline: ratelimit.New(client.AutoPipeline()); " +
				"batching does not apply to that client, so each decision is its own script call",
			Clocked: true,
			New: func(_ context.Context, env Env) (Decider, error) {
				ap, err := env.Client.AutoPipeline()
				if err != nil {
					return nil, err
				}
				return closers{newOurs(ap, env), []io.Closer{ap}}, nil
			},
		},
		{
			Name:    "ours+denycache",
			About:   "ours with ratelimit.WithDenyCache(10000): a client past its limit is denied locally",
			Clocked: true,
			New: func(_ context.Context, env Env) (Decider, error) {
				return newOurs(env.Client, env, ratelimit.WithDenyCache(10_000)), nil
			},
		},
		{
			Name: "bare/incr",
			About: "the bare counter our script's Redis time is weighed against: bare EvalSha of incr.lua (INCR, PEXPIRE) " +
				"on the library's key for the current window; a fixed window, allowed while the count is at most the rate",
			Clocked: true,
			New: func(ctx context.Context, env Env) (Decider, error) {
				return newBareIncr(ctx, env)
			},
		},
		{
			Name:    "bare/article",
			About:   "ceiling of the article's script: bare EvalSha of article.lua (GET, GET, INCR, EXPIRE)",
			Clocked: true,
			New: func(ctx context.Context, env Env) (Decider, error) {
				return newBareArticle(ctx, env)
			},
		},
		{
			Name:  "redis_rate",
			About: "github.com/go-redis/redis_rate/v10: GCRA, burst = rate, one EVALSHA",
			New: func(_ context.Context, env Env) (Decider, error) {
				lim := redis_rate.NewLimiter(env.Client)
				l := redis_rate.Limit{Rate: int(env.Limit.Rate), Burst: int(env.Limit.Rate), Period: env.Limit.Window}
				return DeciderFunc(func(ctx context.Context, id string) (bool, error) {
					res, err := lim.Allow(ctx, id, l)
					if err != nil {
						return false, err
					}
					return res.Allowed > 0, nil
				}), nil
			},
		},
		{
			Name:  "ulule",
			About: "github.com/ulule/limiter/v3 with its Redis store: fixed window, one EVALSHA",
			New: func(_ context.Context, env Env) (Decider, error) {
				store, err := redisstore.NewStoreWithOptions(env.Client, limiter.StoreOptions{Prefix: "limiter"})
				if err != nil {
					return nil, err
				}
				lim := limiter.New(store, limiter.Rate{Period: env.Limit.Window, Limit: env.Limit.Rate})
				return DeciderFunc(func(ctx context.Context, id string) (bool, error) {
					res, err := lim.Get(ctx, id)
					if err != nil {
						return false, err
					}
					return !res.Reached, nil
				}), nil
			},
		},
		{
			Name: "throttled",
			About: "github.com/throttled/throttled/v2 with store/goredisstore.v9: GCRA, burst = rate; " +
				"a pipelined TIME+GET, then a compare-and-swap EVAL (SETNX+EXPIRE for a new key)",
			New: func(_ context.Context, env Env) (Decider, error) {
				store, err := goredisstore.NewCtx(env.Client, "throttled:")
				if err != nil {
					return nil, err
				}
				quota := throttled.RateQuota{
					MaxRate:  throttled.PerDuration(int(env.Limit.Rate), env.Limit.Window),
					MaxBurst: int(env.Limit.Rate) - 1,
				}
				rl, err := throttled.NewGCRARateLimiterCtx(store, quota)
				if err != nil {
					return nil, err
				}
				return DeciderFunc(func(ctx context.Context, id string) (bool, error) {
					limited, _, err := rl.RateLimitCtx(ctx, id, 1)
					return !limited && err == nil, err
				}), nil
			},
		},
	}
}

// ctxClient returns a client of the bench's Redis with ContextTimeoutEnabled.
func ctxClient(env Env) *redis.Client {
	opts := env.Options
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(&opts)
}

// ErrDegraded is wrapped by the error of a decision that the contender's
// failure policy made because Redis could not (this library's
// Result.Degraded): the harness counts it apart from other errors, and any
// fails the run, since it measures the policy, not Redis.
var ErrDegraded = errors.New("bench: degraded decision")

// OursTimeout is the Limiter's timeout in the bench, in place of
// the Limiter's default timeout (100ms): go-redis's ReadTimeout, the bound every
// other contender lives with. It changes no decision's cost (a deadline is
// set either way), only what a stall of the machine does: on two shared
// cores a process can stall past 100ms, and the other libraries then
// answer late where ours would answer from its failure policy (five such
// in a row open the circuit breaker for a second). Decisions slower than
// 100ms are counted for every contender instead (RunResult.Slow).
const OursTimeout = 3 * time.Second

// newOurs returns a Decider running this library on client, with opts
// after the bench's own (a clock, an error handler, OursTimeout): a variant
// of ours is an entry that passes its options here. A decision the failure
// policy made (Redis failed) returns an error wrapping ErrDegraded and the
// error the Limiter handed to its error handler.
func newOurs(client redis.UniversalClient, env Env, opts ...ratelimit.Option) Decider {
	var last atomic.Pointer[error]
	opts = append([]ratelimit.Option{
		ratelimit.WithClock(env.Now),
		ratelimit.WithTimeout(OursTimeout),
		ratelimit.WithErrorHandler(func(_ context.Context, _ string, err error) { last.Store(&err) }),
	}, opts...)
	l := ratelimit.New(client, opts...)
	limit := env.Limit
	return DeciderFunc(func(ctx context.Context, id string) (bool, error) {
		res, err := l.Allow(ctx, id, limit)
		if err == nil && res.Degraded {
			err = ErrDegraded
			if e := last.Load(); e != nil {
				err = fmt.Errorf("%w: %w", ErrDegraded, *e)
			}
		}
		return res.Allowed, err
	})
}
