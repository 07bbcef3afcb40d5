package ratelimit

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// batcher decides concurrent decisions together: while script calls are in
// flight (at most maxInFlight), the decisions that arrive wait, then go in
// the next call, as many requests as maxBatch. Redis spends most of a script
// call's time on invoking the script, not on the few reads and writes inside
// it, so one call for many requests is most of the gain; the round trips
// saved are the rest.
//
// At rest there is no goroutine and no wait: a decision that finds room for
// a call and no one waiting is sent at once, alone, on its caller's
// goroutine. When a call returns and decisions are waiting, a goroutine
// sends them, and the next batch after that, and ends when none is waiting.
//
// Requests in one call are decided in the order they arrived, each seeing
// the counts the ones before it wrote, and each call is atomic: the same
// decisions as if the requests had come one at a time, in some order. All
// keys of a call must be on one server: on a single Redis (or a failover
// client's master) one batcher serves all decisions; on a Redis Cluster there
// is one per master, and its batches declare that their keys span slots
// (Redis 7's allow-cross-slot-keys).
type batcher struct {
	l        *Limiter
	maxBatch int
	client   redis.UniversalClient // where batches go
	cross    bool                  // batches go to one Cluster master, across slots

	mu      sync.Mutex
	sending int        // calls in flight, at most maxInFlight
	queue   []*pending // decisions waiting for the next call
	waiting int        // requests in queue
}

// maxInFlight calls may be in flight at once, so that Redis runs one while
// the client hands out the results of another and gathers the next.
const maxInFlight = 2

// pending is one decision waiting for its batch; done receives once, when
// its requests are decided or their call failed.
type pending struct {
	reqs []*request
	done chan error
}

// decide sends reqs, one decision's requests, in a batch and returns when
// they are decided, or with ctx's error if ctx is done first; they may then
// still be decided, and counted, by the call they are in.
func (b *batcher) decide(ctx context.Context, reqs []*request) error {
	b.mu.Lock()
	if b.sending < maxInFlight && len(b.queue) == 0 {
		// Room for a call and no one waiting: send at once on this
		// goroutine; the Limiter's deadline bounds it.
		b.sending++
		b.mu.Unlock()
		err := b.l.exchange(ctx, b.l.client, decider, reqs)
		b.next()
		return err
	}
	p := &pending{reqs: reqs, done: make(chan error, 1)}
	b.queue = append(b.queue, p)
	b.waiting += len(reqs)
	if b.sending < maxInFlight {
		b.sending++
		go b.flush(b.take())
	}
	b.mu.Unlock()
	ctx, cancel := b.l.deadline(ctx)
	defer cancel()
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// take removes waiting decisions from the queue, up to maxBatch requests
// (at least one decision); b.mu is held.
func (b *batcher) take() []*pending {
	n, reqs := 0, 0
	for n < len(b.queue) && (n == 0 || reqs+len(b.queue[n].reqs) <= b.maxBatch) {
		reqs += len(b.queue[n].reqs)
		n++
	}
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	b.waiting -= reqs
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	return batch
}

// next starts a goroutine for the decisions that came while a call was in
// flight, or marks that nothing is in flight.
func (b *batcher) next() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.sending--
		return
	}
	go b.flush(b.take())
}

// flush sends batch and then every batch that waits after it, until none
// does. Its calls are bounded by the Limiter's timeout alone: no caller's
// ctx can cancel a call that carries other callers' requests.
func (b *batcher) flush(batch []*pending) {
	for {
		// A new slice for each call: a call the Limiter stopped waiting
		// for, on a client that ignores ctx deadlines, may still be
		// reading the last one.
		var reqs []*request
		for _, p := range batch {
			reqs = append(reqs, p.reqs...)
		}
		b.send(batch, reqs)
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.sending--
			b.mu.Unlock()
			return
		}
		batch = b.take()
		b.mu.Unlock()
	}
}

// send makes one script call for batch, whose requests are reqs, and hands
// each decision its outcome. On a Cluster, a batch that the master refused
// without running it (a slot moved or is moving, the cluster is down, or the
// server cannot run cross-slot scripts) is sent again one decision per call
// through the Cluster client, which follows redirects: nothing ran, so
// nothing counts twice.
func (b *batcher) send(batch []*pending, reqs []*request) {
	if !b.cross || len(batch) == 1 {
		err := b.l.exchange(context.Background(), b.l.client, decider, reqs)
		for _, p := range batch {
			p.done <- err
		}
		return
	}
	err := b.l.exchange(context.Background(), b.client, crossSlotDecider, reqs)
	if refused, unsupported := refusedBatch(err); refused {
		if unsupported {
			b.l.nodes.off.Store(true)
		}
		for _, p := range batch {
			p.done <- b.l.exchange(context.Background(), b.l.client, decider, p.reqs)
		}
		return
	}
	for _, p := range batch {
		p.done <- err
	}
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

// nodeBatchers batches decisions per Redis Cluster master.
type nodeBatchers struct {
	cc       *redis.ClusterClient
	maxBatch int
	off      atomic.Bool // the masters cannot run cross-slot scripts
	byNode   sync.Map    // *redis.Client of a master -> *batcher
}

// batcherFor returns the batcher for a decision whose first request is r,
// or nil when it goes alone.
func (l *Limiter) batcherFor(ctx context.Context, r *request) *batcher {
	if l.batch != nil {
		return l.batch
	}
	n := l.nodes
	if n == nil || n.off.Load() {
		return nil
	}
	node, err := n.cc.MasterForKey(ctx, r.keys[0])
	if err != nil {
		return nil
	}
	if b, ok := n.byNode.Load(node); ok {
		return b.(*batcher)
	}
	b, _ := n.byNode.LoadOrStore(node, &batcher{l: l, maxBatch: n.maxBatch, client: node, cross: true})
	return b.(*batcher)
}
