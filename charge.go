// Charge, Refund and GiveBack: costs counted whatever the counts, and given
// back; the path of each.

package ratelimit

import (
	"context"
	"errors"

	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// Charge counts n against every limit for id, whatever the counts are: the cost of work already
// done. It denies nothing: Count may go above Rate, and later requests are denied until the
// window has slid past it. results[i] is limits[i]'s: Allowed says whether a request of cost 1
// would pass now; Count, Remaining, RetryAfter (the wait until a cost-1 request passes) and
// ResetAfter describe the counts after the charge. Shadow limits are charged too.
//
// Allowed is one answer for every Result, as AllowAll's is: whether a cost-1
// request would pass every limit but the Shadow ones, whose Shadowed says
// whether it would pass that one. A Leased limit is charged in Redis, not
// from its lease, and this process's lease of it is given back in the same
// call, so that what it held does not serve after the charge. It is one
// script call, whatever the number of limits, validated as AllowAll is; a
// charge that would take some limit's count past 2^53, where it would no
// longer be a count, is ErrInvalidCost naming the limit, and nothing of it
// is counted. A charge that cannot reach Redis is reported to the error handler and
// returns the error, whatever the failure policy; like a decision it is
// never sent twice, so a charge that timed out may or may not have been
// counted. The Results of a Charge can be refunded.
func (l *Limiter) Charge(ctx context.Context, id string, limits []Limit, n int64) ([]Result, error) {
	out := resultsOf(limits)
	if err := l.checkDecision(id, limits, n); err != nil {
		return out, err
	}
	if err := l.enter(); err != nil {
		return out, err
	}
	defer l.exit()
	p := newPlan(len(limits))
	leased := place(p, id, limits, n, l.now().UnixMilli())
	reqs := p.BuildCharge(l.keys, id)
	var gives []*script.Request
	if leased {
		var at []window.Position
		for i, limit := range limits {
			if limit.Leased {
				at = append(at, p.Spans[i].Pos)
			}
		}
		gives = l.leases.Drain(id, at)
	}
	o := op{kind: EventCharge, limits: limits, cost: n}
	took, left, err := l.sendPlan(ctx, id, p, reqs, gives, &o)
	switch {
	case left:
		return out, err
	case errors.Is(err, ErrInvalidCost):
		// Redis refused the cost (see sliding_window.lua): the caller's
		// input, not a failure of Redis, and nothing counted.
		return out, err
	case err != nil:
		l.onError(ctx, id, err)
		if l.observer != nil {
			l.observe(ctx, id, &o, out, SourceRedis, took, err, false, false)
		}
		return out, wrap("ratelimit: charge", err)
	}
	p.Absorb()
	outs := make([]plan.Out, len(limits))
	allowed, refused := p.DeriveCharge(outs)
	l.fill(out, outs, p)
	if l.denied != nil {
		l.denied.Record(p, refused)
	}
	return out, l.finish(ctx, id, &o, out, allowed, refused, SourceRedis, took, nil, nil)
}

// Refund gives back n of what the decision that returned results counted for id: for each limit,
// in the window (for a strict limit, the sub-window; for a calendar limit, the period) where it
// was counted, never below 0; once that window has slid out of the limit's span (that period has
// ended), there is nothing left to give back and Refund does nothing for it. A refund of a decision that counted nothing (denied, a Peek, a Degraded
// decision, a Result not made by this Limiter) or of more than it counted is an error
// (ErrInvalidCost), and nothing is written. So is, with ErrInvalidLimit, a Result whose Limit
// was changed to one of another Window, Strict, Calendar or Location (it would name another count than the one
// counted), and one count given twice (two Results of one window), as AllowAll refuses two
// limits of one window.
//
// A sliding window is read by decisions until the end of the next one, so a
// refund applies until then; a strict sub-window is read for
// StrictSubWindows sub-windows after its own. Refund does not remember
// earlier refunds of the same Results: refund a decision once, or in parts
// that add up to no more than it counted, and give each Result once. No Results at all (nil or empty) is
// ErrInvalidLimit, as AllowAll and Charge with no limits are. The Results
// of a Shadow limit that did not count the request are passed over; so are
// those counted in this process's failure policy. A denied AllowAll whose
// Shadow limit counted the request on its own can be refunded for that
// limit. A refund is one script call; one that cannot reach Redis is
// reported to the error handler and returns the error.
//
// Neither the Limiter nor go-redis sends a refund twice (the script call
// is marked NoRetry), and a caller should not retry one either: a refund
// whose reply was lost, or that timed out, may have landed, and a second
// would give back twice, taking from what other requests counted. A refund
// lost for good leaves the count higher than it should be until its window
// slides out of the limit's span: the safe side of a limit.
//
// The deny cache of this Limiter forgets id (a decision of id in flight as
// the refund lands may still cache its denial, for the rest of its
// window); other processes' caches keep what they hold. A refund of a
// decision made before a Reset lowers the counts written after it.
func (l *Limiter) Refund(ctx context.Context, id string, results []Result, n int64) error {
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	if err := l.checkRefund(id, results, n); err != nil {
		return err
	}
	now := l.now().UnixMilli()
	var limits []Limit
	var at []window.Position
	var keys []string
	for i := range results {
		r := results[i].receipt
		if r.counted == 0 {
			continue
		}
		limit := results[i].Limit // checked: the count it counted in
		p := locate(now, &limit)
		if p.Gone(r.window) {
			continue // slid out of the span, or the period ended: nothing to give back
		}
		p.E, p.I = 0, r.window
		keys = append(keys, l.keys.Append(nil, id, p)[0])
		limits, at = append(limits, limit), append(at, p)
	}
	if len(keys) == 0 {
		return nil
	}
	return l.giveBack(ctx, id, &op{kind: EventRefund, limits: limits, cost: n}, results, at, keys)
}

// GiveBack gives n back to each of limits for id in its current window
// (for a strict limit, its current sub-window), never below 0: Refund for
// a caller that no longer has the Results of what it counted, such as an
// Envoy rate limit request of negative hits. It is exact for a cost counted
// in the current window. A cost counted in an earlier window is given back
// from the current one all the same, where it weighs in full: the estimate
// then falls by up to n where Refund would lower it by what that cost still
// weighs, which may be less, so that a limit may admit up to that
// difference more until the window ends. Give back what was counted in the
// window you are in. Input is checked as AllowAll's; otherwise GiveBack is
// as Refund: one script call, never resent, observed as a refund, and the
// deny cache forgets id.
func (l *Limiter) GiveBack(ctx context.Context, id string, limits []Limit, n int64) error {
	if err := l.checkDecision(id, limits, n); err != nil {
		return err
	}
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	now := l.now().UnixMilli()
	at := make([]window.Position, len(limits))
	keys := make([]string, len(limits))
	for i, limit := range limits {
		at[i] = locate(now, &limit)
		keys[i] = l.keys.Append(nil, id, at[i])[0]
	}
	return l.giveBack(ctx, id, &op{kind: EventGiveBack, limits: limits, cost: n}, resultsOf(limits), at, keys)
}

// giveBack sends o, a refund's or a give-back's, of n from each of keys
// (at those positions) in one call, and reports what fails; the deny cache
// forgets id's counts there. results are what the Observer sees.
func (l *Limiter) giveBack(ctx context.Context, id string, o *op, results []Result, at []window.Position, keys []string) error {
	var out [1]script.Reply
	took, left, err := l.call(ctx, id, []*script.Request{script.GiveBack(o.cost, keys...)}, out[:], o)
	if err == nil {
		err = out[0].Err
	}
	for _, p := range at {
		l.forgetDenial(id, p)
	}
	if left { // it may yet land: reported if it fails
		return err
	}
	if err != nil {
		l.onError(ctx, id, err)
	}
	if l.observer != nil {
		l.observe(ctx, id, o, results, SourceRedis, took, err, err == nil, false)
	}
	if err != nil {
		return wrap("ratelimit: refund", err)
	}
	return nil
}
