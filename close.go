// Close, and the Limiter's life: the calls under way and the goroutines it
// starts, all counted in one group, and the one quit that ends them.

package ratelimit

import (
	"context"
	"time"

	"github.com/slidingwindow/ratelimit/internal/lease"
)

// Close gives back what the Limiter's leases (Limit.Leased) hold unused,
// waits for the work it started in the background to end (batches in
// flight, give-backs, the failure reports of calls whose callers left, the
// lease sweeper), and stops Slot.Keep's extensions, waiting for one under
// way. It first waits for the calls under way to return; Wait's sleeps end
// at once. Every later call of
// a method that can reach Redis returns an error wrapping ErrClosed, and
// writes nothing; a Slot acquired before can still be Released or
// Extended, so that a handler finishing during a graceful shutdown releases
// its slot. Close does not close the Redis client.
//
// It returns ctx's error if ctx is done first, and leaves the rest of the
// work to end by itself (the leases' give-backs sent); Close may then be
// called again, and goes on from where it stopped: it gives back what
// came back to a lease since, and waits for the rest. Once
// a Close has returned nil, no goroutine of the Limiter's is left, and
// every later Close returns nil at once. A Release or an Extend after it
// is a call of its own, whose goroutines (a call whose caller left) end
// with it.
func (l *Limiter) Close(ctx context.Context) error {
	select {
	case <-l.done:
		return nil
	default:
	}
	l.closed.Store(true)
	l.stop() // Wait's sleeps, the lease sweeper
	l.keeps.Close()
	// The calls under way first, then the leases: what a call settles into
	// a lease after is given back at once (lease.Table.Close), so that a
	// Close whose ctx ends while a call lasts gives back the leases too.
	err := l.work.Wait(ctx)
	if l.t != nil {
		l.leases.Close()
	}
	if err == nil {
		err = l.work.Wait(ctx)
	}
	if err != nil {
		return err
	}
	l.doneOnce.Do(func() { close(l.done) })
	return nil
}

// enter begins a call that may reach Redis, or returns ErrClosed after
// Close; a call begun ends with exit. A decision served from its leases
// alone does not enter: it reaches no Redis, and Close, which drops every
// lease under the lease table's lock, need not wait for it.
func (l *Limiter) enter() error {
	l.work.Add()
	if l.closed.Load() {
		l.work.Done()
		return ErrClosed
	}
	return nil
}

// exit ends a call that enter began.
func (l *Limiter) exit() { l.work.Done() }

// exitTaken is exit for a decision that may take from its leases: should it
// panic before it settles what it took, that ends (lease.Taken.Abandon).
func (l *Limiter) exitTaken(taken *lease.Taken) { taken.Abandon(); l.exit() }

// sleepOpen sleeps for d as l.sleep does, unless ctx is done or the Limiter
// closes first: then ctx's error, or ErrClosed.
func (l *Limiter) sleepOpen(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.quit, cancel)
	defer stop()
	err := l.sleep(ctx, d)
	if l.closed.Load() {
		return ErrClosed
	}
	return err
}
