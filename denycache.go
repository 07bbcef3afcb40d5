package ratelimit

// denyCache remembers, per id and window length, the counts Redis last
// reported for a client that Redis denied, so that the same client's next
// requests can be denied without a round trip.
//
// It never denies what Redis would allow: counts only grow within a window
// (nothing but a Reset or a deletion lowers them), so the counts a decision
// saw are lower bounds of the counts now, and an estimate made from them is
// a lower bound of the estimate Redis would make. A request that the lower
// bound already denies, Redis would deny too. A request it would allow goes
// to Redis, whose answer refreshes the entry.
type denyCache struct {
	table *windowTable
}

// maxCachedID bounds the memory of one entry: longer ids always go to Redis.
const maxCachedID = 256

func newDenyCache(maxEntries int) *denyCache {
	return &denyCache{table: newWindowTable(maxEntries)}
}

// deny returns the Result of denying a request of cost n locally, and true,
// when the counts cached for id already deny it.
func (c *denyCache) deny(id string, limit Limit, pos position, n int64) (Result, bool) {
	e, ok := c.table.get(id, pos.w)
	if !ok {
		return Result{}, false
	}
	seen, ok := e.at(pos.i)
	if !ok || pos.estimate(seen) <= limit.Rate-n {
		return Result{}, false
	}
	return result(limit, pos, seen, false, n), true
}

// record keeps what Redis reported for a decision: always when it denied,
// and to refresh an entry already cached when it allowed.
func (c *denyCache) record(id string, pos position, seen counts, allowed bool, n int64) {
	if len(id) > maxCachedID {
		return
	}
	if allowed {
		seen.cur += n
	}
	c.table.update(id, pos.w, func(_ windowEntry, cached bool) (windowEntry, bool) {
		return windowEntry{i: pos.i, counts: seen}, cached || !allowed
	})
}

// forget drops what is cached for id and window length w.
func (c *denyCache) forget(id string, w int64) { c.table.delete(id, w) }
