// The tail of a call whose caller left before Redis answered: its failure
// reaches the error handler and a CallObserver when it comes, and what an
// Acquire may yet take is given back once its call ends.

package ratelimit

import (
	"context"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// reportLate has the failure of d's call, whose caller left (gone), reach
// the error handler and a CallObserver when it comes, as an Event with Left
// set: d is its caller's, and gone only by then, so that what the report
// needs is copied now. start is when the call was sent, if an Observer
// wants its Duration. What an Acquire may take is released once the
// call ends, whether it took a slot or not.
func (l *Limiter) reportLate(ctx context.Context, d *decision, id string, start time.Time, gone *transport.CallerLeft) {
	if gone.Late == nil { // nothing was sent
		return
	}
	ctx = context.WithoutCancel(ctx)
	if d.slot != nil {
		undo := d.release()
		gone.Late.Then(func() { l.background(id, undo, "") })
	}
	if d.unreported {
		return
	}
	var copied *decision
	if l.observer != nil && !d.quiet {
		copied = &decision{limits: append([]Limit(nil), d.limits...), results: make([]Result, len(d.limits)), cost: d.cost, kind: d.kind, left: true}
		for i, limit := range d.limits {
			copied.results[i].Limit = limit
		}
		if d.slot != nil {
			copied.slot = &Slot{Concurrency: d.slot.Concurrency}
		}
	}
	gone.Late.OnFailure(func(err error) {
		l.onError(ctx, id, err)
		if copied != nil {
			l.observe(ctx, copied, id, SourceRedis, time.Since(start), err, false)
		}
	})
}

// background sends req, owed to Redis whether or not a caller waits (a
// give-back, a release), in a goroutine that Close waits for; a failure
// goes to the error handler in context what, or nowhere if what is empty
// (a release of what an Acquire may have taken: its lease frees it). It is
// sent once, as every call is.
func (l *Limiter) background(id string, req *script.Request, what string) {
	l.bg.Go(func() {
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
