// The Limiter's errors: the sentinels a caller checks with errors.Is, and
// wrap, which gives each its context.

package ratelimit

import (
	"errors"
	"strings"
)

// Errors returned for input that cannot be decided. Each is wrapped with a
// message that names the value at fault; check with errors.Is. Nothing is
// sent to Redis for such input, whatever the failure policy, but for a
// Charge that only Redis can tell would take a count past 2^53 (see
// ErrInvalidCost), which Redis refuses without writing anything.
var (
	// ErrInvalidID is returned for an empty id.
	ErrInvalidID = errors.New("ratelimit: invalid id")
	// ErrInvalidLimit is returned for a Limit that Limit.Validate rejects,
	// and by AllowAll and PeekAll for limits that ValidateLimits rejects.
	ErrInvalidLimit = errors.New("ratelimit: invalid limit")
	// ErrInvalidCost is returned by AllowN, AllowAll and Charge for a
	// cost below 1 or above 2^53, and by Charge for a cost that would take
	// a limit's count past 2^53 (the most a count holds exactly), naming
	// the limit: nothing of that Charge is counted.
	ErrInvalidCost = errors.New("ratelimit: invalid cost")
	// ErrNilClient is returned by every method of a Limiter made with a nil
	// client.
	ErrNilClient = errors.New("ratelimit: New was given a nil Redis client")
	// ErrUnavailable is wrapped, together with the Redis error, by the error
	// a FailClosed decision returns when Redis could not decide.
	ErrUnavailable = errors.New("ratelimit: Redis could not decide")
)

// ErrCircuitOpen is wrapped by the error a decision meets while the circuit
// breaker is open: Redis failed repeatedly, and the decision went to the
// failure policy at once, without trying Redis.
var ErrCircuitOpen = errors.New("ratelimit: circuit open after repeated Redis failures")

// ErrEvictionPolicy is wrapped by a warning the error handler gets, with an
// empty id, when the Limiter reads that a Redis server it uses has a memory
// limit and a maxmemory-policy other than noeviction: under memory pressure
// such a server deletes live counts, silently, and the limits they held
// then admit more than their rates. Decisions go on as usual. The Limiter
// looks the policy up with CONFIG GET after its first successful call to
// each server it knows by address: each master of a Redis Cluster, the one
// server of a *redis.Client (of a failover client, the master at that
// first call; of a Ring, one shard). Where CONFIG is disabled or not
// granted it says nothing.
var ErrEvictionPolicy = errors.New("ratelimit: Redis may evict live counts")

// ErrBadReply is wrapped by the error returned when the script's reply does
// not have the shape the Limiter expects, or when a key the request reads
// holds something that is not a count: a value another program wrote, or a
// key of another type. Such a request fails alone; the others of the same
// call are decided as usual.
var ErrBadReply = errors.New("ratelimit: unexpected reply from Redis")

// Errors returned by Wait and WaitN, besides those of AllowN.
var (
	// ErrNeverAllowed is returned by WaitN, at once, for a cost above the
	// limit's Rate: no window can ever hold it.
	ErrNeverAllowed = errors.New("ratelimit: cost is above the limit's rate; waiting would never help")
	// ErrWaitExceedsDeadline is wrapped by the error WaitN returns, at once
	// and without sleeping, when the wait a denial names would end at or
	// after ctx's deadline.
	ErrWaitExceedsDeadline = errors.New("ratelimit: the wait would outlast the context's deadline")
)

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

// wrap returns errs, the last of them the cause, in context.
func wrap(context string, errs ...error) error { return &wrapped{context: context, errs: errs} }

func (w *wrapped) Error() string {
	return w.context + ": " + strings.TrimPrefix(w.errs[len(w.errs)-1].Error(), "ratelimit: ")
}

func (w *wrapped) Unwrap() []error { return w.errs }
