package otel

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
)

// The values of error.type, as indexes into errorTypeNames.
const (
	noError = iota
	errTimeout
	errCircuitOpen
	errUnavailable
	errBadReply
	errOther
	numErrorTypes
)

var errorTypeNames = [numErrorTypes]string{
	noError:        "",
	errTimeout:     "timeout",
	errCircuitOpen: "circuit_open",
	errUnavailable: "unavailable",
	errBadReply:    "bad_reply",
	errOther:       "other",
}

// unavailableReplies are the Redis error replies that say the server cannot
// serve right now, whatever the keys: the ones the core's circuit breaker
// counts.
var unavailableReplies = []string{
	"LOADING", "BUSY", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
	"NOREPLICAS", "OOM", "MISCONF", "max number of clients reached",
}

// errorType sorts a Redis error into a few kinds, so that error.type stays
// low in cardinality: the breaker was open; the reply was not what the
// script returns; Redis could not serve (a connection refused, reset or
// lost, a closed client or pool, a reply such as LOADING or BUSY); the
// deadline passed with no other cause named; anything else. A timeout that
// the core names a dial error as the cause of ("last dial error: connection
// refused") is unavailability: that is what an operator has to fix.
func errorType(err error) int {
	if err == nil {
		return noError
	}
	switch {
	case errors.Is(err, ratelimit.ErrCircuitOpen):
		return errCircuitOpen
	case errors.Is(err, ratelimit.ErrBadReply):
		return errBadReply
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolExhausted):
		return errUnavailable
	}
	for _, prefix := range unavailableReplies {
		if redis.HasErrorPrefix(err, prefix) {
			return errUnavailable
		}
	}
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrPoolTimeout),
		errors.As(err, &netErr) && netErr.Timeout():
		return errTimeout
	case netErr != nil: // a DNS failure, an unreachable network
		return errUnavailable
	}
	return errOther
}
