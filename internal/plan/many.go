// AllowMany's plan: one request per hash slot, each quota its own id and
// cost.

package plan

import (
	"github.com/slidingwindow/ratelimit/internal/keys"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// BuildMany makes the requests of a decision of several ids' quotas,
// placed in p.Spans with their ids, rates and costs: per hash slot (slot
// gives a key's; nil when every key is on one Redis), one request of its
// enforced quotas and one for each Shadow quota. Each request is of
// ModeLease, in which each limit counts its own need: a quota's Cost (a
// Leased one's Need), or for a Cost of 0 nothing, admitted while its usage
// is at most its rate (asked as a need of 1 against a rate one higher);
// or, when every quota has one cost of 1 or more and none is Leased, of
// ModeCount with that cost, a shorter call. It returns the requests of
// each hash slot, as indexes into p.Reqs, the first one's first.
func (p *Plan) BuildMany(k keys.Keys, slot func(key string) int) [][]int {
	var groups [][]int
	groupOf := map[int]int{}  // hash slot -> index in groups
	enforced := map[int]int{} // hash slot -> its enforced request, in p.Reqs
	for i := range p.Spans {
		s := &p.Spans[i]
		keys := k.Append(nil, s.ID, s.Pos)
		hash := 0
		if slot != nil {
			hash = slot(keys[0])
		}
		g, ok := groupOf[hash]
		if !ok {
			g = len(groups)
			groupOf[hash] = g
			groups = append(groups, nil)
		}
		r, ok := enforced[hash]
		if s.Shadow || !ok {
			r = len(p.Reqs)
			p.Reqs = append(p.Reqs, &script.Request{Cost: 1, Mode: script.ModeLease})
			groups[g] = append(groups[g], r)
			if !s.Shadow {
				enforced[hash] = r
			}
			p.Unsent |= 1 << r // until it carries a limit its lease does not decide
		}
		req := p.Reqs[r]
		a := script.Args(s.Rate, s.Pos)
		a.Need, a.Most = s.Cost, s.Cost
		switch {
		case s.Local:
			a.Need, a.Most = 0, 0 // decided here, from its lease's counts
		case s.Granted:
			a.Need, a.Most = s.Need, s.Most
		case s.Cost == 0:
			a.Rate, a.Need = a.Rate+1, 1 // admitted while usage <= rate; counts nothing
		}
		req.Cost = max(req.Cost, s.Cost)
		if !s.Local {
			p.Unsent &^= 1 << r
		}
		s.Req, s.Arg, s.First = r, len(req.Limits), len(req.Keys)
		req.Limits = append(req.Limits, a)
		req.Keys = append(req.Keys, keys...)
		req.NLimits++
	}
	if same := sameCost(p.Spans); same > 0 { // every limit counts the request's cost: no need or most to send
		for _, req := range p.Reqs {
			req.Mode, req.Cost = script.ModeCount, same
		}
	}
	return groups
}

// sameCost returns the cost every span shares, when it is at least 1 and
// none is Leased (a lease asks for more than its need); else 0.
func sameCost(spans []Span) int64 {
	c := spans[0].Cost
	for _, s := range spans {
		if s.Cost != c || s.Granted {
			return 0
		}
	}
	return c
}

// Counted returns what the request of span s counted of its limit, once
// allowed: its cost, or for a Leased span what it leased (its need and
// the rest of its lease, as the script grants it at the counts it saw).
func (p *Plan) Counted(s *Span) int64 {
	if !s.Granted || s.Local {
		return s.Cost
	}
	var c window.Counts
	copy(c[:s.Pos.Keys()], p.Replies[s.Req].Counts[s.First:])
	a := &p.Reqs[s.Req].Limits[s.Arg]
	return script.Granted(a.Need, a.Most, s.Rate, s.Pos.Estimate(&c))
}

// DeriveMany fills out with the outcomes of an AllowMany, from the counts
// each span holds and the answer to each request, as Derive does
// AllowAll's: each quota with its own cost. Refused is as Derive's.
func (p *Plan) DeriveMany(out []Out) (allowed bool, refused uint32) {
	allowed = true
	for i := range p.Spans {
		if s := &p.Spans[i]; !s.Shadow && !p.Replies[s.Req].Allowed {
			allowed = false
		}
	}
	for i := range p.Spans {
		s := &p.Spans[i]
		ok := p.Replies[s.Req].Allowed && (s.Shadow || allowed)
		counted := ok && s.Cost > 0
		o := s.out(s.Want(s.Cost), counted, 0)
		if counted {
			o.Counted = s.Cost
		}
		if !counted && s.Pos.Estimate(&s.Seen)+s.Want(s.Cost) > s.Rate {
			refused |= 1 << i
		}
		if s.Shadow {
			o.Shadowed = !ok
		}
		out[i] = o
	}
	apply(p.Spans, out, allowed)
	return allowed, refused
}

// Group returns the requests of a hash slot's group, as indexes into
// p.Reqs, that are sent, and their indexes; the others are decided from
// leases, and allowed.
func (p *Plan) Group(group []int) (reqs []*script.Request, at []int) {
	for _, r := range group {
		if p.Unsent&(1<<r) == 0 {
			reqs, at = append(reqs, p.Reqs[r]), append(at, r)
		} else {
			p.Replies[r] = script.Reply{Allowed: true}
		}
	}
	return reqs, at
}

// Refused returns, if the decision was refused (some enforced request was
// not allowed, or failed), the give-backs of what the enforced requests
// of p that were allowed counted, one per key, each quota in the window it
// counted in (none for a quota decided from its lease: what it took goes
// back to its lease), and marks them refused: the decision's other hash
// slots refused it.
func (p *Plan) Refused(failed bool) []*script.Request {
	refused := failed
	for i := range p.Spans {
		if s := &p.Spans[i]; !s.Shadow && !p.Replies[s.Req].Allowed {
			refused = true
		}
	}
	if !refused {
		return nil
	}
	var gives []*script.Request
	for i := range p.Spans {
		s := &p.Spans[i]
		if !s.Shadow && !s.Local && p.Replies[s.Req].Allowed && s.Cost > 0 {
			gives = append(gives, script.GiveBack(p.Counted(s), p.Reqs[s.Req].Keys[s.First]))
		}
	}
	for i := range p.Spans {
		if s := &p.Spans[i]; !s.Shadow {
			p.Replies[s.Req].Allowed = false
			p.Unsent &^= 1 << s.Req // refused, whether its leases decided it or not
		}
	}
	return gives
}
