// Package logs is how the library's default handlers log a failure that
// may repeat at every call: through slog's default logger, at most a line
// every Every, counting the lines left out, so that an outage under load
// gives a line every few seconds rather than one per call.
package logs

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"
)

// Every is how often, at most, a Limited logs.
const Every = 10 * time.Second

// Limited logs at most one line every Every. The zero Limited is ready,
// and safe for simultaneous use.
type Limited struct {
	next    atomic.Int64 // Unix ns before which nothing is logged
	dropped atomic.Int64 // lines not logged since the last one
}

// Warn logs msg and err at Warn level, now being now (by whatever clock
// the caller paces itself), unless a line was logged less than Every
// before: then it counts the line left out, which the next line reports.
func (l *Limited) Warn(ctx context.Context, now time.Time, msg string, err error) {
	n, next := now.UnixNano(), l.next.Load()
	if n < next || !l.next.CompareAndSwap(next, n+int64(Every)) {
		l.dropped.Add(1)
		return
	}
	slog.Default().WarnContext(ctx, msg, "error", err, "errors_not_logged", l.dropped.Swap(0))
}

// Handler is the Limiter's default error handler: it logs through slog's
// default logger, failures at most once every Every (Limited), so that a
// Redis outage under load gives a line every few seconds rather than one
// per request, and an Eviction warning (given once per server) every time.
// It logs no id: ids are often addresses or API keys.
type Handler struct {
	Now           func() time.Time // paces the failures' lines
	Eviction      error            // the warning of a server that may evict counts
	Misconfigured error            // a server that refuses what the Limiter sends: no failure policy decides
	Limited
}

// Handle logs err, an error of id's call.
func (h *Handler) Handle(ctx context.Context, _ string, err error) {
	switch {
	case errors.Is(err, h.Eviction):
		slog.Default().WarnContext(ctx, "ratelimit: Redis may evict live counts", "error", err)
	case errors.Is(err, h.Misconfigured):
		h.Warn(ctx, h.Now(), "ratelimit: Redis refuses what the Limiter sends; every call fails until it is reconfigured", err)
	default:
		h.Warn(ctx, h.Now(), "ratelimit: Redis failed; the failure policy decided", err)
	}
}
