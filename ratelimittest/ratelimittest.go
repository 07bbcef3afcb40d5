// Package ratelimittest gives tests a ratelimit.Limiter on an in-process
// Redis (miniredis) and a clock that only the test moves, so that a test of
// a limited handler needs no Redis server and never sleeps: it crosses a
// window by moving the clock.
//
//	func TestHandler(t *testing.T) {
//		limiter, clock := ratelimittest.New(t)
//		h := newHandler(limiter) // the code under test
//		... two requests pass, the third gets 429 ...
//		clock.Advance(2 * time.Second)
//		... the next passes ...
//	}
//
// It is for tests only. It imports miniredis, which the module requires
// already for its own tests; a program that does not import this package
// builds without it, as before.
package ratelimittest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
)

// start is where every Clock starts: 2026-01-01 00:00:00 UTC, the start of
// a second, a minute, an hour, a day and a 7-day window (sliding windows
// are aligned to the Unix epoch, a Thursday, as this day is), and of a UTC
// calendar day, month and year.
var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// closeTimeout bounds the Limiter's Close when the test ends. On an
// in-process Redis it takes milliseconds; the bound only keeps a stuck
// Close from hanging the test binary.
const closeTimeout = 10 * time.Second

// New returns a Limiter on an in-process Redis that t stops when it ends,
// deciding on the returned Clock, which starts at 2026-01-01 00:00:00 UTC:
// the start of a second, a minute, an hour and a UTC day, month and year,
// so that a time d after it lies d into a window of any of those lengths.
//
// The Limiter is what ratelimit.New makes, with three options of the
// kit's: WithClock(clock.Now); WithSleep, so that Limiter.Wait, instead of
// sleeping, moves the Clock on by what it would sleep (and so passes, on
// the Clock, as it would in real time); and WithTimeout(time.Minute), so
// that a slow test machine never turns a decision into the failure
// policy's. opts are given after them, and so override them (a WithClock
// among them takes decisions off the Clock); WithPrefix, WithFailurePolicy
// or any other option applies as it would in production.
//
// Each call starts a Redis of its own, so tests that call New may run in
// parallel. When t ends, its Cleanup closes the Limiter (an error of its
// Close fails the test), then the client, then the Redis, leaving no
// goroutine behind.
// Register whatever calls the Limiter (an httptest.Server) after New, so
// that t's cleanups stop it first.
func New(t testing.TB, opts ...ratelimit.Option) (*ratelimit.Limiter, *Clock) {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(start)
	c := &Clock{now: start, mr: mr}
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	all := append([]ratelimit.Option{ratelimit.WithClock(c.Now), ratelimit.WithSleep(c.sleep), ratelimit.WithTimeout(time.Minute)}, opts...)
	l := ratelimit.New(client, all...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("ratelimittest: closing the Limiter: %v", err)
		}
		_ = client.Close()
	})
	return l, c
}

// Clock is the time of a Limiter that New returned: it stands still until
// the test moves it with Advance or Set, or the Limiter's Wait moves it on
// by what it would sleep. The in-process Redis follows it:
// its keys expire as it moves forward, and its TIME reads it, so that
// concurrency slots (Limiter.Acquire), whose leases run on Redis's clock,
// end on it too. A Clock is safe for simultaneous use by multiple
// goroutines.
type Clock struct {
	mu  sync.Mutex
	now time.Time
	mr  *miniredis.Miniredis
}

// Now returns the clock's time. It is what the Limiter reads for each
// decision.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d, and with it the in-process Redis:
// its keys whose time to live is d or less expire. It panics if d is
// negative; use Set to move the clock back.
func (c *Clock) Advance(d time.Duration) {
	if d < 0 {
		panic("ratelimittest: Clock.Advance of a negative duration " + d.String() + "; use Set to move the clock back")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.move(c.now.Add(d))
}

// sleep is the Limiter's Wait's sleep: it moves the clock on by d, unless
// ctx is done.
func (c *Clock) sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.Advance(d)
	return nil
}

// Set moves the clock to t, forward or back, and the in-process Redis with
// it. Forward, it is Advance(t.Sub(Now())). Back, nothing expires and
// nothing expired comes back: each key of the in-process Redis keeps the
// time to live it had left, which runs on from t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.move(t)
}

// move sets the clock to t, fast-forwarding the Redis's expiries by the
// distance if t is ahead. c.mu is held: two moves never interleave, so the
// Redis's expiries and TIME move by exactly what the clock does.
func (c *Clock) move(t time.Time) {
	t = t.Round(0) // no monotonic reading: the clock's times compare by wall time
	if d := t.Sub(c.now); d > 0 {
		c.mr.FastForward(d)
	}
	c.mr.SetTime(t)
	c.now = t
}
