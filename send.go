package ratelimit

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// send runs the script for one decision's requests: at once, or in a batch
// with other decisions' requests. It is bounded by the Limiter's timeout,
// and refused at once while the circuit breaker is open.
func (l *Limiter) send(ctx context.Context, reqs []*request) error {
	if err := ctx.Err(); err != nil { // send nothing for a caller who is gone
		return err
	}
	if l.breaker != nil {
		ok, probe := l.breaker.allow()
		if !ok {
			return ErrCircuitOpen
		}
		reqs[0].probe = probe
	}
	if b := l.batcherFor(ctx, reqs[0]); b != nil {
		return b.decide(ctx, reqs)
	}
	return l.exchange(ctx, l.client, decider, reqs)
}

// exchange sends one script call of sc for reqs, which may come from several
// decisions, to c within the Limiter's deadline, and tells the circuit
// breaker how it went: one call, one success or failure. parent is the
// caller's ctx, or for a batch a background one that no single caller can
// cancel.
func (l *Limiter) exchange(parent context.Context, c redis.UniversalClient, sc *script, reqs []*request) error {
	ctx, cancel := l.deadline(parent)
	defer cancel()
	var err error
	if l.ctxAware || ctx.Done() == nil {
		err = call(ctx, c, sc, reqs)
	} else {
		// The call goes on in watch's goroutine after the deadline, until
		// the client gives up on it; its reply is decoded here, and only if
		// it came in time, for the callers go on using reqs (FailLocal
		// decides in them).
		var vals []int64
		vals, err = watch(ctx, func(ctx context.Context) ([]int64, error) {
			return evalCall(ctx, c, sc, reqs)
		})
		if err == nil {
			err = decodeReply(vals, reqs)
		}
	}
	left := err != nil && expired(parent) // the caller left: that says nothing of Redis
	if err != nil && !left && expired(ctx) {
		err = l.timedOut(err)
	}
	if l.breaker != nil {
		probe := false
		for _, r := range reqs {
			probe = probe || r.probe
		}
		switch {
		case left:
			l.breaker.abandon(probe)
		case err != nil && Unavailable(err):
			l.breaker.done(probe, err)
		default: // Redis answered, even if with an error about one id's data
			l.breaker.done(probe, nil)
		}
	}
	return err
}

// call sends one script call of sc for reqs to c and decodes its reply into
// them.
func call(ctx context.Context, c redis.UniversalClient, sc *script, reqs []*request) error {
	vals, err := evalCall(ctx, c, sc, reqs)
	if err != nil {
		return err
	}
	return decodeReply(vals, reqs)
}

// evalCall sends one script call of sc for reqs to c and returns its reply
// undecoded. It only reads reqs.
func evalCall(ctx context.Context, c redis.UniversalClient, sc *script, reqs []*request) ([]int64, error) {
	var buf [24]any
	return eval(ctx, c, sc, callArgs(buf[:0], sc, reqs, sc == crossSlotDecider))
}

// timedOut names the Limiter's timeout in err, which it ended, and the last
// dial error the client met, if recent: with go-redis's default dial retries
// a refused connection is otherwise only a "context deadline exceeded".
func (l *Limiter) timedOut(err error) error {
	if dialErr := l.dials.recent(); dialErr != nil {
		return fmt.Errorf("ratelimit: no reply within %v: %w (last dial error: %w)", l.timeout, err, dialErr)
	}
	return fmt.Errorf("ratelimit: no reply within %v: %w", l.timeout, err)
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

// expired reports whether ctx is done or its deadline has passed: a client
// that stops at the deadline itself (ContextTimeoutEnabled) can return, with
// an i/o timeout, before ctx's own timer has fired.
func expired(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

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
