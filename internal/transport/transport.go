// The Transport and its one way in, Do: a decision's requests routed to
// their server and back, within the Limiter's timeout, through each
// server's breaker and batcher.

package transport

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit/internal/group"
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
	concurrency        *script.Script // concurrency.lua
	timeout            time.Duration  // 0 or less: none
	ctxAware           bool           // the client stops at its ctx deadline by itself
	// timed is a copy of the client, when it is a *redis.Client that does
	// not stop at its ctx deadline, with the timeout (and a tick) as its
	// read and write timeouts (Client.WithTimeout): a call through it is
	// bounded by its socket's deadlines, on its caller's goroutine (see
	// routed). Nil for other clients.
	timed    *redis.Client
	hooked   sync.Once // the routing hook is on the client
	maxBatch int       // requests per call; 1 or less: no batching
	few      int       // decisions under way that a batcher sends each alone (Config.FewDeciding)
	// breakerFailures consecutive failures open a server's breaker for
	// breakerCooldown; 0 failures: no breaker.
	breakerFailures int
	breakerCooldown time.Duration
	now             func() time.Time // the breakers' clock: real time
	dials           *dialErrors      // the client's dial errors; nil for other clients
	warn            func(error)      // reports what is wrong without failing a decision

	one *server // every call, unless the client is a Cluster's

	cluster  *redis.ClusterClient // nil unless the client is a Cluster's
	servers  sync.Map             // a Cluster master's address -> *server
	crossOff atomic.Bool          // the masters cannot run cross-slot scripts
	// oneSlot: a server that is no Cluster's refused a call whose keys
	// are in several hash slots (a proxy, ElastiCache Serverless): calls
	// keep to one slot from then on (see slotRefusal).
	oneSlot    atomic.Bool
	badFlag    error                // a flag of Config.ScriptFlags no shebang can hold: every call's error
	mapped     atomic.Bool          // the Cluster client has its slot map
	mapMu      sync.Mutex           // guards loading
	loading    *mapLoad             // the slot map's load in flight, if any
	nextReload atomic.Int64         // Unix ns before which the slot map is not reloaded again
	checked    sync.Map             // names of the servers whose eviction policy was looked up
	tick       atomic.Pointer[tick] // the last deadline made for a ctx that is never canceled
	epoch      time.Time            // ticks count from here, on the monotonic clock
	work       *group.Group         // the goroutines it starts: the Limiter's
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
// alone in Redis while it lasts; a call of maxCallKeys keys takes well under
// a millisecond. maxCallValues bounds the command's length, keys and
// arguments together.
const (
	maxCallKeys   = 1024
	maxCallValues = 4096
)

// Config is what a Transport is made with: the Limiter's options that bear
// on its calls, and the group its goroutines are counted in.
type Config struct {
	// Timeout bounds each call, queue and call together; 0 or less: none.
	Timeout time.Duration
	// MaxBatch is the most requests of one call; 1 or less: no batching.
	MaxBatch int
	// FewDeciding is how many decisions may be under way at once and each
	// still go at once in a call of its own (see batcher): FewDeciding,
	// the measured default, unless a test wants batches of any size; 0 or
	// less, none, and decisions wait to batch however few are under way.
	FewDeciding int
	// BreakerFailures consecutive failures open a server's breaker for
	// BreakerCooldown; 0 failures: no breaker.
	BreakerFailures int
	BreakerCooldown time.Duration
	// Warn is told what is wrong without failing a call: a server whose
	// eviction policy deletes live counts (ErrEvictionPolicy).
	Warn func(error)
	// ScriptFlags are declared in the scripts' first line (the root's
	// WithScriptFlags); none: no such line but a Cluster batch's.
	ScriptFlags []string
	// Work counts every goroutine the transport starts (batches in
	// flight, calls whose callers left and their late judges, slot-map
	// loads, eviction checks): its owner waits for them.
	Work *group.Group
}

// New returns the transport of client's calls.
func New(client redis.UniversalClient, cfg Config) *Transport {
	t := &Transport{
		client:          client,
		decider:         script.NewScript(script.Source, false, cfg.ScriptFlags...),
		crossSlot:       script.NewScript(script.Source, true, cfg.ScriptFlags...),
		concurrency:     script.NewScript(script.ConcurrencySource, false, cfg.ScriptFlags...),
		timeout:         cfg.Timeout,
		ctxAware:        HonoursContext(client),
		maxBatch:        cfg.MaxBatch,
		few:             max(cfg.FewDeciding, 0),
		breakerFailures: cfg.BreakerFailures,
		breakerCooldown: cfg.BreakerCooldown,
		now:             time.Now,
		epoch:           time.Now(),
		dials:           dialRecorder(client),
		warn:            cfg.Warn,
		work:            cfg.Work,
	}
	for _, f := range cfg.ScriptFlags {
		if !script.ValidFlag(f) {
			t.badFlag = Wrap("ratelimit: WithScriptFlags", ErrMisconfigured, fmt.Errorf("%q is not a script flag: one word of letters, digits, - and _", f))
			break
		}
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		t.cluster = c
	case *redis.Client:
		t.one = t.newServer(serverName(c), c, t.maxBatch > 1, false)
		if !t.ctxAware && t.timeout > 0 && t.timeout <= maxTickTimeout {
			t.timed = c.WithTimeout(t.timeout + tickLen(t.timeout)) // past the call's deadline, a tick after the timeout
		}
	default: // a Ring, or a client of the caller's: no batching
		t.one = t.newServer("Redis", client, false, false)
	}
	return t
}

// IsNil reports whether client is nil, or a nil pointer of some client
// type: a Limiter without a client.
func IsNil(client redis.UniversalClient) bool {
	if client == nil {
		return true
	}
	v := reflect.ValueOf(client)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
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

// Do is the one way to Redis: it sends one call's requests, at once or in a
// batch with other decisions', and stores each request's reply in out.
// Requests of sliding_window.lua (KindWindow) may batch; a request of
// another kind goes alone, one per call. The Limiter's timeout counts from
// here, and bounds the call on the wire whatever the caller's own deadline
// (see wire): a caller who leaves first gets a *CallerLeft, through which a
// failure of its call is told later.
func (t *Transport) Do(ctx context.Context, reqs []*script.Request, out []script.Reply) error {
	if expired(ctx) { // send nothing for a caller who is gone
		return &CallerLeft{err: ctxErr(ctx)}
	}
	if t.badFlag != nil {
		return t.badFlag
	}
	wire, cancel, detached := t.wire(ctx)
	err := t.route(ctx, wire, detached, reqs, out)
	if l := lateOf(err); l != nil {
		l.Then(cancel) // the call goes on under wire
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
		if b := t.batcherOf(srv); b != nil && reqs[0].Kind == script.KindWindow {
			err = b.decide(leave, wire, reqs, out)
		} else {
			err = t.exchange(leave, wire, srv, t.client, t.scriptOf(reqs[0]), reqs, out)
		}
	}
	if err == nil {
		return nil
	}
	if t.cluster == nil && slotRefusal(err) {
		t.oneSlot.Store(true) // the next calls keep to one slot: see SplitSlots
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

// scriptOf returns the script that carries r: nil for a delete.
func (t *Transport) scriptOf(r *script.Request) *script.Script {
	switch r.Kind {
	case script.KindConcurrency:
		return t.concurrency
	case script.KindDelete:
		return nil
	}
	return t.decider
}

// batcherOf returns the batcher of srv, or nil when its calls go alone.
func (t *Transport) batcherOf(srv *server) *batcher {
	if srv.batch == nil || srv.batch.cross && t.crossOff.Load() || t.oneSlot.Load() {
		return nil
	}
	return srv.batch
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
