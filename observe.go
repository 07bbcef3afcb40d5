// What an Observer sees: Source, Event, EventKind, Observer and
// CallObserver; and the one way out of every decision, which fills its
// Results and makes its Event.

package ratelimit

import (
	"context"
	"sync"
	"time"

	"github.com/slidingwindow/ratelimit/internal/plan"
)

// Source says what made a decision.
type Source uint8

const (
	// SourceRedis is a decision of the script in Redis.
	SourceRedis Source = iota
	// SourceCache is a denial by the deny cache (WithDenyCache), from
	// counts Redis reported earlier, without a round trip.
	SourceCache
	// SourcePolicy is a decision of the failure policy: Redis could not
	// decide, or the circuit breaker was open.
	SourcePolicy
	// SourceLease: the decision was made from this process's lease, without
	// Redis (see Limit.Leased). A decision that took a lease is SourceRedis.
	SourceLease
)

// String returns "redis", "cache", "policy" or "lease".
func (s Source) String() string { return name(int(s), "redis", "cache", "policy", "lease") }

// name returns names[i], or "unknown" for an i it has none of.
func name(i int, names ...string) string {
	if i < len(names) {
		return names[i]
	}
	return "unknown"
}

// Event describes one decision on its way out of the Limiter, for an
// Observer. Every decision makes one: allowed or denied, single- or
// multi-limit, a look (Peek, PeekAll) or not, whoever made it; so do a
// Charge, a Refund, and a failed call whose caller left, for a
// CallObserver.
type Event struct {
	// ID is the client id, and empty unless WithObserverIDs asked for it:
	// ids are often addresses or API keys. For AllowMany, the first
	// Quota's.
	ID string
	// Cost is the request's cost; 0 for a look. For AllowMany, the largest
	// Quota's.
	Cost int64
	// Results are the decision's Results, one per limit, as the caller gets
	// them: a copy, reused after the call, which an Observer must not keep.
	Results []Result
	// Allowed is the answer the caller got.
	Allowed bool
	// Source says what made the decision.
	Source Source
	// Shadow reports that the decision was made in shadow mode
	// (WithShadow) or against a Limit with Shadow set: a Result's Shadowed
	// tells whether shadow mode let a denial through.
	Shadow bool
	// Duration is how long the Redis call took, when there was one; 0 for
	// decisions of the deny cache or of an open circuit breaker.
	Duration time.Duration
	// Err is the Redis error the failure policy decided on; nil when Redis
	// decided. For a charge or a refund, the error it returned.
	Err error
	// Kind says whether the Event is of a decision, a Charge, a Refund, an
	// Acquire or a GiveBack (all but a decision only for a CallObserver). A
	// refund's Results are those it was given, and its Cost what it gave
	// back.
	Kind EventKind
	// Left (only for a CallObserver) reports that the caller's ctx was done
	// before Redis answered:
	// the caller got its ctx's error and no decision, and its call went on,
	// bounded by the Limiter's timeout (WithTimeout), and failed; Err says
	// how. Such an Event comes when the call fails, from another goroutine,
	// after the caller has gone on: its Results hold only their Limits,
	// Allowed is false, and Duration runs from the call's start to its
	// failure.
	Left bool
	// Concurrency is the limit of an Acquire's Event; zero for others.
	Concurrency Concurrency

	results []Result // Results' storage, reused
}

// EventKind says what an Event is of.
type EventKind uint8

const (
	// EventDecision is of a decision or a look: Allow, AllowN, AllowAll,
	// Peek, PeekAll, and each try of Wait.
	EventDecision EventKind = iota
	// EventCharge is of a Charge.
	EventCharge
	// EventRefund is of a Refund.
	EventRefund
	// EventAcquire is of an Acquire (for a CallObserver only): Allowed
	// says whether it acquired, Concurrency is the limit, Results are
	// none.
	EventAcquire
	// EventGiveBack is of a GiveBack (for a CallObserver only), as a
	// refund's: its Results hold the limits given back to, and its Cost
	// what was given back.
	EventGiveBack
)

// String returns "decision", "charge", "refund", "acquire" or "give-back".
func (k EventKind) String() string {
	return name(int(k), "decision", "charge", "refund", "acquire", "give-back")
}

// Observer sees every decision a Limiter makes (Allow, AllowN, AllowAll,
// Peek, PeekAll, each try of Wait), on the caller's goroutine, after the
// decision and before the caller gets it: it should be quick and safe for
// simultaneous use. The Event is valid only during the call. It sees
// nothing else: an Event's Kind is EventDecision and its Left false, so
// that an Observer can count every Event as a decision. To see Charges,
// Refunds and the calls of callers who left, implement CallObserver too.
type Observer interface {
	Observe(ctx context.Context, e *Event)
}

// A CallObserver is an Observer that also sees the Limiter's Redis work that
// is no decision a caller got: a Charge or a Refund (Event.Kind), on its
// caller's goroutine, and the failed call of a caller who left before Redis
// answered (Event.Left), later, from another goroutine. The Event is valid
// only during the call.
type CallObserver interface {
	Observer
	ObserveCall(ctx context.Context, e *Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, e *Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e *Event) { f(ctx, e) }

// finish is the one way out of every decision, a look's, a charge's and
// an AllowMany's too: shadow mode lets a denied decision through, and the
// Observer sees it. allowed is the decision, refused its limits that
// denied (bit i for out[i]); redisErr is what Redis failed with, if it
// did; err is what the caller is to get.
func (l *Limiter) finish(ctx context.Context, id string, o *op, out []Result, allowed bool, refused uint32, src Source, took time.Duration, redisErr, err error) error {
	shadowed := false
	if l.shadow && !allowed {
		shadowed, err = true, nil
		for i := range out {
			r := &out[i]
			// the limits that denied, or all when the failure policy did
			r.Allowed, r.Shadowed = true, r.Shadowed || r.Degraded || refused&(1<<i) != 0
		}
	}
	if l.observer != nil {
		l.observe(ctx, id, o, out, src, took, redisErr, shadowed || allowed, false)
	}
	return err
}

// events are the Events observers see, reused: an Event is valid only
// during the Observe call.
var events = sync.Pool{New: func() any { return new(Event) }}

// observe shows the Observer the call of o, whose Results are results, as
// its caller gets it, or as it failed after its caller left.
func (l *Limiter) observe(ctx context.Context, id string, o *op, results []Result, src Source, took time.Duration, redisErr error, allowed, left bool) {
	e := events.Get().(*Event)
	e.results = append(e.results[:0], results...) // results may be on the caller's stack
	*e = Event{Cost: o.cost, Results: e.results, Allowed: allowed, Source: src, Duration: took, Err: redisErr, Kind: o.kind, Left: left, results: e.results}
	if o.slot != nil {
		e.Concurrency = *o.slot
	}
	e.Shadow = l.shadow
	for _, limit := range o.limits {
		e.Shadow = e.Shadow || limit.Shadow
	}
	if l.observeIDs {
		e.ID = id
	}
	if e.Kind == EventDecision && !e.Left {
		l.observer.Observe(ctx, e)
	} else if c, ok := l.observer.(CallObserver); ok {
		c.ObserveCall(ctx, e)
	}
	clear(e.results)
	*e = Event{results: e.results[:0]}
	events.Put(e)
}

// fill fills out, whose Limits are set, from outs, the outcomes of p's
// spans: a Result that counted carries its receipt, of this Limiter and
// its span's id.
func (l *Limiter) fill(out []Result, outs []plan.Out, p *plan.Plan) {
	var h uint64 // idHash of hid
	var hid string
	for i := range out {
		o, r := &outs[i], &out[i] // in place: a Result is large
		r.Allowed, r.Count, r.Remaining, r.RetryAfter, r.ResetAfter = o.Allowed, o.Count, o.Remaining, o.RetryAfter, o.ResetAfter
		r.Degraded, r.Shadowed, r.receipt = false, o.Shadowed, receipt{}
		if o.Counted > 0 {
			if id := p.Spans[i].ID; h == 0 || id != hid {
				h, hid = idHash(id), id
			}
			r.receipt = receipt{by: l.serial, id: h, window: o.Window, counted: o.Counted, ms: r.Limit.Window.Milliseconds(),
				strict: r.Limit.Strict, cal: r.Limit.Calendar, loc: r.Limit.Location, refill: o.Refill}
		}
	}
}
