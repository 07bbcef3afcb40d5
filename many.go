// AllowMany: one request against the limits of several ids, all or nothing,
// and its path (validate, build per hash slot, send, give back on a Cluster,
// derive, finish).

package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// Quota is one limit of one id and what a request costs it: one of the
// several that AllowMany decides at once.
type Quota struct {
	// ID is the client the limit is counted for.
	ID string
	// Limit is the limit; a Leased one is refused (see AllowMany).
	Limit Limit
	// Cost is what the request counts against Limit for ID, from 0 to
	// 2^53. A Cost of 0 counts nothing, and refuses the request only when
	// ID's count is already above Limit.Rate (after a Charge, or a Rate
	// lowered since): its Result's RetryAfter is then the wait until it is
	// not.
	Cost int64
}

// AllowMany decides one request against the limits of several ids at once,
// all or nothing: a per-user and a per-tenant limit, or the descriptors of
// one Envoy rate limit request. The request is allowed only if every
// enforced Quota admits its Cost; then each counts its Cost under its ID,
// and if any refuses, none counts anything. results[i] is quotas[i]'s, as
// AllowAll's are; a Shadow limit's is counted when it alone admits its
// Cost, and decides nothing.
//
// On a single Redis (or a Sentinel's master) the decision is one script
// call and atomic. On a Redis Cluster, the quotas whose ids share a hash slot
// are decided together, atomically, in one call to their master; when the
// ids are in several hash slots each one's quotas are decided in a call
// of their own, at once, and if one refuses, what the others counted is
// given back in the windows it was counted in. A limit is never exceeded
// either way, and a refused request is counted nowhere once its give-backs
// land; until then, a few ms, other requests of those ids see its cost.
// Keep ids that must be decided atomically in one hash slot on a Cluster: ids
// of one Envoy domain or one tenant, say, put together in one id.
//
// AllowMany takes at most 16 quotas, two of one ID only if their windows
// differ (as AllowAll's limits), none Leased (a lease belongs to one id;
// decide Leased limits with Allow, AllowN or AllowAll), and an empty list
// is ErrInvalidLimit. The deny cache (WithDenyCache) answers for it as for
// AllowAll, from what Redis reported of each ID, and WithCountDenied does
// not apply: a refused request counts nothing. When
// Redis fails, the failure policy decides every quota alike; FailLocal
// checks each against its share in this process and counts all of them
// only if all admit. To give back part of what it counted, Refund each
// ID's Results under that ID. An Observer sees one Event, whose ID (with
// WithObserverIDs) is the first quota's and whose Cost is the largest.
func (l *Limiter) AllowMany(ctx context.Context, quotas []Quota) ([]Result, error) {
	d := &decision{quotas: quotas, limits: make([]Limit, len(quotas))}
	for i := range quotas {
		d.limits[i] = quotas[i].Limit
	}
	err := l.decideMany(ctx, d)
	return d.results, err
}

// decideMany makes d, a decision of d.quotas: the steps of decide, with a
// request per hash slot (see buildMany) and on a Cluster the give-backs of
// the hash slots that counted when another refused.
func (l *Limiter) decideMany(ctx context.Context, d *decision) error {
	d.results = make([]Result, len(d.quotas))
	for i, q := range d.quotas {
		d.results[i].Limit = q.Limit
		d.cost = max(d.cost, q.Cost)
	}
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	if err := l.checkMany(d.quotas); err != nil {
		return err
	}
	id := d.quotas[0].ID // for the error handler and the Observer
	groups := l.buildMany(d, l.now().UnixMilli())
	if l.denied != nil && l.denied.deny(id, d) {
		d.deriveMany()
		return l.finish(ctx, d, id, SourceCache, 0, nil, nil)
	}
	var took time.Duration
	var left bool
	var err error
	if len(groups) == 1 {
		took, left, err = l.send(ctx, d, id, d.reqs, nil)
	} else {
		took, left, err = l.sendGroups(ctx, d, id, groups)
	}
	if left {
		return err
	}
	if err != nil {
		return l.fail(ctx, d, id, took, err)
	}
	d.absorb()
	if l.denied != nil {
		l.denied.record(id, d)
	}
	d.deriveMany()
	return l.finish(ctx, d, id, SourceRedis, took, nil, nil)
}

// checkMany validates the quotas of AllowMany before anything is sent.
func (l *Limiter) checkMany(quotas []Quota) error {
	if l.t == nil {
		return ErrNilClient
	}
	if err := checkLen(len(quotas), "quotas"); err != nil {
		return err
	}
	for i, q := range quotas {
		if err := validate(q.ID, q.Limit, 1); err != nil { // the id and the limit: a Cost of 0 is valid here
			return wrap(fmt.Sprintf("ratelimit: quota %d", i), err)
		}
		if q.Limit.Leased {
			return fmt.Errorf("%w: limit %v of quota %d is Leased, which AllowMany does not lease: decide it with AllowN or AllowAll", ErrInvalidLimit, q.Limit, i)
		}
		if q.Cost < 0 || q.Cost > script.MaxCount {
			return fmt.Errorf("%w: cost %d of quota %d is not between 0 and 2^53", ErrInvalidCost, q.Cost, i)
		}
		for j, o := range quotas[:i] {
			if o.ID == q.ID && sameCount(o.Limit, q.Limit) {
				return fmt.Errorf("%w: quotas %d and %d have the same id and window (%v and %v), and would share one count", ErrInvalidLimit, j, i, o.Limit, q.Limit)
			}
		}
	}
	return nil
}

// buildMany places d's quotas on the clock at Unix ms now and makes their
// requests: per hash slot (one for all but on a Cluster), one request of
// its enforced quotas and one for each Shadow quota. Each request
// is of ModeLease, in which each limit counts its own need: a quota's
// Cost, or for a Cost of 0 nothing, admitted while its usage is at most
// its rate (asked as a need of 1 against a rate one higher); or, when
// every quota has one cost of 1 or more, of ModeCount with that cost, a
// shorter call. It returns
// the requests of each hash slot, as indexes into d.reqs, the first one's
// first.
func (l *Limiter) buildMany(d *decision, now int64) [][]int {
	d.spans = make([]span, len(d.quotas))
	cluster := l.t.Cluster()
	var groups [][]int
	groupOf := map[int]int{}  // hash slot -> index in groups
	enforced := map[int]int{} // hash slot -> its enforced request, in d.reqs
	for i, q := range d.quotas {
		s := &d.spans[i]
		*s = span{at: i, rate: q.Limit.Rate, shadow: q.Limit.Shadow, pos: locate(now, q.Limit)}
		keys := l.appendKeys(nil, q.ID, s.pos)
		hash := 0
		if cluster {
			hash = transport.HashSlot(keys[0])
		}
		g, ok := groupOf[hash]
		if !ok {
			g = len(groups)
			groupOf[hash] = g
			groups = append(groups, nil)
		}
		r, ok := enforced[hash]
		if q.Limit.Shadow || !ok {
			r = len(d.reqs)
			d.reqs = append(d.reqs, &script.Request{Cost: 1, Mode: script.ModeLease})
			groups[g] = append(groups[g], r)
			if !q.Limit.Shadow {
				enforced[hash] = r
			}
		}
		req := d.reqs[r]
		a := newLimitArgs(q.Limit, s.pos)
		a.Need, a.Most = q.Cost, q.Cost
		if q.Cost == 0 {
			a.Rate, a.Need = a.Rate+1, 1 // admitted while usage <= rate; counts nothing
		}
		req.Cost = max(req.Cost, q.Cost)
		s.req, s.arg, s.first = r, len(req.Limits), len(req.Keys)
		req.Limits = append(req.Limits, a)
		req.Keys = append(req.Keys, keys...)
		req.NLimits++
	}
	d.replies = make([]script.Reply, len(d.reqs))
	if same := d.sameCost(); same > 0 { // every limit counts the request's cost: no need or most to send
		for _, req := range d.reqs {
			req.Mode, req.Cost = script.ModeCount, same
		}
	}
	return groups
}

// sameCost returns the cost every quota of d shares, when it is at least 1;
// else 0.
func (d *decision) sameCost() int64 {
	c := d.quotas[0].Cost
	for _, q := range d.quotas[1:] {
		if q.Cost != c {
			return 0
		}
	}
	return c
}

// sendGroups sends the requests of each of groups, the hash slots of a
// Cluster, in calls of their own at once, and puts their replies in
// d.replies. If some group's enforced request was refused, or failed, the
// enforced requests of the others that counted give back what they
// counted, in the background (see giveBackMany). It returns how long the
// calls took (for the Observer), and the first group's error; left when the
// caller left before some group answered (there is no decision then: what
// that group's call counts, if it lands, stays until its window slides
// out, as a decision's whose caller left).
func (l *Limiter) sendGroups(ctx context.Context, d *decision, id string, groups [][]int) (took time.Duration, left bool, err error) {
	start := time.Now()
	errs := make([]error, len(groups))
	lefts := make([]bool, len(groups))
	var wg sync.WaitGroup
	for g, group := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]*script.Request, len(group))
			replies := make([]script.Reply, len(group))
			for i, r := range group {
				reqs[i] = d.reqs[r]
			}
			_, lefts[g], errs[g] = l.call(ctx, d, id, reqs, replies)
			for i, r := range group {
				d.replies[r] = replies[i]
			}
		}()
	}
	wg.Wait()
	took = time.Since(start)
	for g := range groups {
		if lefts[g] && !left {
			err, left = errs[g], true
		} else if err == nil {
			err = errs[g]
		}
	}
	if err == nil {
		err = d.failed()
	}
	// The enforced requests that counted, if another did not.
	refused := err != nil
	for i := range d.spans {
		if s := &d.spans[i]; !s.shadow && !d.replies[s.req].Allowed {
			refused = true
		}
	}
	if refused {
		l.giveBackMany(d, id)
	}
	return took, left, err
}

// giveBackMany gives back what the enforced requests of d that were allowed
// counted, each quota's Cost in the window it counted it in, and marks them
// refused: the decision's other hash slots refused it. The give-backs go in
// the background, one call per key (they batch), owed whether or not the
// caller still waits: its caller does not wait for them. One that fails
// goes to the error handler; the count it leaves stays until its window
// slides out of the limit's span.
func (l *Limiter) giveBackMany(d *decision, id string) {
	for i := range d.spans {
		s := &d.spans[i]
		q := d.quotas[s.at]
		if s.shadow || !d.replies[s.req].Allowed || q.Cost == 0 {
			continue
		}
		l.background(id, script.GiveBack(q.Cost, d.reqs[s.req].Keys[s.first]), "ratelimit: giving back the hash slots of a refused AllowMany")
	}
	for i := range d.spans {
		if s := &d.spans[i]; !s.shadow {
			d.replies[s.req].Allowed = false
		}
	}
}

// deriveMany fills d.results, AllowMany's, from the counts each span holds
// and the decision of each request, as derive does AllowAll's: each quota
// with its own cost.
func (d *decision) deriveMany() {
	d.allowed, d.refused = true, 0
	for i := range d.spans {
		if s := &d.spans[i]; !s.shadow && !d.replies[s.req].Allowed {
			d.allowed = false
		}
	}
	for i := range d.spans {
		s := &d.spans[i]
		q := d.quotas[s.at]
		ok := d.replies[s.req].Allowed && (s.shadow || d.allowed)
		counted := ok && q.Cost > 0
		res := s.result(q.Limit, q.Cost, counted, 0)
		if counted {
			res.receipt = newReceipt(q.Limit, s.pos, q.Cost, res.receipt.refill)
			res.receipt.id = idHash(q.ID)
		}
		if !counted && s.pos.estimate(&s.seen)+q.Cost > s.rate {
			d.refused |= 1 << s.at
		}
		if s.shadow {
			res.Shadowed = !ok
		}
		d.results[s.at] = res
	}
	d.apply()
}
