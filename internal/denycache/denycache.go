// Package denycache is the deny cache (the root's WithDenyCache): denials
// made from counts Redis reported earlier, without a round trip.
package denycache

import (
	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/table"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// Cache remembers, per id and limit window, the counts Redis last reported
// for a client that Redis denied, so that the same client's next requests
// can be denied without a round trip.
//
// It never denies what Redis would allow while counts only grow within a
// window, so that the counts a decision saw are lower bounds of the counts
// now, and an estimate made from them is a lower bound of the estimate Redis
// would make. What lowers a count forgets the id's entry: a Reset, a Refund,
// a lease's give-back in this process. Another process's refund or
// give-back, or a decision in flight as this process's lands, can leave an
// entry a little high until its window has passed: a denial that Redis
// would not make, never an admission it would refuse. A request that the
// lower bound already denies, Redis would deny too. A request it would
// allow goes to Redis, whose answer refreshes the entry. The outcomes of a
// local denial are derived from those lower bounds. A Cache is safe for
// simultaneous use.
type Cache struct {
	table *table.Table
}

// MaxID bounds the memory of one entry: longer ids always go to Redis.
const MaxID = 256

// New returns a cache of at most about maxEntries entries.
func New(maxEntries int) *Cache { return &Cache{table: table.New(maxEntries)} }

// Deny reports whether the counts cached for the ids of p's spans already
// deny the decision, and if so fills its spans with them (zero where
// nothing is cached: a lower bound too) and marks its requests denied. A
// decision of several requests (but an AllowMany's, many) or with a Shadow
// limit always goes to Redis, which counts the shadow limit when it alone
// admits the request.
func (c *Cache) Deny(p *plan.Plan, many bool) bool {
	if len(p.Reqs) != 1 && !many {
		return false
	}
	denied := false
	for i := range p.Spans {
		s := &p.Spans[i]
		if s.Shadow {
			return false
		}
		if s.Local {
			continue // its lease admits it
		}
		e, ok := c.table.Get(s.ID, s.Pos)
		if !ok {
			continue
		}
		if seen, ok := e.At(s.Pos); ok && s.Pos.Estimate(&seen) > s.Rate-s.Want(s.Cost) {
			denied = true
		}
	}
	if !denied {
		return false
	}
	for i := range p.Spans {
		s := &p.Spans[i]
		s.Seen = window.Counts{}
		if e, ok := c.table.Get(s.ID, s.Pos); ok {
			s.Seen, _ = e.At(s.Pos)
		}
	}
	for r := range p.Replies {
		p.Replies[r] = script.Reply{}
	}
	return true
}

// Record keeps what Redis reported for p's decision: always when it denied,
// and to refresh an entry already cached when it allowed; and when a
// charge pushed a limit over (bit i of over for span i).
func (c *Cache) Record(p *plan.Plan, over uint32) {
	for i := range p.Spans {
		s := &p.Spans[i]
		if len(s.ID) > MaxID {
			continue
		}
		allowed := p.Replies[s.Req].Allowed
		seen := s.Seen
		if allowed {
			seen[0] += s.Want(s.Cost)
		}
		pushed := over&(1<<i) != 0
		c.table.Update(s.ID, s.Pos, func(_ table.Entry, cached bool) (table.Entry, bool) {
			return table.Entry{I: s.Pos.I, W: s.Pos.W, Counts: seen}, cached || !allowed || pushed
		})
	}
}

// Forget drops what is cached for id and the limit placed at p.
func (c *Cache) Forget(id string, p window.Position) { c.table.Delete(id, p) }

// Size returns the number of entries.
func (c *Cache) Size() int { return c.table.Size() }
