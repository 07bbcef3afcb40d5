// The failure policies' decisions, and the default error handler.

package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"
)

// fail turns an error from Redis into a decision by the failure policy:
// every limit of the decision alike; for an Acquire, its slot.
func (l *Limiter) fail(ctx context.Context, d *decision, id string, took time.Duration, redisErr error) error {
	l.onError(ctx, id, redisErr)
	var err error
	switch l.policy {
	case FailClosed:
		d.allowed = false
		err = wrap("ratelimit: Redis could not decide (FailClosed)", ErrUnavailable, redisErr)
	case FailLocal:
		switch {
		case d.quotas != nil:
			l.local.decideMany(d)
		case d.slot != nil:
			l.local.acquire(l, id, d)
		default:
			l.local.decide(id, d)
		}
	default:
		d.allowed = true
	}
	if s := d.slot; s != nil {
		s.Degraded, s.Acquired = true, d.allowed
		if !d.allowed { // the script may have run: what it may have taken goes back
			l.background(id, d.release(), "")
		} else if l.policy == FailOpen {
			s.held = d.holding(l, id)
			s.held.maybe = true
		}
	}
	for i := range d.results {
		r := &d.results[i]
		if l.policy != FailLocal {
			*r = Result{Allowed: d.allowed, Limit: r.Limit}
			if d.allowed {
				r.Remaining = r.Limit.Rate
			}
		}
		r.Degraded, r.receipt = true, receipt{} // counted here, if at all, not in Redis
	}
	return l.finish(ctx, d, id, SourcePolicy, took, redisErr, err)
}

// logEvery is how often, at most, the default error handler logs.
const logEvery = 10 * time.Second

// logHandler is the default error handler: it logs through slog's default
// logger, at most once every logEvery, so that a Redis outage under load
// gives a line every few seconds rather than one per request. It logs no id:
// ids are often addresses or API keys.
type logHandler struct {
	now     func() time.Time
	next    atomic.Int64 // Unix ns before which nothing is logged
	dropped atomic.Int64 // errors not logged since the last line
}

func newLogHandler(now func() time.Time) *logHandler { return &logHandler{now: now} }

func (h *logHandler) handle(ctx context.Context, _ string, err error) {
	if errors.Is(err, ErrEvictionPolicy) { // once per server: never left out
		slog.Default().WarnContext(ctx, "ratelimit: Redis may evict live counts", "error", err)
		return
	}
	now := h.now().UnixNano()
	next := h.next.Load()
	if now < next || !h.next.CompareAndSwap(next, now+int64(logEvery)) {
		h.dropped.Add(1)
		return
	}
	slog.Default().WarnContext(ctx, "ratelimit: Redis failed; the failure policy decided",
		"error", err, "errors_not_logged", h.dropped.Swap(0))
}
