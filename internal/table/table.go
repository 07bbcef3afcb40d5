// Package table is the table of windows a process keeps per id: the
// counts of each count's window this process holds, for the deny cache
// and FailLocal, bounded, a full shard dropping one; and the key that
// names one count of an id in any table of the process (the leases' too).
package table

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/slidingwindow/ratelimit/internal/window"
)

// Key names one count of an id, as the process's tables hold it: the id,
// and the length and kind of its limit's windows (for a calendar limit,
// -Subs its Period and W a hash of its zone's name). See Of.
type Key struct {
	ID      string
	W, Subs int64
}

// Of returns the key of id's count of the limit placed at p.
func Of(id string, p window.Position) Key {
	if p.Period != 0 {
		// A zone's name, hashed: a string in the key cost every decision's
		// lookup a tenth (BenchmarkLeased), calendar or not. Two zones of
		// one id and kind of period meet only if 64-bit hashes of their
		// names collide.
		return Key{ID: id, W: int64(maphash.String(window.ZoneSeed, p.Loc.String())), Subs: -int64(p.Period)}
	}
	return Key{ID: id, W: p.W, Subs: p.Subs}
}

// Table keeps, in this process, per id and window length, a window index
// and the counts of that window and the ones before: what the deny cache
// remembers of Redis, and what FailLocal counts by itself. It holds a
// bounded number of entries, in shards; a full shard drops an arbitrary
// entry to make room. It is safe for simultaneous use.
type Table struct {
	seed   maphash.Seed
	Shards [shards]Shard
}

const shards = 32

// Shard is one shard of a Table: Mu guards Entries.
type Shard struct {
	Mu      sync.RWMutex
	Entries map[Key]Entry
	max     int
}

// Entry holds the counts of a limit as they stood in window I, E ms into
// it (FailLocal's; the deny cache keeps no E), W the length of window I (a
// calendar period's varies); or, under a key of no window (W and Subs 0),
// FailLocal's slots of a concurrency limit: per token, when its lease ends.
type Entry struct {
	I, E, W int64
	Counts  window.Counts
	Slots   map[string]time.Time
}

// Later returns p, or the entry's position if the entry was counted later
// (a caller that read the clock after p's counted first): a decision is
// made there, not on counts that would forget it, nor at an earlier moment
// that weighs the previous window more than that caller's did.
func (e Entry) Later(p window.Position) window.Position {
	if e.I > p.I || e.I == p.I && e.E > p.E {
		p.I, p.E, p.W = e.I, e.E, e.W
	}
	return p
}

// At returns the counts as they stand at p with no traffic since the entry
// was stored, when the entry can say: not when p is before it.
func (e Entry) At(p window.Position) (window.Counts, bool) {
	if p.I < e.I {
		return window.Counts{}, false
	}
	return p.Shift(e.Counts, p.I-e.I), true
}

// New returns a table of at most about maxEntries entries.
func New(maxEntries int) *Table {
	t := &Table{seed: maphash.MakeSeed()}
	per := max(1, maxEntries/shards)
	for i := range t.Shards {
		t.Shards[i] = Shard{Entries: make(map[Key]Entry), max: per}
	}
	return t
}

// Shard returns the shard of id, which holds all of id's entries.
func (t *Table) Shard(id string) *Shard { return &t.Shards[t.Index(id)] }

// Index returns the index of id's shard.
func (t *Table) Index(id string) int { return int(maphash.String(t.seed, id) % shards) }

// Get returns the entry of id for the limit placed at p.
func (t *Table) Get(id string, p window.Position) (Entry, bool) {
	s := t.Shard(id)
	s.Mu.RLock()
	e, ok := s.Entries[Of(id, p)]
	s.Mu.RUnlock()
	return e, ok
}

// Update calls fn with the entry of id for the limit placed at p (ok false
// when there is none) under the shard's lock, and stores what fn returns if
// it says to.
func (t *Table) Update(id string, p window.Position, fn func(e Entry, ok bool) (Entry, bool)) {
	s := t.Lock(id)
	defer s.Mu.Unlock()
	k := Of(id, p)
	e, ok := s.Entries[k]
	if e, store := fn(e, ok); store {
		s.Put(k, e)
	}
}

// Lock locks and returns the shard of id, which holds all of id's entries:
// a caller can read and write several of them in one step.
func (t *Table) Lock(id string) *Shard {
	s := t.Shard(id)
	s.Mu.Lock()
	return s
}

// Put stores e under k, dropping an arbitrary entry when the shard is full;
// s.Mu is held.
func (s *Shard) Put(k Key, e Entry) {
	if _, ok := s.Entries[k]; !ok && len(s.Entries) >= s.max {
		for old := range s.Entries { // map order is random: drop any one
			delete(s.Entries, old)
			break
		}
	}
	s.Entries[k] = e
}

// Delete drops the entry of id for the limit placed at p.
func (t *Table) Delete(id string, p window.Position) {
	s := t.Shard(id)
	s.Mu.Lock()
	delete(s.Entries, Of(id, p))
	s.Mu.Unlock()
}

// Size returns the number of entries.
func (t *Table) Size() int {
	n := 0
	for i := range t.Shards {
		s := &t.Shards[i]
		s.Mu.RLock()
		n += len(s.Entries)
		s.Mu.RUnlock()
	}
	return n
}
