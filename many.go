// AllowMany: one request against the limits of several ids, all or nothing,
// and its path (validate, place, serve from leases, build per hash slot,
// deny from the cache, send, give back on a Cluster, derive, finish).

package ratelimit

import (
	"context"
	"sync"
	"time"

	"github.com/slidingwindow/ratelimit/internal/lease"
	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// Quota is one limit of one id and what a request costs it: one of the
// several that AllowMany decides at once.
type Quota struct {
	// ID is the client the limit is counted for.
	ID string
	// Limit is the limit; a Leased one is decided from a lease of ID's
	// (see AllowMany).
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
// differ (as AllowAll's limits), and an empty list is ErrInvalidLimit. A
// Leased quota of a Cost of 1 or more is decided from this process's lease
// of its ID and limit, as AllowN would: when every quota is Leased and
// each lease holds its Cost, the decision takes no Redis call; a request
// that another quota refuses gives back to each lease what it took. The deny cache (WithDenyCache) answers for it as for
// AllowAll, from what Redis reported of each ID, and WithCountDenied does
// not apply: a refused request counts nothing. When
// Redis fails, the failure policy decides every quota alike; FailLocal
// checks each against its share in this process and counts all of them
// only if all admit. To give back part of what it counted, Refund each
// ID's Results under that ID. An Observer sees one Event, whose ID (with
// WithObserverIDs) is the first quota's and whose Cost is the largest.
func (l *Limiter) AllowMany(ctx context.Context, quotas []Quota) ([]Result, error) {
	out := make([]Result, len(quotas))
	limits := make([]Limit, len(quotas))
	for i, q := range quotas {
		out[i].Limit, limits[i] = q.Limit, q.Limit
	}
	if err := l.enter(); err != nil {
		return out, err
	}
	var taken lease.Taken
	defer l.exitTaken(&taken)
	if err := l.checkMany(quotas); err != nil {
		return out, err
	}
	id := quotas[0].ID // for the error handler and the Observer
	o := op{limits: limits}
	p := newPlan(len(quotas))
	now := l.now().UnixMilli()
	leased := false
	for i, q := range quotas {
		lease := q.Limit.Leased && q.Cost > 0 // a quota of 0 takes no lease
		p.Spans[i] = plan.Span{ID: q.ID, Rate: q.Limit.Rate, Cost: q.Cost, Shadow: q.Limit.Shadow, Pos: locate(now, &q.Limit), Lease: lease}
		o.cost = max(o.cost, q.Cost)
		leased = leased || lease
	}
	outs := make([]plan.Out, len(quotas))
	if leased && l.leases.ServePlan(ctx, p, false) {
		return out, l.derivedMany(ctx, id, &o, p, outs, out, SourceLease, 0)
	}
	if leased {
		l.leases.TakePlan(p, &taken, true) // give-backs of other ids' slots, maybe: not in this call
	}
	groups := p.BuildMany(l.keys, l.slotOf())
	if leased && p.Unsent == 1<<len(p.Reqs)-1 { // all decided from leases after all
		p.Received(nil, 0)
		taken.Settle(p, true)
		return out, l.derivedMany(ctx, id, &o, p, outs, out, SourceLease, 0)
	}
	if l.denied != nil && l.denied.Deny(p, true) {
		taken.Settle(p, false)
		return out, l.derivedMany(ctx, id, &o, p, outs, out, SourceCache, 0)
	}
	var took time.Duration
	var left bool
	var err error
	if len(groups) == 1 {
		took, left, err = l.sendPlan(ctx, id, p, p.Reqs, nil, &o)
	} else {
		took, left, err = l.sendGroups(ctx, id, p, groups, &o)
	}
	if err != nil {
		taken.Settle(p, false)
		if left {
			return out, err
		}
		return out, l.failMany(ctx, id, &o, p, outs, out, took, err)
	}
	p.Absorb()
	taken.Settle(p, true)
	if l.denied != nil {
		l.denied.Record(p, 0)
	}
	return out, l.derivedMany(ctx, id, &o, p, outs, out, SourceRedis, took)
}

// slotOf returns the hash slot of a key where keys of different slots
// cannot be in one script call (a Redis Cluster, or a server that refused
// such a call); nil on one Redis.
func (l *Limiter) slotOf() func(key string) int {
	if l.t.SplitSlots() {
		return transport.HashSlot
	}
	return nil
}

// derivedMany derives the outcomes of p, an AllowMany answered, fills out
// with them, and finishes.
func (l *Limiter) derivedMany(ctx context.Context, id string, o *op, p *plan.Plan, outs []plan.Out, out []Result, src Source, took time.Duration) error {
	allowed, refused := p.DeriveMany(outs)
	l.fill(out, outs, p)
	return l.finish(ctx, id, o, out, allowed, refused, src, took, nil, nil)
}

// sendGroups sends the requests of each of groups, the hash slots of a
// Cluster, in calls of their own at once (but those decided from leases),
// and puts their replies in p.Replies. If some group's enforced request
// was refused, or failed, the enforced requests of the others that counted
// give back what they counted, in the background (see plan.Refused). It
// returns how long the calls took (for the Observer), and the first
// group's error; left when the caller left before some group answered
// (there is no decision then: what that group's call counts, if it lands,
// stays until its window slides out, as a decision's whose caller left).
func (l *Limiter) sendGroups(ctx context.Context, id string, p *plan.Plan, groups [][]int, o *op) (took time.Duration, left bool, err error) {
	start := time.Now()
	errs := make([]error, len(groups))
	lefts := make([]bool, len(groups))
	var wg sync.WaitGroup
	for g, group := range groups {
		reqs, at := p.Group(group)
		if len(reqs) == 0 {
			continue
		}
		wg.Go(func() {
			replies := make([]script.Reply, len(reqs))
			_, lefts[g], errs[g] = l.call(ctx, id, reqs, replies, o)
			for i, r := range at {
				p.Replies[r] = replies[i]
			}
		})
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
		err = p.Failed()
	}
	// Owed whether or not the caller still waits, which does not wait for
	// them; one that fails goes to the error handler, and the count it
	// leaves stays until its window slides out of the limit's span.
	for _, give := range p.Refused(err != nil) {
		l.background(id, give, "ratelimit: giving back the hash slots of a refused AllowMany")
	}
	return took, left, err
}
