// The decision and the look, each read top to bottom: validate, place on
// the clock, serve from leases, build, deny from the cache, send, derive,
// finish. Leases and the deny cache wrap the send; the plan (internal/plan)
// builds the requests and derives the outcomes.

package ratelimit

import (
	"context"
	"time"

	"github.com/slidingwindow/ratelimit/internal/lease"
	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// one holds a decision of one limit on its caller's stack: Allow, AllowN,
// Peek.
type one struct {
	limits  [1]Limit
	results [1]Result
	plan.One
}

// of returns o's limits, limit alone.
func (o *one) of(limit Limit) []Limit {
	o.limits[0] = limit
	return o.limits[:]
}

// newPlan returns the plan of a decision of n limits.
func newPlan(n int) *plan.Plan {
	return &plan.Plan{Spans: make([]plan.Span, n), Replies: make([]script.Reply, n)}
}

// decide makes a decision of cost n by id against limits (Allow, AllowN,
// AllowAll) and fills out with its Results: from the leases of its Leased
// limits when they hold the cost, from the deny cache when it holds a
// denial, else by Redis or, when Redis fails, by the failure policy. p is
// its plan, with a span and a reply per limit, and outs its outcomes.
func (l *Limiter) decide(ctx context.Context, id string, limits []Limit, n int64, p *plan.Plan, outs []plan.Out, out []Result) error {
	setLimits(out, limits)
	if err := l.checkDecision(id, limits, n); err != nil {
		return err
	}
	o := op{limits: limits, cost: n}
	leased := place(p, id, limits, n, l.now().UnixMilli())
	if leased && l.leases.ServePlan(ctx, p, false) { // no Redis: Close need not wait
		return l.decided(ctx, id, &o, p, outs, out, SourceLease, 0, false)
	}
	if err := l.enter(); err != nil {
		return err
	}
	var taken lease.Taken // on the stack: only a decision with a Leased limit fills it
	defer l.exitTaken(&taken)
	var gives []*script.Request
	if leased {
		gives = l.leases.TakePlan(p, &taken, false)
	}
	reqs := p.Build(l.keys, id, l.countDenied, leased)
	if leased && p.Unsent == 1<<len(reqs)-1 { // all decided from leases after all
		l.leases.Later(id, gives)
		p.Received(nil, 0)
		taken.Settle(p, true)
		return l.decided(ctx, id, &o, p, outs, out, SourceLease, 0, false)
	}
	if l.denied != nil && l.denied.Deny(p, false) {
		taken.Settle(p, false)
		l.leases.Later(id, gives)
		return l.decided(ctx, id, &o, p, outs, out, SourceCache, 0, false)
	}
	took, left, err := l.sendPlan(ctx, id, p, reqs, gives, &o)
	if err != nil {
		taken.Settle(p, false)
		if left {
			return err
		}
		return l.fail(ctx, id, &o, p, outs, out, took, err)
	}
	p.Absorb()
	taken.Settle(p, true)
	if l.denied != nil {
		l.denied.Record(p, 0)
	}
	return l.decided(ctx, id, &o, p, outs, out, SourceRedis, took, true)
}

// look fills out with where id stands against limits, counting nothing
// (Peek, PeekAll): each Result says what a request of cost 1 would get
// now. The leases of the limits answer when every limit is Leased and each
// lease holds a unit; else Redis does or, when Redis fails, the failure
// policy; out through l.finish.
func (l *Limiter) look(ctx context.Context, id string, limits []Limit, p *plan.Plan, outs []plan.Out, out []Result) error {
	setLimits(out, limits)
	if err := l.checkDecision(id, limits, 1); err != nil { // checked as a request of cost 1
		return err
	}
	o := op{limits: limits}
	if place(p, id, limits, 0, l.now().UnixMilli()) && l.leases.ServePlan(ctx, p, true) {
		return l.decided(ctx, id, &o, p, outs, out, SourceLease, 0, false)
	}
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	reqs := p.Build(l.keys, id, l.countDenied, false)
	took, left, err := l.sendPlan(ctx, id, p, reqs, nil, &o)
	if left {
		return err
	}
	if err != nil {
		return l.fail(ctx, id, &o, p, outs, out, took, err)
	}
	p.Absorb()
	return l.decided(ctx, id, &o, p, outs, out, SourceRedis, took, false)
}

// place puts limits, of id at cost n (0 for a look), on the clock at Unix
// ms now, one span of p each, and reports whether some limit is Leased.
func place(p *plan.Plan, id string, limits []Limit, n, now int64) (leased bool) {
	for i := range limits {
		limit, s := &limits[i], &p.Spans[i]
		*s = plan.Span{} // then field by field: a literal is copied from a temporary (BenchmarkLeased)
		s.ID, s.Rate, s.Cost, s.Shadow, s.Lease, s.Pos = id, limit.Rate, n, limit.Shadow, limit.Leased, locate(now, limit)
		leased = leased || limit.Leased
	}
	return leased
}

// locate returns the position of Unix millisecond t in limit's windows.
func locate(t int64, limit *Limit) window.Position {
	return window.Locate(t, limit.Window.Milliseconds(), limit.Strict, window.Period(limit.Calendar), limit.Location)
}

// sendPlan sends reqs, p's as Build returned them, but those decided from
// leases, after gives, the give-backs of leases that travel with them, in
// one call; puts their replies in p.Replies and counts the give-backs. It
// returns what call does, or else the error of one of p's replies.
func (l *Limiter) sendPlan(ctx context.Context, id string, p *plan.Plan, reqs, gives []*script.Request, o *op) (took time.Duration, left bool, err error) {
	reqs, replies := p.Sending(reqs, gives)
	took, left, err = l.call(ctx, id, reqs, replies, o)
	p.Received(replies, len(gives))
	if len(gives) > 0 {
		l.leases.GaveBack(ctx, id, gives, replies, err)
	}
	if err == nil {
		err = p.Failed()
	}
	return took, left, err
}

// decided derives the outcomes of p, a decision or a look answered (by
// Redis, whose script counted denied requests when countedDenied, the
// leases or the deny cache), fills out with them, and finishes.
func (l *Limiter) decided(ctx context.Context, id string, o *op, p *plan.Plan, outs []plan.Out, out []Result, src Source, took time.Duration, countedDenied bool) error {
	allowed, refused := p.Derive(countedDenied, outs)
	l.fill(out, outs, p)
	return l.finish(ctx, id, o, out, allowed, refused, src, took, nil, nil)
}
