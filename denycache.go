package ratelimit

import (
	"hash/maphash"
	"sync"
)

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
//
// The cache holds at most maxEntries entries, in shards, each entry an id of
// at most maxCachedID bytes and a few integers; a full shard drops an
// arbitrary entry to make room.
type denyCache struct {
	seed   maphash.Seed
	shards [denyShards]denyShard
}

const (
	denyShards = 32
	// maxCachedID bounds the memory of one entry: longer ids always go to
	// Redis.
	maxCachedID = 256
)

type denyShard struct {
	mu      sync.RWMutex
	entries map[denyKey]denyEntry
	max     int
}

type denyKey struct {
	id string
	w  int64
}

// denyEntry is what Redis reported: the counts of windows i and i-1 after
// the decision.
type denyEntry struct {
	i int64
	counts
}

func newDenyCache(maxEntries int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed()}
	per := max(1, maxEntries/denyShards)
	for i := range c.shards {
		c.shards[i] = denyShard{entries: make(map[denyKey]denyEntry), max: per}
	}
	return c
}

func (c *denyCache) shard(id string) *denyShard {
	return &c.shards[maphash.String(c.seed, id)%denyShards]
}

// deny returns the Result of denying a request of cost n locally, and true,
// when the counts cached for id already deny it.
func (c *denyCache) deny(id string, limit Limit, pos position, n int64) (Result, bool) {
	s := c.shard(id)
	s.mu.RLock()
	e, ok := s.entries[denyKey{id, pos.w}]
	s.mu.RUnlock()
	if !ok {
		return Result{}, false
	}
	var seen counts
	switch pos.i {
	case e.i:
		seen = e.counts
	case e.i + 1: // the cached current window is now the previous one
		seen = counts{prev: e.cur}
	default: // too old to say anything, or from a clock that ran ahead
		return Result{}, false
	}
	if pos.estimate(seen) > limit.Rate-n {
		return result(limit, pos, seen, false, n), true
	}
	return Result{}, false
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
	k := denyKey{id, pos.w}
	s := c.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.entries[k]; !ok {
		if allowed {
			return
		}
		if len(s.entries) >= s.max {
			for old := range s.entries { // map order is random: drop any one
				delete(s.entries, old)
				break
			}
		}
	}
	s.entries[k] = denyEntry{i: pos.i, counts: seen}
}

// forget drops what is cached for id and window length w.
func (c *denyCache) forget(id string, w int64) {
	s := c.shard(id)
	s.mu.Lock()
	delete(s.entries, denyKey{id, w})
	s.mu.Unlock()
}
