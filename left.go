package ratelimit

import (
	"context"
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

// late hands the failure of a call whose caller left to whoever reports it:
// fail and onFailure may come in either order, from any goroutines, and the
// report runs once, on the goroutine of the second. A call that does not
// fail is never reported.
type late struct {
	mu     sync.Mutex
	err    error
	report func(error)
}

// fail records that the call failed with err.
func (l *late) fail(err error) {
	l.mu.Lock()
	report := l.report
	if report == nil {
		l.err = err
	}
	l.mu.Unlock()
	if report != nil {
		report(err)
	}
}

// onFailure has report called with the call's error, if it fails.
func (l *late) onFailure(report func(error)) {
	l.mu.Lock()
	err := l.err
	if err == nil {
		l.report = report
	}
	l.mu.Unlock()
	if err != nil {
		report(err)
	}
}

// reportLate has the failure of d's call, whose caller left (gone), reach
// the error handler and the Observer when it comes, as an Event with Left
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
