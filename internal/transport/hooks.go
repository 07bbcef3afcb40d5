// What the root's tests reach inside a Transport: knobs and readings of its
// breakers and batchers. No decision uses them.

package transport

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/script"
)

// FewDeciding is fewDeciding: while no more decisions than that are under
// way, a batcher sends each alone.
const FewDeciding = fewDeciding

// MaxInFlight is maxInFlight: the calls a batcher has in flight before
// decisions wait for one of them to end.
const MaxInFlight = maxInFlight

// BatchAlways makes t's batchers batch decisions however few are under way.
// Call it before t's first call.
func (t *Transport) BatchAlways() { t.few = 0 }

// SetBreakerClock sets the clock of the breaker of t's one server, for a
// test that passes a cooldown without waiting it out; a Transport without
// breakers has none to set.
func (t *Transport) SetBreakerClock(now func() time.Time) {
	if b := t.one.breaker; b != nil {
		b.now = now
	}
}

// HasBreaker and HasBatcher report whether t's one server has a breaker and
// a batcher.
func (t *Transport) HasBreaker() bool { return t.one.breaker != nil }

// HasBatcher reports whether t's one server batches.
func (t *Transport) HasBatcher() bool { return t.one.batch != nil }

// Failures returns the consecutive failures the breaker of t's one server
// has counted.
func (t *Transport) Failures() int32 { return t.one.breaker.failures.Load() }

// Queued returns how many requests wait in the batcher of t's one server,
// and how many of its calls are in flight.
func (t *Transport) Queued() (waiting, sending int) {
	b := t.one.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting, b.sending
}

// CrossOff reports whether t has stopped sending cross-slot batches.
func (t *Transport) CrossOff() bool { return t.crossOff.Load() }

// CheckEviction looks up the eviction policy of t's one server now, on this
// goroutine, and tells warn what it finds wrong.
func (t *Transport) CheckEviction(warn func(error)) {
	t.warn = warn
	t.checkEviction(t.one)
}

// Call sends reqs to t's client in one call, neither routed nor batched,
// and decodes the reply into out.
func (t *Transport) Call(ctx context.Context, reqs []*script.Request, out []script.Reply) error {
	return t.call(ctx, t.client, t.decider, reqs, out)
}

// An Outcome is what SendBatch hands one decision: its replies, or the
// error of its call.
type Outcome struct {
	Replies []script.Reply
	Err     error
}

// SendBatch sends the requests of several decisions in one batch, as a
// batcher does: to t's one server when node is nil, else to node, a master
// of t's Cluster, as a cross-slot batch of a server made anew.
func (t *Transport) SendBatch(ctx context.Context, node *redis.Client, decisions [][]*script.Request) []Outcome {
	srv := t.one
	if node != nil {
		srv = t.newServer(node.Options().Addr, node, true, true)
	}
	batch := make([]*pending, len(decisions))
	for i, reqs := range decisions {
		batch[i] = newPending(ctx, ctx, reqs)
	}
	srv.batch.send(batch)
	out := make([]Outcome, len(batch))
	for i, p := range batch {
		r := <-p.done
		out[i] = Outcome{r.replies, r.err}
	}
	return out
}
