// The batcher: concurrent decisions for one server waiting for, and sent
// in, one script call.

package transport

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// batcher decides concurrent decisions for one server together: while
// script calls are in flight (at most maxInFlight), the decisions that
// arrive wait, then go in the next call, as many requests as maxBatch and
// within the bounds of one call (maxCallKeys, maxCallValues). Redis spends
// most of a script call's time on invoking the script, not on the few reads
// and writes inside it, so one call for many requests is most of the gain;
// the round trips saved are the rest.
//
// At rest there is no goroutine and no wait: a decision that finds room for
// a call and no one waiting is sent at once, alone, on its caller's
// goroutine. So is every decision while no more than FewDeciding are under
// way (Config.FewDeciding), whatever is in flight: a batch of so few would save Redis little and
// cost its decisions a round trip's wait. When a call returns and decisions
// are waiting, a goroutine sends them, and the next batch after that, and
// ends when none is waiting or more than maxInFlight calls are in flight
// (the others then serve the queue).
//
// A waiting decision whose caller has left, or whose deadline has passed, is
// dropped before the next call is built: a call carries only requests whose
// callers still wait, and it lasts until the latest of their deadlines. The
// circuit breaker is asked before each call.
//
// At most maxQueue requests, of queuedCalls × maxCallKeys keys, wait: about
// queuedCalls calls' worth. Past that, a decision waits for room on
// its caller's goroutine, within its own deadline, and goes to the failure
// policy if that passes first: a burst that a healthy Redis drains in a few
// milliseconds is still decided by Redis, while the batcher's memory stays
// bounded whatever the burst, and a slow Redis is sent no more than its
// callers wait for.
//
// Requests in one call are decided in the order they arrived, each seeing
// the counts the ones before it wrote, and each call is atomic: the same
// decisions as if the requests had come one at a time, in some order. All
// keys of a call must be on one server: on a single Redis (or a failover
// client's master) one batcher serves all decisions; on a Redis Cluster
// there is one per master, and its batches declare that their keys span
// slots (Redis 7's allow-cross-slot-keys).
type batcher struct {
	t        *Transport
	srv      *server
	cross    bool // batches go to one Cluster master's own client, across slots
	maxBatch int  // requests per call
	maxQueue int  // requests waiting, at most

	deciding atomic.Int64 // decisions in decide

	mu      sync.Mutex
	sending int           // calls in flight: at most maxInFlight, or FewDeciding
	queue   []*pending    // decisions waiting for the next call, in order
	waiting int           // requests in queue
	keys    int           // and their keys
	room    chan struct{} // closed when the queue shrinks; nil when no one waits for room
}

// maxInFlight calls may be in flight at once while decisions batch, so that
// Redis runs one while the client hands out the results of another and
// gathers the next.
const maxInFlight = 2

// FewDeciding is how many decisions may be under way at once and still each
// go at once in a call of its own, up to FewDeciding calls in flight (calls
// whose callers left count too: a slow Redis is sent no more). Measured on
// 2 cores (bench/README.md, "How many calls in flight"): with 8 goroutines
// deciding, about 1.5 times the decisions a second of 2 calls in flight, on
// either client; with another process taking a core, 0.87 times on a
// ContextTimeoutEnabled client and about level on go-redis's default one;
// with 64, no change.
const FewDeciding = 8

// queuedCalls is how many calls' worth of requests (maxBatch each) may wait.
const queuedCalls = 16

// pending is one decision waiting for its batch; done receives its replies
// once, when its requests are decided or their call failed.
type pending struct {
	leave        context.Context // done when its caller stops waiting
	wire         context.Context // its call's: the Limiter's deadline, the caller's values
	reqs         []*script.Request
	keys, values int // what its requests add to a call
	done         chan batchReply
}

// newPending returns a pending decision of reqs whose caller waits until
// leave is done, and whose call is bounded by wire (see transport.do).
func newPending(leave, wire context.Context, reqs []*script.Request) *pending {
	p := &pending{leave: leave, wire: wire, reqs: reqs, done: make(chan batchReply, 1)}
	for _, r := range reqs {
		k, v := r.CallSize()
		p.keys, p.values = p.keys+k, p.values+v
	}
	return p
}

// batchReply is what a batch hands one of its decisions: replies of its own,
// which the batch no longer touches; or errUnsent, for a decision dropped
// unsent because its caller left.
type batchReply struct {
	replies []script.Reply
	err     error
}

// errUnsent is the reply of a waiting decision dropped because its caller
// left: nothing of it was sent.
var errUnsent = errors.New("ratelimit: not sent: its caller left")

// decide sends reqs, one decision's requests, in a batch and stores their
// replies in out, or returns when leave is done first (see exchange); the
// requests may then still be decided, and counted, by a call already under
// way, which tells the CallerLeft it returns if it fails.
func (b *batcher) decide(leave, wire context.Context, reqs []*script.Request, out []script.Reply) error {
	few := b.deciding.Add(1) <= int64(b.t.few)
	defer b.deciding.Add(-1)
	b.mu.Lock()
	for {
		if len(b.queue) == 0 && (b.sending < maxInFlight || few && b.sending < b.t.few) {
			// Room for a call and no one waiting: send at once on this
			// goroutine, through the client itself.
			b.sending++
			b.mu.Unlock()
			err := b.t.exchange(leave, wire, b.srv, b.t.client, b.t.decider, reqs, out)
			if l := lateOf(err); l != nil {
				l.Then(b.next) // in flight until it ends, its caller gone or not
			} else {
				b.next()
			}
			return err
		}
		if b.fits(reqs) {
			break
		}
		if b.prune(); b.fits(reqs) {
			continue
		}
		if b.room == nil {
			b.room = make(chan struct{})
		}
		room := b.room
		b.mu.Unlock()
		select {
		case <-room:
		case <-leave.Done():
			return b.unsent(leave, wire)
		}
		b.mu.Lock()
	}
	p := newPending(leave, wire, reqs)
	b.queue = append(b.queue, p)
	b.waiting += len(reqs)
	b.keys += p.keys
	if b.sending < maxInFlight {
		b.sending++
		b.t.work.Go(b.flush)
	}
	b.mu.Unlock()
	select {
	case r := <-p.done:
		if r.err == errUnsent {
			return b.unsent(leave, wire)
		}
		copy(out, r.replies)
		return r.err
	case <-leave.Done():
	}
	if leave == wire {
		return wire.Err()
	}
	gone := &CallerLeft{err: leave.Err(), Late: &Late{}}
	b.t.work.Go(func() { // until its call, if it is in one, ends: one that was made
		var err error
		if r := <-p.done; r.err != nil && r.err != errUnsent && !errors.Is(r.err, ErrCircuitOpen) {
			err = b.t.explain(wire, b.srv, r.err)
		}
		gone.Late.end(err)
	})
	return gone
}

// unsent returns the error of a decision whose caller left before any of it
// was sent: nothing to tell of Redis.
func (b *batcher) unsent(leave, wire context.Context) error {
	if leave == wire {
		return ctxErr(wire)
	}
	return &CallerLeft{err: ctxErr(leave)}
}

// fits reports whether reqs fit in the queue; b.mu is held. An empty queue
// takes any decision.
func (b *batcher) fits(reqs []*script.Request) bool {
	keys := 0
	for _, r := range reqs {
		keys += len(r.Keys)
	}
	return len(b.queue) == 0 || b.waiting+len(reqs) <= b.maxQueue && b.keys+keys <= queuedCalls*maxCallKeys
}

// prune drops the waiting decisions whose callers have left; b.mu is held.
func (b *batcher) prune() {
	kept := b.queue[:0]
	for _, p := range b.queue {
		if expired(p.leave) {
			b.waiting, b.keys = b.waiting-len(p.reqs), b.keys-p.keys
			p.done <- batchReply{err: errUnsent}
			continue
		}
		kept = append(kept, p)
	}
	if len(kept) < len(b.queue) && b.room != nil {
		close(b.room)
		b.room = nil
	}
	clear(b.queue[len(kept):])
	b.queue = kept
}

// next starts a goroutine for the decisions that came while a call was in
// flight, or marks that the call is over: it leaves them to the other calls
// in flight if there are maxInFlight of those.
func (b *batcher) next() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 || b.sending > maxInFlight {
		b.sending--
		return
	}
	b.t.work.Go(b.flush)
}

// flush sends the waiting decisions, a batch at a time, until none waits or
// maxInFlight other calls are in flight to serve them.
func (b *batcher) flush() {
	for {
		b.mu.Lock()
		var batch []*pending
		if b.sending <= maxInFlight {
			batch = b.take()
		}
		if len(batch) == 0 {
			b.sending--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.send(batch)
	}
}

// take removes the next batch from the queue: waiting decisions in order,
// up to the bounds of a call (at least one decision), passing over and
// dropping those whose caller has left. b.mu is held.
func (b *batcher) take() []*pending {
	var batch []*pending
	reqs, keys, values, n := 0, 0, 0, 0
	for ; n < len(b.queue); n++ {
		p := b.queue[n]
		if expired(p.leave) {
			b.waiting, b.keys = b.waiting-len(p.reqs), b.keys-p.keys
			p.done <- batchReply{err: errUnsent}
			continue
		}
		if len(batch) > 0 && (reqs+len(p.reqs) > b.maxBatch || keys+p.keys > maxCallKeys || values+p.values > maxCallValues) {
			break
		}
		batch = append(batch, p)
		reqs, keys, values = reqs+len(p.reqs), keys+p.keys, values+p.values
		b.waiting, b.keys = b.waiting-len(p.reqs), b.keys-p.keys
	}
	clear(b.queue[:n]) // let the dropped and taken go
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	if b.room != nil {
		close(b.room)
		b.room = nil
	}
	return batch
}

// send makes one script call for batch and hands each decision its
// replies. The call's deadline is the latest of its decisions': no caller's
// ctx can cancel a call that carries other callers' requests, and no call
// outlasts all of them.
//
// On a Cluster, a batch that the master refused without running it (a slot
// moved or is moving, the cluster is down, or the server cannot run
// cross-slot scripts) is sent again one decision per call through the
// Cluster client, which follows redirects: nothing ran, so nothing counts
// twice.
func (b *batcher) send(batch []*pending) {
	ctx, cancel := callContext(batch)
	defer cancel()
	var reqs []*script.Request
	for _, p := range batch {
		reqs = append(reqs, p.reqs...)
	}
	out := make([]script.Reply, len(reqs))
	c, sc := b.t.client, b.t.decider
	cross := b.cross && len(batch) > 1
	if cross {
		c, sc = b.srv.client, b.t.crossSlot
	}
	err := b.t.exchange(ctx, ctx, b.srv, c, sc, reqs, out)
	if !b.cross && len(batch) > 1 && slotRefusal(err) {
		// A server that is no Cluster's, behind which the keys of a call
		// must share a slot: nothing ran; each goes alone, and no more
		// batches are made (batcherOf).
		b.t.oneSlot.Store(true)
		for _, p := range batch {
			p.done <- b.t.alone(p)
		}
		return
	}
	if refused, unsupported := refusedBatch(err); cross && (refused || errors.Is(err, redis.ErrClosed)) {
		// A closed node client is one go-redis dropped from its slot map:
		// the Cluster client knows where the keys went.
		if unsupported {
			b.t.crossOff.Store(true)
		}
		b.t.reload()
		for _, p := range batch {
			p.done <- b.t.alone(p)
		}
		return
	}
	for _, p := range batch {
		p.done <- batchReply{replies: out[:len(p.reqs):len(p.reqs)], err: err}
		out = out[len(p.reqs):]
	}
}

// alone sends the requests of p, a decision of a Cluster batch that its
// master refused, in a call of their own through the Cluster client.
func (t *Transport) alone(p *pending) batchReply {
	if expired(p.leave) {
		return batchReply{err: errUnsent}
	}
	out := make([]script.Reply, len(p.reqs))
	srv, err := t.serverFor(p.wire, p.wire, p.reqs[0].Keys[0])
	if err == nil {
		err = t.exchange(p.wire, p.wire, srv, t.client, t.decider, p.reqs, out)
	}
	return batchReply{replies: out, err: err}
}

// callContext returns the context of a call for batch: the latest of its
// decisions' call deadlines (none if one has none), with the values of the
// first decision's ctx (a trace, say). With a Limiter timeout, a call that
// deadline ends is a Redis failure: no reply came within the timeout of any
// of them.
func callContext(batch []*pending) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, p := range batch {
		d, ok := p.wire.Deadline()
		if !ok {
			return context.WithoutCancel(batch[0].wire), noCancel
		}
		latest = later(latest, d)
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].wire), latest)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// refusedBatch reports whether a Cluster master refused a batch without
// running it, and whether because it cannot run cross-slot scripts at all.
func refusedBatch(err error) (refused, unsupported bool) {
	if err == nil {
		return false, false
	}
	for _, prefix := range []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "CROSSSLOT"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true, false
		}
	}
	// A master that refuses a script's keys of several slots whatever
	// its flags (ElastiCache Serverless) will refuse every batch.
	if strings.Contains(err.Error(), "do not hash to the same slot") {
		return true, true
	}
	// The script reads every key before it writes any: one this master
	// no longer serves fails it before a write.
	if strings.Contains(err.Error(), "non local key") {
		return true, false
	}
	// A script that does not compile did not run: before Redis 7 the
	// shebang line is not Lua.
	if msg := err.Error(); redis.HasErrorPrefix(err, "") && (strings.Contains(msg, "shebang") || strings.Contains(msg, "compiling script")) {
		return true, true
	}
	return false, false
}
