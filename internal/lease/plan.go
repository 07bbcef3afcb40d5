// A decision's plan and the table: its spans of Leased limits served from
// their leases, or taken from them on the way to Redis and settled once
// answered.

package lease

import (
	"context"
	"time"

	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// ServePlan decides p (a look when look), if its every span is of a
// limit that leases (Span.Lease), from their leases alone when each holds
// the span's cost (a look's, 1). It reports whether it did, with p's spans
// and replies filled for the plan to derive; if not, it has changed
// nothing. A decision (not a look) that finds a lease short while a refill
// of it is in flight may wait for that refill, ctx or Config.Wait, and
// try once more (see Table); a caller who left is then told so by its
// call.
func (t *Table) ServePlan(ctx context.Context, p *plan.Plan, look bool) bool {
	// On the stack, as many as there are spans: zeroing plan.MaxLimits
	// grants took a third of a decision served from a lease
	// (BenchmarkLeased).
	var asks1 [1]Ask
	var grants1 [1]Grant
	asks, grants := asks1[:], grants1[:]
	if n := len(p.Spans); n > 1 {
		var asksN [plan.MaxLimits]Ask
		var grantsN [plan.MaxLimits]Grant
		asks, grants = asksN[:n], grantsN[:n]
	}
	for i := range p.Spans {
		s := &p.Spans[i]
		if !s.Lease {
			return false
		}
		a := &asks[i] // zero; field by field, as a literal is copied from a temporary
		a.ID, a.Rate, a.N, a.Pos = s.ID, s.Rate, max(s.Cost, 1), s.Pos
	}
	served, wait := t.serve(asks, look, grants)
	if !served && wait != nil && !look && t.cfg.Wait > 0 {
		if !t.await(ctx, wait) || ctx.Err() != nil {
			return false
		}
		served, _ = t.serve(asks, look, grants)
	}
	if !served {
		return false
	}
	for i := range p.Spans {
		s, g := &p.Spans[i], &grants[i]
		s.Granted, s.Local, s.Need, s.Seen, s.Req = true, true, g.Need, g.Seen, 0
	}
	if len(p.Replies) == 0 {
		p.Replies = make([]script.Reply, 1)
	}
	p.Replies = p.Replies[:1]
	p.Replies[0] = script.Reply{Allowed: !look}
	p.Reqs = nil
	return true
}

// await waits for f to settle, ctx to end or Config.Wait to pass, and
// reports whether f settled.
func (t *Table) await(ctx context.Context, f *refill) bool {
	timer := time.NewTimer(t.cfg.Wait)
	defer timer.Stop()
	select {
	case <-f.done:
		return true
	case <-ctx.Done():
	case <-timer.C:
	}
	return false
}

// Taken is what the table granted the spans of a plan on its way to Redis,
// for its caller's stack: at[j] is the span of asks[j] and grants[j], for
// j below n.
type Taken struct {
	t       *Table
	n       int
	settled bool
	at      [plan.MaxLimits]int
	asks    [plan.MaxLimits]Ask
	grants  [plan.MaxLimits]Grant
}

// TakePlan takes from the leases of p's spans whose limits lease what they
// hold of their costs, marks each span with its grant (see Take), and
// keeps the grants in tk, which Settle ends. It returns the give-backs of
// leases whose window has passed, for the same call; or, when later (the
// spans are of several ids, whose keys a call may not hold together), it
// leaves them to the sweeper, each under its own id.
func (t *Table) TakePlan(p *plan.Plan, tk *Taken, later bool) []*script.Request {
	tk.t, tk.n, tk.settled = t, 0, false
	for i := range p.Spans {
		if s := &p.Spans[i]; s.Lease {
			tk.at[tk.n] = i
			tk.asks[tk.n] = Ask{ID: s.ID, Rate: s.Rate, N: s.Cost, Pos: s.Pos}
			tk.n++
		}
	}
	gives := t.Take(tk.asks[:tk.n], tk.grants[:tk.n], later)
	for j, i := range tk.at[:tk.n] {
		s, g := &p.Spans[i], &tk.grants[j]
		s.Granted, s.Local, s.Need, s.Most = true, g.Local, g.Need, g.Most
		if g.Local {
			s.Seen = g.Seen
		}
	}
	return gives
}

// Settle ends what TakePlan began, once p's call is answered (ok) or has
// failed, or p was decided without one: each grant is allowed if its
// request was (or was not sent, decided from leases), with the counts
// Redis saw, at the key its request counts it in (see Table.Settle). It
// does nothing if TakePlan took nothing, or once tk is settled.
func (tk *Taken) Settle(p *plan.Plan, ok bool) {
	if tk.t == nil || tk.settled {
		return
	}
	tk.settled = true
	var answers [plan.MaxLimits]Answer
	for j, i := range tk.at[:tk.n] {
		s := &p.Spans[i]
		tk.asks[j].Key = p.Reqs[s.Req].Keys[s.First]
		answers[j] = Answer{Allowed: ok && (p.Replies[s.Req].Allowed || p.Unsent&(1<<s.Req) != 0), Seen: s.Seen}
	}
	tk.t.Settle(tk.asks[:tk.n], tk.grants[:tk.n], answers[:tk.n])
}

// Abandon ends what TakePlan began if tk is not settled: for a decision's
// defer, should it panic between the two. What its grants took is lost,
// and their refills end (see Table.abandon).
func (tk *Taken) Abandon() {
	if tk.t == nil || tk.settled {
		return
	}
	tk.settled = true
	tk.t.abandon(tk.asks[:tk.n], tk.grants[:tk.n])
}
