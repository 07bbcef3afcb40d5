// Package lease holds a process's leases of Leased limits: units counted
// in Redis ahead of the requests they serve (the root's Limit.Leased), its
// sweeper and its give-backs. It is given what it needs in a Config (the
// send, the error report, the deny cache's forget, the clock, the
// Limiter's goroutines and its quit) and reaches nothing else.
package lease

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/table"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// Config is what a Table needs of its Limiter.
type Config struct {
	// Send sends one call's requests and stores their replies, as the
	// transport's Do does.
	Send func(ctx context.Context, reqs []*script.Request, out []script.Reply) error
	// Report is told of a give-back that failed, for id.
	Report func(ctx context.Context, id string, err error)
	// Forget, if not nil, drops what the deny cache holds of id at p: a
	// give-back lowers a count it may hold, and it must hold lower bounds.
	Forget func(id string, p window.Position)
	// Now is the Limiter's clock, in Unix ms.
	Now func() int64
	// Go runs f in a goroutine the Limiter's Close waits for.
	Go func(f func())
	// Quit is closed when the Limiter closes: the sweeper ends.
	Quit <-chan struct{}
	// Max bounds the table: leases are for hot ids, a few per process. A
	// full table evicts a lease, giving its units back. 0 is MaxLeases.
	Max int
	// Manual: no sweeper goroutine; whoever made the table calls Sweep.
	Manual bool
	// Wait bounds how long a request waits for a refill in flight (see
	// Table): the Limiter's timeout, which bounds the refill's call. 0 or
	// less: requests do not wait.
	Wait time.Duration
}

// MaxLeases is the default bound of a table (Config.Max).
const MaxLeases = 10_000

const (
	// fraction caps a lease at Rate/fraction units: what one process can
	// hold unused of a limit and id at any moment.
	fraction = 20
	// sweepEvery and IdleSweeps set how soon the units of a lease no
	// decision uses go back: within about a second.
	sweepEvery = 250 * time.Millisecond
	// IdleSweeps is how many sweeps give back a lease no decision used.
	IdleSweeps = 4
)

// Cap returns the largest lease of a limit of rate: Rate/20.
func Cap(rate int64) int64 { return max(1, rate/fraction) }

// Table holds a process's leases of Leased limits.
//
// A lease of an id and a limit holds units counted in one window (for a
// strict limit, one sub-window; for a calendar limit, one period) at that
// window's key, and serves requests while the Limiter's clock is in it.
// What is left when the clock has moved on is given back to that key,
// never below 0: by the next decision on the id, which must take a new
// lease and carries the give-back in its call, or else by the sweeper. A
// request that Redis denies gives back to the lease the units it took from
// it, unwritten.
//
// What a lease holds unused, with what requests took from it and have not
// settled and what the one refill in flight may add, is at most Cap(Rate)
// at any moment, however many goroutines decide at once: one request at a
// time asks Redis to lease more (the refill), and it asks for no more than
// that room. A request that finds the lease short while a refill is in
// flight that may bring what it needs (and its other leases hold their
// asks) waits for it (ServePlan), once, for at most Config.Wait: in the
// round trip a call of its own would take, the refill most likely brings
// it. A request that waited in vain goes to Redis: as the next refill, or,
// if another has begun, for what it needs alone. A refill that did not
// bring more than its own need (denied, failed, or the limit nearly
// reached) makes the lease dry: no one waits for the next, until one
// brings more.
//
// The sweeper runs while the table holds a lease or a give-back: every
// sweepEvery of real time it drops the leases whose window has passed or
// that no decision used for IdleSweeps sweeps, and sends what they held
// back, with the give-backs that could not travel with a decision (of an
// evicted lease, of a lease that came back after its window). It ends when
// the table is empty, or when the Limiter closes.
//
// One lock guards the table: a hot id's decisions all meet at its lease
// anyway, and what each does under the lock is a few sums.
type Table struct {
	cfg      Config
	mu       sync.Mutex
	entries  map[table.Key]*lease
	pending  []pendingGive // give-backs for the sweeper to send
	sweeps   int64         // the sweeps so far: the table's coarse clock
	sweeping bool          // a sweeper goroutine runs
	closed   bool          // by Close: no sweeper starts again

	givenBack atomic.Int64 // units given back, Redis said so
	lost      atomic.Int64 // units not given back: dropped, or their call failed
}

// lease is what this process holds of one count.
type lease struct {
	rate  int64           // the Rate of the limit that took it, which sized it
	at    window.Position // the window (sub-window, period) its units are counted in
	gen   uint64          // which lease of the entry: a new window's is another
	key   string          // that window's key; empty until a lease is granted in it
	left  int64           // units counted and not used
	taken int64           // units requests took and have not settled: used, or back to left
	used  int64           // units of the last lease used since it was taken
	seen  window.Counts   // the counts Redis reported with the last lease, before it
	size  int64           // the lease to ask for next
	sweep int64           // the sweep during which it was last used
	// refill is the refill in flight, if any: a request that asks Redis for
	// more of it, which others may wait for (serve).
	refill *refill
	// dry: the last refill brought nothing beyond its own need, so that no
	// request waits for the next.
	dry bool
	// reset: Reset deleted the keys it was counted in. What is in flight
	// from it is dropped, neither kept nor given back: a give-back could
	// lower counts written after the Reset.
	reset bool
}

// refill is a request in flight that asks Redis to lease more of a lease.
type refill struct {
	done chan struct{} // closed when it settles
	more int64         // what it asks Redis to lease beyond its own need, at most
}

// pendingGive is a give-back waiting for the sweeper: of id, at the key of a
// limit whose windows p places (p zero: of a decision, whose denials were
// forgotten).
type pendingGive struct {
	id  string
	p   window.Position
	req *script.Request
}

// New returns an empty table.
func New(cfg Config) *Table {
	if cfg.Max <= 0 {
		cfg.Max = MaxLeases
	}
	return &Table{cfg: cfg, entries: make(map[table.Key]*lease)}
}

// Ask is one Leased limit of a decision, in the table's terms: a lease of
// ID serves one limit's Rate in one window; N is what the request costs
// it (a look takes nothing and needs 1).
type Ask struct {
	ID   string
	Rate int64           // the limit's Rate, which sizes its lease
	N    int64           // the request's cost
	Pos  window.Position // its windows' length and kind, and the one the clock is in
	Key  string          // the key of that window, where Redis counts what it leases: for Settle
}

// Grant is what the table decided of an Ask: Held units of its cost come
// from the lease, all of them when Local (then the limit is decided here,
// from Seen, the lease's counts as of its last lease plus this process's
// use since). Otherwise Need is what Redis is to count of the cost (the
// rest), and Most what it is to count at most, for the lease too; a grant
// served from the lease alone has Need the cost, which its Result counts.
type Grant struct {
	Local            bool
	Held, Need, Most int64
	Seen             window.Counts
	entry            *lease
	gen              uint64
	grow             bool    // a lease of its window ran out
	refill           *refill // not nil: it asks Redis to lease more, and Settle ends that
}

// Answer is how a Grant's request was answered: Allowed (false for a
// denial, a failed call or a denial from the deny cache), and then the
// counts Redis saw, which a lease taken is reported with.
type Answer struct {
	Allowed bool
	Seen    window.Counts
}

// current reports whether e, a lease of an id, serves the clock at p for a
// limit of rate.
func (e *lease) current(p window.Position, rate int64) bool {
	return e != nil && e.at.I == p.I && e.rate == rate
}

// serve decides a request against asks, every limit of a decision, from
// their leases alone if each holds its cost (a look, each 1, and takes
// nothing), and then fills grants, one per ask, and reports true. If not,
// it has changed nothing, and returns the refill in flight of the one
// lease short of its ask, when every other lease holds its ask, the lease
// is not dry and that refill may bring the rest: one worth waiting for.
func (t *Table) serve(asks []Ask, look bool, grants []Grant) (bool, *refill) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var wait *refill
	for i := range asks {
		a := &asks[i]
		e := t.entries[table.Of(a.ID, a.Pos)]
		switch {
		case !e.current(a.Pos, a.Rate):
			return false, nil
		case e.left >= a.N:
			grants[i].entry = e
		case wait != nil || e.refill == nil || e.dry || e.left+e.refill.more < a.N:
			return false, nil // nothing worth waiting for
		default:
			wait = e.refill
		}
	}
	if wait != nil {
		return false, wait
	}
	for i := range asks {
		// Field by field: a literal is copied from a temporary, with the
		// lock held (BenchmarkLeased).
		g, n := &grants[i], asks[i].N
		e := g.entry
		g.Local, g.Held, g.Need, g.Most, g.gen, g.grow, g.refill = true, 0, n, 0, e.gen, false, nil
		g.Seen = e.seen
		g.Seen[0] += e.used
		e.sweep = t.sweeps
		if !look {
			g.Held = n
			e.left -= n
			e.used += n
		}
	}
	return true, nil
}

// Take takes for each of asks, the Leased limits of a request on its way
// to Redis, what its lease holds of the cost, up to all of it, and fills
// grants, one per ask, with what the lease held and what to ask Redis to
// count and to lease. It returns the give-backs of leases whose window has
// passed, for the same call; when later, it leaves them to the sweeper
// instead, each under its ask's id. Every grant must be settled (Settle).
func (t *Table) Take(asks []Ask, grants []Grant, later bool) []*script.Request {
	var gives []*script.Request
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range asks {
		a := &asks[i]
		if t.closed { // a call under way as the Limiter closes: unleased
			grants[i] = unleased(a.N)
			continue
		}
		e := t.entry(a.ID, a.Pos)
		if e.rate == a.Rate && e.at.I > a.Pos.I {
			// Placed before the lease's window began (its caller waited, or
			// was slow): unleased, rather than give back a current lease.
			grants[i] = unleased(a.N)
			continue
		}
		if !e.current(a.Pos, a.Rate) {
			if e.left > 0 && e.key != "" {
				if give := script.GiveBack(e.left, e.key); later {
					t.queue(pendingGive{a.ID, e.at, give})
				} else {
					gives = append(gives, give)
				}
				t.forget(a.ID, a.Pos)
				if e.left > e.size/2 { // expired unused: ask for less
					e.size = max(1, e.size/2)
				}
			}
			*e = lease{rate: a.Rate, at: a.Pos, gen: e.gen + 1, size: e.size}
		}
		e.sweep = t.sweeps
		grants[i] = e.take(a.N, Cap(a.Rate))
	}
	if len(gives) > 0 {
		t.start()
	}
	return gives
}

// unleased returns the grant of a request of cost n that its lease takes
// no part in: Redis counts it all and leases nothing, and Settle skips it.
func unleased(n int64) Grant {
	return Grant{Need: n, Most: n, entry: &lease{reset: true}}
}

// take takes a request of cost n from e, a lease of a limit whose leases
// are at most most units: see Take.
func (e *lease) take(n, most int64) Grant {
	g := Grant{entry: e, gen: e.gen}
	if e.left >= n {
		g.Local, g.Held, g.Need = true, n, n
		g.Seen = e.seen
		g.Seen[0] += e.used
		e.left -= n
		e.used += n
		e.taken += n
		return g
	}
	g.Held, e.left = e.left, 0
	e.taken += g.Held
	g.Need = n - g.Held
	g.Most = g.Need
	if e.refill == nil {
		// One refill at a time, of what the lease has room for: what it
		// holds and what requests in flight took from it stay within most.
		if extra := min(min(e.size, most)-g.Need, most-e.taken); extra > 0 {
			g.Most += extra
		}
		g.grow = e.key != "" // a lease of this window ran out
		e.refill = &refill{done: make(chan struct{}), more: g.Most - g.Need}
		g.refill = e.refill
	}
	return g
}

// entry returns the lease of id at p, a new one if there is none, making
// room for it when the table is full. Called with t.mu held.
func (t *Table) entry(id string, p window.Position) *lease {
	k := table.Of(id, p)
	if e := t.entries[k]; e != nil {
		return e
	}
	if len(t.entries) >= t.cfg.Max {
		for old, e := range t.entries {
			t.drop(old, e)
			break
		}
	}
	e := &lease{at: p, size: 1}
	t.entries[k] = e
	t.start()
	return e
}

// drop removes a lease from the table, and gives back what it holds.
// Called with t.mu held.
func (t *Table) drop(k table.Key, e *lease) {
	delete(t.entries, k)
	if e.left > 0 && e.key != "" {
		t.queue(pendingGive{k.ID, e.at, script.GiveBack(e.left, e.key)})
	}
}

// queue appends g to the give-backs waiting for the sweeper, unless
// the table's bound of them already wait: then it is dropped, which
// under-uses the limit and never over-admits. After Close, g is sent at
// once: what a call under way settles after it goes back too. Called with
// t.mu held.
func (t *Table) queue(g pendingGive) {
	if t.closed { // no sweeper to come: at once, in a goroutine Close waits for
		t.cfg.Go(func() { t.send(g) })
		return
	}
	if len(t.pending) < t.cfg.Max {
		t.pending = append(t.pending, g)
	} else {
		t.lost.Add(-g.req.Cost)
	}
	t.start()
}

// Settle ends what Take began for asks and their grants, once their
// requests are answered: a grant allowed keeps what it took and, unless
// local, adds to its lease the rest of what Redis leased at the ask's key;
// one not allowed gives back to its lease what it took from it. What comes
// back to a lease that has moved on (a new window, a Charge's drain) is
// given back to Redis.
func (t *Table) Settle(asks []Ask, grants []Grant, answers []Answer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range asks {
		a, g, r := &asks[i], &grants[i], &answers[i]
		f := g.refill
		if f != nil { // whatever became of its lease: no one waits past it
			close(f.done)
			g.refill = nil
		}
		if g.entry.reset {
			continue // see lease.reset
		}
		e := t.entries[table.Of(a.ID, a.Pos)]
		mine := e == g.entry && e.gen == g.gen // the lease it took from, still held
		if mine {
			e.taken -= g.Held
			if f != nil {
				e.refill, e.dry = nil, true // until it brings more, below
			}
		}
		if g.Local && r.Allowed {
			continue // decided here, and kept
		}
		if !r.Allowed || g.Local {
			t.restore(a, e, mine, g.Held)
			continue
		}
		extra := script.Granted(g.Need, g.Most, a.Rate, a.Pos.Estimate(&r.Seen)) - g.Need
		if !mine {
			if extra > 0 {
				t.queue(pendingGive{a.ID, a.Pos, script.GiveBack(extra, a.Key)})
			}
			continue
		}
		e.left += extra
		e.key, e.seen, e.used = a.Key, r.Seen, g.Need
		if f != nil {
			e.dry = extra <= 0
		}
		if g.grow {
			e.size = min(Cap(a.Rate), 2*e.size)
		}
	}
}

// restore gives units taken from e, a's lease, back to it if it is still
// the lease they came from (mine), or else to a's key. Called with t.mu
// held.
func (t *Table) restore(a *Ask, e *lease, mine bool, units int64) {
	if units == 0 {
		return
	}
	if mine {
		e.left += units
		e.used = max(0, e.used-units)
		e.key = a.Key // the entry may be new, and must give them back in time
		return
	}
	t.queue(pendingGive{a.ID, a.Pos, script.GiveBack(units, a.Key)})
}

// abandon ends what Take began for asks and their grants when their
// decision cannot settle them (it panicked on the way): what they took
// from their leases is lost, never given back twice, and their refills
// end, so that no one waits for them.
func (t *Table) abandon(asks []Ask, grants []Grant) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range asks {
		a, g := &asks[i], &grants[i]
		f := g.refill
		if f != nil {
			close(f.done)
			g.refill = nil
		}
		if e := t.entries[table.Of(a.ID, a.Pos)]; e == g.entry && e.gen == g.gen {
			e.taken -= g.Held
			if f != nil {
				e.refill = nil
			}
		}
	}
}

// Later leaves gives, the give-backs of a decision of id that sends
// nothing, to the sweeper. Their positions do not matter: a decision gives
// back only leases whose window has passed, and has forgotten their
// denials.
func (t *Table) Later(id string, gives []*script.Request) {
	if len(gives) == 0 {
		return
	}
	t.mu.Lock()
	for _, g := range gives {
		t.queue(pendingGive{id: id, req: g})
	}
	t.mu.Unlock()
}

// GaveBack counts the give-backs that went in a decision's call, with
// their replies, and reports those that failed alone (a key that holds no
// count); all are lost when the call failed (err), which its decision
// reports.
func (t *Table) GaveBack(ctx context.Context, id string, gives []*script.Request, replies []script.Reply, err error) {
	for i, g := range gives {
		switch {
		case err != nil:
			t.lost.Add(-g.Cost)
		case replies[i].Err != nil:
			t.lost.Add(-g.Cost)
			t.cfg.Report(ctx, id, replies[i].Err)
		default:
			t.givenBack.Add(-g.Cost)
		}
	}
}

// forget drops what the deny cache holds of id at p.
func (t *Table) forget(id string, p window.Position) {
	if t.cfg.Forget != nil {
		t.cfg.Forget(id, p)
	}
}

// Drain drops this process's leases of id at each of at, the positions of
// a Charge's Leased limits, and returns the give-backs of what they held,
// for the charge's call: units counted before the charge must not serve
// after it, which may have pushed the count over. What a decision has in
// flight from them goes back when it settles (see restore).
func (t *Table) Drain(id string, at []window.Position) []*script.Request {
	var gives []*script.Request
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range at {
		k := table.Of(id, p)
		e := t.entries[k]
		if e == nil {
			continue
		}
		delete(t.entries, k)
		if e.left > 0 && e.key != "" {
			gives = append(gives, script.GiveBack(e.left, e.key))
			t.forget(id, p)
		}
	}
	return gives
}

// Forget drops the lease of id at p, and the give-backs waiting for keys,
// without giving anything back: Reset deleted keys, which they were counted
// in. What a decision has in flight from the lease is dropped too (see
// lease.reset).
func (t *Table) Forget(id string, p window.Position, keys []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := table.Of(id, p)
	if e := t.entries[k]; e != nil {
		e.reset = true
		delete(t.entries, k)
	}
	t.pending = slices.DeleteFunc(t.pending, func(g pendingGive) bool {
		return g.id == id && slices.Contains(keys, g.req.Keys[0])
	})
}

// start starts the sweeper if it is not running. Called with t.mu held.
func (t *Table) start() {
	if t.sweeping || t.cfg.Manual || t.closed {
		return
	}
	t.sweeping = true
	t.cfg.Go(t.run)
}

// run sweeps every sweepEvery until a sweep leaves the table empty, or the
// Limiter closes.
func (t *Table) run() {
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-t.cfg.Quit:
			t.mu.Lock()
			t.sweeping = false
			t.mu.Unlock()
			return
		}
		if !t.Sweep() {
			return
		}
	}
}

// Close ends the table for the Limiter's Close: it drops every lease and
// sends what they hold back, with every pending give-back, each in a call
// of its own in the Limiter's background (they batch), which Close waits
// for. No sweeper starts after it, and no lease: a call under way after it
// takes none, and what it settles into a lease goes back at once (queue).
// It may be called again.
func (t *Table) Close() {
	t.mu.Lock()
	t.closed = true
	for k, e := range t.entries {
		t.drop(k, e)
	}
	gives := t.pending
	t.pending = nil
	t.mu.Unlock()
	for _, g := range gives {
		t.cfg.Go(func() { t.send(g) })
	}
}

// Sweep drops the leases whose window has passed or that have been idle for
// IdleSweeps sweeps, and sends what they held back with every pending
// give-back, each in a call of its own (they may be of ids on different
// Cluster slots). It reports whether the sweeper must go on: false, with
// the table's sweeping cleared, once the table is empty.
func (t *Table) Sweep() bool {
	now := t.cfg.Now()
	t.mu.Lock()
	t.sweeps++
	for k, e := range t.entries {
		if !e.at.Holds(now) || t.sweeps-e.sweep >= IdleSweeps {
			t.drop(k, e)
		}
	}
	gives := t.pending
	t.pending = nil
	more := len(t.entries) > 0
	if !more && len(gives) == 0 {
		t.sweeping = false
	}
	t.mu.Unlock()
	for _, g := range gives {
		t.send(g)
	}
	if !more && len(gives) > 0 {
		t.mu.Lock()
		more = len(t.entries) > 0 || len(t.pending) > 0
		if !more {
			t.sweeping = false
		}
		t.mu.Unlock()
	}
	return more
}

// send sends one give-back. A give-back is never sent twice: one that may
// have reached Redis and been lost is lost, which under-uses the limit and
// never over-admits.
func (t *Table) send(g pendingGive) {
	if g.p.W > 0 {
		t.forget(g.id, g.p)
	}
	var out [1]script.Reply
	err := t.cfg.Send(context.Background(), []*script.Request{g.req}, out[:])
	if err == nil {
		err = out[0].Err
	}
	if err != nil {
		t.lost.Add(-g.req.Cost)
		t.cfg.Report(context.Background(), g.id, err)
		return
	}
	t.givenBack.Add(-g.req.Cost)
}

// Held returns how many leases the table holds, and their units.
func (t *Table) Held() (leases int, units int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.entries {
		units += e.left
	}
	return len(t.entries), units
}

// GivenBack and Lost return the units given back since the table was
// made, and those that were not: dropped, or whose give-back failed.
func (t *Table) GivenBack() int64 { return t.givenBack.Load() }

// Lost: see GivenBack.
func (t *Table) Lost() int64 { return t.lost.Load() }

// Drop drops every lease and give-back, sending nothing: for a test's
// cleanup, before its client closes. The sweeper ends at its next sweep.
func (t *Table) Drop() {
	t.mu.Lock()
	clear(t.entries)
	t.pending = nil
	t.mu.Unlock()
}
