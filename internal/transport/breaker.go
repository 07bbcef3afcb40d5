// The circuit breaker of one server, and which Redis errors it counts
// (IsOutage).

package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit/internal/script"
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

// isOpen reports whether b is open or probing; false for no breaker.
func (b *breaker) isOpen() bool { return b != nil && b.state.Load() != closed }

// abandon records that a decision which tried Redis ended without telling
// anything of Redis (its caller left). A probe gives its turn back, so the
// next decision probes at once.
func (b *breaker) abandon(probe bool) {
	if probe {
		b.state.CompareAndSwap(probing, open)
	}
}

// unavailableReplies are the prefixes of the Redis errors that say the
// server cannot serve at all right now, whatever the keys: loading its data,
// busy with a script, a replica, without a master, a cluster that is down or
// resharding, out of memory, unable to persist, or full of clients.
var unavailableReplies = []string{
	"LOADING", "BUSY", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
	"NOREPLICAS", "OOM", "MISCONF", "max number of clients reached",
}

// IsOutage is the root's IsOutage: whether err says Redis itself could
// not serve.
func IsOutage(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted):
		return true
	case errors.Is(err, script.ErrBadReply):
		return false
	}
	for _, prefix := range unavailableReplies {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

// opensBreaker reports whether err counts toward opening the breaker of the
// server that gave it: an outage (IsOutage), but for CLUSTERDOWN and
// TRYAGAIN. A node that answers those at once is up: the cluster as a
// whole is down (a master failed, and full coverage is required) or a slot
// is moving, and it may be whole again at any moment. Were they counted, the failure of one
// master would open the breakers of all the others, which would then deny
// for a cooldown after the cluster had recovered.
func opensBreaker(err error) bool {
	return IsOutage(err) && !redis.HasErrorPrefix(err, "CLUSTERDOWN") && !redis.HasErrorPrefix(err, "TRYAGAIN")
}
