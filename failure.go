package ratelimit

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// fail turns an error from Redis into a decision by the failure policy, for
// a request of cost n (0 for a Peek). A ctx that the caller let end is not a
// Redis failure: its error comes back as it is, with no decision and no call
// to the error handler.
func (l *Limiter) fail(ctx context.Context, id string, limit Limit, pos position, n int64, err error) (Result, error) {
	if ctx.Err() != nil {
		return Result{Limit: limit}, ctx.Err()
	}
	l.onError(ctx, id, err)
	switch l.policy {
	case FailClosed:
		return Result{Limit: limit, Degraded: true}, fmt.Errorf("%w (FailClosed): %w", ErrUnavailable, err)
	case FailLocal:
		return l.local.decide(id, limit, pos, n), nil
	}
	return Result{Allowed: true, Limit: limit, Remaining: limit.Rate, Degraded: true}, nil
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
	now := h.now().UnixNano()
	next := h.next.Load()
	if now < next || !h.next.CompareAndSwap(next, now+int64(logEvery)) {
		h.dropped.Add(1)
		return
	}
	slog.Default().WarnContext(ctx, "ratelimit: Redis failed; the failure policy decided",
		"error", err, "errors_not_logged", h.dropped.Swap(0))
}
