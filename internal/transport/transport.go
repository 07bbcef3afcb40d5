// The transport: a decision's requests to their server and back, within
// the Limiter's timeout, through each server's breaker and batcher.

package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// Transport is the one way from a decision to Redis and back. It takes a
// call's requests, which it only reads, and hands back each request's reply
// by value, on the caller's goroutine. Per server (the one server of most
// clients; each master of a Redis Cluster) it keeps a circuit breaker and a
// batcher, so that a failure belongs to the server that failed. It bounds
// every call by the Limiter's timeout, counted from the moment the decision
// reached it, queue and call together, and sends nothing for a caller who
// has left.
type Transport struct {
	client redis.UniversalClient
	// decider is the script for the keys of one slot: one decision, or a
	// batch on a single Redis; crossSlot the same script for a batch of
	// decisions whose keys are in several slots of one Cluster master.
	decider, crossSlot *script.Script
	timeout            time.Duration // 0 or less: none
	ctxAware           bool          // the client stops at its ctx deadline by itself
	maxBatch           int           // requests per call; 1 or less: no batching
	few                int           // decisions under way that a batcher sends each alone: fewDeciding (tests set 0)
	// breakerFailures consecutive failures open a server's breaker for
	// breakerCooldown; 0 failures: no breaker.
	breakerFailures int
	breakerCooldown time.Duration
	now             func() time.Time // the breakers' clock: real time
	dials           *dialErrors      // the client's dial errors; nil for other clients
	warn            func(error)      // reports what is wrong without failing a decision

	one *server // every call, unless the client is a Cluster's

	cluster    *redis.ClusterClient // nil unless the client is a Cluster's
	servers    sync.Map             // a Cluster master's address -> *server
	crossOff   atomic.Bool          // the masters cannot run cross-slot scripts
	mapped     atomic.Bool          // the Cluster client has its slot map
	mapMu      sync.Mutex           // guards loading
	loading    *mapLoad             // the slot map's load in flight, if any
	nextReload atomic.Int64         // Unix ns before which the slot map is not reloaded again
	checked    sync.Map             // names of the servers whose eviction policy was looked up
	tick       atomic.Pointer[tick] // the last deadline made for a ctx that is never canceled
	epoch      time.Time            // ticks count from here, on the monotonic clock
}

// server is one Redis server the transport sends calls to: the client's
// only server, or one master of a Redis Cluster.
type server struct {
	name    string                // for errors: its address
	client  redis.UniversalClient // a Cluster master's own client, where its batches go
	breaker *breaker              // nil: none
	batch   *batcher              // nil: each call alone
	used    atomic.Int64          // Unix ns of its last use, to within usedGrain (a Cluster master's)
}

// A Cluster's server that no decision has used for staleServer is forgotten:
// its slots moved to another master (a failover, a resharding), or get no
// traffic, and its breaker, open or not, says nothing any more. usedGrain is
// how fresh server.used is kept, so that a decision seldom writes it.
const (
	staleServer = 10 * time.Second
	usedGrain   = time.Second
)

// Bounds of one script call. Redis's Lua unpacks at most about 8,000 values
// at once (the script's MGET takes every key of the call), and a call runs
// alone in Redis while it lasts; a call of MaxCallKeys keys takes well under
// a millisecond. MaxCallValues bounds the command's length, keys and
// arguments together.
const (
	MaxCallKeys   = 1024
	MaxCallValues = 4096
)

// reloadEvery is how often, at most, a Cluster client is told to reload its
// slot map while calls to one of its masters fail: often enough that the
// slots of a failed master move to its promoted replica within a fraction
// of a second of the promotion, seldom enough to cost the cluster nothing.
const reloadEvery = 250 * time.Millisecond

// Config is what a Transport is made with: the Limiter's options that bear
// on its calls.
type Config struct {
	// Script is the source of the script that decides.
	Script string
	// Timeout bounds each call, queue and call together; 0 or less: none.
	Timeout time.Duration
	// MaxBatch is the most requests of one call; 1 or less: no batching.
	MaxBatch int
	// BreakerFailures consecutive failures open a server's breaker for
	// BreakerCooldown; 0 failures: no breaker.
	BreakerFailures int
	BreakerCooldown time.Duration
	// Warn is told what is wrong without failing a call: a server whose
	// eviction policy deletes live counts (ErrEvictionPolicy).
	Warn func(error)
}

// New returns the transport of client's calls.
func New(client redis.UniversalClient, cfg Config) *Transport {
	t := &Transport{
		client:          client,
		decider:         script.NewScript(cfg.Script, false),
		crossSlot:       script.NewScript(cfg.Script, true),
		timeout:         cfg.Timeout,
		ctxAware:        HonoursContext(client),
		maxBatch:        cfg.MaxBatch,
		few:             fewDeciding,
		breakerFailures: cfg.BreakerFailures,
		breakerCooldown: cfg.BreakerCooldown,
		now:             time.Now,
		epoch:           time.Now(),
		dials:           dialRecorder(client),
		warn:            cfg.Warn,
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		t.cluster = c
	case *redis.Client:
		t.one = t.newServer(serverName(c), c, t.maxBatch > 1, false)
	default: // a Ring, or a client of the caller's: no batching
		t.one = t.newServer("Redis", client, false, false)
	}
	return t
}

func (t *Transport) newServer(name string, c redis.UniversalClient, batch, cross bool) *server {
	s := &server{name: name, client: c}
	if t.breakerFailures > 0 {
		s.breaker = newBreaker(t.breakerFailures, t.breakerCooldown, t.now)
	}
	if batch {
		s.batch = &batcher{t: t, srv: s, cross: cross, maxBatch: t.maxBatch, maxQueue: queuedCalls * t.maxBatch}
	}
	return s
}

// serverName names the server of a client in errors.
func serverName(c *redis.Client) string {
	if addr := c.Options().Addr; addr != "FailoverClient" {
		return addr
	}
	return "Sentinel master"
}

// Do sends one decision's requests, at once or in a batch with other
// decisions', and stores each request's reply in out. The Limiter's timeout
// counts from here, and bounds the call on the wire whatever the caller's
// own deadline (see wire): a caller who leaves first gets a *CallerLeft,
// through which a failure of its call is told later.
func (t *Transport) Do(ctx context.Context, reqs []*script.Request, out []script.Reply) error {
	if expired(ctx) { // send nothing for a caller who is gone
		return &CallerLeft{err: ctxErr(ctx)}
	}
	wire, cancel, detached := t.wire(ctx)
	err := t.route(ctx, wire, detached, reqs, out)
	if l := lateOf(err); l != nil {
		l.then(cancel) // the call goes on under wire
	} else {
		cancel()
	}
	return err
}

// route sends reqs to their server, once do has made wire.
func (t *Transport) route(ctx, wire context.Context, detached bool, reqs []*script.Request, out []script.Reply) error {
	leave := wire // the caller waits as long as the call's deadline
	if detached {
		leave = ctx // or less
	}
	srv, err := t.serverFor(leave, wire, reqs[0].Keys[0])
	if err == nil {
		if b := t.batcherOf(srv); b != nil {
			err = b.decide(leave, wire, reqs, out)
		} else {
			err = t.exchange(leave, wire, srv, t.client, t.decider, reqs, out)
		}
	}
	if err == nil {
		return nil
	}
	if expired(ctx) {
		return t.left(ctx, wire, srv, err)
	}
	return t.explain(wire, srv, err)
}

// left returns the error of a decision whose caller's ctx is done: err if it
// is a *CallerLeft already; else one that tells err, a failure of Redis the
// call met while its caller still waited, unless the caller's own ctx ended
// the call (abandoned), which says nothing of Redis, or no call was made (an
// open breaker).
func (t *Transport) left(ctx, wire context.Context, srv *server, err error) error {
	var gone *CallerLeft
	if errors.As(err, &gone) {
		return gone
	}
	gone = &CallerLeft{err: ctxErr(ctx)}
	if !t.abandoned(wire) && !errors.Is(err, ErrCircuitOpen) { // a call was made, and Redis failed it
		gone.Late = &Late{}
		gone.Late.end(t.explain(wire, srv, err))
	}
	return gone
}

// serverFor returns the server that serves key: on a Cluster, its master as
// the client's slot map has it now. A Cluster client without a slot map yet
// loads one first, which its caller waits for until leave is done (see
// awaitMap): go-redis loads it on the caller's goroutine, bounded by its
// own timeouts, not by the call's deadline.
func (t *Transport) serverFor(leave, wire context.Context, key string) (*server, error) {
	if t.cluster == nil {
		return t.one, nil
	}
	if !t.mapped.Load() {
		if err := t.awaitMap(leave, wire); err != nil {
			return nil, err
		}
	}
	node, err := t.cluster.MasterForKey(wire, key)
	if err != nil {
		t.reload()
		return nil, err
	}
	addr := node.Options().Addr
	now := time.Now().UnixNano()
	if v, ok := t.servers.Load(addr); ok && v.(*server).client == node {
		s := v.(*server)
		if now-s.used.Load() > int64(usedGrain) {
			s.used.Store(now)
		}
		return s, nil
	}
	// A master not seen before, or one whose client go-redis made anew (the
	// node left the slot map and came back): its own breaker and batcher.
	t.dials.hookNode(node)
	t.forgetStale(now)
	s := t.newServer(addr, node, t.maxBatch > 1, true)
	s.used.Store(now)
	for {
		old, loaded := t.servers.LoadOrStore(addr, s)
		if !loaded {
			return s, nil
		}
		if old.(*server).client == node {
			return old.(*server), nil
		}
		if t.servers.CompareAndSwap(addr, old, s) {
			return s, nil
		}
	}
}

// A mapLoad is a load of the Cluster client's slot map, in a goroutine of
// its own: err is set before done is closed.
type mapLoad struct {
	started time.Time
	done    chan struct{}
	err     error
}

// awaitMap waits until the Cluster client has its slot map, or leave is
// done. One load is in flight at a time; decisions that come while it lasts
// wait for it; one that has lasted past its bound (a client whose own
// timeouts never end it) is left to itself, and another starts. A caller
// who leaves before wire's deadline gets a *CallerLeft, told the load's
// failure if it fails by then.
func (t *Transport) awaitMap(leave, wire context.Context) error {
	t.mapMu.Lock()
	m := t.loading
	if m == nil || time.Since(m.started) > t.mapBound() {
		m = &mapLoad{started: time.Now(), done: make(chan struct{})}
		t.loading = m
		go t.loadMap(m)
	}
	t.mapMu.Unlock()
	select {
	case <-m.done:
		return m.err
	case <-leave.Done():
	}
	if leave == wire {
		return fmt.Errorf("loading its slot map: %w", wire.Err())
	}
	gone := &CallerLeft{err: leave.Err(), Late: &Late{}}
	go func() {
		var err error
		select {
		case <-m.done:
			err = m.err
		case <-wire.Done():
			err = fmt.Errorf("loading its slot map: %w", wire.Err())
		}
		if err != nil {
			err = t.explain(wire, nil, err)
		}
		gone.Late.end(err)
	}()
	return gone
}

// loadMap loads the Cluster client's slot map for m, within go-redis's own
// timeouts and at most slotMapWait (a client that stops at its ctx's
// deadline), then ends the load: the next decision without a map starts
// another.
func (t *Transport) loadMap(m *mapLoad) {
	ctx, cancel := context.WithTimeout(context.Background(), t.mapBound())
	defer cancel()
	if _, err := t.cluster.MasterForKey(ctx, ""); err != nil {
		m.err = fmt.Errorf("loading its slot map: %w", err)
	} else {
		t.mapped.Store(true)
	}
	t.mapMu.Lock()
	if t.loading == m {
		t.loading = nil
	}
	t.mapMu.Unlock()
	close(m.done)
}

// mapBound is how long a load of the slot map may last: the Limiter's
// timeout, or slotMapWait if that is longer.
func (t *Transport) mapBound() time.Duration { return max(t.timeout, slotMapWait) }

// slotMapWait bounds a load of a Cluster client's slot map, on a client
// that stops at its ctx's deadline, when the Limiter's timeout is shorter:
// a large Cluster's map may take longer than a decision waits.
const slotMapWait = time.Second

// forgetStale drops the Cluster servers no decision has used for
// staleServer.
func (t *Transport) forgetStale(now int64) {
	t.servers.Range(func(addr, v any) bool {
		if now-v.(*server).used.Load() > int64(staleServer) {
			t.servers.CompareAndDelete(addr, v)
		}
		return true
	})
}

// batcherOf returns the batcher of srv, or nil when its calls go alone.
func (t *Transport) batcherOf(srv *server) *batcher {
	if srv.batch == nil || srv.batch.cross && t.crossOff.Load() {
		return nil
	}
	return srv.batch
}

// exchange makes one script call of sc for reqs through c, as a call to
// srv: srv's breaker is asked first and told how it went, one call, one
// success or failure, judged by wire, the call's context. Its caller waits
// until leave is done: wire itself, or the caller's own ctx when its
// deadline comes before wire's (see wire). Then a caller who leaves first
// gets a *CallerLeft, and the call goes on to wire's deadline in a
// goroutine of its own, which tells the breaker, and the CallerLeft's Late,
// how it went.
func (t *Transport) exchange(leave, wire context.Context, srv *server, c redis.UniversalClient, sc *script.Script, reqs []*script.Request, out []script.Reply) error {
	probe := false
	if b := srv.breaker; b != nil {
		ok, p := b.allow()
		if !ok {
			t.reload()
			return ErrCircuitOpen
		}
		probe = p
	}
	var err error
	if leave == wire && (t.ctxAware || wire.Done() == nil) {
		err = t.call(wire, c, sc, reqs, out)
	} else {
		vals, w, callErr := sendWatched(leave, wire, c, sc, reqs)
		switch {
		case w != nil && leave != wire: // the caller left before the Limiter's deadline
			gone := &CallerLeft{err: leave.Err(), Late: &Late{}}
			go t.judgeLate(w, wire, srv, probe, gone.Late)
			return gone
		case w != nil:
			err = wire.Err()
		case callErr != nil:
			err = callErr
		default:
			err = script.Decode(vals, reqs, out)
		}
	}
	t.judge(wire, srv, probe, err)
	return err
}

// judge tells srv's breaker how a call that wire bounded went, and has the
// slot map reloaded after an outage; the first success on a server has its
// eviction policy checked.
func (t *Transport) judge(wire context.Context, srv *server, probe bool, err error) {
	left := err != nil && t.abandoned(wire)
	if b := srv.breaker; b != nil {
		switch {
		case left:
			b.abandon(probe)
		case err != nil && opensBreaker(err):
			b.done(probe, err)
		default: // Redis answered, even if with an error about one id's data
			b.done(probe, nil)
		}
	}
	if err != nil && !left && IsOutage(err) {
		t.reload()
	}
	if err == nil {
		if _, seen := t.checked.Load(srv.name); !seen {
			if _, seen := t.checked.LoadOrStore(srv.name, struct{}{}); !seen {
				go t.checkEviction(srv)
			}
		}
	}
}

// abandoned reports whether a call that wire bounded ended for its caller's
// sake, not Redis's: wire was canceled (its caller's ctx was), or its
// deadline, which passed, was the caller's own (no Limiter timeout).
func (t *Transport) abandoned(wire context.Context) bool {
	return errors.Is(wire.Err(), context.Canceled) || t.timeout <= 0 && expired(wire)
}

// judgeLate waits for the end of w, a call whose caller left, or for wire's
// deadline, whichever comes first, and judges the call by it: a failure goes
// to the breaker and to l.
func (t *Transport) judgeLate(w *watchedCall, wire context.Context, srv *server, probe bool, l *Late) {
	var err error
	select {
	case <-w.done:
		err = w.err
	case <-wire.Done():
		err = wire.Err()
	}
	t.judge(wire, srv, probe, err)
	if err != nil {
		err = t.explain(wire, srv, err)
	}
	l.end(err)
}

// call sends one script call of sc for reqs to c and decodes its reply into
// out, on this goroutine: with a client that does not stop at ctx's
// deadline itself, the call goes on in sendWatched's goroutine after it,
// until the client gives up, and its late reply is dropped there.
func (t *Transport) call(ctx context.Context, c redis.UniversalClient, sc *script.Script, reqs []*script.Request, out []script.Reply) error {
	var vals []int64
	var err error
	if t.ctxAware || ctx.Done() == nil {
		vals, err = send(ctx, c, sc, reqs)
	} else {
		var w *watchedCall
		if vals, w, err = sendWatched(ctx, ctx, c, sc, reqs); w != nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	return script.Decode(vals, reqs, out)
}

// A watchedCall is a script call that a goroutine of its own makes for a
// caller that may leave before it ends: what watch does for any command,
// for decisions without the closures and channel each would allocate.
type watchedCall struct {
	ctx  context.Context
	c    redis.UniversalClient
	sc   *script.Script
	reqs []*script.Request
	vals []int64
	err  error
	done chan struct{} // buffered: the goroutine never waits for its caller
}

// watchedCalls holds the watchedCalls whose callers took their replies:
// their goroutines have sent on done and touch them no more. One whose
// caller left stays its goroutine's, and is never pooled: its late reply
// reaches no one.
var watchedCalls = sync.Pool{New: func() any { return &watchedCall{done: make(chan struct{}, 1)} }}

// run makes w's call, then lets its caller know; it touches w no more.
func (w *watchedCall) run() {
	w.vals, w.err = send(w.ctx, w.c, w.sc, w.reqs)
	w.done <- struct{}{}
}

// sendWatched is send under ctx on a goroutine of its own, as watch runs a
// command: it returns the reply, or the call itself if leave is done first,
// which is then its goroutine's until the client's own timeouts end it: its
// done receives once, when it ends.
func sendWatched(leave, ctx context.Context, c redis.UniversalClient, sc *script.Script, reqs []*script.Request) ([]int64, *watchedCall, error) {
	w := watchedCalls.Get().(*watchedCall)
	w.ctx, w.c, w.sc, w.reqs = ctx, c, sc, reqs
	go w.run()
	select {
	case <-w.done:
		vals, err := w.vals, w.err
		*w = watchedCall{done: w.done}
		watchedCalls.Put(w)
		return vals, nil, err
	case <-leave.Done():
		return nil, w, nil
	}
}

// send makes the script call of sc for reqs on c and returns its reply's
// integers.
func send(ctx context.Context, c redis.UniversalClient, sc *script.Script, reqs []*script.Request) ([]int64, error) {
	cross := sc.Cross
	short, n := script.ShortCall(reqs, cross), 0
	if short {
		n = len(reqs)
	}
	buf := argLists.Get().(*[]any)
	if need := script.CallLen(reqs, short); cap(*buf) < need {
		*buf = make([]any, 0, need)
	}
	args := script.AppendCall((*buf)[:0], sc, reqs, cross, short)
	vals, err := eval(ctx, c, sc, args, n)
	if err == nil && cap(args) <= MaxCallValues {
		clear(args) // nothing kept alive by the list: the requests are the caller's
		*buf = args[:0]
		argLists.Put(buf)
	}
	return vals, err
}

// argLists holds the argument lists of calls that were answered, for calls
// to come: a call's list is as long as it has values (10 for one request),
// 16 bytes each. go-redis reads a command's arguments until its reply has
// been read, and not after; a call that failed may have left its command
// in go-redis's hands (one whose caller stopped waiting), so its list is
// not reused; nor is one longer than MaxCallValues. (A go-redis hook that
// kept a command past its return would see a later call's arguments there.)
var argLists = sync.Pool{New: func() any { return new([]any) }}

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

// reload tells a Cluster client to reload its slot map, at most once every
// reloadEvery: go-redis reloads it by itself only on MOVED and ASK, on a
// retry (which the script never gets), and every minute, so that without
// this the slots of a failed master would stay with it for up to a minute
// after its replica took over.
func (t *Transport) reload() {
	if t.cluster == nil {
		return
	}
	now := time.Now().UnixNano()
	next := t.nextReload.Load()
	if now < next || !t.nextReload.CompareAndSwap(next, now+int64(reloadEvery)) {
		return
	}
	t.cluster.ReloadState(context.Background())
}

// BreakerOpen reports whether the breaker of any server in use is open or
// probing: a Cluster server unused for staleServer is not.
func (t *Transport) BreakerOpen() bool {
	open := t.one != nil && t.one.breaker.isOpen()
	now := time.Now().UnixNano()
	t.servers.Range(func(_, v any) bool {
		s := v.(*server)
		open = open || now-s.used.Load() <= int64(staleServer) && s.breaker.isOpen()
		return !open
	})
	return open
}

// wire returns the context of a decision's call to Redis: ctx bounded by
// the Limiter's timeout, as deadline makes it, and whether it is detached
// from ctx. A ctx whose own deadline comes first gets one detached: ctx's
// values, and the Limiter's deadline, never canceled. Its caller leaves at
// its own deadline, but its call, once sent, is judged by the Limiter's
// bound: Redis answering within the timeout is health, and no answer within
// it is a failure, whoever still waits.
func (t *Transport) wire(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	d, ok := ctx.Deadline()
	if t.timeout <= 0 || !ok || time.Until(d) > t.timeout {
		wire, cancel, _ := t.deadline(ctx)
		return wire, cancel, false
	}
	if t.timeout <= maxTickTimeout {
		return &tickCtx{Context: context.WithoutCancel(ctx), tick: t.tickAfter(time.Now())}, noCancel, true
	}
	wire, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.timeout)
	return wire, cancel, true
}

// deadline returns ctx bounded by the Limiter's timeout, and whether that
// timeout set its deadline; ctx itself when its own deadline comes first or
// there is no timeout. A ctx that is never canceled (its Done is nil:
// context.Background, a worker's) gets a tickCtx.
func (t *Transport) deadline(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	if t.timeout <= 0 {
		return ctx, noCancel, false
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= t.timeout {
		return ctx, noCancel, false
	}
	if ctx.Done() == nil && t.timeout <= maxTickTimeout {
		k := t.tickAfter(time.Now())
		if ctx == context.Background() { // a worker's: the tick's own
			return &k.background, noCancel, true
		}
		return &tickCtx{Context: ctx, tick: k}, noCancel, true
	}
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	return ctx, cancel, true
}

// A tickCtx is a ctx that is never canceled, with a deadline: the end of a
// tick, a span of tickLen. Every tickCtx of one tick shares its Done
// channel, and one timer closes it at the tick's end: where
// context.WithTimeout makes a context, a timer and a channel for each
// decision (about 370 bytes), decisions that start within a tick of each
// other make them once. The deadline is the timeout rounded up to a tick.
// A tick's timer lives until its end, not until its decisions end: at most
// 1,024 ticks (the timeout over tickLen) are waiting at once.
type tickCtx struct {
	context.Context // the caller's, never canceled: its values
	tick            *tick
}

// tick is the deadline that tickCtxs share: done closes at it. background
// is its tickCtx of context.Background, which every decision of the tick
// made with that ctx shares.
type tick struct {
	end        int64     // ns since the transport's epoch, a multiple of tickLen
	at         time.Time // the deadline
	done       chan struct{}
	background tickCtx
}

// Deadline, Done and Err are the tick's; Value is the caller's.
func (c *tickCtx) Deadline() (time.Time, bool) { return c.tick.at, true }
func (c *tickCtx) Done() <-chan struct{}       { return c.tick.done }
func (c *tickCtx) Err() error {
	select {
	case <-c.tick.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// maxTickTimeout bounds the timeouts whose deadlines are ticks: a longer
// one gets context.WithTimeout (and no tick that ends past an int64 of ns).
const maxTickTimeout = time.Hour

// tickLen returns how long a tick of the transport's deadlines lasts: a
// ms, or a thousandth of a longer timeout, or a sixteenth of one under
// 16 ms, so that rounding up to a tick adds little to the timeout and at
// most 1,024 ticks wait at once.
func tickLen(timeout time.Duration) time.Duration {
	return max(timeout/1024, min(time.Millisecond, timeout/16), time.Nanosecond)
}

// tickAfter returns the tick that ends at the first tick boundary at least
// the timeout after now: the last one made, if it is that one. Ticks count
// on the monotonic clock, from the transport's epoch: a wall clock set back
// cannot bring back a tick that has ended.
func (t *Transport) tickAfter(now time.Time) *tick {
	n := int64(tickLen(t.timeout))
	end := int64(now.Sub(t.epoch) + t.timeout)
	end += (n - end%n) % n
	if k := t.tick.Load(); k != nil && k.end == end {
		return k
	}
	k := &tick{end: end, at: t.epoch.Add(time.Duration(end)), done: make(chan struct{})}
	k.background = tickCtx{Context: context.Background(), tick: k}
	time.AfterFunc(k.at.Sub(now), func() { close(k.done) })
	t.tick.Store(k) // of two made at once, both serve; the last is kept
	return k
}

func noCancel() {}

// ctxErr returns the error of ctx, which expired reports done: its deadline
// may have passed before its timer fired.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// expired reports whether ctx is done or its deadline has passed: a client
// that stops at the deadline itself (ContextTimeoutEnabled) can return, with
// an i/o timeout, before ctx's own timer has fired.
func expired(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// Delete deletes keys, within the Limiter's deadline: not a decision, so
// neither batched nor judged by a breaker.
func (t *Transport) Delete(ctx context.Context, keys ...string) error {
	_, err := run(ctx, t, func(ctx context.Context) (int64, error) {
		return t.client.Del(ctx, keys...).Result()
	})
	return err
}

// run runs fn, a command that is not a decision, within the Limiter's
// deadline, on a client that may not watch ctx.
func run[T any](ctx context.Context, t *Transport, fn func(context.Context) (T, error)) (T, error) {
	ctx, cancel, _ := t.deadline(ctx)
	defer cancel()
	if t.ctxAware || ctx.Done() == nil {
		return fn(ctx)
	}
	return Watch(ctx, fn)
}

// Watch runs fn in a goroutine and returns when it does or when ctx is done,
// whichever comes first: the client may not stop at ctx's deadline by
// itself. In the second case fn goes on until the client's own timeouts end
// it, and its result is dropped.
func Watch[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// HonoursContext reports whether client stops waiting at its ctx deadline
// by itself, so that the transport need not watch for it.
func HonoursContext(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}
