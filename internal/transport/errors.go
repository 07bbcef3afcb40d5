// The errors of the transport, which the root names as its own; the form
// of every error that says where it happened (Wrap); and what a failed
// call says of its server (explain).

package transport

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrCircuitOpen is the root's ErrCircuitOpen: a server's breaker is open,
// and no call was made.
var ErrCircuitOpen = errors.New("ratelimit: circuit open after repeated Redis failures")

// ErrEvictionPolicy is the root's ErrEvictionPolicy: a server's
// maxmemory-policy can evict live counts.
var ErrEvictionPolicy = errors.New("ratelimit: Redis may evict live counts")

// ErrMisconfigured is the root's ErrMisconfigured: the server answered,
// and will answer every call the same until its configuration or the
// Limiter's changes (see misconfigured).
var ErrMisconfigured = errors.New("ratelimit: Redis cannot serve the Limiter as configured")

// wrapped says where an error happened, with "ratelimit:" once: its message
// is context, then the last error's own message without the "ratelimit: "
// it may start with, so that a FailClosed error over a circuit-open error
// over a server reads "ratelimit: Redis could not decide (FailClosed):
// 127.0.0.1:6379: circuit open …", not "ratelimit:" three times over. It
// unwraps to every error it was given: a sentinel and the cause.
type wrapped struct {
	context string  // starts with "ratelimit: "
	errs    []error // the last is the cause, whose message follows
}

// Wrap returns errs, the last of them the cause, in context.
func Wrap(context string, errs ...error) error { return &wrapped{context: context, errs: errs} }

// Error is context and the cause's message.
func (w *wrapped) Error() string {
	return w.context + ": " + strings.TrimPrefix(w.errs[len(w.errs)-1].Error(), "ratelimit: ")
}

// Unwrap returns every error given to Wrap.
func (w *wrapped) Unwrap() []error { return w.errs }

// explain returns the error of a decision that Redis did not make, saying
// what failed: the server, and for a call the Limiter's timeout ended (its
// context, wire, expired), that timeout and the last dial error the client
// met on that server.
func (t *Transport) explain(wire context.Context, srv *server, err error) error {
	name := "Redis Cluster"
	if srv != nil {
		name = srv.name
	}
	if t.timeout > 0 && expired(wire) && !errors.Is(err, ErrCircuitOpen) { // an open breaker asked no server: no reply was due
		addr := ""
		if t.cluster != nil {
			addr = name
		}
		if dialErr := t.dials.recent(addr); dialErr != nil {
			return fmt.Errorf("ratelimit: no reply within %v from %s: %w (last dial error: %w)", t.timeout, name, err, dialErr)
		}
		return fmt.Errorf("ratelimit: no reply within %v from %s: %w", t.timeout, name, err)
	}
	return Wrap("ratelimit: "+name, err)
}
