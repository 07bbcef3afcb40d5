package otel

import (
	"context"
	"errors"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
)

// The values of error.type, as indexes into errorTypeNames.
const (
	noError = iota
	errTimeout
	errUnavailable
	errBadReply
	errOther
	numErrorTypes
)

var errorTypeNames = [numErrorTypes]string{
	noError:        "",
	errTimeout:     "timeout",
	errUnavailable: "unavailable",
	errBadReply:    "bad_reply",
	errOther:       "other",
}

// errorType sorts a Redis error into a few kinds, so that error.type stays
// low in cardinality (a decision of an open breaker has no Redis call, and
// so no duration to record one with): the reply was not what the
// script returns; Redis could not serve (a connection refused, reset or
// lost, a closed client or pool, a reply such as LOADING or BUSY); the
// deadline passed with no other cause named; anything else. A timeout that
// the core names a dial error as the cause of ("last dial error: connection
// refused") is unavailability: that is what an operator has to fix.
func errorType(err error) int {
	if err == nil {
		return noError
	}
	var netErr net.Error
	switch {
	case errors.Is(err, ratelimit.ErrBadReply):
		return errBadReply
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return errUnavailable // also when the core names it as a timeout's cause
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrPoolTimeout),
		errors.As(err, &netErr) && netErr.Timeout():
		return errTimeout
	case ratelimit.IsOutage(err):
		return errUnavailable
	}
	return errOther
}
