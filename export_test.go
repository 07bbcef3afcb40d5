package ratelimit

import (
	"context"
	"time"

	"github.com/slidingwindow/ratelimit/internal/keys"
	"github.com/slidingwindow/ratelimit/internal/lease"
	"github.com/slidingwindow/ratelimit/internal/logs"
)

// newLogHandler returns New's default error handler, its failures paced
// by now.
func newLogHandler(now func() time.Time) *logs.Handler {
	return &logs.Handler{Now: now, Eviction: ErrEvictionPolicy, Misconfigured: ErrMisconfigured}
}

// MaxLimits is maxLimits, for the tests of package ratelimit_test.
const MaxLimits = maxLimits

// The defaults the tests of package ratelimit_test check against.
const (
	DefaultBatch = defaultBatch
	MaxIDLength  = keys.MaxID
)

// WithFewDeciding has the Limiter's batchers send each decision alone, at
// once, while no more than n are under way, in place of the transport's
// default; 0 or less, none: see BatchAlways.
func WithFewDeciding(n int) Option {
	return optionFunc(func(c *config) { c.fewDeciding = n })
}

// BatchAlways has the Limiter's batchers batch decisions however few are
// under way, for tests that need calls of several decisions from few
// goroutines.
func BatchAlways() Option { return WithFewDeciding(0) }

// IdleSweeps is how many sweeps give back an idle lease.
const IdleSweeps = lease.IdleSweeps

// SweepLeases runs one sweep of l's leases, as the sweeper does every
// quarter of a second.
func SweepLeases(l *Limiter) { l.leases.Sweep() }

// DropLeases drops l's leases and give-backs, sending nothing, and waits for
// what l runs in the background, its sweeper too: for a test's cleanup,
// before its client closes.
func DropLeases(l *Limiter) {
	l.leases.Drop()
	Settle(l)
}

// WithMaxLeases bounds the Limiter's lease table at n, in place of its
// default.
func WithMaxLeases(n int) Option {
	return optionFunc(func(c *config) { c.maxLeases = n })
}

// LeaseCount returns how many leases l holds.
func LeaseCount(l *Limiter) int {
	n, _ := l.leases.Held()
	return n
}

// Public returns r without what it carries for Refund: the Result a model,
// which cannot set it, would make.
func Public(r Result) Result {
	r.receipt = receipt{}
	return r
}

// PublicAll returns Public of each of rs, in a new slice.
func PublicAll(rs []Result) []Result {
	if rs == nil {
		return nil
	}
	out := make([]Result, len(rs))
	for i, r := range rs {
		out[i] = Public(r)
	}
	return out
}

// SweepByHand keeps the Limiter from starting its lease sweeper: the test
// sweeps with SweepLeases, when it chooses.
func SweepByHand() Option {
	return optionFunc(func(c *config) { c.sweepByHand = true })
}

// Settle waits until the work l does in the background (give-backs,
// releases, calls whose callers left, the lease sweeper) has ended, as
// Close does, without closing l.
func Settle(l *Limiter) { _ = l.work.Wait(context.Background()) }
