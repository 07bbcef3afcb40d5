// The one send of every operation, and the tail of a call whose caller
// left before Redis answered.

package ratelimit

import (
	"context"
	"errors"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// op describes one call of an operation for what it reports: the Event an
// Observer sees of it (its kind, limits, cost and concurrency limit), and
// what is done if its caller leaves before Redis answers.
type op struct {
	kind   EventKind
	limits []Limit
	cost   int64        // for a refund or a give-back, what it gives back
	slot   *Concurrency // an Acquire's
	// quiet: a Release's, an Extend's or a Reset's, which no Event shows;
	// unreported: whose failure, even late, goes to no error handler.
	quiet, unreported bool
	// acquire is an Acquire's request: what it may take is released once
	// its call ends, if its caller left.
	acquire *script.Request
}

// call is the one send of every operation: it sends reqs in one call
// through the transport, and their replies to out. It returns how long the
// call took, for the Observer (0 without one, or when an open breaker made
// no call), and the call's error; or, when the caller left before Redis
// answered (see late), left true and ctx's error once ctx is done.
func (l *Limiter) call(ctx context.Context, id string, reqs []*script.Request, out []script.Reply, o *op) (took time.Duration, left bool, err error) {
	var start time.Time
	if l.observer != nil {
		start = time.Now()
	}
	err = l.t.Do(ctx, reqs, out)
	if err == nil {
		if l.observer != nil {
			took = time.Since(start)
		}
		return took, false, nil
	}
	if gone := (*transport.CallerLeft)(nil); errors.As(err, &gone) { // gone is on the heap: not for every call
		l.late(ctx, id, o, start, gone)
		<-ctx.Done() // at once, or as soon as the timer of a deadline just passed fires
		return 0, true, ctx.Err()
	}
	if l.observer != nil && !errors.Is(err, ErrCircuitOpen) { // an open breaker makes no call
		took = time.Since(start)
	}
	return took, false, err
}

// late has the failure of o's call, whose caller left (gone), reach the
// error handler and a CallObserver when it comes, as an Event with Left
// set: what the report needs is copied now, as the caller's memory is its
// own. start is when the call was sent, if an Observer wants its
// Duration. What an Acquire may take is released once its call ends,
// whether it took a slot or not.
func (l *Limiter) late(ctx context.Context, id string, o *op, start time.Time, gone *transport.CallerLeft) {
	if gone.Late == nil { // nothing was sent
		return
	}
	ctx = context.WithoutCancel(ctx)
	if o.acquire != nil {
		release := script.Release(o.acquire)
		gone.Late.Then(func() { l.background(id, release, "") })
	}
	if o.unreported {
		return
	}
	var report *op
	var results []Result
	if l.observer != nil && !o.quiet {
		report = &op{kind: o.kind, limits: append([]Limit(nil), o.limits...), cost: o.cost}
		if o.slot != nil { // a copy: nothing of o's may outlive its caller's call
			c := *o.slot
			report.slot = &c
		}
		results = resultsOf(report.limits)
	}
	gone.Late.OnFailure(func(err error) {
		l.onError(ctx, id, err)
		if report != nil {
			l.observe(ctx, id, report, results, SourceRedis, time.Since(start), err, false, true)
		}
	})
}

// background sends req, owed to Redis whether or not a caller waits (a
// give-back, a release), in a goroutine that Close waits for; a failure
// goes to the error handler in context what, or nowhere if what is empty
// (a release of what an Acquire may have taken: its lease frees it). It is
// sent once, as every call is.
func (l *Limiter) background(id string, req *script.Request, what string) {
	l.work.Go(func() {
		var out [1]script.Reply
		err := l.t.Do(context.Background(), []*script.Request{req}, out[:])
		if err == nil {
			err = out[0].Err
		}
		if err != nil && what != "" {
			l.onError(context.Background(), id, wrap(what, err))
		}
	})
}
