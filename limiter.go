// The Limiter and its methods: the API a user reads first.

package ratelimit

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/denycache"
	"github.com/slidingwindow/ratelimit/internal/group"
	"github.com/slidingwindow/ratelimit/internal/keys"
	"github.com/slidingwindow/ratelimit/internal/lease"
	"github.com/slidingwindow/ratelimit/internal/local"
	"github.com/slidingwindow/ratelimit/internal/logs"
	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/transport"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// InfDuration is the RetryAfter of a request that would never be allowed:
// its cost is above the limit's Rate. It is about 292 years, as in
// golang.org/x/time/rate, so that a caller that takes RetryAfter as a wait
// and rounds it up waits for ever rather than retrying at once. It is
// math.MaxInt64 less a second but a ns, where x/time/rate's is
// math.MaxInt64, so that the integer idiom of rounding up to seconds,
// (d + time.Second - 1) / time.Second, does not wrap: it gives 9223372036,
// as math.Ceil(d.Seconds()) does; d.Round saturates. Test for it with
// == InfDuration, not against x/time/rate's.
const InfDuration = time.Duration(math.MaxInt64 - (time.Second - 1))

// The wait of what never happens is the same in the arithmetic's model.
var _ = [1]struct{}{}[InfDuration-window.Never]

// maxLimits is the most limits AllowAll and PeekAll take in one call. Each
// limit adds its keys and four arguments to the one script call; real plans
// have two to four limits, and more than maxLimits is a mistake to report
// rather than a slow call to make.
const maxLimits = plan.MaxLimits

// Result is the outcome of one decision against one limit.
//
// A Result whose limit counted the request also carries, unexported, what
// Refund needs to give it back: it is then not == to a Result literal of
// the same fields, nor Equal to one under testify. In tests compare its
// fields, or use testify's EqualExportedValues (go-cmp:
// cmpopts.IgnoreUnexported(Result{})). A Result that counted nothing (a
// denial, a Peek, a Degraded decision) carries nothing unexported.
type Result struct {
	// Allowed reports whether the request may go ahead. When it is true, the
	// request's cost has been counted.
	Allowed bool
	// Count is the estimated usage of the sliding window after this decision:
	// with this request's cost if it was counted, without it if not.
	Count int64
	// Limit is the limit the decision was made against.
	Limit Limit
	// Remaining is max(0, Limit.Rate - Count).
	Remaining int64
	// RetryAfter is 0 when the request was allowed. When it was denied, it is
	// the shortest wait after which this limit would admit the same request
	// if no other traffic came, exact to the millisecond (0 if it already
	// does, when another limit denied); InfDuration if it never would,
	// because the cost is above Limit.Rate. A denial that shadow mode let
	// through (Shadowed) keeps the denial's RetryAfter, and so does the
	// Result of a Shadow limit: Allowed is then true, RetryAfter not 0.
	RetryAfter time.Duration
	// ResetAfter is the shortest wait after which Count would be 0 if no
	// other traffic came, exact to the millisecond.
	ResetAfter time.Duration
	// Degraded reports that the decision came from the failure policy because
	// Redis could not make it. Count, Remaining, RetryAfter and ResetAfter
	// then say nothing about real usage: under FailOpen Count is 0 and
	// Remaining is Limit.Rate, under FailClosed both are 0, and the waits
	// are 0; under FailLocal they describe this process's share. A decision
	// that timed out may still have been counted by Redis, if the script ran
	// after all: a degraded request may have used quota.
	Degraded bool
	// Shadowed reports that this limit would have denied the request, which
	// went ahead because of shadow mode: under WithShadow, on the Results of
	// the limits that denied a decision (all of them when the failure policy
	// denied it); for a Limit with Shadow set, when that limit alone would
	// have denied it. Count, RetryAfter and ResetAfter are those of the
	// denied. A request some Result of which is Shadowed would have been
	// denied.
	Shadowed bool

	// receipt is what Refund needs; the zero receipt when this limit
	// counted nothing.
	receipt receipt
}

// receipt says what one limit of a decision counted, for Refund: the
// Limiter that made it and a hash of the id (to refuse a Result of
// another), what the limit counted (0 for nothing) in which window (for a
// strict limit, sub-window; for a calendar limit, the start of its
// period in Unix ms) index, of which count (Window in ms and Strict, or
// Calendar and Location, as decided: Result.Limit is the caller's to
// change).
type receipt struct {
	by, id          uint64
	window, counted int64
	ms              int64
	strict          bool
	cal             Period
	loc             *time.Location
	// refill is RefillAfter's: the wait, as of the decision, until the
	// count would fall below what it is after it.
	refill time.Duration
}

// RefillAfter returns, for a Result whose limit counted the request, the
// shortest wait after which Count would fall, so that Remaining grows, if
// no other traffic came, exact to the millisecond: for a sliding window
// when the previous window's weight drops by one request, or, when it
// weighs nothing, as the current window's requests begin to fade; for a
// strict limit when its oldest counted sub-window leaves the Window; for a
// Calendar limit when the period ends (ResetAfter). Until then Remaining
// is all the client may use, and it is never longer than ResetAfter.
// httplimit's RateLimit t on an allowed response is it, in seconds. It is
// 0 for a Result that counted nothing (a denial, a Peek, a Degraded
// decision), which carries nothing unexported.
func (r Result) RefillAfter() time.Duration { return r.receipt.refill }

// Binding returns the Result that decided: when denied, the one with the
// longest RetryAfter (InfDuration, "never", is the longest); when
// allowed, the one with the least Remaining; ties go to the first; the zero
// Result for none. The Results of Shadow limits, which decide nothing, are
// passed over unless there are no others.
func Binding(results []Result) Result {
	for _, shadows := range []bool{false, true} { // the Shadow limits' only if no other
		best := -1
		for i, r := range results {
			if (shadows || !r.Limit.Shadow) && (best < 0 || better(r, results[best])) {
				best = i
			}
		}
		if best >= 0 {
			return results[best]
		}
	}
	return Result{}
}

// better reports whether r binds more than b, the one so far.
func better(r, b Result) bool {
	if b.Allowed {
		return r.Remaining < b.Remaining
	}
	return r.RetryAfter > b.RetryAfter
}

// Limiter decides requests against sliding-window limits kept in Redis.
// Each decision is one round trip running one Lua script, so any number of
// application servers sharing one Redis (or Redis Cluster) share each limit
// exactly. A Limiter is safe for simultaneous use by multiple goroutines.
//
// Close it when the process is done with it, after the servers that call
// it have stopped (http.Server.Shutdown): Close gives back what its leases
// (Limit.Leased) hold unused, which would otherwise count in Redis until
// their windows end, and waits for its goroutines: batches in flight,
// give-backs and the calls of callers who left (each within the Limiter's
// timeout), the look at each server's eviction policy (within a second,
// or a Cluster or Ring client's ReadTimeout if it ignores ctx deadlines),
// and while the Limiter holds leases, the one that gives back what goes
// unused.
type Limiter struct {
	serial      uint64 // tells its Results from another Limiter's, for Refund
	keys        keys.Keys
	now         func() time.Time
	policy      FailurePolicy
	onError     func(ctx context.Context, id string, err error)
	shadow      bool  // WithShadow
	countDenied uint8 // script.ModeCountDenied with WithCountDenied
	observer    Observer
	observeIDs  bool
	t           *transport.Transport // nil for a nil client
	denied      *denycache.Cache     // nil unless WithDenyCache
	local       *local.Windows       // nil unless FailLocal
	leases      *lease.Table
	keeps       group.Repeats // Slot.Keep's extensions
	// slotsAcquired and slotsReleased count Acquire's slots and their
	// Releases, for Stats.
	slotsAcquired, slotsReleased atomic.Int64
	// sleep pauses Wait between tries (WithSleep).
	sleep func(ctx context.Context, d time.Duration) error

	// The Limiter's life, which Close ends: closed is set and quit
	// canceled by Close, ending Wait's sleeps, the lease sweeper and
	// Slot.Keep's extensions; done is closed once a Close has ended
	// everything. work counts everything under way, the calls that may
	// reach Redis and every goroutine the Limiter starts (its transport's
	// too), on a cache line of its own: every call writes it, and the
	// fields above are read by every call.
	closed   atomic.Bool
	quit     context.Context
	stop     context.CancelFunc
	done     chan struct{}
	doneOnce sync.Once
	_        [64]byte
	work     group.Group
	_        [64]byte
}

// limiters numbers the Limiters of the process.
var limiters atomic.Uint64

// New returns a Limiter that keeps its counts in client. Any
// redis.UniversalClient works: a *redis.Client, a *redis.ClusterClient (all
// keys of a decision share a hash slot), a *redis.Ring or a failover client.
// With a nil client, of any type, every method returns ErrNilClient.
//
// New knows those client types by their concrete type: batching applies to
// a *redis.Client (a failover client is one) and a *redis.ClusterClient,
// and the Limiter leaves its deadlines to a *redis.Client, ClusterClient or
// Ring whose ContextTimeoutEnabled is set, and to the socket deadlines of a
// *redis.Client whose ContextTimeoutEnabled is not (see WithTimeout). A
// client of any other type (a UniversalClient of your own that wraps one)
// is used as it is: no batching, and each decision's deadline watched from
// a goroutine. New adds a go-redis hook to the client (for a Cluster or a
// Ring, to its nodes' clients) that records dial errors, so that a timeout
// can name the last one; and, to a *redis.Client whose
// ContextTimeoutEnabled is not set, at the Limiter's first call, a hook
// that sends the Limiter's own commands through a copy of it with the
// Limiter's timeout (see WithTimeout). It does nothing else to a command.
func New(client redis.UniversalClient, opts ...Option) *Limiter {
	cfg := defaultConfig()
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&cfg)
		}
	}
	l := &Limiter{
		serial:     limiters.Add(1),
		keys:       keys.New(cfg.prefix),
		now:        cfg.now,
		policy:     cfg.policy,
		onError:    cfg.onError,
		shadow:     cfg.shadow,
		observer:   cfg.observer,
		observeIDs: cfg.observeIDs,
		sleep:      cfg.sleep,
		done:       make(chan struct{}),
	}
	l.quit, l.stop = context.WithCancel(context.Background())
	if cfg.countDenied {
		l.countDenied = script.ModeCountDenied
	}
	if cfg.denyMax > 0 && !cfg.countDenied {
		l.denied = denycache.New(cfg.denyMax)
	}
	if cfg.policy == FailLocal {
		l.local = local.New(cfg.replicas)
	}
	if l.onError == nil {
		l.onError = (&logs.Handler{Now: time.Now, Eviction: ErrEvictionPolicy, Misconfigured: ErrMisconfigured}).Handle // real time: WithClock's may stand still
	}
	if !transport.IsNil(client) {
		l.t = transport.New(client, transport.Config{
			Timeout:         cfg.timeout,
			MaxBatch:        cfg.batchMax,
			FewDeciding:     cfg.fewDeciding,
			ScriptFlags:     cfg.scriptFlags,
			BreakerFailures: cfg.breakerFailures,
			BreakerCooldown: cfg.breakerCooldown,
			Warn:            func(err error) { l.onError(context.Background(), "", err) },
			Work:            &l.work,
		})
	}
	l.leases = lease.New(lease.Config{
		Send: l.t.Do, // not called without a client
		Report: func(ctx context.Context, id string, err error) {
			l.onError(ctx, id, wrap("ratelimit: giving back a lease", err))
		},
		Forget: l.forgetDenial,
		Now:    func() int64 { return l.now().UnixMilli() },
		Go:     l.work.Go,
		Quit:   l.quit.Done(),
		Max:    cfg.maxLeases,
		Manual: cfg.sweepByHand,
		Wait:   cfg.timeout,
	})
	return l
}

// forgetDenial drops what the deny cache holds of id's count at p, if
// there is a deny cache.
func (l *Limiter) forgetDenial(id string, p window.Position) {
	if l.denied != nil {
		l.denied.Forget(id, p)
	}
}

// Allow is shorthand for AllowN(ctx, id, limit, 1).
func (l *Limiter) Allow(ctx context.Context, id string, limit Limit) (Result, error) {
	return l.AllowN(ctx, id, limit, 1)
}

// AllowN decides whether a request of cost n by id fits in limit and, if it
// does, counts it. Being denied is a Result with Allowed false, not an error.
// Limits of the same Window share one count per id: see Limit.
//
// The error is non-nil for invalid input (ErrInvalidID, ErrInvalidLimit,
// ErrInvalidCost), when ctx is done before Redis answers and the caller
// leaves (ctx.Err(); see FailurePolicy for when it does), and
// when Redis cannot decide under FailClosed (ErrUnavailable). A cost above
// limit.Rate is denied with RetryAfter InfDuration; one above 2^53, more
// than any Rate, is ErrInvalidCost.
func (l *Limiter) AllowN(ctx context.Context, id string, limit Limit, n int64) (Result, error) {
	var o one
	var p plan.Plan
	p.Spans, p.Replies = o.Spans[:], o.Replies[:]
	err := l.decide(ctx, id, o.of(limit), n, &p, o.Outs[:], o.results[:])
	return o.results[0], err
}

// AllowAll decides a request of cost n by id against every limit at once. It
// is allowed, and counted under each limit, only if it fits all of them;
// otherwise nothing is counted anywhere. results[i] is limits[i]'s; every
// results[i].Allowed is that one decision. It is one script call, whatever
// the number of limits.
//
// A limit with Shadow set takes no part in that decision: it is counted
// when it admits the request on its own, and its Result's Shadowed reports
// when it would not have.
//
// The errors are AllowN's, and ErrInvalidLimit for limits that
// ValidateLimits rejects: none, more than 16, or two of the same Window and
// Strict (they would share a count), naming both. Results then has one
// zero-valued Result per limit but for its Limit.
func (l *Limiter) AllowAll(ctx context.Context, id string, limits []Limit, n int64) ([]Result, error) {
	out := resultsOf(limits)
	err := l.decide(ctx, id, limits, n, newPlan(len(limits)), make([]plan.Out, len(limits)), out)
	return out, err
}

// Peek reports where id stands against limit without counting anything:
// Count is the current estimate and ResetAfter the wait until it is 0;
// Allowed and RetryAfter are what a request of cost 1 would get now. Errors
// are as for AllowN. For a Leased limit, a lease held with a unit left
// answers without Redis, as a decision from it would count.
func (l *Limiter) Peek(ctx context.Context, id string, limit Limit) (Result, error) {
	var o one
	var p plan.Plan
	p.Spans, p.Replies = o.Spans[:], o.Replies[:]
	err := l.look(ctx, id, o.of(limit), &p, o.Outs[:], o.results[:])
	return o.results[0], err
}

// PeekAll reports where id stands against each limit, writing nothing:
// Count is each limit's current estimate and ResetAfter the wait until it is
// 0; Allowed and RetryAfter are what a cost-1 AllowAll would get now. Errors
// are as for AllowAll.
func (l *Limiter) PeekAll(ctx context.Context, id string, limits []Limit) ([]Result, error) {
	out := resultsOf(limits)
	err := l.look(ctx, id, limits, newPlan(len(limits)), make([]plan.Out, len(limits)), out)
	return out, err
}

// Reset forgets id's usage of limit: it deletes the keys of its current and
// previous windows (every sub-window, for a strict limit), and drops any
// lease this process holds of them (Limit.Leased) without giving it back;
// other processes' leases serve on until their window ends, and a
// give-back this process already sent may land after the delete, lowering
// the new count by at most what its lease held (see docs/leases.md). The error is
// non-nil for invalid input, when ctx is done, and when Redis fails; the
// failure policy does not apply.
func (l *Limiter) Reset(ctx context.Context, id string, limit Limit) error {
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	if err := l.checkDecision(id, []Limit{limit}, 1); err != nil {
		return err
	}
	pos := locate(l.now().UnixMilli(), &limit)
	keys := l.keys.Append(nil, id, pos)
	var out [1]script.Reply
	_, left, err := l.call(ctx, id, []*script.Request{{Kind: script.KindDelete, Keys: keys}}, out[:], &op{quiet: true})
	l.forgetDenial(id, pos)
	l.leases.Forget(id, pos, keys)
	if err != nil {
		if !left { // a caller who left hears of it when it comes (see late)
			l.onError(ctx, id, err)
		}
		return wrap("ratelimit: reset", err)
	}
	return nil
}

// Now returns the time on the Limiter's clock, the one its decisions are
// placed on: WithClock's, a RedisClock's, or time.Now. With Period.Bounds
// it tells which calendar period a decision made now falls in, and
// l.Now().Add(res.ResetAfter) when a Result's count will be 0.
func (l *Limiter) Now() time.Time { return l.now() }

// Stats is a snapshot of a Limiter's local state, for metrics.
type Stats struct {
	// BreakerOpen reports that the circuit breaker of some server (on a
	// Redis Cluster there is one per master) is open or probing: decisions
	// for that server go to the failure policy without trying Redis.
	BreakerOpen bool
	// DenyCacheEntries is the number of clients the deny cache holds.
	DenyCacheEntries int
	// Leases is the number of leases (Limit.Leased) this process holds, and
	// LeasedUnits the units they hold: counted in Redis and not yet used
	// here, what the limits under-use now.
	Leases      int
	LeasedUnits int64
	// LeaseUnitsGivenBack counts the unused leased units given back to
	// Redis since New, and LeaseUnitsLost those that were not: dropped (a
	// full queue of give-backs) or whose give-back failed. A lost unit is
	// under-use until its window ends, never over-admission. (Reset drops
	// leases without either: their counts are gone.)
	LeaseUnitsGivenBack int64
	LeaseUnitsLost      int64
	// SlotsAcquired counts the concurrency slots Acquire took since New
	// (in Redis, or by the failure policy), and SlotsReleased those given
	// back by Release: their difference is what this process holds, less
	// the slots whose leases ended unreleased.
	SlotsAcquired int64
	SlotsReleased int64
}

// Stats returns a snapshot of the Limiter's local state.
func (l *Limiter) Stats() Stats {
	var s Stats
	if l.t != nil {
		s.BreakerOpen = l.t.BreakerOpen()
	}
	s.SlotsAcquired, s.SlotsReleased = l.slotsAcquired.Load(), l.slotsReleased.Load()
	if l.denied != nil {
		s.DenyCacheEntries = l.denied.Size()
	}
	s.Leases, s.LeasedUnits = l.leases.Held()
	s.LeaseUnitsGivenBack, s.LeaseUnitsLost = l.leases.GivenBack(), l.leases.Lost()
	return s
}
