// The Limiter's errors: the sentinels a caller checks with errors.Is, and
// wrap, which gives each its context.

package ratelimit

import (
	"errors"

	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/transport"
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
	ErrInvalidCost = script.ErrInvalidCost
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
var ErrCircuitOpen = transport.ErrCircuitOpen

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
var ErrEvictionPolicy = transport.ErrEvictionPolicy

// ErrMisconfigured is wrapped by the error of a call Redis answers as it will
// every call until reconfigured: no Lua (Garnet without --lua), NOPERM, or
// WithScriptFlags' flags refused. The error handler gets it; no failure
// policy decides it: not allowed, under FailOpen too. docs/engines.md.
var ErrMisconfigured = transport.ErrMisconfigured

// ErrBadReply is wrapped by the error returned when the script's reply does
// not have the shape the Limiter expects, or when a key the request reads
// holds something that is not a count: a value another program wrote, or a
// key of another type. Such a request fails alone; the others of the same
// call are decided as usual.
var ErrBadReply = script.ErrBadReply

// ErrClosed is wrapped by the error of every call a Limiter is given after
// its Close that could reach Redis: nothing is sent.
var ErrClosed = errors.New("ratelimit: limiter closed")

// Errors of a Slot's Release and Extend.
var (
	// ErrInvalidSlot is returned by Release and Extend for a Slot that was
	// not Acquired: the zero Slot, or one Acquire refused.
	ErrInvalidSlot = errors.New("ratelimit: not a slot that Acquire acquired")
	// ErrLeaseEnded is returned by Extend when the slot's lease has ended:
	// the slot is no longer held, and may be someone else's.
	ErrLeaseEnded = errors.New("ratelimit: the slot's lease has ended")
)

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

// wrap returns errs, the last of them the cause, in context, as every
// error of the Limiter says where it happened: see transport.Wrap.
func wrap(context string, errs ...error) error { return transport.Wrap(context, errs...) }

// IsOutage reports whether err says Redis itself could not serve: a
// timeout, a connection that could not be made or was lost, a closed client
// or exhausted pool, or a reply such as LOADING, BUSY, READONLY,
// MASTERDOWN, CLUSTERDOWN, TRYAGAIN, NOREPLICAS, OOM or MISCONF. These are
// the failures a server's circuit breaker counts, but for CLUSTERDOWN and
// TRYAGAIN. A reply of the wrong shape (ErrBadReply), or a script error
// caused by one id's data, says Redis is up: IsOutage is false for them.
func IsOutage(err error) bool { return transport.IsOutage(err) }
