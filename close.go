// Close, and the calls under way that it waits for.

package ratelimit

import (
	"context"
	"time"
)

// Close gives back what the Limiter's leases (Limit.Leased) hold unused,
// waits for the work it started in the background to end (batches in
// flight, give-backs, the failure reports of calls whose callers left, the
// lease sweeper), and stops Slot.Keep's extensions. It first waits for the
// calls under way to return; Wait's sleeps end at once. Every later call of
// a method that can reach Redis returns an error wrapping ErrClosed, and
// writes nothing; a Slot acquired before can still be Released or
// Extended, so that a handler finishing during a graceful shutdown releases
// its slot. Close does not close the Redis client.
//
// It returns ctx's error if ctx is done first, and leaves the rest of the
// work to end by itself; a second Close returns nil. Once Close has
// returned nil, no goroutine of the Limiter's is left.
func (l *Limiter) Close(ctx context.Context) error {
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	l.cancel()
	l.keeps.close()
	if err := l.ops.Wait(ctx); err != nil {
		return err
	}
	if l.t == nil {
		return nil
	}
	l.leases.close(ctx)
	for {
		if err := l.bg.Wait(ctx); err != nil {
			return err
		}
		if err := l.t.Drain(ctx); err != nil {
			return err
		}
		if !l.bg.Busy() { // the transport's late work started none
			return nil
		}
	}
}

// enter begins a call that may reach Redis, or returns ErrClosed after
// Close; a call begun ends with exit. A decision served from its leases
// alone does not enter: it reaches no Redis, and Close, which drops every
// lease under the lease table's lock, need not wait for it.
func (l *Limiter) enter() error {
	l.ops.Add()
	if l.closed.Load() {
		l.ops.Done()
		return ErrClosed
	}
	return nil
}

// exit ends a call that enter began.
func (l *Limiter) exit() { l.ops.Done() }

// sleepOpen sleeps for d as l.sleep does, unless ctx is done or the Limiter
// closes first: then ctx's error, or ErrClosed.
func (l *Limiter) sleepOpen(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.closing, cancel)
	defer stop()
	err := l.sleep(ctx, d)
	if l.closed.Load() {
		return ErrClosed
	}
	return err
}
