// Charge, Refund and GiveBack: costs counted whatever the counts, and given back;
// the path of each (charge; refund and sendRefund).

package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
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
	d := &decision{limits: limits}
	err := l.charge(ctx, d, id, n)
	return d.results, err
}

// charge counts d, a Charge of n by id, in Redis, whatever the counts; gives
// back in the same call this process's leases of d's Leased limits, which
// it drops; and fills d.results from the counts Redis saw (see
// deriveCharge), out through l.finish. A charge Redis does not count is an
// error, whatever the failure policy.
func (l *Limiter) charge(ctx context.Context, d *decision, id string, n int64) error {
	d.cost, d.kind = n, EventCharge
	if err := l.begin(d, id, n); err != nil {
		return err
	}
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	reqs := l.build(d, id, l.now().UnixMilli())
	var gives []*script.Request
	if d.leased() {
		var at [maxLimits]position
		n := 0
		for i := range d.spans {
			if s := &d.spans[i]; d.limits[s.at].Leased {
				at[n] = s.pos
				n++
			}
		}
		gives = l.leases.drain(id, at[:n])
	}
	took, left, err := l.send(ctx, d, id, reqs, gives)
	if left {
		return err
	}
	if errors.Is(err, ErrInvalidCost) {
		// Redis refused the cost (see sliding_window.lua): the caller's
		// input, not a failure of Redis, and nothing counted.
		return err
	}
	if err != nil {
		l.onError(ctx, id, err)
		if l.observer != nil {
			l.observe(ctx, d, id, SourceRedis, took, err, false)
		}
		return wrap("ratelimit: charge", err)
	}
	d.absorb()
	d.deriveCharge()
	if l.denied != nil {
		l.denied.record(id, d)
	}
	return l.finish(ctx, d, id, SourceRedis, took, nil, nil)
}

// deriveCharge fills the Results of d, a charge, from the counts the script
// saw before it: see Charge.
func (d *decision) deriveCharge() {
	d.allowed, d.refused = true, 0
	for i := range d.spans {
		s := &d.spans[i]
		c := s.seen
		c[0] += d.cost
		count := s.pos.estimate(&c)
		res := Result{Limit: d.limits[s.at], Count: count, Remaining: max(0, s.rate-count),
			RetryAfter: s.pos.waitUntil(&c, s.rate-1), ResetAfter: s.pos.waitUntil(&c, 0),
			receipt: newReceipt(d.limits[s.at], s.pos, d.cost, s.pos.waitUntil(&c, count-1))}
		if count+1 > s.rate {
			d.refused |= 1 << s.at
			if s.shadow {
				res.Shadowed = true
			} else {
				d.allowed = false
			}
		}
		d.results[s.at] = res
	}
	for i := range d.results {
		d.results[i].Allowed = d.allowed
	}
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
	d, err := l.refund(id, results, n)
	if err != nil || d == nil {
		return err
	}
	return l.sendRefund(ctx, d, id)
}

// refund checks a refund and returns it as a decision of one give-back
// request, or nil when every limit's window has slid out of its span.
func (l *Limiter) refund(id string, results []Result, n int64) (*decision, error) {
	if l.t == nil {
		return nil, ErrNilClient
	}
	if id == "" {
		return nil, fmt.Errorf("%w: id is empty", ErrInvalidID)
	}
	if len(results) == 0 {
		return nil, fmt.Errorf("%w: no Results to refund", ErrInvalidLimit)
	}
	if n < 1 {
		return nil, fmt.Errorf("%w: refund %d is below 1", ErrInvalidCost, n)
	}
	counted := false
	for i := range results {
		r := results[i].receipt
		if r.counted == 0 {
			continue
		}
		limit := results[i].Limit
		if r.by != l.serial || r.id != idHash(id) {
			return nil, fmt.Errorf("%w: a Result of limit %v was not made by this Limiter for this id", ErrInvalidCost, limit)
		}
		if !r.of(limit) {
			counted := Limit{Rate: limit.Rate, Window: time.Duration(r.ms) * time.Millisecond, Strict: r.strict, Calendar: r.cal, Location: r.loc}
			return nil, fmt.Errorf("%w: a Result's limit %v is not the one it counted in (%v)", ErrInvalidLimit, limit, counted)
		}
		if n > r.counted {
			return nil, fmt.Errorf("%w: refund of %d is more than the %d that limit %v counted", ErrInvalidCost, n, r.counted, limit)
		}
		for _, other := range results[:i] {
			if other.receipt.counted > 0 && sameCount(other.Limit, limit) && other.receipt.window == r.window {
				// One count given twice would take back more than it counted.
				return nil, fmt.Errorf("%w: two Results of the same count (limits %v and %v)", ErrInvalidLimit, other.Limit, limit)
			}
		}
		counted = true
	}
	if !counted {
		return nil, fmt.Errorf("%w: the decision counted nothing to refund (denied, a look, degraded, or not this Limiter's)", ErrInvalidCost)
	}
	now := l.now().UnixMilli()
	d := &decision{cost: -n, kind: EventRefund}
	var keys []string
	for i := range results {
		r := results[i].receipt
		if r.counted == 0 {
			continue
		}
		limit := results[i].Limit // checked above: the count it counted in
		p := locate(now, limit)
		if p.cal != 0 && p.i > r.window || p.cal == 0 && p.i > r.window+max(1, p.subs) {
			continue // slid out of the span, or the period ended: nothing to give back
		}
		p.e, p.i = 0, r.window
		keys = append(keys, l.appendKeys(nil, id, p)[0])
		d.limits = append(d.limits, limit)
		d.spans = append(d.spans, span{at: len(d.spans), pos: p})
	}
	if len(keys) == 0 {
		return nil, nil
	}
	d.results = results
	d.reqs = []*script.Request{script.GiveBack(n, keys...)}
	d.replies = make([]script.Reply, 1)
	return d, nil
}

// sendRefund sends d, a refund's give-back, and reports what fails.
func (l *Limiter) sendRefund(ctx context.Context, d *decision, id string) error {
	took, left, err := l.send(ctx, d, id, d.reqs, nil)
	if l.denied != nil {
		for i := range d.spans {
			l.denied.forget(id, d.spans[i].pos)
		}
	}
	if left { // it may yet land: reported if it fails
		return err
	}
	if err != nil {
		l.onError(ctx, id, err)
	}
	if l.observer != nil {
		l.observe(ctx, d, id, SourceRedis, took, err, err == nil)
	}
	if err != nil {
		return wrap("ratelimit: refund", err)
	}
	return nil
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
	d := &decision{limits: limits, kind: EventGiveBack}
	if err := l.begin(d, id, n); err != nil {
		return err
	}
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	d.cost = -n
	now := l.now().UnixMilli()
	var keys []string
	for i, limit := range limits {
		p := locate(now, limit)
		d.spans = append(d.spans, span{at: i, pos: p})
		keys = append(keys, l.appendKeys(nil, id, p)[0])
	}
	d.reqs = []*script.Request{script.GiveBack(n, keys...)}
	d.replies = make([]script.Reply, 1)
	return l.sendRefund(ctx, d, id)
}
