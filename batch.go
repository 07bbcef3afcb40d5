package ratelimit

import (
	"context"
	"sync"
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
// keys of a call must be on one server, so batching is for a single Redis
// (or a failover client's master), never a Redis Cluster.
type batcher struct {
	l        *Limiter
	maxBatch int

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
		err := b.l.exchange(ctx, reqs)
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
	var reqs []*request
	for {
		reqs = reqs[:0]
		for _, p := range batch {
			reqs = append(reqs, p.reqs...)
		}
		err := b.l.exchange(context.Background(), reqs)
		for _, p := range batch {
			p.done <- err
		}
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
