// Concurrency limits: Acquire, and a Slot's Release, Extend and Keep. An
// Acquire is a request of its own kind (concurrency.lua) through the one
// send; its failure policy counts in FailLocal's table (internal/local).

package ratelimit

import (
	"context"
	"errors"
	"time"

	"github.com/slidingwindow/ratelimit/internal/local"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// Concurrency limits how many requests of one client may be in flight at
// once, across every server sharing the Redis. A held slot returns by itself
// once Lease has passed without Release or Extend, so a process that dies
// holding slots cannot keep them.
type Concurrency struct {
	Max   int64         // slots, at least 1
	Lease time.Duration // at least 1ms, a whole number of ms
	Name  string        // names the limit in headers and metrics, as Limit.Name does
}

// Slot is the outcome of Acquire.
type Slot struct {
	Acquired    bool          // a slot is held; Release it when the work is done
	InFlight    int64         // slots held after this call (this one included when Acquired)
	Remaining   int64         // max(0, Max - InFlight)
	RetryAfter  time.Duration // 0 when Acquired; else the time until the earliest held lease ends
	Degraded    bool          // Redis could not decide; the failure policy did
	Concurrency Concurrency

	held slotHeld // what Release, Extend and Keep need
}

// Acquire takes one of c's slots for id, or says when one may be free. The
// slot is held until its Release, or until c.Lease has passed without an
// Extend, on Redis's clock: a process whose clock is wrong can neither take
// a slot early nor keep one late. Invalid input (an empty id, Max below 1,
// a Lease below 1 ms or not of whole ms) is an error naming the value, and
// nothing is sent. Under WithShadow a full limit refuses nothing: the Slot
// is Acquired, holds nothing, and the Observer's Event is Shadow.
//
// When Redis cannot decide, the failure policy does: FailOpen acquires
// (Degraded; nothing is held here), FailClosed does not and returns the
// error, FailLocal holds a slot in this process, at most Max / WithReplicas
// at once for id. A call that failed late may still have taken a slot in
// Redis: a Degraded slot's Release gives that back too, if it can (a
// refusal's is given back at once), and otherwise its lease frees it. A
// caller whose ctx is done gets its error, and what its acquire may yet
// take is given back once its call ends.
func (l *Limiter) Acquire(ctx context.Context, id string, c Concurrency) (Slot, error) {
	s := Slot{Concurrency: c}
	if err := l.enter(); err != nil {
		return s, err
	}
	defer l.exit()
	if err := l.checkConcurrency(id, c); err != nil {
		return s, err
	}
	req := script.Slot(l.keys.Slots(id, c.Name), "a", script.NewToken(), c.Max, c.Lease)
	o := op{kind: EventAcquire, cost: 1, slot: &s.Concurrency, acquire: req}
	var out [1]script.Reply
	took, left, err := l.call(ctx, id, []*script.Request{req}, out[:], &o)
	switch {
	case left:
		return s, err
	case err != nil:
		return s, l.failAcquire(ctx, id, &o, &s, took, err)
	case ctx.Err() != nil: // its caller's ctx ended while Redis answered: no slot for it
		if out[0].Allowed {
			l.background(id, script.Release(req), "")
		}
		return s, ctx.Err()
	}
	r := &out[0]
	s.Acquired, s.InFlight = r.Allowed, r.Counts[0]
	s.RetryAfter = time.Duration(r.Counts[1]) * time.Millisecond
	if s.Acquired {
		s.held = holding(l, id, req)
		s.held.redis = true
	}
	return s, l.finishSlot(ctx, id, &o, &s, s.Acquired, SourceRedis, took, nil, nil)
}

// failAcquire turns an error from Redis into s, an Acquire's outcome, by
// the failure policy: FailOpen acquires (holding nothing here), FailClosed
// does not, FailLocal holds a slot in this process against its share. The
// call that failed may have taken a slot in Redis all the same: one not
// acquired here gives it back at once, one acquired when it is released.
func (l *Limiter) failAcquire(ctx context.Context, id string, o *op, s *Slot, took time.Duration, redisErr error) error {
	allowed, err := l.onFailure(ctx, id, redisErr)
	req := o.acquire
	held := holding(l, id, req)
	held.maybe = true
	if l.policy == FailLocal && err == nil {
		c := s.Concurrency
		allowed, s.InFlight, s.RetryAfter = l.local.Acquire(local.Slot{Key: held.key, Token: held.token, Max: c.Max, Lease: c.Lease}, l.now())
		held.local = true
	}
	s.Degraded, s.Acquired = true, allowed
	switch {
	case !allowed: // the script may have run: what it may have taken goes back
		l.background(id, script.Release(req), "")
	case l.policy != FailClosed:
		s.held = held
	}
	return l.finishSlot(ctx, id, o, s, allowed, SourcePolicy, took, redisErr, err)
}

// finishSlot is the way out of an Acquire, as finish is of a decision:
// under shadow mode a full limit refuses nothing (the Slot holds nothing),
// and the Observer sees it.
func (l *Limiter) finishSlot(ctx context.Context, id string, o *op, s *Slot, allowed bool, src Source, took time.Duration, redisErr, err error) error {
	shadowed := l.shadow && !allowed
	if shadowed { // acquired, holding nothing
		err = nil
		s.Acquired, s.RetryAfter, s.held = true, 0, slotHeld{l: l, id: id}
	}
	s.Remaining = max(0, s.Concurrency.Max-s.InFlight)
	if s.held.redis || s.held.local {
		l.slotsAcquired.Add(1)
	}
	if l.observer != nil {
		l.observe(ctx, id, o, nil, src, took, redisErr, shadowed || allowed, false)
	}
	return err
}

// holding returns what an Acquire of id, whose request is req, holds if it
// acquired: the key, token and lease it acquired with, whatever becomes of
// the Slot's exported Concurrency.
func holding(l *Limiter, id string, req *script.Request) slotHeld {
	return slotHeld{l: l, id: id, key: req.Keys[0], token: req.Concurrency.Token, lease: time.Duration(req.Concurrency.Lease) * time.Millisecond}
}

// slotHeld is what Release and Extend need of an Acquired slot: its
// Limiter and id, and the key, token and lease it was acquired with;
// whether it is held in Redis or in this process (FailLocal); and whether
// the acquire that failed may have taken it in Redis all the same (maybe).
// A slot of shadow mode holds nothing.
type slotHeld struct {
	l              *Limiter
	id, key, token string
	lease          time.Duration
	redis, local   bool
	maybe          bool
}

// Release gives the slot back. A second Release, or one after the lease
// ended, does nothing and returns nil; a Slot not Acquired from this
// Limiter is ErrInvalidSlot. A Release that cannot reach Redis goes to the
// error handler and returns the error; the lease still ends by itself.
// Release works after the Limiter's Close.
func (s Slot) Release(ctx context.Context) error {
	h := s.held
	if !s.Acquired || h.l == nil {
		return ErrInvalidSlot
	}
	l := h.l
	if h.local && l.local.Release(h.key, h.token) {
		l.slotsReleased.Add(1)
	}
	if !h.redis && !h.maybe {
		return nil
	}
	r, err := l.slotCall(ctx, h, "r")
	if err != nil {
		if !h.redis { // what a failed acquire may have taken: best effort
			return nil
		}
		return wrap("ratelimit: release", err)
	}
	if h.redis && r.Allowed {
		l.slotsReleased.Add(1)
	}
	return nil
}

// Extend renews the lease for another Lease from now (the Lease the slot
// was acquired with); a lease that has ended is ErrLeaseEnded and the slot
// may be someone else's. A slot that holds nothing (FailOpen's, shadow
// mode's) extends nothing and returns nil. An Extend that cannot reach
// Redis goes to the error handler and returns the error. Extend works
// after the Limiter's Close.
func (s Slot) Extend(ctx context.Context) error {
	h := s.held
	if !s.Acquired || h.l == nil {
		return ErrInvalidSlot
	}
	l := h.l
	switch {
	case h.local:
		if !l.local.Extend(h.key, h.token, h.lease, l.now()) {
			return ErrLeaseEnded
		}
		return nil
	case !h.redis:
		return nil
	}
	r, err := l.slotCall(ctx, h, "e")
	if err != nil {
		return wrap("ratelimit: extend", err)
	}
	if !r.Allowed {
		return ErrLeaseEnded
	}
	return nil
}

// slotCall sends op for h, a held slot, through the steps every call
// takes. A failure goes to the error handler, now or, when the caller
// left, when it comes; but for a release of what a failed acquire may
// have taken (h not held in Redis), which is best effort.
func (l *Limiter) slotCall(ctx context.Context, h slotHeld, what string) (script.Reply, error) {
	report := h.redis || what != "r"
	var out [1]script.Reply
	req := script.Slot(h.key, what, h.token, 0, h.lease)
	_, left, err := l.call(ctx, h.id, []*script.Request{req}, out[:], &op{quiet: true, unreported: !report})
	if err == nil {
		err = out[0].Err
	}
	if err != nil && !left && report {
		l.onError(ctx, h.id, err)
	}
	return out[0], err
}

// Keep extends the slot's lease every half lease while the work it guards
// runs, and returns the func that ends it: it stops the extending and
// releases the slot (use it as defer slot.Keep(ctx)()). For work of any
// length: a slot kept outlives its Lease while its holder lives, and
// returns within a Lease of its holder's death. Each extension is due half
// a lease after the one before was due, however long that one took. An
// extension that fails goes to the error handler, as Extend's; one that
// finds the lease ended stops. Only ctx's values reach the extensions and
// the release: its cancel and deadline end neither (each is bounded by the
// Limiter's timeout), so that a slot is released even after its caller
// gave up. The Limiter's Close stops the extensions (the lease then ends
// by itself, unless released); the func still releases.
func (s Slot) Keep(ctx context.Context) (release func()) {
	ctx = context.WithoutCancel(ctx)
	if !s.held.redis && !s.held.local { // nothing to extend
		return func() { _ = s.Release(ctx) }
	}
	l := s.held.l
	k := l.keeps.Every(&l.work, max(s.held.lease/2, time.Millisecond/2), func() bool {
		err := s.Extend(ctx)
		return !errors.Is(err, ErrLeaseEnded) && !errors.Is(err, ErrInvalidSlot)
	})
	return func() {
		k.Stop()
		_ = s.Release(ctx)
	}
}
