// Leased limits (Limit.Leased): the lease table, its sweeper and
// give-backs.

package ratelimit

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
)

// leaseTable holds this process's leases of Leased limits: units counted in
// Redis ahead of the requests they serve (see Limit.Leased).
//
// A lease of an id and a limit holds units counted in one window (for a
// strict limit, one sub-window) at that window's key, and serves requests
// while the Limiter's clock is in it. What is left when the clock has moved
// on is given back to that key, never below 0: by the next decision on the
// id, which must take a new lease and carries the give-back in its call, or
// else by the sweeper. A request that Redis denies gives back to the lease
// the units it took from it, unwritten.
//
// The sweeper runs while the table holds a lease or a give-back: every
// sweepEvery of real time it drops the leases whose window has passed or
// that no decision used for idleSweeps sweeps, and sends what they held
// back, with the give-backs that could not travel with a decision (of an
// evicted lease, of a lease that came back after its window). It ends when
// the table is empty.
//
// One lock guards the table: a hot id's decisions all meet at its lease
// anyway, and what each does under the lock is a few sums.
type leaseTable struct {
	l        *Limiter
	mu       sync.Mutex
	entries  map[tableKey]*lease
	max      int           // entries at most: maxLeases
	pending  []pendingGive // give-backs for the sweeper to send
	sweeps   int64         // the sweeps so far: the table's coarse clock
	sweeping bool          // a sweeper goroutine runs
	stopped  chan struct{} // closed when the last sweeper started has ended
	manual   bool          // no sweeper goroutine: a test calls sweep
	quit     chan struct{} // closed by close: the sweeper ends
	closed   bool          // by close: no sweeper starts again

	givenBack atomic.Int64 // units given back, Redis said so
	lost      atomic.Int64 // units not given back: dropped, or their call failed
}

// lease is what this process holds of one count.
type lease struct {
	rate  int64    // the Rate of the limit that took it, which sized it
	at    position // the window (sub-window, period) its units are counted in
	key   string   // that window's key; empty until a lease is granted in it
	left  int64    // units counted and not used
	used  int64    // units of the last lease used since it was taken
	seen  counts   // the counts Redis reported with the last lease, before it
	size  int64    // the lease to ask for next
	sweep int64    // the sweep during which it was last used
	// reset: Reset deleted the keys it was counted in. What is in flight
	// from it is dropped, neither kept nor given back: a give-back could
	// lower counts written after the Reset.
	reset bool
}

// queue appends g to the give-backs waiting for the sweeper, unless
// maxLeases already wait: then it is dropped, which under-uses the limit
// and never over-admits. Called with t.mu held.
func (t *leaseTable) queue(g pendingGive) {
	if len(t.pending) < maxLeases {
		t.pending = append(t.pending, g)
	} else {
		t.lost.Add(-g.req.Cost)
	}
	t.start()
}

// pendingGive is a give-back waiting for the sweeper: of id, at the key of a
// limit whose windows p places.
type pendingGive struct {
	id  string
	p   position
	req *script.Request
}

const (
	// maxLeases bounds the table: leases are for hot ids, a few per
	// process. A full table evicts a lease, giving its units back.
	maxLeases = 10_000
	// leaseFraction caps a lease at Rate/leaseFraction units: what one
	// server can hold unused of a limit at any moment.
	leaseFraction = 20
	// sweepEvery and idleSweeps set how soon the units of a lease no
	// decision uses go back: within about a second.
	sweepEvery = 250 * time.Millisecond
	idleSweeps = 4
)

func newLeaseTable(l *Limiter) *leaseTable {
	return &leaseTable{l: l, entries: make(map[tableKey]*lease), max: maxLeases, quit: make(chan struct{})}
}

// leaseCap returns the largest lease of a limit of rate.
func leaseCap(rate int64) int64 { return max(1, rate/leaseFraction) }

// leaseAsk is one Leased limit of a decision, in the lease table's terms:
// a lease of an id serves one limit's Rate in one window (sub-window).
type leaseAsk struct {
	rate int64    // the limit's Rate, which sizes its lease
	pos  position // its windows' length and kind, and the one the clock is in
	key  string   // the key of that window, where Redis counts what it leases: for settle
}

// leaseGrant is what the table decided of a leaseAsk for a cost n: held
// units of n come from the lease, all of them when local (then it is
// decided here, from seen, the lease's counts as of its last lease plus
// this process's use since). Otherwise need is what Redis is to count of
// n (the rest), and most what it is to lease at most; grow says the lease
// ran out within its window, so the next is larger. A grant served from
// the lease alone has need n, which the Result counts.
type leaseGrant struct {
	local, grow      bool
	held, need, most int64
	seen             counts
	entry            *lease // the lease it took from, for settle
}

// leaseAnswer is how a leaseGrant's request was answered: allowed (false
// for a denial, a failed call or a denial from the deny cache), and then
// the counts Redis saw, which a lease taken is reported with.
type leaseAnswer struct {
	allowed bool
	seen    counts
}

// current returns the lease of id at p if it serves the clock there for a
// limit of rate.
func (e *lease) current(p position, rate int64) bool {
	return e != nil && e.at.i == p.i && e.rate == rate
}

// serve decides a request of cost n (a look takes nothing and needs one)
// against asks, every limit of a decision, from their leases alone if each
// holds n, and then fills grants, one per ask, and reports true; if not, it
// has changed nothing.
func (t *leaseTable) serve(id string, asks []leaseAsk, n int64, look bool, grants []leaseGrant) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range asks {
		a := &asks[i]
		e := t.entries[a.pos.tableKey(id)]
		if !e.current(a.pos, a.rate) || e.left < n {
			return false
		}
		grants[i].entry = e
	}
	for i := range asks {
		e := grants[i].entry
		g := leaseGrant{local: true, need: n, seen: e.seen, entry: e}
		g.seen[0] += e.used
		e.sweep = t.sweeps
		if !look {
			g.held = n
			e.left -= n
			e.used += n
		}
		grants[i] = g
	}
	return true
}

// take takes for each of asks, the Leased limits of a request of cost n on
// its way to Redis, what its lease holds of n, up to all of it, and fills
// grants, one per ask, with what the lease held and what to ask Redis to
// count and to lease. It returns the give-backs of leases whose window has
// passed, for the same call.
func (t *leaseTable) take(id string, asks []leaseAsk, n int64, grants []leaseGrant) []*script.Request {
	var gives []*script.Request
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range asks {
		a := &asks[i]
		e := t.entry(id, a.pos)
		if !e.current(a.pos, a.rate) {
			if e.left > 0 && e.key != "" {
				gives = append(gives, script.GiveBack(e.left, e.key))
				t.forgetDenial(id, a.pos)
				if e.left > e.size/2 { // expired unused: ask for less
					e.size = max(1, e.size/2)
				}
			}
			*e = lease{rate: a.rate, at: a.pos, size: e.size}
		}
		e.sweep = t.sweeps
		g := leaseGrant{entry: e}
		if e.left >= n {
			g.local, g.held, g.need = true, n, n
			g.seen = e.seen
			g.seen[0] += e.used
			e.left -= n
			e.used += n
		} else {
			g.held, e.left = e.left, 0
			g.need = n - g.held
			g.grow = e.key != "" // a lease of this window ran out
			g.most = max(g.need, min(e.size, leaseCap(a.rate)))
		}
		grants[i] = g
	}
	if len(gives) > 0 {
		t.start()
	}
	return gives
}

// entry returns the lease of id at p, a new one if there is none, making
// room for it when the table is full. Called with t.mu held.
func (t *leaseTable) entry(id string, p position) *lease {
	k := p.tableKey(id)
	if e := t.entries[k]; e != nil {
		return e
	}
	if len(t.entries) >= t.max {
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
func (t *leaseTable) drop(k tableKey, e *lease) {
	delete(t.entries, k)
	if e.left > 0 && e.key != "" {
		t.queue(pendingGive{k.id, e.at, script.GiveBack(e.left, e.key)})
	}
}

// settle ends what take began for asks and their grants, once their
// requests are answered: a grant allowed keeps what it took and, unless
// local, adds to its lease the rest of what Redis leased at the ask's key;
// one not allowed gives back to its lease what it took from it. A lease
// that came back after its window is given back.
func (t *leaseTable) settle(id string, asks []leaseAsk, grants []leaseGrant, answers []leaseAnswer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range asks {
		a, g, r := &asks[i], &grants[i], &answers[i]
		if g.entry.reset {
			continue // see lease.reset
		}
		e := t.entries[a.pos.tableKey(id)]
		if g.local && r.allowed {
			continue // decided here, and kept
		}
		if !r.allowed || g.local {
			t.restore(id, e, a, g.held)
			continue
		}
		extra := script.Granted(g.need, g.most, a.rate, a.pos.estimate(&r.seen)) - g.need
		if !e.current(a.pos, a.rate) {
			if extra > 0 {
				t.queue(pendingGive{id, a.pos, script.GiveBack(extra, a.key)})
			}
			continue
		}
		e.left += extra
		e.key, e.seen, e.used = a.key, r.seen, g.need
		if g.grow {
			e.size = min(leaseCap(a.rate), 2*e.size)
		}
	}
}

// restore gives units taken from e, a's lease, back to it, or to a's key if
// the lease has moved on. Called with t.mu held.
func (t *leaseTable) restore(id string, e *lease, a *leaseAsk, units int64) {
	if units == 0 {
		return
	}
	if e.current(a.pos, a.rate) {
		e.left += units
		e.used = max(0, e.used-units)
		e.key = a.key // the entry may be new, and must give them back in time
		return
	}
	t.queue(pendingGive{id, a.pos, script.GiveBack(units, a.key)})
}

// later leaves gives, the give-backs of a decision of id that sends nothing,
// to the sweeper. Their positions do not matter: a decision gives back
// only leases whose window has passed, and has forgotten their denials.
func (t *leaseTable) later(id string, gives []*script.Request) {
	if len(gives) == 0 {
		return
	}
	t.mu.Lock()
	for _, g := range gives {
		t.queue(pendingGive{id: id, req: g})
	}
	t.mu.Unlock()
}

// gaveBack counts the give-backs that went in a decision's call, with
// their replies, and reports those that failed alone (a key that holds no
// count); all are lost when the call failed (err), which its decision
// reports.
func (t *leaseTable) gaveBack(ctx context.Context, id string, gives []*script.Request, replies []script.Reply, err error) {
	for i, g := range gives {
		switch {
		case err != nil:
			t.lost.Add(-g.Cost)
		case replies[i].Err != nil:
			t.lost.Add(-g.Cost)
			t.l.onError(ctx, id, wrap("ratelimit: giving back a lease", replies[i].Err))
		default:
			t.givenBack.Add(-g.Cost)
		}
	}
}

// forgetDenial drops what the deny cache holds of id at p: a give-back lowers
// a count it may hold, and it must hold lower bounds.
func (t *leaseTable) forgetDenial(id string, p position) {
	if t.l.denied != nil {
		t.l.denied.forget(id, p)
	}
}

// drain drops this process's leases of id at each of at, the positions of
// a Charge's Leased limits, and returns the give-backs of what they held,
// for the charge's call: units counted before the charge must not serve
// after it, which may have pushed the count over. What a decision has in
// flight from them goes back when it settles (see restore).
func (t *leaseTable) drain(id string, at []position) []*script.Request {
	var gives []*script.Request
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range at {
		k := p.tableKey(id)
		e := t.entries[k]
		if e == nil {
			continue
		}
		delete(t.entries, k)
		if e.left > 0 && e.key != "" {
			gives = append(gives, script.GiveBack(e.left, e.key))
			t.forgetDenial(id, p)
		}
	}
	return gives
}

// forget drops the lease of id at p, and the give-backs waiting for keys,
// without giving anything back: Reset deleted keys, which they were counted
// in. What a decision has in flight from the lease is dropped too (see
// lease.reset).
func (t *leaseTable) forget(id string, p position, keys []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := p.tableKey(id)
	if e := t.entries[k]; e != nil {
		e.reset = true
		delete(t.entries, k)
	}
	t.pending = slices.DeleteFunc(t.pending, func(g pendingGive) bool {
		return g.id == id && slices.Contains(keys, g.req.Keys[0])
	})
}

// start starts the sweeper if it is not running. Called with t.mu held.
func (t *leaseTable) start() {
	if t.sweeping || t.manual || t.closed {
		return
	}
	t.sweeping = true
	t.stopped = make(chan struct{})
	go t.run(t.stopped)
}

// run sweeps every sweepEvery until a sweep leaves the table empty, then
// closes stopped.
func (t *leaseTable) run(stopped chan struct{}) {
	defer close(stopped)
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-t.quit:
			return
		}
		if !t.sweep() {
			return
		}
	}
}

// close ends the table for the Limiter's Close: it stops the sweeper,
// waiting for a sweep under way to end (or for ctx), drops every lease and
// sends what they hold back, with every pending give-back, each in a call
// of its own in the Limiter's background (they batch), which Close waits
// for.
func (t *leaseTable) close(ctx context.Context) {
	t.mu.Lock()
	t.closed = true
	close(t.quit)
	stopped := t.stopped
	if !t.sweeping {
		stopped = nil
	}
	t.mu.Unlock()
	if stopped != nil {
		select {
		case <-stopped:
		case <-ctx.Done():
		}
	}
	t.mu.Lock()
	for k, e := range t.entries {
		t.drop(k, e)
	}
	gives := t.pending
	t.pending = nil
	t.mu.Unlock()
	for _, g := range gives {
		t.l.bg.Go(func() { t.send(g) })
	}
}

// sweep drops the leases whose window has passed or that have been idle for
// idleSweeps sweeps, and sends what they held back with every pending
// give-back, each in a call of its own (they may be of ids on different
// Cluster slots). It reports whether the sweeper must go on: false, with
// t.sweeping cleared, once the table is empty.
func (t *leaseTable) sweep() bool {
	now := t.l.now().UnixMilli()
	t.mu.Lock()
	t.sweeps++
	for k, e := range t.entries {
		if !e.at.holds(now) || t.sweeps-e.sweep >= idleSweeps {
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
func (t *leaseTable) send(g pendingGive) {
	if g.p.w > 0 {
		t.forgetDenial(g.id, g.p)
	}
	var out [1]script.Reply
	err := t.l.t.Do(context.Background(), []*script.Request{g.req}, out[:])
	if err == nil {
		err = out[0].Err
	}
	if err != nil {
		t.lost.Add(-g.req.Cost)
		t.l.onError(context.Background(), g.id, wrap("ratelimit: giving back a lease", err))
		return
	}
	t.givenBack.Add(-g.req.Cost)
}

// held returns how many leases the table holds, and their units.
func (t *leaseTable) held() (leases int, units int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.entries {
		units += e.left
	}
	return len(t.entries), units
}
