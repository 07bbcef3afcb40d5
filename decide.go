// The decision and its paths: decide (Allow, AllowN, AllowAll) and look
// (Peek, PeekAll), each read top to bottom, and the steps they share with
// charge (charge.go): begin (validate), build the requests, send them,
// absorb the replies, derive the Results, finish.

package ratelimit

import (
	"context"
	"errors"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// decision is one call of AllowN, AllowAll, Peek, PeekAll, Charge or
// Refund on its way through the Limiter: its limits placed on the clock
// (spans), the requests it sends (see build), their replies, and its
// results. It belongs to its caller's goroutine, on whose stack a decision
// of one limit lives (see one): what goes to Redis is only read by the
// transport, and replies come back by value.
type decision struct {
	limits  []Limit
	results []Result
	spans   []span // one per limit
	reqs    []*script.Request
	replies []script.Reply // one per request, from Redis, the deny cache or FailLocal
	cost    int64          // 0 for a look
	allowed bool           // the one decision every Result reports
	// refused has bit i set when limits[i] did not admit the request (or
	// for a look, a cost of 1), whatever the decision: the limits a denial
	// is owed to. maxLimits bits fit.
	refused uint32
	// deniedCounted: the script decided, and under WithCountDenied counted
	// each denied request's cost (see sliding_window.lua).
	deniedCounted bool
	// unsent has bit r set when reqs[r] is not sent: its limits are all
	// Leased and decided from their leases (see takeLeases).
	unsent uint32
	// kind is what the decision is, as its Event says: EventCharge counts
	// whatever the counts, EventRefund and EventGiveBack give back (see
	// charge.go), EventAcquire takes a concurrency slot.
	kind EventKind
	// left: a copy of a decision whose caller left, for the Event of its
	// call's failure (see reportLate).
	left bool
	// quotas are AllowMany's, one per limit: each with its own id and
	// cost (see many.go); nil for the others.
	quotas []Quota
	// slot is an Acquire's outcome (see concurrency.go), which the steps
	// fill as they fill results.
	slot *Slot
	// quiet: a Release's, an Extend's or a Reset's, which no Event shows;
	// unreported: whose failure, even late, goes to no error handler.
	quiet, unreported bool
}

// one holds a decision of one limit, beside it on its caller's stack: a
// decision cannot point into itself without going to the heap.
type one struct {
	limits  [1]Limit
	results [1]Result
	spans   [1]span
	replies [1]script.Reply
}

// decideOne is decide for a decision of one limit, held on its caller's
// stack (see one): Allow and AllowN.
func (l *Limiter) decideOne(ctx context.Context, id string, limit Limit, n int64) (Result, error) {
	var o one
	d := o.decision(limit)
	err := l.decide(ctx, &d, id, n)
	return o.results[0], err
}

// lookOne is look for one limit, held on its caller's stack (see one):
// Peek.
func (l *Limiter) lookOne(ctx context.Context, id string, limit Limit) (Result, error) {
	var o one
	d := o.decision(limit)
	err := l.look(ctx, &d, id)
	return o.results[0], err
}

// decision returns a decision of limit alone, whose storage o holds.
func (o *one) decision(limit Limit) decision {
	o.limits[0] = limit
	return decision{limits: o.limits[:], results: o.results[:], spans: o.spans[:], replies: o.replies[:]}
}

// oneRequest is what a decision of one limit sends to Redis, in one allocation:
// its request and what the call's arguments point to.
type oneRequest struct {
	req  script.Request
	reqs [1]*script.Request
	args [1]script.LimitArgs
	keys [2]string
}

// span is one limit of a decision: where the clock stands in its windows,
// which request carries it, and the counts that request's reply says the
// script saw.
type span struct {
	at     int   // index of the limit in the caller's list
	rate   int64 // the limit's Rate, or under FailLocal its share
	shadow bool  // the limit's Shadow
	pos    position
	req    int // index in decision.reqs of the request that carries it
	arg    int // index of its script.LimitArgs in that request's Limits
	first  int // index of its first key in that request's keys
	seen   counts
	// A Leased limit's: what the lease table granted it (see leaseGrant).
	leased, local, grow bool
	held, need, most    int64
	entry               *lease
}

// granted records in s, a Leased limit's span, what the lease table
// granted it: a limit decided from its lease derives its Result from the
// lease's counts.
func (s *span) granted(g *leaseGrant) {
	s.leased = true
	s.local, s.grow = g.local, g.grow
	s.held, s.need, s.most = g.held, g.need, g.most
	s.entry = g.entry
	if g.local {
		s.seen = g.seen
	}
}

// grant returns what s, a Leased limit's span, was granted.
func (s *span) grant() leaseGrant {
	return leaseGrant{local: s.local, grow: s.grow, held: s.held, need: s.need, most: s.most, entry: s.entry}
}

// want returns what a request of cost n (1 for a look) adds to the span's
// count as its Result counts it: n, or for a Leased limit what it asked
// Redis to count (held units were counted when they were leased).
func (s *span) want(n int64) int64 {
	if s.leased {
		return s.need
	}
	return n
}

// decision.refused has a bit for each of up to maxLimits limits.
const _ uint32 = 1<<maxLimits - 1

// decide makes decision d, a request of cost n by id (Allow, AllowN,
// AllowAll), and fills d.results: from the leases of its Leased limits when
// they hold the cost, from the deny cache when it holds a denial, else by
// Redis or, when Redis fails, by the failure policy; out through l.finish.
func (l *Limiter) decide(ctx context.Context, d *decision, id string, n int64) error {
	d.cost = n
	if err := l.begin(d, id, n); err != nil {
		return err
	}
	now := l.now().UnixMilli()
	leased := d.leased()
	if leased && l.serveLeases(d, id, now, false) { // no Redis: Close need not wait
		d.derive()
		return l.finish(ctx, d, id, SourceLease, 0, nil, nil)
	}
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	reqs := l.build(d, id, now)
	var gives []*script.Request
	if leased {
		gives = l.takeLeases(d, id)
		if d.unsent == 1<<len(d.reqs)-1 { // all decided from leases after all
			l.leases.later(id, gives)
			d.received(nil, 0)
			d.derive()
			return l.finish(ctx, d, id, SourceLease, 0, nil, nil)
		}
	}
	if l.denied != nil && l.denied.deny(id, d) {
		if leased {
			l.settleLeases(d, id, false)
			l.leases.later(id, gives)
		}
		d.derive()
		return l.finish(ctx, d, id, SourceCache, 0, nil, nil)
	}
	took, left, err := l.send(ctx, d, id, reqs, gives)
	if err != nil {
		if leased {
			l.settleLeases(d, id, false)
		}
		if left {
			return err
		}
		return l.fail(ctx, d, id, took, err)
	}
	d.absorb()
	if leased {
		l.settleLeases(d, id, true)
	}
	if l.denied != nil {
		l.denied.record(id, d)
	}
	d.deniedCounted = true
	d.derive()
	return l.finish(ctx, d, id, SourceRedis, took, nil, nil)
}

// look fills d.results with where id stands against d's limits, counting
// nothing (Peek, PeekAll): each Result says what a request of cost 1 would
// get now. The leases of d's limits answer when every limit is Leased and
// each lease holds a unit; else Redis does or, when Redis fails, the failure
// policy; out through l.finish.
func (l *Limiter) look(ctx context.Context, d *decision, id string) error {
	d.cost = 0
	if err := l.begin(d, id, 1); err != nil { // checked as a request of cost 1
		return err
	}
	now := l.now().UnixMilli()
	if d.leased() && l.serveLeases(d, id, now, true) {
		d.derive()
		return l.finish(ctx, d, id, SourceLease, 0, nil, nil)
	}
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	reqs := l.build(d, id, now)
	took, left, err := l.send(ctx, d, id, reqs, nil)
	if left {
		return err
	}
	if err != nil {
		return l.fail(ctx, d, id, took, err)
	}
	d.absorb()
	d.derive()
	return l.finish(ctx, d, id, SourceRedis, took, nil, nil)
}

// leased reports whether some limit of d is Leased.
func (d *decision) leased() bool {
	for i := range d.limits {
		if d.limits[i].Leased {
			return true
		}
	}
	return false
}

// serveLeases decides d, if its every limit is Leased, from the leases
// alone when each holds what it needs, placing them on the clock at Unix ms
// now. It reports whether it did, with d's spans and replies filled for
// derive; if not, it has changed nothing.
func (l *Limiter) serveLeases(d *decision, id string, now int64, look bool) bool {
	// On the stack, as many as d has limits: zeroing maxLimits grants took
	// a third of a decision served from a lease (BenchmarkLeased).
	var asks1 [1]leaseAsk
	var grants1 [1]leaseGrant
	asks, grants := asks1[:], grants1[:]
	if n := len(d.limits); n > 1 {
		var asksN [maxLimits]leaseAsk
		var grantsN [maxLimits]leaseGrant
		asks, grants = asksN[:n], grantsN[:n]
	}
	for i, limit := range d.limits {
		if !limit.Leased {
			return false
		}
		asks[i] = leaseAsk{rate: limit.Rate, pos: locate(now, limit)}
	}
	n := len(d.limits)
	if !l.leases.serve(id, asks, max(d.cost, 1), look, grants) {
		return false
	}
	if len(d.spans) != n {
		d.spans = make([]span, n)
	}
	for i, limit := range d.limits {
		s := &d.spans[i]
		*s = span{at: i, rate: limit.Rate, shadow: limit.Shadow, pos: asks[i].pos}
		s.granted(&grants[i])
	}
	if len(d.replies) == 0 {
		d.replies = make([]script.Reply, 1)
	}
	d.replies = d.replies[:1]
	d.replies[0] = script.Reply{Allowed: !look}
	d.reqs = nil
	return true
}

// takeLeases prepares d, built for Redis, for its Leased limits: each takes
// from its lease what it holds of the cost (see leaseTable.take). A request
// whose every limit is decided from its lease is not sent: d.unsent has its
// bit. One that carries a Leased limit asks the script to lease: each
// Leased limit's arguments say what its grant asks Redis to count and to
// lease (nothing, when it is decided here), the others the cost. It returns
// the give-backs of leases whose window has passed, for the same call.
func (l *Limiter) takeLeases(d *decision, id string) []*script.Request {
	var asks [maxLimits]leaseAsk
	var grants [maxLimits]leaseGrant
	n := 0
	for i := range d.spans {
		if s := &d.spans[i]; d.limits[s.at].Leased {
			asks[n] = leaseAsk{rate: d.limits[s.at].Rate, pos: s.pos}
			n++
		}
	}
	gives := l.leases.take(id, asks[:n], d.cost, grants[:n])
	n = 0
	for i := range d.spans {
		if s := &d.spans[i]; d.limits[s.at].Leased {
			s.granted(&grants[n])
			n++
		}
	}
	d.unsent = 0
	for r, req := range d.reqs {
		local := true
		for i := range d.spans {
			if s := &d.spans[i]; s.req == r && !s.local {
				local = false
			}
		}
		if local {
			d.unsent |= 1 << r
			continue
		}
		leases := false
		for i := range d.spans {
			if s := &d.spans[i]; s.req == r && s.leased {
				leases = true
			}
		}
		if !leases {
			continue
		}
		req.Mode = script.ModeLease
		for i := range req.Limits {
			req.Limits[i].Need, req.Limits[i].Most = req.Cost, req.Cost
		}
		for i := range d.spans {
			if s := &d.spans[i]; s.req == r && s.leased {
				a := &req.Limits[s.arg]
				if s.local {
					a.Need, a.Most = 0, 0 // decided here, from its lease's counts
				} else {
					a.Need, a.Most = s.need, s.most
				}
			}
		}
	}
	return gives
}

// settleLeases ends what takeLeases began, once d's call is answered (ok)
// or has failed: each Leased limit's grant is allowed if its request was
// (or was not sent, decided from leases), with the counts Redis saw, at
// the key its request counts it in (see leaseTable.settle).
func (l *Limiter) settleLeases(d *decision, id string, ok bool) {
	var asks [maxLimits]leaseAsk
	var grants [maxLimits]leaseGrant
	var answers [maxLimits]leaseAnswer
	n := 0
	for i := range d.spans {
		s := &d.spans[i]
		if !s.leased {
			continue
		}
		asks[n] = leaseAsk{rate: s.rate, pos: s.pos, key: d.reqs[s.req].Keys[s.first]}
		grants[n] = s.grant()
		answers[n] = leaseAnswer{allowed: ok && (d.replies[s.req].Allowed || d.unsent&(1<<s.req) != 0), seen: s.seen}
		n++
	}
	l.leases.settle(id, asks[:n], grants[:n], answers[:n])
}

// begin starts decision d of id: it gives each of d.results its Limit,
// making them if the caller did not, and validates the client, id, limits
// and n, the cost they are checked at, before anything is sent; after
// Close, ErrClosed. A decision that goes on to Redis enters (see enter).
func (l *Limiter) begin(d *decision, id string, n int64) error {
	if d.results == nil {
		d.results = make([]Result, len(d.limits))
	}
	for i, limit := range d.limits {
		d.results[i].Limit = limit
	}
	if l.closed.Load() {
		return ErrClosed
	}
	return l.checkAll(id, d.limits, n)
}

// send sends reqs, d's requests as build made them, in one call after
// gives, give-backs of leases that travel with them (see sending); puts
// their replies in d.replies and counts the give-backs (see gaveBack). It
// returns how long the call took, for the Observer (0 without one, or when
// an open breaker made no call), and the error of the call or else of one
// of d's replies. When the caller left before Redis answered, there is no
// decision: the call's failure, if it fails, is reported when it comes
// (see reportLate), and send returns left true and ctx's error once ctx is
// done.
func (l *Limiter) send(ctx context.Context, d *decision, id string, reqs, gives []*script.Request) (took time.Duration, left bool, err error) {
	reqs, replies := d.sending(reqs, gives)
	took, left, err = l.call(ctx, d, id, reqs, replies)
	d.received(replies, len(gives))
	l.leases.gaveBack(ctx, id, gives, replies[:len(gives)], err)
	if err == nil {
		err = d.failed()
	}
	return took, left, err
}

// call is the one send of every operation: it sends reqs, requests of d, in
// one call through the transport, and their replies to out. It returns how
// long the call took, for the Observer (0 without one, or when an open
// breaker made no call), and the call's error. When the caller left before
// Redis answered, there is no decision: the call's failure, if it fails, is
// reported when it comes (see reportLate), what an Acquire may take is given back
// once the call ends, and call returns left true and ctx's error once ctx
// is done.
func (l *Limiter) call(ctx context.Context, d *decision, id string, reqs []*script.Request, out []script.Reply) (took time.Duration, left bool, err error) {
	var start time.Time
	if l.observer != nil {
		start = time.Now()
	}
	err = l.t.Do(ctx, reqs, out)
	if err == nil {
		if l.observer != nil {
			took = time.Since(start)
		}
		return took, false, nil
	}
	if gone := (*transport.CallerLeft)(nil); errors.As(err, &gone) { // gone is on the heap: not for every call
		l.reportLate(ctx, d, id, start, gone)
		<-ctx.Done() // at once, or as soon as the timer of a deadline just passed fires
		return 0, true, ctx.Err()
	}
	if l.observer != nil && !errors.Is(err, ErrCircuitOpen) { // an open breaker makes no call
		took = time.Since(start)
	}
	return took, false, err
}

// failed returns the error of the first of d's replies that has one: a
// request Redis could not decide, or whose reply made no sense.
func (d *decision) failed() error {
	for _, r := range d.replies {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

// build places d's limits on the clock at Unix ms now and makes its
// requests, which it returns: for a look, one request of cost 0 for every
// limit; for a charge, one that charges every limit; otherwise one for the
// enforced limits (if any), and one for each Shadow limit, which is counted
// when it alone admits the request. Nothing
// it stores in d is loaded from d: d may be on its caller's stack (see
// one), and Go's escape analysis tells no field of d from another.
func (l *Limiter) build(d *decision, id string, now int64) []*script.Request {
	if len(d.spans) == 1 { // set up by decideOne
		limit := d.limits[0]
		pos := locate(now, limit)
		d.spans[0] = span{rate: limit.Rate, shadow: limit.Shadow, pos: pos}
		w := &oneRequest{}
		w.args[0] = newLimitArgs(limit, pos)
		w.req = script.Request{Cost: d.cost, Mode: l.countDenied, NLimits: 1, Limits: w.args[:]}
		w.req.Keys = l.appendKeys(w.keys[:0], id, pos)
		w.reqs[0] = &w.req
		d.reqs = w.reqs[:]
		return w.reqs[:]
	}
	spans := make([]span, len(d.limits))
	enforced := &script.Request{Cost: d.cost, Mode: l.countDenied}
	if d.kind == EventCharge {
		enforced.Mode = script.ModeCharge // every limit, Shadow ones too
	}
	reqs := []*script.Request{enforced}
	for i, limit := range d.limits {
		r, at := enforced, 0
		if limit.Shadow && d.cost > 0 && d.kind != EventCharge {
			r, at = &script.Request{Cost: d.cost, Mode: l.countDenied}, len(reqs)
			reqs = append(reqs, r)
		}
		s := &spans[i]
		*s = span{at: i, rate: limit.Rate, shadow: limit.Shadow, pos: locate(now, limit), req: at, arg: len(r.Limits), first: len(r.Keys)}
		r.Limits = append(r.Limits, newLimitArgs(limit, s.pos))
		r.Keys = l.appendKeys(r.Keys, id, s.pos)
		r.NLimits++
	}
	if len(enforced.Limits) == 0 {
		reqs = reqs[1:]
		for i := range spans {
			spans[i].req--
		}
	}
	d.spans, d.reqs, d.replies = spans, reqs, make([]script.Reply, len(reqs))
	return reqs
}

// absorb copies the counts of each request's reply into its spans but
// those decided from leases, which hold their leases' counts: the counts as
// of the last lease and this process's use since, which their Results
// report (Redis's counts hold all of the lease, used or not).
func (d *decision) absorb() {
	for i := range d.spans {
		if s := &d.spans[i]; !s.local {
			copy(s.seen[:s.pos.keys()], d.replies[s.req].Counts[s.first:])
		}
	}
}

// sending returns the requests to send of reqs, d's (which it takes from its
// caller, not from d: see build): gives first, so that the requests after
// them see the counts they lower, then those not decided from leases; with
// their replies' places.
func (d *decision) sending(reqs, gives []*script.Request) ([]*script.Request, []script.Reply) {
	if d.unsent == 0 && len(gives) == 0 {
		return reqs, d.replies
	}
	send := append(make([]*script.Request, 0, len(reqs)+len(gives)), gives...)
	for r, req := range reqs {
		if d.unsent&(1<<r) == 0 {
			send = append(send, req)
		}
	}
	return send, make([]script.Reply, len(send))
}

// received puts the replies of the requests sending returned, after those
// of its gives, in d.replies, and allows the requests decided from leases.
func (d *decision) received(replies []script.Reply, gives int) {
	if len(replies) > 0 && &replies[0] == &d.replies[0] {
		return
	}
	replies = replies[min(gives, len(replies)):]
	for r := range d.reqs {
		if d.unsent&(1<<r) != 0 {
			d.replies[r] = script.Reply{Allowed: true}
			continue
		}
		d.replies[r], replies = replies[0], replies[1:]
	}
}

// derive fills d.results from the counts each span holds and the decision of
// each request: the one decision is that of the enforced limits (all of
// them admit the cost; true if there are none), and each Shadow limit
// reports whether it admitted the cost on its own. When the script counted
// denied requests, a denied request's Results describe the counts as the
// script left them, as Result says: Count with what was counted, and
// RetryAfter the wait until the same request would pass.
func (d *decision) derive() {
	look := d.cost == 0
	n := max(d.cost, 1)
	d.allowed, d.refused = true, 0
	for i := range d.spans {
		s := &d.spans[i]
		allowed := d.replies[s.req].Allowed
		counted := allowed && !look
		var added int64
		if d.deniedCounted && !allowed && !look && d.reqs[s.req].Mode == script.ModeCountDenied && !d.never(s.req) {
			added = max(0, min(d.cost, s.rate-s.seen[0])) // as the script adds
		}
		want := s.want(n)
		if n > s.rate {
			want = n // never admitted, leased or not: RetryAfter is InfDuration
		}
		res := s.result(d.limits[s.at], want, counted, added)
		if counted {
			// all of n, leased or not
			res.receipt = newReceipt(res.Limit, s.pos, n, res.receipt.refill)
		}
		fits := counted || s.pos.estimate(&s.seen)+want <= s.rate
		if !fits {
			d.refused |= 1 << s.at
		}
		ok := counted || look && fits
		if s.shadow {
			res.Shadowed = !ok
		} else if !ok {
			d.allowed = false
		}
		d.results[s.at] = res
	}
	d.apply()
}

// apply gives every Result the one decision, d.allowed: an allowed
// request's enforced limits wait for nothing.
func (d *decision) apply() {
	for i := range d.results {
		r := &d.results[i]
		r.Allowed = d.allowed
		if d.allowed && !r.Limit.Shadow {
			r.RetryAfter = 0
		}
	}
}

// never reports whether some limit of request i can never admit its cost:
// then a denial of it is counted nowhere, as the script does.
func (d *decision) never(i int) bool {
	for _, a := range d.reqs[i].Limits {
		if d.reqs[i].Cost > a.Rate {
			return true
		}
	}
	return false
}

// result derives the Result of one limit, the span's, from the counts the
// script saw, for a request of cost n that this limit counted or not, and of
// which the script added added to the current count even so (a denial
// counted). Allowed is left to the decision.
func (s *span) result(limit Limit, n int64, counted bool, added int64) Result {
	c := s.seen
	c[0] += added
	r := Result{Limit: limit, Count: s.pos.estimate(&c)}
	if counted {
		c[0] += n
		r.Count += n
		r.receipt.refill = s.pos.waitUntil(&c, r.Count-1) // the receipt's, which the caller completes
	} else {
		r.RetryAfter = s.pos.waitUntil(&c, s.rate-n)
	}
	r.Remaining = max(0, s.rate-r.Count)
	r.ResetAfter = s.pos.waitUntil(&c, 0)
	return r
}

// finish is the one way out of every decision, an Acquire's too: shadow
// mode lets a denied decision through, and the observer sees it. redisErr is what Redis
// failed with, if it did; err is what the caller is to get.
func (l *Limiter) finish(ctx context.Context, d *decision, id string, src Source, took time.Duration, redisErr, err error) error {
	var h uint64 // idHash(id), once, if some Result counted
	for i := range d.results {
		if r := &d.results[i].receipt; r.counted > 0 {
			if r.id == 0 { // AllowMany's have their own ids'
				if h == 0 {
					h = idHash(id)
				}
				r.id = h
			}
			r.by = l.serial
		}
	}
	shadowed := false
	if l.shadow && !d.allowed {
		shadowed, err = true, nil
		for i := range d.results {
			r := &d.results[i]
			// the limits that denied, or all when the failure policy did
			r.Allowed, r.Shadowed = true, r.Shadowed || r.Degraded || d.refused&(1<<i) != 0
		}
		if s := d.slot; s != nil { // acquired, holding nothing
			s.Acquired, s.RetryAfter, s.held = true, 0, slotHeld{l: l, id: id}
		}
	}
	if s := d.slot; s != nil {
		s.Remaining = max(0, s.Concurrency.Max-s.InFlight)
		if s.held.redis || s.held.local {
			l.slotsAcquired.Add(1)
		}
	}
	if l.observer != nil {
		l.observe(ctx, d, id, src, took, redisErr, shadowed || d.allowed)
	}
	return err
}
