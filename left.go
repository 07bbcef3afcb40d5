// The late report of a call whose caller left before Redis answered: its
// failure reaches the error handler and a CallObserver when it comes.

package ratelimit

import (
	"context"
	"time"

	"github.com/slidingwindow/ratelimit/internal/transport"
)

// reportLate has the failure of d's call, whose caller left (gone), reach
// the error handler and a CallObserver when it comes, as an Event with Left
// set: d is its caller's, and gone only by then, so that what the report
// needs is copied now. start is when the call was sent, if an Observer
// wants its Duration.
func (l *Limiter) reportLate(ctx context.Context, d *decision, id string, start time.Time, gone *transport.CallerLeft) {
	if gone.Late == nil {
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
	gone.Late.OnFailure(func(err error) {
		l.onError(ctx, id, err)
		if copied != nil {
			l.observe(ctx, copied, id, SourceRedis, time.Since(start), err, false)
		}
	})
}
