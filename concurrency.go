// Concurrency limits: Acquire, and a Slot's Release, Extend and Keep. An
// Acquire is a decision of a request of its own kind (concurrency.lua),
// carried by the steps every decision takes (send, fail, finish); its
// failure policy counts in FailLocal's one table (local.go).

package ratelimit

import (
	"context"
	"crypto/rand"
	_ "embed" // for the script source
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

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

//go:embed concurrency.lua
var concurrencySource string

// Validate reports what is wrong with c, as an error that wraps
// ErrInvalidLimit, or nil.
func (c Concurrency) Validate() error {
	switch {
	case c.Max < 1:
		return fmt.Errorf("%w: concurrency Max %d is below 1", ErrInvalidLimit, c.Max)
	case c.Lease < time.Millisecond:
		return fmt.Errorf("%w: concurrency Lease %v is below 1ms", ErrInvalidLimit, c.Lease)
	case c.Lease%time.Millisecond != 0:
		return fmt.Errorf("%w: concurrency Lease %v is not a whole number of ms", ErrInvalidLimit, c.Lease)
	}
	return nil
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
	d := &decision{slot: &s, cost: 1, kind: EventAcquire}
	d.reqs = []*script.Request{concurrencyRequest(l.concurrencyKey(id, c.Name), "a", newToken(), c.Max, c.Lease)}
	d.replies = make([]script.Reply, 1)
	took, left, err := l.send(ctx, d, id, d.reqs, nil)
	if left {
		return s, err
	}
	if err != nil {
		return s, l.fail(ctx, d, id, took, err)
	}
	d.deriveSlot(l, id)
	return s, l.finish(ctx, d, id, SourceRedis, took, nil, nil)
}

// checkConcurrency validates an Acquire of c by id before anything is sent.
func (l *Limiter) checkConcurrency(id string, c Concurrency) error {
	if l.t == nil {
		return ErrNilClient
	}
	if id == "" {
		return fmt.Errorf("%w: id is empty", ErrInvalidID)
	}
	return c.Validate()
}

// concurrencyRequest returns the request of op ("a" acquire, "r" release,
// "e" extend) for token, on the slots at key: at most max held (an
// acquire's), each for lease (an acquire's and an extend's).
func concurrencyRequest(key, op, token string, max int64, lease time.Duration) *script.Request {
	return &script.Request{Kind: script.KindConcurrency, NLimits: 1, Keys: []string{key},
		Concurrency: &script.Concurrency{Op: op, Token: token, Max: max, Lease: lease.Milliseconds()}}
}

// deriveSlot fills d.slot, an Acquire's, from its reply: on the steps'
// side, d.allowed.
func (d *decision) deriveSlot(l *Limiter, id string) {
	s, r := d.slot, &d.replies[0]
	d.allowed = r.Allowed
	s.Acquired, s.InFlight = r.Allowed, r.Counts[0]
	s.RetryAfter = time.Duration(r.Counts[1]) * time.Millisecond
	s.Remaining = max(0, s.Concurrency.Max-s.InFlight)
	if s.Acquired {
		s.held = d.holding(l, id)
		s.held.redis = true
	}
}

// holding returns what d, an Acquire of id, holds if it acquired: the
// key, token and lease it acquired with, whatever becomes of the Slot's
// exported Concurrency.
func (d *decision) holding(l *Limiter, id string) slotHeld {
	r := d.reqs[0]
	return slotHeld{l: l, id: id, key: r.Keys[0], token: r.Concurrency.Token, lease: time.Duration(r.Concurrency.Lease) * time.Millisecond}
}

// release returns the request that releases what d, an Acquire, may have
// taken.
func (d *decision) release() *script.Request {
	r := *d.reqs[0]
	c := *r.Concurrency
	c.Op, r.Concurrency = "r", &c
	return &r
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
	if h.local && l.local.release(h.key, h.token) {
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
		if !l.local.extend(h.key, h.token, h.lease, l.now()) {
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
func (l *Limiter) slotCall(ctx context.Context, h slotHeld, op string) (script.Reply, error) {
	report := h.redis || op != "r"
	d := &decision{quiet: true, unreported: !report}
	d.reqs = []*script.Request{concurrencyRequest(h.key, op, h.token, 0, h.lease)}
	d.replies = make([]script.Reply, 1)
	_, left, err := l.send(ctx, d, h.id, d.reqs, nil)
	if err != nil && !left && report {
		l.onError(ctx, h.id, err)
	}
	return d.replies[0], err
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
	k := s.held.l.keeps.start(ctx, s)
	return func() {
		s.held.l.keeps.stop(k)
		_ = s.Release(ctx)
	}
}

// keeps are the Slots kept (Slot.Keep) that have not ended: each a timer
// that extends its lease, which Close stops.
type keeps struct {
	mu     sync.Mutex
	timers map[*keeping]struct{}
	closed bool
}

// keeping is one kept Slot's extending.
type keeping struct {
	s       Slot
	ctx     context.Context
	every   time.Duration
	next    time.Time // when the next extension is due
	timer   *time.Timer
	stopped bool // guarded by keeps.mu
}

// start starts extending s every half lease.
func (ks *keeps) start(ctx context.Context, s Slot) *keeping {
	k := &keeping{s: s, ctx: ctx, every: max(s.held.lease/2, time.Millisecond/2)}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.closed {
		k.stopped = true
		return k
	}
	if ks.timers == nil {
		ks.timers = map[*keeping]struct{}{}
	}
	ks.timers[k] = struct{}{}
	k.next = time.Now().Add(k.every)
	k.timer = time.AfterFunc(k.every, func() { ks.extend(k) })
	return k
}

// extend extends k's lease, and arms the next extension half a lease
// after this one was due (at once if that has passed), unless k stopped or
// its lease ended.
func (ks *keeps) extend(k *keeping) {
	ks.mu.Lock()
	if k.stopped {
		ks.mu.Unlock()
		return
	}
	k.next = k.next.Add(k.every)
	ks.mu.Unlock()
	if err := k.s.Extend(k.ctx); errors.Is(err, ErrLeaseEnded) || errors.Is(err, ErrInvalidSlot) {
		ks.stop(k)
		return
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if !k.stopped {
		k.timer.Reset(max(0, time.Until(k.next)))
	}
}

// stop ends k's extending.
func (ks *keeps) stop(k *keeping) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	k.stopped = true
	if k.timer != nil {
		k.timer.Stop()
	}
	delete(ks.timers, k)
}

// close stops every kept Slot's extending, and any to come.
func (ks *keeps) close() {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.closed = true
	for k := range ks.timers {
		k.stopped = true
		k.timer.Stop()
	}
	ks.timers = nil
}

// concurrencyKey returns the key of id's slots of the concurrency limit
// named name: prefix:{id}:slots, then :name when it has one, escaped as
// ids are.
func (l *Limiter) concurrencyKey(id, name string) string {
	var b strings.Builder
	b.Grow(l.tagLen(id) + len(":slots:") + escapedLen(name))
	l.writeTag(&b, id)
	b.WriteString(":slots")
	if name != "" {
		b.WriteByte(':')
		writeEscaped(&b, name)
	}
	return b.String()
}

// newToken returns a slot's token: 128 random bits, in hex.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
