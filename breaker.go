package ratelimit

import (
	"errors"
	"sync/atomic"
	"time"
)

// ErrCircuitOpen is wrapped by the error a decision meets while the circuit
// breaker is open: Redis failed repeatedly, and the decision went to the
// failure policy at once, without trying Redis.
var ErrCircuitOpen = errors.New("ratelimit: circuit open after repeated Redis failures")

// Breaker defaults: see WithCircuitBreaker.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = time.Second
)

// breaker stops sending decisions to a Redis that keeps failing. Closed, it
// counts consecutive failures; at the threshold it opens, and decisions go
// straight to the failure policy. After the cooldown it lets one decision
// through as a probe (half-open): success closes it, failure opens it for
// another cooldown. Closed, a decision costs one atomic load, and a success
// one more.
type breaker struct {
	threshold int32
	cooldown  int64 // ns
	now       func() time.Time

	state    atomic.Int32 // closed, open or probing
	failures atomic.Int32 // consecutive, while closed
	openedAt atomic.Int64 // Unix ns of the last opening
}

const (
	closed int32 = iota
	open
	probing // one decision is out testing Redis
)

func newBreaker(failures int, cooldown time.Duration, now func() time.Time) *breaker {
	return &breaker{threshold: int32(failures), cooldown: int64(cooldown), now: now}
}

// allow reports whether a decision may try Redis, and whether it is the
// probe of a half-open breaker.
func (b *breaker) allow() (ok, probe bool) {
	switch b.state.Load() {
	case closed:
		return true, false
	case open:
		if b.now().UnixNano()-b.openedAt.Load() >= b.cooldown && b.state.CompareAndSwap(open, probing) {
			return true, true
		}
	}
	return false, false
}

// done records how a decision that tried Redis went.
func (b *breaker) done(probe bool, err error) {
	switch {
	case err == nil && probe:
		b.failures.Store(0)
		b.state.Store(closed)
	case err == nil:
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
	case probe:
		b.openedAt.Store(b.now().UnixNano())
		b.state.Store(open)
	case b.failures.Add(1) >= b.threshold && b.state.Load() == closed:
		// The time first, so that no one sees the breaker open with an old
		// opening time and probes at once.
		b.openedAt.Store(b.now().UnixNano())
		if b.state.CompareAndSwap(closed, open) {
			b.failures.Store(0)
		}
	}
}

// abandon records that a decision which tried Redis ended without telling
// anything of Redis (its caller left). A probe gives its turn back, so the
// next decision probes at once.
func (b *breaker) abandon(probe bool) {
	if probe {
		b.state.CompareAndSwap(probing, open)
	}
}
