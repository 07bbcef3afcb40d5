package ratelimit

import "context"

// MaxLimits is maxLimits, for the tests of package ratelimit_test.
const MaxLimits = maxLimits

// The defaults the tests of package ratelimit_test check against.
const (
	DefaultBatch = defaultBatch
	MaxIDLength  = maxIDLength
)

// WithFewDeciding has the Limiter's batchers send each decision alone, at
// once, while no more than n are under way, in place of the transport's
// default; below 0, none: see BatchAlways.
func WithFewDeciding(n int) Option {
	return optionFunc(func(c *config) { c.fewDeciding = n })
}

// BatchAlways has the Limiter's batchers batch decisions however few are
// under way, for tests that need calls of several decisions from few
// goroutines.
func BatchAlways() Option { return WithFewDeciding(-1) }

// IdleSweeps is how many sweeps give back an idle lease.
const IdleSweeps = idleSweeps

// SweepLeases runs one sweep of l's leases, as the sweeper does every
// sweepEvery.
func SweepLeases(l *Limiter) { l.leases.sweep() }

// DropLeases drops l's leases and give-backs, sending nothing, and waits for
// its sweeper to end: for a test's cleanup, before its client closes.
func DropLeases(l *Limiter) {
	t := l.leases
	t.mu.Lock()
	clear(t.entries)
	t.pending = nil
	stopped := t.stopped
	t.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
}

// SetMaxLeases bounds l's lease table at n, in place of maxLeases.
func SetMaxLeases(l *Limiter, n int) {
	l.leases.mu.Lock()
	l.leases.max = n
	l.leases.mu.Unlock()
}

// LeaseCount returns how many leases l holds.
func LeaseCount(l *Limiter) int {
	l.leases.mu.Lock()
	defer l.leases.mu.Unlock()
	return len(l.leases.entries)
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

// SweepByHand keeps l from starting its lease sweeper: the test sweeps with
// SweepLeases, when it chooses. Call it before l holds a lease.
func SweepByHand(l *Limiter) {
	l.leases.mu.Lock()
	l.leases.manual = true
	l.leases.mu.Unlock()
}

// Settle waits until the work l does in the background (give-backs,
// releases, calls whose callers left) has ended, as Close does, without
// closing l.
func Settle(l *Limiter) {
	for {
		_ = l.bg.Wait(context.Background())
		if l.t != nil {
			_ = l.t.Drain(context.Background())
		}
		if !l.bg.Busy() {
			return
		}
	}
}
