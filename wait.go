// Wait and WaitN: a decision that sleeps until it is allowed.

package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// The jitter added to each wait is uniform in [0, min(RetryAfter/jitterDiv,
// Window/jitterWindowDiv)]: a quarter of the wait spreads waiters that were
// denied together, and the cap of a hundredth of the window (10ms for a
// one-second window) keeps a long wait from idling the quota for long.
const (
	jitterDiv       = 4
	jitterWindowDiv = 100
)

// Wait is shorthand for WaitN(ctx, id, limit, 1).
func (l *Limiter) Wait(ctx context.Context, id string, limit Limit) error {
	return l.WaitN(ctx, id, limit, 1)
}

// WaitN blocks until a request of cost n by id fits in limit, and counts it
// as AllowN does, or until it is clear that it will not. It returns nil once
// the request is allowed, then counted.
//
// Each try is one AllowN; a denied try counts nothing (unless the Limiter
// counts denials, WithCountDenied), so a waiter uses no quota until it is
// let through. After a denial WaitN sleeps the denial's
// RetryAfter, the exact moment the window would let the request in if no
// other traffic came, plus a random jitter, uniform between 0 and
// min(RetryAfter/4, limit.Window/100): waiters denied together, such as
// workers started at once, then come back one after another rather than in
// the same millisecond. The jitter is left out when it would carry the sleep
// to ctx's deadline. Waiters are not queued: under contention whoever tries
// first after the window frees up gets in, and one waiter may be denied
// again. Sleeps are in real time, whatever clock WithClock set, unless
// WithSleep says how to sleep.
//
// To pace calls to a third party that counts its quota over any span of
// the window (most do), make the limit Strict: a sliding limit is an
// estimate, and waiters let in together as a window turns can fit more
// than the rate into one span, up to twice it (11 calls in a second of 10
// a second in `go run ./examples/worker` with a sliding limit; never more
// than 10 with the example's strict one).
//
// It returns at once:
//   - ErrNeverAllowed (wrapped) for a valid limit and n above its Rate,
//     without consulting Redis;
//   - the error of invalid input (ErrInvalidID, ErrInvalidLimit,
//     ErrInvalidCost), as AllowN does;
//   - an error wrapping ErrWaitExceedsDeadline, without sleeping, when a
//     denial's RetryAfter would end at or after ctx's deadline;
//   - ctx.Err() when ctx is done, before a try or during a sleep;
//   - under FailClosed, the error wrapping ErrUnavailable when Redis cannot
//     decide.
//
// Under FailOpen a degraded decision lets the request through and WaitN
// returns nil. Under FailLocal WaitN waits on the local share's RetryAfter;
// a cost within Rate but above the local share, which only Redis can allow,
// is tried again every min(limit.Window, DefaultBreakerCooldown) until Redis
// decides.
func (l *Limiter) WaitN(ctx context.Context, id string, limit Limit, n int64) error {
	if limit.Validate() == nil && n > limit.Rate {
		return fmt.Errorf("%w: cost %d, limit %v", ErrNeverAllowed, n, limit)
	}
	for {
		res, err := l.AllowN(ctx, id, limit, n)
		if err != nil {
			return err
		}
		if res.Allowed {
			return nil
		}
		wait := res.RetryAfter
		switch {
		case wait == InfDuration:
			// Only the local share of FailLocal says never to a cost within
			// Rate; Redis may be back by the time the breaker tries it again.
			// (So does a wait too long for a Duration, of a window over 146
			// years: trying again is as good as sleeping for ever.)
			wait = min(limit.Window, DefaultBreakerCooldown)
		case wait < time.Millisecond:
			// A denial always names a wait of 1ms or more; the floor keeps a
			// reply that says otherwise from spinning on Redis.
			wait = time.Millisecond
		}
		d := wait + jitter(wait, limit.Window)
		if d < wait { // a wait of centuries plus its jitter wrapped
			d = wait
		}
		if deadline, ok := ctx.Deadline(); ok {
			left := time.Until(deadline)
			if wait >= left {
				return fmt.Errorf("%w: %v to wait for %v, %v left", ErrWaitExceedsDeadline, wait, limit, left.Round(time.Millisecond))
			}
			if d >= left {
				d = wait
			}
		}
		if err := l.sleepOpen(ctx, d); err != nil {
			return err
		}
	}
}

// jitterMax returns the largest jitter added to a wait of d for a window of
// the given length.
func jitterMax(d, window time.Duration) time.Duration {
	return max(0, min(d/jitterDiv, window/jitterWindowDiv))
}

// jitter returns a random extra wait, uniform in [0, jitterMax(d, window)].
// math/rand/v2's top-level functions are safe for concurrent use and seeded
// per process, so waiters in different processes draw differently.
func jitter(d, window time.Duration) time.Duration {
	return rand.N(jitterMax(d, window) + 1)
}

// sleepCtx waits for d or until ctx is done, whichever comes first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
