package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors returned for input that cannot be decided. Each is wrapped with a
// message that names the value at fault; check with errors.Is. Nothing is
// sent to Redis for such input, whatever the failure policy.
var (
	// ErrInvalidID is returned for an empty id.
	ErrInvalidID = errors.New("ratelimit: invalid id")
	// ErrInvalidLimit is returned for a Limit with a Rate below 1, a Window
	// shorter than 1ms or not a whole number of milliseconds, or a Rate ×
	// Window (in ms) above 2^53.
	ErrInvalidLimit = errors.New("ratelimit: invalid limit")
	// ErrInvalidCost is returned by AllowN for a cost below 1.
	ErrInvalidCost = errors.New("ratelimit: invalid cost")
	// ErrNilClient is returned by every method of a Limiter made with a nil
	// client.
	ErrNilClient = errors.New("ratelimit: New was given a nil Redis client")
	// ErrUnavailable is wrapped, together with the Redis error, by the error
	// a FailClosed decision returns when Redis could not decide.
	ErrUnavailable = errors.New("ratelimit: Redis could not decide")
)

// Limit is a number of requests (or cost units) allowed in any sliding
// window of a given length.
type Limit struct {
	// Rate is how many requests, or cost units, any Window may hold; at
	// least 1.
	Rate int64
	// Window is the window's length: a whole number of milliseconds, at least
	// 1ms. Rate × Window in ms may not exceed 2^53 (about 9×10^15), so that
	// the script's arithmetic stays exact.
	Window time.Duration
}

// PerSecond returns a Limit of rate requests in any one second.
func PerSecond(rate int64) Limit { return Limit{Rate: rate, Window: time.Second} }

// PerMinute returns a Limit of rate requests in any one minute.
func PerMinute(rate int64) Limit { return Limit{Rate: rate, Window: time.Minute} }

// PerHour returns a Limit of rate requests in any one hour.
func PerHour(rate int64) Limit { return Limit{Rate: rate, Window: time.Hour} }

// String returns the limit as "100/1m0s".
func (l Limit) String() string { return fmt.Sprintf("%d/%v", l.Rate, l.Window) }

// Result is the outcome of one decision.
type Result struct {
	// Allowed reports whether the request may go ahead. When it is true, the
	// request's cost has been counted.
	Allowed bool
	// Count is the estimated usage of the sliding window after this decision:
	// with this request's cost if it was allowed, without it if not.
	Count int64
	// Limit is the limit the decision was made against.
	Limit Limit
	// Remaining is max(0, Limit.Rate - Count).
	Remaining int64
	// RetryAfter is 0 when the request was allowed. When it was denied, it is
	// the shortest wait after which the same request would be allowed if no
	// other traffic came, exact to the millisecond; negative if it never
	// would be, because its cost is above Limit.Rate.
	RetryAfter time.Duration
	// ResetAfter is the shortest wait after which Count would be 0 if no
	// other traffic came, exact to the millisecond.
	ResetAfter time.Duration
	// Degraded reports that the decision came from the failure policy because
	// Redis could not make it. Count, Remaining, RetryAfter and ResetAfter
	// then say nothing about real usage: under FailOpen and FailClosed Count
	// is 0, Remaining is Limit.Rate and the waits are 0; under FailLocal they
	// describe this process's share. A decision that timed out may still
	// have been counted by Redis, if the script ran after all: a degraded
	// request may have used quota.
	Degraded bool
}

// Limiter decides requests against sliding-window limits kept in Redis.
// Each decision is one round trip running one Lua script, so any number of
// application servers sharing one Redis (or Redis Cluster) share each limit
// exactly. A Limiter is safe for simultaneous use by multiple goroutines.
//
// It needs no Close: it keeps no goroutine of its own. Two kinds of
// goroutine can outlive a call for a while: with a client that ignores ctx
// deadlines (go-redis's default), a call that timed out leaves the client's
// goroutine waiting until the client's ReadTimeout; with WithBatching, the
// goroutine sending a batch ends when no request is waiting.
type Limiter struct {
	client    redis.UniversalClient
	keyPrefix string // the prefix, escaped, then ":{"
	now       func() time.Time
	policy    FailurePolicy
	onError   func(ctx context.Context, id string, err error)
	timeout   time.Duration // 0 or less: none
	// ctxAware is true when the client itself stops at the ctx deadline
	// (ContextTimeoutEnabled); otherwise the Limiter stops waiting for it.
	ctxAware bool
	denied   *denyCache    // nil unless WithDenyCache
	batch    *batcher      // nil unless WithBatching, on a *redis.Client
	breaker  *breaker      // nil if WithCircuitBreaker turned it off
	local    *localWindows // nil unless FailLocal
	// sleep pauses Wait between tries; tests replace it to move a fake clock.
	sleep func(ctx context.Context, d time.Duration) error
}

// New returns a Limiter that keeps its counts in client. Any
// redis.UniversalClient works: a *redis.Client, a *redis.ClusterClient (both
// keys of a decision share a hash slot), a *redis.Ring or a failover client.
func New(client redis.UniversalClient, opts ...Option) *Limiter {
	cfg := defaultConfig()
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&cfg)
		}
	}
	l := &Limiter{
		client:    client,
		keyPrefix: keyPrefixFor(cfg.prefix),
		now:       cfg.now,
		policy:    cfg.policy,
		onError:   cfg.onError,
		timeout:   cfg.timeout,
		ctxAware:  honoursContext(client),
		sleep:     sleepCtx,
	}
	if cfg.denyMax > 0 {
		l.denied = newDenyCache(cfg.denyMax)
	}
	if _, single := client.(*redis.Client); single && cfg.batchMax > 1 {
		l.batch = &batcher{l: l, maxBatch: cfg.batchMax}
	}
	if cfg.breakerFailures > 0 {
		l.breaker = newBreaker(cfg.breakerFailures, cfg.breakerCooldown, time.Now)
	}
	if cfg.policy == FailLocal {
		l.local = newLocalWindows(cfg.replicas)
	}
	if l.onError == nil {
		l.onError = newLogHandler(cfg.now).handle
	}
	return l
}

// Allow is shorthand for AllowN(ctx, id, limit, 1).
func (l *Limiter) Allow(ctx context.Context, id string, limit Limit) (Result, error) {
	return l.AllowN(ctx, id, limit, 1)
}

// AllowN decides whether a request of cost n by id fits in limit and, if it
// does, counts it. Being denied is a Result with Allowed false, not an error.
//
// The error is non-nil for invalid input (ErrInvalidID, ErrInvalidLimit,
// ErrInvalidCost), when ctx is done before Redis answers (ctx.Err()), and
// when Redis cannot decide under FailClosed (ErrUnavailable). A cost above
// limit.Rate is denied with a negative RetryAfter.
func (l *Limiter) AllowN(ctx context.Context, id string, limit Limit, n int64) (Result, error) {
	if err := l.check(id, limit, n); err != nil {
		return Result{Limit: limit}, err
	}
	pos := locate(l.now().UnixMilli(), limit.Window.Milliseconds())
	if l.denied != nil {
		if r, ok := l.denied.deny(id, limit, pos, n); ok {
			return r, nil
		}
	}
	allowed, c, err := l.run(ctx, id, limit, pos, n)
	if err == nil && allowed && pos.estimate(c) > limit.Rate-n {
		// The script allows only what fits; a reply that says otherwise was
		// not written by it.
		err = fmt.Errorf("%w: allowed at counts (%d, %d) above rate %d", ErrBadReply, c.cur, c.prev, limit.Rate)
	}
	if err != nil {
		return l.fail(ctx, id, limit, pos, n, err)
	}
	if l.denied != nil {
		l.denied.record(id, pos, c, allowed, n)
	}
	return result(limit, pos, c, allowed, n), nil
}

// Peek reports where id stands against limit without counting anything:
// Count is the current estimate, and Allowed, RetryAfter and ResetAfter are
// what a request of cost 1 would get now. Errors are as for AllowN.
func (l *Limiter) Peek(ctx context.Context, id string, limit Limit) (Result, error) {
	if err := l.check(id, limit, 1); err != nil {
		return Result{Limit: limit}, err
	}
	pos := locate(l.now().UnixMilli(), limit.Window.Milliseconds())
	_, c, err := l.run(ctx, id, limit, pos, 0)
	if err != nil {
		return l.fail(ctx, id, limit, pos, 0, err)
	}
	est := pos.estimate(c)
	r := result(limit, pos, c, est < limit.Rate, 1)
	r.Count = est
	r.Remaining = max(0, limit.Rate-est)
	return r, nil
}

// Reset forgets id's usage of limit: it deletes the keys of the current and
// previous windows. The error is non-nil for invalid input, when ctx is done,
// and when Redis fails; the failure policy does not apply.
func (l *Limiter) Reset(ctx context.Context, id string, limit Limit) error {
	if err := l.check(id, limit, 1); err != nil {
		return err
	}
	pos := locate(l.now().UnixMilli(), limit.Window.Milliseconds())
	cur, prev := l.keyPair(id, pos.w, pos.i)
	_, err := bounded(ctx, l, func(ctx context.Context) (int64, error) {
		return l.client.Del(ctx, cur, prev).Result()
	})
	if l.denied != nil {
		l.denied.forget(id, pos.w)
	}
	if err != nil {
		return fmt.Errorf("ratelimit: reset: %w", err)
	}
	return nil
}

func (l *Limiter) check(id string, limit Limit, n int64) error {
	if l.client == nil {
		return ErrNilClient
	}
	return validate(id, limit, n)
}

// run sends the script for one decision, within the Limiter's deadline,
// unless the circuit breaker is open.
func (l *Limiter) run(ctx context.Context, id string, limit Limit, pos position, cost int64) (bool, counts, error) {
	if err := ctx.Err(); err != nil { // send nothing for a caller who is gone
		return false, counts{}, err
	}
	if l.breaker == nil {
		return l.send(ctx, id, limit, pos, cost)
	}
	ok, probe := l.breaker.allow()
	if !ok {
		return false, counts{}, ErrCircuitOpen
	}
	allowed, c, err := l.send(ctx, id, limit, pos, cost)
	if err != nil && ctx.Err() != nil {
		// The caller left: that says nothing of Redis.
		l.breaker.abandon(probe)
	} else {
		l.breaker.done(probe, err)
	}
	return allowed, c, err
}

// send sends the script for one decision, within the Limiter's deadline.
func (l *Limiter) send(ctx context.Context, id string, limit Limit, pos position, cost int64) (bool, counts, error) {
	cur, prev := l.keyPair(id, pos.w, pos.i)
	req := request{cur: cur, prev: prev, cost: cost, rate: limit.Rate, window: pos.w, left: pos.left()}
	ctx, cancel := l.deadline(ctx)
	defer cancel()
	if l.batch != nil {
		return l.batch.decide(ctx, req)
	}
	if l.ctxAware || ctx.Done() == nil {
		return runOne(ctx, l.client, req)
	}
	d, err := watch(ctx, func(ctx context.Context) (decision, error) {
		allowed, c, err := runOne(ctx, l.client, req)
		return decision{allowed, c}, err
	})
	return d.allowed, d.counts, err
}

// decision is what the script decided and the counts it saw.
type decision struct {
	allowed bool
	counts
}

// deadline returns ctx bounded by the Limiter's timeout, or ctx itself when
// its own deadline comes first or there is no timeout.
func (l *Limiter) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if l.timeout <= 0 {
		return ctx, noCancel
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= l.timeout {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, l.timeout)
}

func noCancel() {}

// bounded runs fn within the Limiter's deadline, on a client that may not
// watch ctx.
func bounded[T any](ctx context.Context, l *Limiter, fn func(context.Context) (T, error)) (T, error) {
	ctx, cancel := l.deadline(ctx)
	defer cancel()
	if l.ctxAware || ctx.Done() == nil {
		return fn(ctx)
	}
	return watch(ctx, fn)
}

// watch runs fn in a goroutine and returns when it does or when ctx is done,
// whichever comes first: the client may not stop at ctx's deadline by
// itself. In the second case fn goes on until the client's own timeouts end
// it, and its result is dropped.
func watch[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	type reply struct {
		v   T
		err error
	}
	done := make(chan reply, 1)
	go func() {
		v, err := fn(ctx)
		done <- reply{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// result derives a Result from the counts the script saw before a decision
// of cost n, and whether it allowed (and so counted) the request.
func result(limit Limit, pos position, c counts, allowed bool, n int64) Result {
	r := Result{Allowed: allowed, Limit: limit, Count: pos.estimate(c)}
	if allowed {
		c.cur += n
		r.Count += n
	} else {
		r.RetryAfter = pos.waitUntil(c, limit.Rate-n)
	}
	r.Remaining = max(0, limit.Rate-r.Count)
	r.ResetAfter = pos.waitUntil(c, 0)
	return r
}

// honoursContext reports whether client stops waiting at its ctx deadline
// by itself, so that the Limiter need not watch for it.
func honoursContext(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}
