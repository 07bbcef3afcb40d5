// The options of New, and the failure policies' names.

package ratelimit

import (
	"context"
	"strconv"
	"time"

	"github.com/slidingwindow/ratelimit/internal/transport"
)

// defaultTimeout is how long one decision may spend on Redis unless
// WithTimeout says otherwise. A healthy Redis answers in well under a
// millisecond; 100ms leaves room for a dial and a busy server while keeping a
// dead one from holding up the request that asked.
const defaultTimeout = 100 * time.Millisecond

// defaultPrefix starts every key the Limiter writes unless WithPrefix says
// otherwise.
const defaultPrefix = "ratelimit"

// FailurePolicy decides a request when Redis cannot: when it is unreachable,
// slow past the timeout, or answers with an error. It decides only for a
// caller who still waits: one whose own ctx is done first (its deadline
// shorter than WithTimeout's, or canceled before its call is answered)
// gets its ctx's error and no Result; its call's failure still goes to the
// error handler and a CallObserver (Event.Left), and counts toward the
// circuit breaker. (A caller canceled whose deadline is not shorter than
// WithTimeout's waits, on a go-redis client of either kind, for the reply
// of a call under way, and gets what Redis decided; an Acquire then gives
// back the slot and returns ctx's error.)
type FailurePolicy int

const (
	// FailOpen allows the request. The Result is Degraded, the error goes to
	// the error handler, and Allow returns a nil error. It is the default: an
	// outage of the limiter should not become an outage of the API.
	FailOpen FailurePolicy = iota
	// FailClosed denies the request. The Result is Degraded and Allow returns
	// an error that wraps the Redis error.
	FailClosed
	// FailLocal decides the request in this process: the same sliding window,
	// counted locally, against the limit's share for one replica (Rate
	// divided by WithReplicas, at least 1). An outage then neither blocks
	// every client nor lets every client through. The Result is Degraded;
	// its Count, Remaining and waits are those of the local share, and Allow
	// returns a nil error.
	FailLocal
)

// String returns the policy's name, as in "FailOpen".
func (p FailurePolicy) String() string {
	switch p {
	case FailOpen:
		return "FailOpen"
	case FailClosed:
		return "FailClosed"
	case FailLocal:
		return "FailLocal"
	}
	return "FailurePolicy(" + strconv.Itoa(int(p)) + ")"
}

// Option configures a Limiter; pass options to New.
type Option interface{ apply(*config) }

// optionFunc adapts a function to Option.
type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config holds what the options set; New fills in the defaults.
type config struct {
	prefix      string
	now         func() time.Time
	policy      FailurePolicy
	onError     func(ctx context.Context, id string, err error)
	timeout     time.Duration // 0 or less: no limiter deadline at all
	denyMax     int           // entries of the deny cache; 0: no cache
	batchMax    int           // requests per script call; 0: one each
	replicas    int           // application servers sharing the limits, for FailLocal
	shadow      bool
	countDenied bool
	observer    Observer
	observeIDs  bool
	// breakerFailures consecutive failures open the circuit breaker for
	// breakerCooldown; 0 failures: no breaker.
	breakerFailures int
	breakerCooldown time.Duration
	// sleep is WithSleep's.
	sleep func(ctx context.Context, d time.Duration) error
	// fewDeciding is transport.Config.FewDeciding: the transport's
	// measured default, unless a test sets it. maxLeases bounds the lease
	// table (0: its default); sweepByHand starts no lease sweeper, for a
	// test that sweeps.
	fewDeciding int
	maxLeases   int
	sweepByHand bool
	scriptFlags []string // WithScriptFlags'
}

func defaultConfig() config {
	return config{
		prefix:          defaultPrefix,
		now:             time.Now,
		policy:          FailOpen,
		timeout:         defaultTimeout,
		replicas:        1,
		batchMax:        defaultBatch,
		breakerFailures: DefaultBreakerFailures,
		breakerCooldown: DefaultBreakerCooldown,
		sleep:           sleepCtx,
		fewDeciding:     transport.FewDeciding,
	}
}

// WithPrefix sets the string every key starts with (default "ratelimit").
// Give each application its own prefix when several share one Redis. Braces
// and '%' in the prefix are percent-encoded, as in ids, so that the prefix
// can never change a key's Redis Cluster hash tag.
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) { c.prefix = prefix })
}

// WithClock sets the clock that places requests in windows (default
// time.Now). Tests use it to move time by hand. Every application server that
// shares a limit should read a clock that agrees with the others' to within
// a small fraction of the window.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) {
		if now != nil {
			c.now = now
		}
	})
}

// WithSleep sets how Wait sleeps between its tries (default: a timer, in
// real time, whatever clock WithClock set), for a test whose clock moves
// only when it is told to: sleep returns once that clock has moved d on,
// or ctx's error if ctx is done first. ratelimittest's Limiter moves its
// Clock by d. A nil sleep keeps the default.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return optionFunc(func(c *config) {
		if sleep != nil {
			c.sleep = sleep
		}
	})
}

// WithFailurePolicy sets what a decision is when Redis cannot make it
// (default FailOpen). A value that is not one of the constants acts as
// FailOpen.
func WithFailurePolicy(p FailurePolicy) Option {
	return optionFunc(func(c *config) { c.policy = p })
}

// WithErrorHandler sets the function called with every Redis error a decision
// meets, under any policy, with the id it was for. It runs on the caller's
// goroutine, so it should be quick. It also gets, once per server, a warning
// that is no failure: an error wrapping ErrEvictionPolicy, with an empty id
// and a background ctx, from a goroutine of the Limiter's; tell it apart
// with errors.Is. The default logs through log/slog's default logger,
// failures at most one line every 10 seconds, counting the errors it left
// out, and warnings always. A nil fn restores the default.
func WithErrorHandler(fn func(ctx context.Context, id string, err error)) Option {
	return optionFunc(func(c *config) { c.onError = fn })
}

// WithTimeout bounds the time one decision spends on Redis (default
// 100ms), dial, retries and all, a Cluster client's first load of its slot
// map too, from the moment it asks, queue included. Past it the decision
// goes to the failure policy, and the circuit breaker counts a failure. A
// decision that waits for its lease's refill (Limit.Leased) waits at most
// this long, then its own call has the whole bound: up to twice in all.
//
// It is also how Redis is judged whatever the caller's own deadline: a
// caller whose ctx is done first gets its ctx's error (no Result, no
// failure policy), while its call, if already sent, goes on to this bound.
// Redis answering within it is health; no answer within it is a failure
// that the breaker counts and that reaches the error handler and a
// CallObserver (an Event with Left set), later, from another goroutine.
// So callers with deadlines of a few ms neither hide an outage nor make a
// slow but healthy Redis look like one. Nothing is sent for a caller who
// has left.
//
// The bound holds whatever the client's own timeouts. A *redis.Client
// whose ContextTimeoutEnabled is false (go-redis's default) ignores ctx
// deadlines: for a d of up to an hour, the Limiter sends its calls through
// a copy of it whose read and write timeouts are d and a tick (below;
// Client.WithTimeout), so that a call ends on its caller's goroutine about
// when d has passed (a wait for one of the pool's connections adds to it,
// up to d), as on a client that stops at ctx deadlines. The copy shares
// the client's connections; it is reached through a hook the Limiter adds
// to the client at its first call, so that the hooks added before see its
// commands, and those added after do not. With another client that ignores
// ctx deadlines, the Limiter stops waiting for the reply itself, and the
// client gives up on the connection later, after its ReadTimeout. For a
// ctx that is never
// canceled (context.Background), the deadline is d rounded up by at most a
// ms or a thousandth of d, whichever is more (a sixteenth of a d under
// 16 ms), so that the decisions of that span share one timer. A d of zero
// or less removes the limiter's deadline; then only the caller's ctx and
// the client bound it.
//
// A timeout cannot take back a script Redis has received: when Redis is
// slow rather than gone, the script may still run after the deadline, and
// count a request that the failure policy decided.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.timeout = d })
}

// WithDenyCache keeps, in this process, the counts Redis last reported for
// up to maxEntries clients that it denied, and denies their further requests
// locally while those counts already deny them, without a round trip: a
// client hammering past its limit then costs microseconds, not a Redis call.
// It is off by default; maxEntries of 0 or less turns it off.
//
// It never denies a request that Redis would allow, as long as counts only
// grow: within a window they do, and the cached counts are lower bounds of
// Redis's. What lowers a count is invisible to the cache unless it comes
// through this Limiter: Reset on this Limiter clears its entry, but a Reset
// through another Limiter (another server), or a key deleted by hand, leaves
// this one denying the client until the cached counts would have let it
// through, at most two windows. Ids longer than 256 bytes are not cached, so
// an entry costs a few hundred bytes at most. It has no effect with
// WithCountDenied, whose denials must reach Redis to be counted.
func WithDenyCache(maxEntries int) Option {
	return optionFunc(func(c *config) { c.denyMax = max(0, maxEntries) })
}

// defaultBatch is the most requests one script call carries when
// concurrent decisions are batched, unless WithBatching says otherwise.
const defaultBatch = 64

// WithBatching sets how many requests one script call may carry (default
// 64) when concurrent decisions share calls. Batching is on by default.
// While calls are in flight (two at most), the decisions that arrive wait
// and then go together. Redis spends most of a call on invoking
// the script, so under concurrent load this multiplies the decisions one
// Redis can make; a decision that finds nothing in flight is sent at once on
// its caller's goroutine, so a quiet service sees no added latency.
// Decisions are the same as if the requests of a call had come one at a
// time in the order they arrived.
//
// With a *redis.Client (one server, or a failover client's master) all
// decisions share one batcher. With a *redis.ClusterClient, decisions whose
// ids live on the same master share calls, declared with Redis 7's
// allow-cross-slot-keys; a batch that a master refuses without running it
// (a slot moved or moving, the cluster down, a server before Redis 7) is
// sent again one decision per call, so nothing is lost or counted twice.
// With any other client the option has no effect. maxBatch of 1 or less
// turns batching off: every decision is then its own call.
func WithBatching(maxBatch int) Option {
	return optionFunc(func(c *config) { c.batchMax = maxBatch })
}

// WithShadow puts the whole Limiter in shadow mode: every decision is made
// and counted exactly as if it were enforced, so that turning shadow mode
// off changes nothing but the answer, and none denies. A decision that
// would have denied comes back Allowed, with Shadowed set on the Results of
// the limits that denied it (and with a nil error under FailClosed: the
// error handler still gets the Redis error); observers see it with
// Event.Shadow. For one limit among
// enforced ones, set Limit.Shadow instead.
func WithShadow(on bool) Option {
	return optionFunc(func(c *config) { c.shadow = on })
}

// WithCountDenied counts denied requests too (Cloudflare's rule): a denied
// request's cost is added to each limit's current count, up to the limit's
// Rate, and the denial's Result describes the counts so left (its Count
// includes what was counted, its RetryAfter is the wait from there). A
// client that keeps sending above its limit then stays denied until it
// slows down, rather than getting a request through each time the estimate
// dips; the price is that a client which retries too fast never gets
// through. A request whose cost is above a limit's Rate, which could never
// pass, is not counted. The deny cache is not used in this mode (a request
// it denied would not be counted), and FailLocal does not count denials.
func WithCountDenied(on bool) Option {
	return optionFunc(func(c *config) { c.countDenied = on })
}

// WithObserver sets an Observer that sees every decision (default none); one
// that is a CallObserver also sees charges, refunds, and the failed calls
// of callers who left. With none, a decision costs nothing more.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) { c.observer = o })
}

// WithObserverIDs lets the Observer see each decision's client id
// (Event.ID). It is off by default: ids are often addresses, API keys or
// user names, personal data that metrics and traces should not carry.
func WithObserverIDs(on bool) Option {
	return optionFunc(func(c *config) { c.observeIDs = on })
}

// WithReplicas tells the Limiter how many application servers share its
// limits (default 1), so that FailLocal lets each of them allow its share,
// Rate/n, while Redis is down. It changes nothing else.
func WithReplicas(n int) Option {
	return optionFunc(func(c *config) { c.replicas = max(1, n) })
}

// Breaker defaults: see WithCircuitBreaker.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = time.Second
)

// WithCircuitBreaker stops sending decisions to a Redis that keeps failing:
// after failures consecutive failed script calls, it opens, and for cooldown
// every decision goes to the failure policy at once, in microseconds, with
// an error that wraps ErrCircuitOpen. Then one decision tries Redis: if it
// succeeds, the breaker closes; if not, it stays open for another cooldown.
//
// Only failures that say Redis itself cannot serve count: the Limiter's
// timeout, a connection refused, reset or lost, a closed client or an
// exhausted pool, and the replies LOADING, BUSY, READONLY, MASTERDOWN,
// CLUSTERDOWN, TRYAGAIN, NOREPLICAS, OOM, MISCONF and "max number of clients
// reached". A bad reply or a script error caused by one id's data does not:
// Redis answered. A batched call counts once, whatever it carried.
//
// It is on by default, with DefaultBreakerFailures (5) and
// DefaultBreakerCooldown (1s); failures of 0 or less turns it off. Cooldowns
// are measured in real time, not on the clock of WithClock, which places
// requests in windows and may be a test's clock that stands still.
func WithCircuitBreaker(failures int, cooldown time.Duration) Option {
	return optionFunc(func(c *config) {
		c.breakerFailures = max(0, failures)
		c.breakerCooldown = cooldown
	})
}

// WithScriptFlags declares flags in the first line of every script the
// Limiter sends, "#!lua flags=a,b" (by default there is none), for an engine
// that asks for them: "allow-key-locking" for Upstash, which otherwise runs
// each script under one global lock. On a Cluster they join
// allow-cross-slot-keys. A flag the engine refuses (Redis and Valkey refuse
// allow-key-locking) fails every call with ErrMisconfigured. docs/engines.md.
func WithScriptFlags(flags ...string) Option {
	return optionFunc(func(c *config) { c.scriptFlags = append([]string(nil), flags...) })
}
