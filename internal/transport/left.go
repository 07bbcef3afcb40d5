// A decision whose caller left before Redis answered: its error, and the
// late report of its call's failure.

package transport

import (
	"errors"
	"sync"
)

// CallerLeft is the error of a decision whose caller's ctx was done before
// Redis answered: the caller gets err, its ctx's error, and no decision.
// The call may still be on the wire: Late, if not nil, is told if it fails
// within the Limiter's timeout, which the breaker counts (see
// Transport.wire).
type CallerLeft struct {
	err  error
	Late *Late
}

func (e *CallerLeft) Error() string { return e.err.Error() }
func (e *CallerLeft) Unwrap() error { return e.err }

// Late follows a call whose caller left, to its end: end says how it ended,
// once, from the goroutine that saw it; onFailure hands the failure, if
// any, to whoever reports it, and then has what must wait for the call's end
// (its context's cancel, the batcher's count of calls in flight) run then.
// They may come in any order, from any goroutines.
type Late struct {
	mu     sync.Mutex
	ended  bool
	err    error
	report func(error)
	after  []func()
}

// end records that the call ended, with err nil for an answer or the
// failure, and runs what waited for it.
func (l *Late) end(err error) {
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

// OnFailure has report called with the call's error, if it fails.
func (l *Late) OnFailure(report func(error)) {
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

// Then has f run when the call ends, on the goroutine that saw it end: at
// once if it has.
func (l *Late) Then(f func()) {
	l.mu.Lock()
	if !l.ended {
		l.after = append(l.after, f)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	f()
}

// lateOf returns the late of err, a *CallerLeft whose call goes on; nil if
// err is no such error.
func lateOf(err error) *Late {
	if err == nil {
		return nil // before gone, which goes to the heap
	}
	var gone *CallerLeft
	if errors.As(err, &gone) {
		return gone.Late
	}
	return nil
}
