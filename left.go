// A decision whose caller left before Redis answered: its error, and the
// late report of its call's failure.

package ratelimit

import (
	"context"
	"errors"
	"sync"
	"time"
)

// callerLeft is the error of a decision whose caller's ctx was done before
// Redis answered: the caller gets err, its ctx's error, and no decision.
// The call may still be on the wire: late, if not nil, is told if it fails
// within the Limiter's timeout, which the breaker counts (see
// transport.wire).
type callerLeft struct {
	err  error
	late *late
}

func (e *callerLeft) Error() string { return e.err.Error() }
func (e *callerLeft) Unwrap() error { return e.err }

// late follows a call whose caller left, to its end: end says how it ended,
// once, from the goroutine that saw it; onFailure hands the failure, if
// any, to whoever reports it, and then has what must wait for the call's end
// (its context's cancel, the batcher's count of calls in flight) run then.
// They may come in any order, from any goroutines.
type late struct {
	mu     sync.Mutex
	ended  bool
	err    error
	report func(error)
	after  []func()
}

// end records that the call ended, with err nil for an answer or the
// failure, and runs what waited for it.
func (l *late) end(err error) {
	l.mu.Lock()
	l.ended, l.err = true, err
	report, after := l.report, l.after
	l.after = nil
	l.mu.Unlock()
	for _, f := range after {
		f()
	}
	if report != nil && err != nil {
		report(err)
	}
}

// onFailure has report called with the call's error, if it fails.
func (l *late) onFailure(report func(error)) {
	l.mu.Lock()
	ended, err := l.ended, l.err
	if !ended {
		l.report = report
	}
	l.mu.Unlock()
	if ended && err != nil {
		report(err)
	}
}

// then has f run when the call ends: at once if it has.
func (l *late) then(f func()) {
	l.mu.Lock()
	if !l.ended {
		l.after = append(l.after, f)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	f()
}

// lateOf returns the late of err, a *callerLeft whose call goes on; nil if
// err is no such error.
func lateOf(err error) *late {
	if err == nil {
		return nil // before gone, which goes to the heap
	}
	var gone *callerLeft
	if errors.As(err, &gone) {
		return gone.late
	}
	return nil
}

// reportLate has the failure of d's call, whose caller left (gone), reach
// the error handler and a CallObserver when it comes, as an Event with Left
// set: d is its caller's, and gone only by then, so that what the report
// needs is copied now. start is when the call was sent, if an Observer
// wants its Duration.
func (l *Limiter) reportLate(ctx context.Context, d *decision, id string, start time.Time, gone *callerLeft) {
	if gone.late == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	var copied *decision
	if l.observer != nil {
		copied = &decision{limits: append([]Limit(nil), d.limits...), results: make([]Result, len(d.limits)), cost: d.cost, charge: d.charge, refund: d.refund, left: true}
		for i, limit := range d.limits {
			copied.results[i].Limit = limit
		}
	}
	gone.late.onFailure(func(err error) {
		l.onError(ctx, id, err)
		if copied != nil {
			l.observe(ctx, copied, id, SourceRedis, time.Since(start), err, false)
		}
	})
}
