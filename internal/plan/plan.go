// Package plan builds a decision's requests and derives its outcomes from
// the counts Redis saw: pure functions of their inputs. A Plan holds one
// decision's limits placed on the clock (its spans), the requests that
// carry them, and their replies; the deny cache, FailLocal and the leases
// read and fill its spans around the send, and the root turns its outcomes
// into Results.
package plan

import (
	"time"

	"github.com/slidingwindow/ratelimit/internal/keys"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// MaxLimits is the most limits one decision takes: each adds its keys and
// four arguments to the one script call; real plans have two to four.
const MaxLimits = 16

// Plan is one decision (a decide, look, charge or AllowMany) on its way:
// one span per limit, in the caller's order; the requests that carry them
// (see Build, BuildCharge, BuildMany); and one reply per request, from
// Redis, the deny cache, FailLocal or the leases.
type Plan struct {
	Spans   []Span
	Reqs    []*script.Request
	Replies []script.Reply
	// Unsent has bit r set when Reqs[r] is not sent: each of its limits
	// is decided from its lease.
	Unsent uint32
}

// Span is one limit of a decision: where the clock stands in its windows,
// which request carries it, and the counts that request's reply says the
// script saw.
type Span struct {
	ID     string // the id its limit counts under
	Rate   int64  // the limit's Rate, or under FailLocal its share
	Cost   int64  // what the request costs it; 0 for a look
	Shadow bool   // the limit's Shadow
	Pos    window.Position
	Req    int // index in Reqs of the request that carries it
	Arg    int // index of its script.LimitArgs in that request's Limits
	First  int // index of its first key in that request's Keys
	Seen   window.Counts
	// Lease: its limit is Leased, and a lease of its id may decide it (not
	// an AllowMany's quota of cost 0). Granted when its lease did, as the
	// lease package fills it: Need of its cost is asked of Redis (its
	// lease holds the rest), and Most at most to count for the lease;
	// Local when its lease holds all of it, and then Seen are the lease's
	// counts.
	Lease, Granted, Local bool
	Need, Most            int64
}

// Want returns what a request of cost n adds to the span's count as its
// Result counts it: n, or for a limit its lease granted what it asked
// Redis to count (held units were counted when they were leased).
func (s *Span) Want(n int64) int64 {
	if s.Granted {
		return s.Need
	}
	return n
}

// Out is what a plan derives for one limit: a Result's numbers. Counted
// is what the limit counted of the request (0 for nothing), in window
// Window (its position's index), and Refill, if it counted, the wait until
// its count falls.
type Out struct {
	Allowed, Shadowed bool
	Count, Remaining  int64
	RetryAfter        time.Duration
	ResetAfter        time.Duration
	Counted, Window   int64
	Refill            time.Duration
}

// One holds the plan of a decision of one limit, and its outcome, for its
// caller's stack; its Plan beside it, as a plan pointing into itself would
// go to the heap: Plan{Spans: o.Spans[:], Replies: o.Replies[:]}. (A
// method returning it cost a tenth of a decision served from a lease,
// BenchmarkLeased: its copy's loads stalled on the stores that made it.)
type One struct {
	Outs    [1]Out
	Spans   [1]Span
	Replies [1]script.Reply
}

// one is what a decision of one limit sends to Redis, in one allocation: its
// request and what the call's arguments point to.
type one struct {
	req  script.Request
	reqs [1]*script.Request
	args [1]script.LimitArgs
	keys [2]string
}

// Build makes the requests of a decision (a look when its spans' Cost is
// 0) of id's limits, placed in p.Spans with their rates: one request for
// the enforced limits (if any), and for a decision of a cost, one for each
// Shadow limit, which is counted when it alone admits the request; each of
// mode, ModeCount or ModeCountDenied. Every request of a look costs 0.
// When leased (some span was Granted), a request that carries a limit its
// lease granted asks the script to lease (see leaseArgs), and one whose
// every limit is decided from its lease is not sent.
//
// It returns the requests it stores in p.Reqs: the caller sends those,
// not p's. p may be on its caller's stack beside what its spans and replies
// point to, and Go's escape analysis tells no field of p from another: what
// is sent goes to the heap, and what is loaded from p would take p along.
func (p *Plan) Build(k keys.Keys, id string, mode uint8, leased bool) []*script.Request {
	var reqs []*script.Request
	if len(p.Spans) == 1 {
		s := &p.Spans[0]
		w := &one{}
		w.args[0] = script.Args(s.Rate, s.Pos)
		w.req = script.Request{Cost: s.Cost, Mode: mode, NLimits: 1, Limits: w.args[:]}
		w.req.Keys = k.Append(w.keys[:0], id, s.Pos)
		w.reqs[0] = &w.req
		s.Req, s.Arg, s.First = 0, 0, 0
		reqs = w.reqs[:]
	} else {
		reqs = p.build(k, mode)
	}
	p.Reqs = reqs
	if leased {
		p.leaseArgs()
	}
	return reqs
}

// build makes the requests of Build for several limits.
func (p *Plan) build(k keys.Keys, mode uint8) []*script.Request {
	cost := p.Spans[0].Cost
	enforced := &script.Request{Cost: cost, Mode: mode}
	reqs := []*script.Request{enforced}
	for i := range p.Spans {
		s := &p.Spans[i]
		r, at := enforced, 0
		if s.Shadow && cost > 0 {
			r, at = &script.Request{Cost: cost, Mode: mode}, len(reqs)
			reqs = append(reqs, r)
		}
		p.add(k, r, at, s)
	}
	return dropEmpty(reqs, p.Spans)
}

// leaseArgs makes each request of a decision that carries a limit its
// lease granted ask the script to lease (ModeLease): each such limit's
// arguments say what its lease asks Redis to count and to lease at most
// (nothing, when it is decided from its lease), the others the cost. A
// request whose every limit is decided from its lease is not sent: Unsent
// has its bit.
func (p *Plan) leaseArgs() {
	p.Unsent = 0
	for r, req := range p.Reqs {
		local, leased := true, false
		for i := range p.Spans {
			if s := &p.Spans[i]; s.Req == r {
				local, leased = local && s.Local, leased || s.Granted
			}
		}
		if local {
			p.Unsent |= 1 << r
			continue
		}
		if !leased {
			continue
		}
		req.Mode = script.ModeLease
		for i := range req.Limits {
			req.Limits[i].Need, req.Limits[i].Most = req.Cost, req.Cost
		}
		for i := range p.Spans {
			if s := &p.Spans[i]; s.Req == r && s.Granted {
				a := &req.Limits[s.Arg]
				a.Need, a.Most = s.Need, s.Most
				if s.Local {
					a.Need, a.Most = 0, 0 // decided here, from its lease's counts
				}
			}
		}
	}
}

// BuildCharge makes the one request of a charge of id's limits, placed in
// p.Spans: every limit, Shadow ones too, counts the cost whatever its
// counts. It returns p.Reqs, as Build does.
func (p *Plan) BuildCharge(k keys.Keys, id string) []*script.Request {
	r := &script.Request{Cost: p.Spans[0].Cost, Mode: script.ModeCharge}
	for i := range p.Spans {
		p.add(k, r, 0, &p.Spans[i])
	}
	p.Reqs = []*script.Request{r}
	return p.Reqs
}

// add adds span s, of id, to r, the request at index at.
func (p *Plan) add(k keys.Keys, r *script.Request, at int, s *Span) {
	s.Req, s.Arg, s.First = at, len(r.Limits), len(r.Keys)
	r.Limits = append(r.Limits, script.Args(s.Rate, s.Pos))
	r.Keys = k.Append(r.Keys, s.ID, s.Pos)
	r.NLimits++
}

// dropEmpty returns reqs without the first, the enforced limits' request,
// when it carries none (every limit is Shadow), and renumbers spans.
func dropEmpty(reqs []*script.Request, spans []Span) []*script.Request {
	if len(reqs[0].Limits) > 0 {
		return reqs
	}
	for i := range spans {
		spans[i].Req--
	}
	return reqs[1:]
}

// Absorb copies the counts of each request's reply into its spans but
// those decided from leases, which hold their leases' counts: the counts as
// of the last lease and this process's use since, which their outcomes
// report (Redis's counts hold all of the lease, used or not).
func (p *Plan) Absorb() {
	for i := range p.Spans {
		if s := &p.Spans[i]; !s.Local {
			copy(s.Seen[:s.Pos.Keys()], p.Replies[s.Req].Counts[s.First:])
		}
	}
}

// Failed returns the error of the first of the replies that has one: a
// request Redis could not decide, or whose reply made no sense.
func (p *Plan) Failed() error {
	for _, r := range p.Replies {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

// Sending returns the requests to send of reqs, p's as Build returned them,
// gives first (give-backs that travel with them, so that the requests
// after them see the counts they lower), then those not decided from
// leases; with their replies' places.
func (p *Plan) Sending(reqs, gives []*script.Request) ([]*script.Request, []script.Reply) {
	if p.Unsent == 0 && len(gives) == 0 {
		return reqs, p.Replies
	}
	send := append(make([]*script.Request, 0, len(reqs)+len(gives)), gives...)
	for r, req := range reqs {
		if p.Unsent&(1<<r) == 0 {
			send = append(send, req)
		}
	}
	return send, make([]script.Reply, len(send))
}

// Received puts the replies of the requests Sending returned, after those
// of its gives, in p.Replies, and allows the requests decided from leases.
func (p *Plan) Received(replies []script.Reply, gives int) {
	if len(replies) > 0 && &replies[0] == &p.Replies[0] {
		return
	}
	replies = replies[min(gives, len(replies)):]
	for r := range p.Reqs {
		if p.Unsent&(1<<r) != 0 {
			p.Replies[r] = script.Reply{Allowed: true}
			continue
		}
		p.Replies[r], replies = replies[0], replies[1:]
	}
}

// Derive fills out, one per span at the span's index, with the outcomes of
// a decision (a look, when the spans' Cost is 0) from the counts each span
// holds and the answer to each request: the one decision is that of the
// enforced limits (all of them admit the cost; true if there are none),
// and each Shadow limit reports whether it admitted the cost on its own.
// When the script counted denied requests (countedDenied), a denied
// request's outcomes describe the counts as the script left them: Count
// with what was counted, and RetryAfter the wait until the same request
// would pass. It returns the decision, and refused, with bit i set when
// limit i did not admit the request (for a look, a cost of 1).
func (p *Plan) Derive(countedDenied bool, out []Out) (allowed bool, refused uint32) {
	allowed = true
	for i := range p.Spans {
		s := &p.Spans[i]
		look := s.Cost == 0
		n := max(s.Cost, 1)
		ok := p.Replies[s.Req].Allowed
		counted := ok && !look
		var added int64
		if countedDenied && !ok && !look && p.Reqs[s.Req].Mode == script.ModeCountDenied && !never(p.Reqs[s.Req]) {
			added = max(0, min(s.Cost, s.Rate-s.Seen[0])) // as the script adds
		}
		want := s.Want(n)
		if n > s.Rate {
			want = n // never admitted, leased or not: RetryAfter is Never
		}
		o := s.out(want, counted, added)
		if counted {
			o.Counted = n // all of n, leased or not
		}
		fits := counted || s.Pos.Estimate(&s.Seen)+want <= s.Rate
		if !fits {
			refused |= 1 << i
		}
		admitted := counted || look && fits
		if s.Shadow {
			o.Shadowed = !admitted
		} else if !admitted {
			allowed = false
		}
		out[i] = o
	}
	apply(p.Spans, out, allowed)
	return allowed, refused
}

// apply gives every outcome the one decision: an allowed request's
// enforced limits wait for nothing.
func apply(spans []Span, out []Out, allowed bool) {
	for i := range out {
		out[i].Allowed = allowed
		if allowed && !spans[i].Shadow {
			out[i].RetryAfter = 0
		}
	}
}

// never reports whether some limit of r can never admit its cost: then a
// denial of it is counted nowhere, as the script does.
func never(r *script.Request) bool {
	for _, a := range r.Limits {
		if r.Cost > a.Rate {
			return true
		}
	}
	return false
}

// out derives the outcome of one limit, the span's, from the counts the
// script saw, for a request of cost n that this limit counted or not, and
// of which the script added added to the current count even so (a denial
// counted). Allowed is left to the decision.
func (s *Span) out(n int64, counted bool, added int64) Out {
	c := s.Seen
	c[0] += added
	o := Out{Count: s.Pos.Estimate(&c)}
	if counted {
		c[0] += n
		o.Count += n
		o.Refill = s.Pos.WaitUntil(&c, o.Count-1)
		o.Window = s.Pos.I
	} else {
		o.RetryAfter = s.Pos.WaitUntil(&c, s.Rate-n)
	}
	o.Remaining = max(0, s.Rate-o.Count)
	o.ResetAfter = s.Pos.WaitUntil(&c, 0)
	return o
}

// DeriveCharge fills out with the outcomes of a charge from the counts the
// script saw before it: each limit counted the cost, and Allowed says
// whether a request of cost 1 would pass every limit but the Shadow ones,
// whose Shadowed says whether it would pass that one. Refused is as
// Derive's.
func (p *Plan) DeriveCharge(out []Out) (allowed bool, refused uint32) {
	allowed = true
	for i := range p.Spans {
		s := &p.Spans[i]
		c := s.Seen
		c[0] += s.Cost
		count := s.Pos.Estimate(&c)
		o := Out{Count: count, Remaining: max(0, s.Rate-count),
			RetryAfter: s.Pos.WaitUntil(&c, s.Rate-1), ResetAfter: s.Pos.WaitUntil(&c, 0),
			Counted: s.Cost, Window: s.Pos.I, Refill: s.Pos.WaitUntil(&c, count-1)}
		if count+1 > s.Rate {
			refused |= 1 << i
			if s.Shadow {
				o.Shadowed = true
			} else {
				allowed = false
			}
		}
		out[i] = o
	}
	for i := range out {
		out[i].Allowed = allowed
	}
	return allowed, refused
}
