// Concurrency limits: Acquire, and a Slot's Release and Extend, on the
// script of concurrency.lua; FailLocal's slots in this process.

package ratelimit

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
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
// FailClosed refusal's is given back at once), and otherwise its lease
// frees it. A caller whose ctx is done gets its error, and a slot its
// acquire may yet take is freed by its lease.
func (l *Limiter) Acquire(ctx context.Context, id string, c Concurrency) (Slot, error) {
	s := Slot{Concurrency: c}
	if l.t == nil {
		return s, ErrNilClient
	}
	if id == "" {
		return s, fmt.Errorf("%w: id is empty", ErrInvalidID)
	}
	if err := c.Validate(); err != nil {
		return s, err
	}
	key, token := l.slotsKey(id, c.Name), newToken()
	start := time.Now()
	vals, redisErr := l.t.Eval(ctx, l.slots(), []string{key}, "a", token, c.Max, c.Lease.Milliseconds())
	took := time.Since(start)
	if redisErr == nil && len(vals) != 3 {
		redisErr = fmt.Errorf("%w: %v", ErrBadReply, vals)
	}
	if redisErr != nil && gone(ctx) {
		return s, ctx.Err()
	}
	var err error
	shadowed := false
	switch {
	case redisErr == nil:
		s.Acquired, s.InFlight = vals[0] == 1, vals[1]
		s.RetryAfter = time.Duration(vals[2]) * time.Millisecond
		if s.Acquired {
			s.held = slotHeld{l: l, id: id, key: key, token: token, lease: c.Lease, redis: true}
		} else if l.shadow { // refuses nothing: acquired, holding nothing
			s.Acquired, s.RetryAfter, shadowed = true, 0, true
			s.held = slotHeld{l: l, id: id}
		}
	default:
		err = l.failAcquire(ctx, id, &s, key, token, redisErr)
	}
	s.Remaining = max(0, c.Max-s.InFlight)
	if s.held.redis || s.held.local {
		l.slotsAcquired.Add(1)
	}
	if l.observer != nil {
		l.observeSlot(ctx, id, &s, took, redisErr, shadowed)
	}
	return s, err
}

// gone reports whether ctx is done or its deadline has passed: a client
// that stops at its deadline by itself can return before ctx's timer fires.
func gone(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// failAcquire decides s, an Acquire of key and token that Redis could not
// decide (redisErr), by the failure policy, and returns what the caller is
// to get.
func (l *Limiter) failAcquire(ctx context.Context, id string, s *Slot, key, token string, redisErr error) error {
	l.onError(ctx, id, redisErr)
	s.Degraded = true
	switch l.policy {
	case FailClosed:
		// The script may have run: give back what it may have taken.
		go func() { _, _ = l.t.Eval(context.WithoutCancel(ctx), l.slots(), []string{key}, "r", token) }()
		return wrap("ratelimit: Redis could not decide (FailClosed)", ErrUnavailable, redisErr)
	case FailLocal:
		s.Acquired, s.InFlight, s.RetryAfter = l.localSlots.acquire(key, token, s.Concurrency, l.local.share(s.Concurrency.Max), l.now())
		if s.Acquired {
			s.held = slotHeld{l: l, id: id, key: key, token: token, lease: s.Concurrency.Lease, local: true, maybe: true}
		} else {
			go func() { _, _ = l.t.Eval(context.WithoutCancel(ctx), l.slots(), []string{key}, "r", token) }()
		}
	default:
		s.Acquired = true
		s.held = slotHeld{l: l, id: id, key: key, token: token, maybe: true}
	}
	return nil
}

// slotHeld is what Release and Extend need of an Acquired slot: its
// Limiter and id, and its key, token and lease; whether it is held in
// Redis or in this process (FailLocal); and whether the acquire that
// failed may have taken it in Redis all the same (maybe). A slot of
// shadow mode holds nothing.
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
func (s Slot) Release(ctx context.Context) error {
	h := s.held
	if !s.Acquired || h.l == nil {
		return ErrInvalidSlot
	}
	l := h.l
	if h.local && l.localSlots.release(h.key, h.token) {
		l.slotsReleased.Add(1)
	}
	if h.maybe { // what a failed acquire may have taken, if Redis is back
		_, _ = l.t.Eval(ctx, l.slots(), []string{h.key}, "r", h.token)
	}
	if !h.redis {
		return nil
	}
	vals, err := l.t.Eval(ctx, l.slots(), []string{h.key}, "r", h.token)
	if err != nil {
		if !gone(ctx) {
			l.onError(ctx, h.id, err)
		}
		return wrap("ratelimit: release", err)
	}
	if len(vals) == 3 && vals[0] == 1 {
		l.slotsReleased.Add(1)
	}
	return nil
}

// Extend renews the lease for another Lease from now (the Lease the slot
// was acquired with); a lease that has ended is ErrLeaseEnded and the slot
// may be someone else's. A slot that holds nothing (FailOpen's, shadow
// mode's) extends nothing and returns nil. An Extend that cannot reach
// Redis goes to the error handler and returns the error.
func (s Slot) Extend(ctx context.Context) error {
	h := s.held
	if !s.Acquired || h.l == nil {
		return ErrInvalidSlot
	}
	l := h.l
	switch {
	case h.local:
		if !l.localSlots.extend(h.key, h.token, h.lease, l.now()) {
			return ErrLeaseEnded
		}
		return nil
	case !h.redis:
		return nil
	}
	vals, err := l.t.Eval(ctx, l.slots(), []string{h.key}, "e", h.token, 0, h.lease.Milliseconds())
	if err != nil {
		if !gone(ctx) {
			l.onError(ctx, h.id, err)
		}
		return wrap("ratelimit: extend", err)
	}
	if len(vals) != 3 {
		return fmt.Errorf("%w: %v", ErrBadReply, vals)
	}
	if vals[0] != 1 {
		return ErrLeaseEnded
	}
	return nil
}

// Keep extends the slot's lease every half lease while the work it guards
// runs, and returns the func that ends it: it stops the extending and
// releases the slot (use it as defer slot.Keep(ctx)()). For work of any
// length: a slot kept outlives its Lease while its holder lives, and
// returns within a Lease of its holder's death. An extension that fails
// goes to the error handler, as Extend's; one that finds the lease ended
// stops. Only ctx's values reach the extensions and the release: its
// cancel and deadline end neither (each is bounded by the Limiter's
// timeout), so that a slot is released even after its caller gave up.
func (s Slot) Keep(ctx context.Context) (release func()) {
	ctx = context.WithoutCancel(ctx)
	if !s.held.redis && !s.held.local { // nothing to extend
		return func() { _ = s.Release(ctx) }
	}
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	every := max(s.held.lease/2, time.Millisecond/2)
	extend := func() {
		if err := s.Extend(ctx); errors.Is(err, ErrLeaseEnded) || errors.Is(err, ErrInvalidSlot) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	}
	mu.Lock()
	t = time.AfterFunc(every, extend)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		_ = s.Release(ctx)
	}
}

// slots returns the script of concurrency.lua, made once.
func (l *Limiter) slots() *script.Script {
	slotsScriptOnce.Do(func() { slotsScript = script.NewScript(concurrencySource, false) })
	return slotsScript
}

var (
	slotsScriptOnce sync.Once
	slotsScript     *script.Script
)

// slotsKey returns the key of id's slots of the concurrency limit named
// name: prefix:{id}:slots, then :name when it has one, escaped as ids are.
func (l *Limiter) slotsKey(id, name string) string {
	var b strings.Builder
	b.WriteString(l.keyPrefix)
	if len(id) > maxIDLength {
		sum := sha256.Sum256([]byte(id))
		b.WriteString("%H" + hex.EncodeToString(sum[:]))
	} else {
		writeEscaped(&b, id)
	}
	b.WriteString("}:slots")
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

// localSlots are FailLocal's slots: per key, the tokens held in this
// process and when their leases end, on the Limiter's clock.
type localSlots struct {
	mu   sync.Mutex
	held map[string]map[string]time.Time
}

// acquire takes a slot of key for token if fewer than most are held now;
// it returns whether it did, the slots held after, and when not, the wait
// until the earliest lease ends.
func (s *localSlots) acquire(key, token string, c Concurrency, most int64, now time.Time) (bool, int64, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		s.held = map[string]map[string]time.Time{}
	}
	slots := s.held[key]
	first := time.Time{}
	for t, end := range slots {
		if !end.After(now) {
			delete(slots, t)
		} else if first.IsZero() || end.Before(first) {
			first = end
		}
	}
	if int64(len(slots)) >= most {
		return false, int64(len(slots)), first.Sub(now)
	}
	if slots == nil {
		slots = map[string]time.Time{}
		s.held[key] = slots
	}
	slots[token] = now.Add(c.Lease)
	return true, int64(len(slots)), 0
}

// release gives token's slot of key back, and reports whether it was held.
func (s *localSlots) release(key, token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.held[key][token]
	delete(s.held[key], token)
	if len(s.held[key]) == 0 {
		delete(s.held, key)
	}
	return ok
}

// extend renews token's lease of key for lease from now, and reports
// whether it was still held.
func (s *localSlots) extend(key, token string, lease time.Duration, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	end, ok := s.held[key][token]
	if !ok || !end.After(now) {
		delete(s.held[key], token)
		return false
	}
	s.held[key][token] = now.Add(lease)
	return true
}

// observeSlot has the Observer, if a CallObserver, see an Acquire: redisErr
// is what Redis failed with, if it did.
func (l *Limiter) observeSlot(ctx context.Context, id string, s *Slot, took time.Duration, redisErr error, shadowed bool) {
	c, ok := l.observer.(CallObserver)
	if !ok {
		return
	}
	e := &Event{Kind: EventAcquire, Cost: 1, Allowed: s.Acquired, Source: SourceRedis, Duration: took, Err: redisErr,
		Concurrency: s.Concurrency, Shadow: shadowed || l.shadow}
	if s.Degraded {
		e.Source = SourcePolicy
	}
	if l.observeIDs {
		e.ID = id
	}
	c.ObserveCall(ctx, e)
}
