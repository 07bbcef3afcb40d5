// Concurrency limits: Acquire, and a Slot's Release and Extend, on the
// script of concurrency.lua; FailLocal's slots in this process.

package ratelimit

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed" // for the script source
	"encoding/hex"
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

	// What Release and Extend need: the Limiter, and the slot's key and
	// token (token empty for a slot FailOpen granted: nothing is held).
	l          *Limiter
	key, token string
	local      bool // held in this process, by FailLocal
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
// nothing is sent. When Redis cannot decide, the failure policy does:
// FailOpen acquires (Degraded; nothing is held), FailClosed does not and
// returns the error, FailLocal holds a slot in this process, at most
// Max / WithReplicas at once for id. A caller whose ctx is done gets its
// error; an acquire already sent may still take a slot, which its lease
// frees.
func (l *Limiter) Acquire(ctx context.Context, id string, c Concurrency) (Slot, error) {
	s := Slot{Concurrency: c, l: l}
	if l.t == nil {
		return s, ErrNilClient
	}
	if id == "" {
		return s, fmt.Errorf("%w: id is empty", ErrInvalidID)
	}
	if err := c.Validate(); err != nil {
		return s, err
	}
	s.key, s.token = l.slotsKey(id, c.Name), newToken()
	start := time.Now()
	vals, err := l.t.Eval(ctx, l.slots(), []string{s.key}, "a", s.token, c.Max, c.Lease.Milliseconds())
	took := time.Since(start)
	if err == nil && len(vals) != 3 {
		err = fmt.Errorf("%w: %v", ErrBadReply, vals)
	}
	switch {
	case err == nil:
		s.Acquired, s.InFlight = vals[0] == 1, vals[1]
		s.RetryAfter = time.Duration(vals[2]) * time.Millisecond
	case ctx.Err() != nil:
		return Slot{Concurrency: c}, ctx.Err()
	default:
		err = l.failAcquire(ctx, id, &s, err)
	}
	s.Remaining = max(0, c.Max-s.InFlight)
	if s.Acquired {
		l.slotsAcquired.Add(1)
	} else {
		s.key, s.token = "", ""
	}
	if l.observer != nil {
		l.observeSlot(ctx, id, &s, took, err)
	}
	return s, err
}

// failAcquire decides s, an Acquire Redis could not decide (redisErr), by
// the failure policy, and returns what the caller is to get.
func (l *Limiter) failAcquire(ctx context.Context, id string, s *Slot, redisErr error) error {
	l.onError(ctx, id, redisErr)
	s.Degraded = true
	switch l.policy {
	case FailClosed:
		return wrap("ratelimit: Redis could not decide (FailClosed)", ErrUnavailable, redisErr)
	case FailLocal:
		s.Acquired, s.InFlight, s.RetryAfter = l.localSlots.acquire(s.key, s.token, s.Concurrency, l.local.share(s.Concurrency.Max), l.now())
		s.local = s.Acquired
	default:
		s.Acquired, s.token = true, "" // nothing held: nothing to release
	}
	return nil
}

// Release gives the slot back. A second Release, or one after the lease
// ended, does nothing and returns nil; a Slot not Acquired from this
// Limiter is ErrInvalidSlot. A Release that cannot reach Redis goes to the
// error handler and returns the error; the lease still ends by itself.
func (s Slot) Release(ctx context.Context) error {
	if !s.Acquired || s.l == nil {
		return ErrInvalidSlot
	}
	l := s.l
	switch {
	case s.token == "": // FailOpen's: held nowhere
		return nil
	case s.local: // FailLocal's: held here
		if l.localSlots.release(s.key, s.token) {
			l.slotsReleased.Add(1)
		}
		return nil
	}
	vals, err := l.t.Eval(ctx, l.slots(), []string{s.key}, "r", s.token)
	if err != nil {
		if ctx.Err() == nil {
			l.onError(ctx, "", err)
		}
		return wrap("ratelimit: release", err)
	}
	if len(vals) == 3 && vals[0] == 1 {
		l.slotsReleased.Add(1)
	}
	return nil
}

// Extend renews the lease for another Lease from now; a lease that has
// ended is ErrLeaseEnded and the slot may be someone else's. A slot of the
// failure policy extends nothing in Redis and returns nil. An Extend that
// cannot reach Redis goes to the error handler and returns the error.
func (s Slot) Extend(ctx context.Context) error {
	if !s.Acquired || s.l == nil {
		return ErrInvalidSlot
	}
	l := s.l
	if s.token == "" {
		return nil
	}
	if s.local {
		if !l.localSlots.extend(s.key, s.token, s.Concurrency.Lease, l.now()) {
			return ErrLeaseEnded
		}
		return nil
	}
	vals, err := l.t.Eval(ctx, l.slots(), []string{s.key}, "e", s.token, 0, s.Concurrency.Lease.Milliseconds())
	if err != nil {
		if ctx.Err() == nil {
			l.onError(ctx, "", err)
		}
		return wrap("ratelimit: extend", err)
	}
	if len(vals) != 3 || vals[0] != 1 {
		return ErrLeaseEnded
	}
	return nil
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

// observeSlot has the Observer, if a CallObserver, see an Acquire.
func (l *Limiter) observeSlot(ctx context.Context, id string, s *Slot, took time.Duration, err error) {
	c, ok := l.observer.(CallObserver)
	if !ok {
		return
	}
	e := &Event{Kind: EventAcquire, Cost: 1, Allowed: s.Acquired, Source: SourceRedis, Duration: took, Err: err, Concurrency: s.Concurrency}
	if s.Degraded {
		e.Source = SourcePolicy
	}
	if l.observeIDs {
		e.ID = id
	}
	c.ObserveCall(ctx, e)
}
