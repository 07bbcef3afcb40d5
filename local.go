// FailLocal's windows and concurrency slots, counted in this process, in
// one bounded table.

package ratelimit

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
)

// localWindows decides requests in this process while Redis cannot, for
// FailLocal: the same sliding window, counted here, against each limit's
// share for one replica (Rate divided by the number of replicas, at least
// 1). It holds at most maxLocalEntries windows; when it must drop one, that
// client starts again from nothing, which errs towards allowing.
type localWindows struct {
	replicas int64
	table    *windowTable
	seed     maphash.Seed
}

// maxLocalEntries bounds FailLocal's memory: about 100 bytes an entry.
const maxLocalEntries = 100_000

func newLocalWindows(replicas int) *localWindows {
	return &localWindows{replicas: int64(max(1, replicas)), table: newWindowTable(maxLocalEntries), seed: maphash.MakeSeed()}
}

// share returns the part of a limit's rate that this process enforces
// alone.
func (w *localWindows) share(rate int64) int64 {
	return max(1, rate/w.replicas)
}

// decide decides d in this process, all or nothing, against each limit's
// share: it fills d's replies and results (Degraded is left to the caller)
// and d.allowed. A Shadow limit is counted when its share alone admits the
// request, and denies nothing. All of an id's windows sit in one shard of
// the table, so the check and the counting are one step under its lock.
func (w *localWindows) decide(id string, d *decision) {
	key := w.key(id)
	n := max(d.cost, 1) // a look is asked as for a cost of 1
	for i := range d.replies {
		d.replies[i] = script.Reply{Allowed: d.cost > 0}
	}
	shard := w.table.lock(key)
	for i := range d.spans {
		s := &d.spans[i]
		s.rate = w.share(s.rate)
		s.seen = counts{}
		if e, ok := shard.entries[s.pos.tableKey(key)]; ok {
			s.pos = e.later(s.pos)
			s.seen, _ = e.at(s.pos)
		}
		if s.pos.estimate(&s.seen)+n > s.rate {
			d.replies[s.req].Allowed = false
		}
	}
	for i := range d.spans {
		s := &d.spans[i]
		if !d.replies[s.req].Allowed {
			continue
		}
		c := s.seen
		c[0] += n
		shard.put(s.pos.tableKey(key), windowEntry{i: s.pos.i, e: s.pos.e, w: s.pos.w, counts: c})
	}
	shard.mu.Unlock()
	d.deniedCounted = false
	d.derive()
}

// key is the id, or for a longer id than maxCachedID a stand-in of
// maxCachedID+1 bytes, so that an entry's memory is bounded: the id's first
// bytes and a 64-bit digest of the whole. Being longer than any id kept as
// it is, it cannot meet one; two long ids meet only if they share those
// first bytes and the digest.
func (w *localWindows) key(id string) string {
	if len(id) <= maxCachedID {
		return id
	}
	b := make([]byte, maxCachedID+1)
	copy(b, id[:maxCachedID-7])
	binary.BigEndian.PutUint64(b[maxCachedID-7:], maphash.String(w.seed, id))
	return string(b)
}

// decideMany decides d, an AllowMany's, in this process against each
// quota's share, all or nothing, as decide does a decision of one id: it
// locks the shards of every id the decision counts under, in the order of
// the table (as nothing else locks two, no two decisions wait on each
// other), checks every quota, and counts each if all admit.
func (w *localWindows) decideMany(d *decision) {
	keys := make([]string, len(d.quotas))
	var shards []int
	for i, q := range d.quotas {
		keys[i] = w.key(q.ID)
		if at := w.table.index(keys[i]); !slices.Contains(shards, at) {
			shards = append(shards, at)
		}
	}
	slices.Sort(shards)
	for _, at := range shards {
		w.table.shards[at].mu.Lock()
	}
	defer func() {
		for _, at := range shards {
			w.table.shards[at].mu.Unlock()
		}
	}()
	for i := range d.replies {
		d.replies[i] = script.Reply{Allowed: true}
	}
	ok := true
	for i := range d.spans {
		s := &d.spans[i]
		q := d.quotas[s.at]
		s.rate = w.share(s.rate)
		s.seen = counts{}
		if e, found := w.table.shard(keys[s.at]).entries[s.pos.tableKey(keys[s.at])]; found {
			s.pos = e.later(s.pos)
			s.seen, _ = e.at(s.pos)
		}
		if s.pos.estimate(&s.seen)+q.Cost > s.rate {
			d.replies[s.req].Allowed = false
			ok = ok && s.shadow
		}
	}
	for i := range d.spans {
		s := &d.spans[i]
		q := d.quotas[s.at]
		if !s.shadow && !ok {
			d.replies[s.req].Allowed = false
		}
		if !d.replies[s.req].Allowed || q.Cost == 0 {
			continue
		}
		c := s.seen
		c[0] += q.Cost
		w.table.shard(keys[s.at]).put(s.pos.tableKey(keys[s.at]), windowEntry{i: s.pos.i, e: s.pos.e, w: s.pos.w, counts: c})
	}
	d.deriveMany()
}

// acquire decides d, an Acquire of id, in this process against its
// limit's share: a slot is held here, under the concurrency limit's key,
// until it is released or its lease ends on the Limiter's clock. It fills
// d.allowed and the Slot's counts; an acquired Slot holds its slot here,
// and may hold one in Redis (its call failed late).
func (w *localWindows) acquire(l *Limiter, id string, d *decision) {
	s := d.slot
	c := s.Concurrency
	held := d.holding(l, id)
	k := tableKey{id: w.key(held.key)} // no window's: w and subs 0
	now := l.now()
	shard := w.table.lock(k.id)
	defer shard.mu.Unlock()
	e := shard.entries[k]
	var first time.Time
	for token, end := range e.slots {
		if !end.After(now) {
			delete(e.slots, token)
		} else if first.IsZero() || end.Before(first) {
			first = end
		}
	}
	s.InFlight = int64(len(e.slots))
	if d.allowed = s.InFlight < w.share(c.Max); !d.allowed {
		s.RetryAfter = first.Sub(now)
		return
	}
	if e.slots == nil {
		e.slots = map[string]time.Time{}
	}
	e.slots[held.token] = now.Add(c.Lease)
	shard.put(k, e)
	s.InFlight++
	held.local, held.maybe = true, true
	s.held = held
}

// release gives token's slot of the concurrency limit keyed key back, and
// reports whether it was held.
func (w *localWindows) release(key, token string) bool {
	k := tableKey{id: w.key(key)}
	shard := w.table.lock(k.id)
	defer shard.mu.Unlock()
	e := shard.entries[k]
	_, ok := e.slots[token]
	delete(e.slots, token)
	if len(e.slots) == 0 {
		delete(shard.entries, k)
	}
	return ok
}

// extend renews token's lease of the concurrency limit keyed key for lease
// from now, and reports whether it was still held.
func (w *localWindows) extend(key, token string, lease time.Duration, now time.Time) bool {
	k := tableKey{id: w.key(key)}
	shard := w.table.lock(k.id)
	defer shard.mu.Unlock()
	e := shard.entries[k]
	end, ok := e.slots[token]
	if !ok || !end.After(now) {
		delete(e.slots, token)
		return false
	}
	e.slots[token] = now.Add(lease)
	return true
}
