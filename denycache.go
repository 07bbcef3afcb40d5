// The deny cache (WithDenyCache): denials made from counts Redis reported
// earlier, without a round trip.

package ratelimit

import "github.com/slidingwindow/ratelimit/internal/script"

// denyCache remembers, per id and limit window, the counts Redis last
// reported for a client that Redis denied, so that the same client's next
// requests can be denied without a round trip.
//
// It never denies what Redis would allow while counts only grow within a
// window, so that the counts a decision saw are lower bounds of the counts
// now, and an estimate made from them is a lower bound of the estimate Redis
// would make. What lowers a count forgets the id's entry: a Reset, a Refund,
// a lease's give-back in this process. Another process's refund or
// give-back, or a decision in flight as this process's lands, can leave an
// entry a little high until its window has passed: a denial that Redis
// would not make, never an admission it would refuse. A request that the lower
// bound already denies, Redis would deny too. A request it would allow goes
// to Redis, whose answer refreshes the entry. The Results of a local denial
// are derived from those lower bounds.
type denyCache struct {
	table *windowTable
}

// maxCachedID bounds the memory of one entry: longer ids always go to Redis.
const maxCachedID = 256

func newDenyCache(maxEntries int) *denyCache {
	return &denyCache{table: newWindowTable(maxEntries)}
}

// deny reports whether the counts cached for id (for AllowMany's, each
// quota's ID) already deny decision d, and if so fills its spans with them
// (zero where nothing is cached: a lower bound too) and marks its requests
// denied. A decision with a Shadow limit always goes to Redis, which counts
// the shadow limit when it alone admits the request.
func (c *denyCache) deny(id string, d *decision) bool {
	if len(d.reqs) != 1 && d.quotas == nil {
		return false
	}
	denied := false
	for i := range d.spans {
		s := &d.spans[i]
		if s.shadow {
			return false
		}
		if s.local {
			continue // its lease admits it
		}
		e, ok := c.table.get(d.spanID(s, id), s.pos)
		if !ok {
			continue
		}
		if seen, ok := e.at(s.pos); ok && s.pos.estimate(&seen) > s.rate-s.want(d.spanCost(s)) {
			denied = true
		}
	}
	if !denied {
		return false
	}
	for i := range d.spans {
		s := &d.spans[i]
		s.seen = counts{}
		if e, ok := c.table.get(d.spanID(s, id), s.pos); ok {
			s.seen, _ = e.at(s.pos)
		}
	}
	for r := range d.replies {
		d.replies[r] = script.Reply{}
	}
	return true
}

// spanID returns the id the span's limit counts under: its quota's, for
// AllowMany's, else the decision's, id.
func (d *decision) spanID(s *span, id string) string {
	if d.quotas != nil {
		return d.quotas[s.at].ID
	}
	return id
}

// spanCost returns what the span's request costs its limit: its quota's
// Cost, for AllowMany's (0 refuses only a count above the rate), else its
// request's.
func (d *decision) spanCost(s *span) int64 {
	if d.quotas != nil {
		return d.quotas[s.at].Cost
	}
	return d.reqs[s.req].Cost
}

// record keeps what Redis reported for decision d: always when it denied,
// and to refresh an entry already cached when it allowed.
func (c *denyCache) record(id string, d *decision) {
	for i := range d.spans {
		s := &d.spans[i]
		id := d.spanID(s, id)
		if len(id) > maxCachedID {
			continue
		}
		allowed := d.replies[s.req].Allowed
		seen := s.seen
		if allowed {
			seen[0] += s.want(d.spanCost(s))
		}
		over := d.kind == EventCharge && d.refused&(1<<s.at) != 0 // a Charge pushed the id over
		c.table.update(id, s.pos, func(_ windowEntry, cached bool) (windowEntry, bool) {
			return windowEntry{i: s.pos.i, w: s.pos.w, counts: seen}, cached || !allowed || over
		})
	}
}

// forget drops what is cached for id and the limit placed at p.
func (c *denyCache) forget(id string, p position) { c.table.delete(id, p) }
