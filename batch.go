package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"sync"
)

// batcher decides concurrent requests together: while script calls are in
// flight (at most maxInFlight), the requests that arrive wait, then go in the
// next call, as many as maxBatch. Redis spends most of a script call's time on invoking the
// script, not on the few reads and writes inside it, so one call for many
// requests is most of the gain; the round trips saved are the rest.
//
// At rest there is no goroutine and no wait: a request that finds room for a
// call and no one waiting is sent at once, alone. When a call returns and requests are
// waiting, a goroutine sends them, and the next batch after that, and ends
// when none is waiting.
//
// Requests in one call are decided in the order they arrived, each seeing
// the counts the ones before it wrote, and each call is atomic: the same
// decisions as if the requests had come one at a time, in some order. All keys of a call must be on one
// server, so batching is for a single Redis (or a failover client's
// master), never a Redis Cluster.
type batcher struct {
	l        *Limiter
	maxBatch int

	mu      sync.Mutex
	sending int        // calls in flight, at most maxInFlight
	queue   []*pending // requests waiting for the next call
}

// maxInFlight calls may be in flight at once, so that Redis runs one while
// the client hands out the results of another and gathers the next.
const maxInFlight = 2

// pending is one request waiting for its batch; done receives once, when
// its outcome is set.
type pending struct {
	req     request
	done    chan struct{}
	allowed bool
	counts  counts
	err     error
}

// decide adds req to a batch and returns its outcome, or ctx's error if ctx
// is done first; the request may then still be decided, and counted, by the
// batch it is in.
func (b *batcher) decide(ctx context.Context, req request) (bool, counts, error) {
	p := &pending{req: req, done: make(chan struct{}, 1)}
	b.mu.Lock()
	if b.sending < maxInFlight && len(b.queue) == 0 && b.l.ctxAware {
		// Room for a call and no one waiting: send at once on this
		// goroutine; ctx bounds it.
		b.sending++
		b.mu.Unlock()
		b.send(ctx, []*pending{p})
		b.next()
		return p.allowed, p.counts, p.err
	}
	b.queue = append(b.queue, p)
	if b.sending < maxInFlight {
		b.sending++
		go b.flush(b.take())
	}
	b.mu.Unlock()
	select {
	case <-p.done:
		return p.allowed, p.counts, p.err
	case <-ctx.Done():
		return false, counts{}, ctx.Err()
	}
}

// take removes up to maxBatch waiting requests from the queue; b.mu is held.
func (b *batcher) take() []*pending {
	n := min(len(b.queue), b.maxBatch)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	return batch
}

// next starts a goroutine for the requests that came while a call was in
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
		ctx, cancel := b.l.deadline(context.Background())
		b.send(ctx, batch)
		cancel()
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

// send runs one script call for batch and hands each request its outcome.
func (b *batcher) send(ctx context.Context, batch []*pending) {
	args := make([]any, 0, 3+7*len(batch))
	args = append(args, "evalsha", shaArg, strconv.Itoa(2*len(batch)))
	for _, p := range batch {
		args = append(args, &p.req.cur, &p.req.prev)
	}
	for _, p := range batch {
		r := &p.req
		args = append(args, &r.cost, "1", &r.rate, &r.window, &r.left)
	}
	vals, err := eval(ctx, b.l.client, args)
	if err == nil && len(vals) != 3*len(batch) {
		err = fmt.Errorf("%w: %d values for %d requests, want %d", ErrBadReply, len(vals), len(batch), 3*len(batch))
	}
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.allowed, p.counts, p.err = decode(vals[3*i : 3*i+3])
		}
		p.done <- struct{}{}
	}
}
