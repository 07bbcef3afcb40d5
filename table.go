// The window table: per id, the counts of its windows this process holds,
// for the deny cache and FailLocal; bounded, a full shard dropping one.

package ratelimit

import (
	"hash/maphash"
	"sync"
	"time"
)

// windowTable keeps, in this process, per id and window length, a window
// index and the counts of that window and the one before: what the deny
// cache remembers of Redis, and what FailLocal counts by itself. It holds a
// bounded number of entries, in shards; a full shard drops an arbitrary
// entry to make room. It is safe for simultaneous use.
type windowTable struct {
	seed   maphash.Seed
	shards [tableShards]tableShard
}

const tableShards = 32

type tableShard struct {
	mu      sync.RWMutex
	entries map[tableKey]windowEntry
	max     int
}

// tableKey is an id and the length and kind of its limit's windows (for a
// calendar limit, -subs its Period and w a hash of its zone's name): one
// count of the id, as the window table and the lease table key it. See
// position.tableKey.
type tableKey struct {
	id      string
	w, subs int64
}

// windowEntry holds the counts of a limit as they stood in window i, e ms
// into it (FailLocal's; the deny cache keeps no e); or, under a key of no
// window (w and subs 0), FailLocal's slots of a concurrency limit: per
// token, when its lease ends.
type windowEntry struct {
	i, e int64
	w    int64 // the length of window i: a calendar period's varies
	counts
	slots map[string]time.Time
}

// later returns p, or the entry's position if the entry was counted later
// (a caller that read the clock after p's counted first): a decision is
// made there, not on counts that would forget it, nor at an earlier moment
// that weighs the previous window more than that caller's did.
func (e windowEntry) later(p position) position {
	if e.i > p.i || e.i == p.i && e.e > p.e {
		p.i, p.e, p.w = e.i, e.e, e.w
	}
	return p
}

// at returns the counts as they stand at p with no traffic since the entry
// was stored, when the entry can say: not when p is before it.
func (e windowEntry) at(p position) (counts, bool) {
	if p.i < e.i {
		return counts{}, false
	}
	return p.shift(e.counts, p.i-e.i), true
}

func newWindowTable(maxEntries int) *windowTable {
	t := &windowTable{seed: maphash.MakeSeed()}
	per := max(1, maxEntries/tableShards)
	for i := range t.shards {
		t.shards[i] = tableShard{entries: make(map[tableKey]windowEntry), max: per}
	}
	return t
}

func (t *windowTable) shard(id string) *tableShard { return &t.shards[t.index(id)] }

// index returns the index of id's shard.
func (t *windowTable) index(id string) int { return int(maphash.String(t.seed, id) % tableShards) }

// get returns the entry of id for the limit placed at p.
func (t *windowTable) get(id string, p position) (windowEntry, bool) {
	s := t.shard(id)
	s.mu.RLock()
	e, ok := s.entries[p.tableKey(id)]
	s.mu.RUnlock()
	return e, ok
}

// update calls fn with the entry of id for the limit placed at p (ok false
// when there is none) under the shard's lock, and stores what fn returns if
// it says to.
func (t *windowTable) update(id string, p position, fn func(e windowEntry, ok bool) (windowEntry, bool)) {
	s := t.lock(id)
	defer s.mu.Unlock()
	k := p.tableKey(id)
	e, ok := s.entries[k]
	if e, store := fn(e, ok); store {
		s.put(k, e)
	}
}

// lock locks and returns the shard of id, which holds all of id's entries:
// a caller can read and write several of them in one step.
func (t *windowTable) lock(id string) *tableShard {
	s := t.shard(id)
	s.mu.Lock()
	return s
}

// put stores e under k, dropping an arbitrary entry when the shard is full;
// s.mu is held.
func (s *tableShard) put(k tableKey, e windowEntry) {
	if _, ok := s.entries[k]; !ok && len(s.entries) >= s.max {
		for old := range s.entries { // map order is random: drop any one
			delete(s.entries, old)
			break
		}
	}
	s.entries[k] = e
}

// delete drops the entry of id for the limit placed at p.
func (t *windowTable) delete(id string, p position) {
	s := t.shard(id)
	s.mu.Lock()
	delete(s.entries, p.tableKey(id))
	s.mu.Unlock()
}

// size returns the number of entries.
func (t *windowTable) size() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		n += len(s.entries)
		s.mu.RUnlock()
	}
	return n
}
