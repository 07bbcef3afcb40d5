// The deadlines of calls: the Limiter's timeout over the caller's ctx,
// detached from a caller who may leave first, and the ticks that decisions
// of a ctx never canceled share.

package transport

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// wire returns the context of a decision's call to Redis: ctx bounded by
// the Limiter's timeout, as deadline makes it, and whether it is detached
// from ctx. A ctx whose own deadline comes first gets one detached: ctx's
// values, and the Limiter's deadline, never canceled. Its caller leaves at
// its own deadline, but its call, once sent, is judged by the Limiter's
// bound: Redis answering within the timeout is health, and no answer within
// it is a failure, whoever still waits.
func (t *Transport) wire(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	d, ok := ctx.Deadline()
	if t.timeout <= 0 || !ok || time.Until(d) > t.timeout {
		wire, cancel, _ := t.deadline(ctx)
		return wire, cancel, false
	}
	if t.timeout <= maxTickTimeout {
		return &tickCtx{Context: context.WithoutCancel(ctx), tick: t.tickAfter(time.Now())}, noCancel, true
	}
	wire, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.timeout)
	return wire, cancel, true
}

// deadline returns ctx bounded by the Limiter's timeout, and whether that
// timeout set its deadline; ctx itself when its own deadline comes first or
// there is no timeout. A ctx that is never canceled (its Done is nil:
// context.Background, a worker's) gets a tickCtx.
func (t *Transport) deadline(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	if t.timeout <= 0 {
		return ctx, noCancel, false
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= t.timeout {
		return ctx, noCancel, false
	}
	if ctx.Done() == nil && t.timeout <= maxTickTimeout {
		k := t.tickAfter(time.Now())
		if ctx == context.Background() { // a worker's: the tick's own
			return &k.background, noCancel, true
		}
		return &tickCtx{Context: ctx, tick: k}, noCancel, true
	}
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	return ctx, cancel, true
}

// A tickCtx is a ctx that is never canceled, with a deadline: the end of a
// tick, a span of tickLen. Every tickCtx of one tick shares its Done
// channel, and one timer closes it at the tick's end: where
// context.WithTimeout makes a context, a timer and a channel for each
// decision (about 370 bytes), decisions that start within a tick of each
// other make them once. The deadline is the timeout rounded up to a tick.
// A tick's timer lives until its end, not until its decisions end: at most
// 1,024 ticks (the timeout over tickLen) are waiting at once.
type tickCtx struct {
	context.Context // the caller's, never canceled: its values
	tick            *tick
}

// tick is the deadline that tickCtxs share: done closes at it. background
// is its tickCtx of context.Background, which every decision of the tick
// made with that ctx shares.
type tick struct {
	end        int64     // ns since the transport's epoch, a multiple of tickLen
	at         time.Time // the deadline
	done       chan struct{}
	background tickCtx
	timed      *redis.Client // the transport's: see routed
}

// Deadline, Done and Err are the tick's; Value is the caller's, but for
// the copy of the client a call is routed through.
func (c *tickCtx) Deadline() (time.Time, bool) { return c.tick.at, true }

func (c *tickCtx) Done() <-chan struct{} { return c.tick.done }

// Value is the transport's copy of its client for routeKey, when it has
// one (see routed), else the caller's.
func (c *tickCtx) Value(key any) any {
	if key == (routeKey{}) && c.tick.timed != nil {
		return c.tick.timed
	}
	return c.Context.Value(key)
}

func (c *tickCtx) Err() error {
	select {
	case <-c.tick.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// maxTickTimeout bounds the timeouts whose deadlines are ticks: a longer
// one gets context.WithTimeout (and no tick that ends past an int64 of ns).
const maxTickTimeout = time.Hour

// tickLen returns how long a tick of the transport's deadlines lasts: a
// ms, or a thousandth of a longer timeout, or a sixteenth of one under
// 16 ms, so that rounding up to a tick adds little to the timeout and at
// most 1,024 ticks wait at once.
func tickLen(timeout time.Duration) time.Duration {
	return max(timeout/1024, min(time.Millisecond, timeout/16), time.Nanosecond)
}

// tickAfter returns the tick that ends at the first tick boundary at least
// the timeout after now: the last one made, if it is that one. Ticks count
// on the monotonic clock, from the transport's epoch: a wall clock set back
// cannot bring back a tick that has ended.
func (t *Transport) tickAfter(now time.Time) *tick {
	n := int64(tickLen(t.timeout))
	end := int64(now.Sub(t.epoch) + t.timeout)
	end += (n - end%n) % n
	if k := t.tick.Load(); k != nil && k.end == end {
		return k
	}
	k := &tick{end: end, at: t.epoch.Add(time.Duration(end)), done: make(chan struct{}), timed: t.timed}
	k.background = tickCtx{Context: context.Background(), tick: k}
	time.AfterFunc(k.at.Sub(now), func() { close(k.done) })
	t.tick.Store(k) // of two made at once, both serve; the last is kept
	return k
}

func noCancel() {}

// ctxErr returns the error of ctx, which expired reports done: its deadline
// may have passed before its timer fired.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

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
