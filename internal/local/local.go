// Package local is FailLocal's windows and concurrency slots, counted in
// this process while Redis cannot decide, in one bounded table.
package local

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"time"

	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/table"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// Windows decides requests in this process while Redis cannot, for
// FailLocal: the same sliding window, counted here, against each limit's
// share for one replica (Rate divided by the number of replicas, at least
// 1). It holds at most MaxEntries windows; when it must drop one, that
// client starts again from nothing, which errs towards allowing. It is
// safe for simultaneous use.
type Windows struct {
	replicas int64
	table    *table.Table
	seed     maphash.Seed
}

// MaxEntries bounds FailLocal's memory: about 100 bytes an entry.
const MaxEntries = 100_000

// maxID is the longest id kept as it is: a longer one is kept under a
// stand-in (see key).
const maxID = 256

// New returns the windows of a process that shares its limits with
// replicas others, itself included.
func New(replicas int) *Windows {
	return &Windows{replicas: int64(max(1, replicas)), table: table.New(MaxEntries), seed: maphash.MakeSeed()}
}

// share returns the part of a limit's rate that this process enforces
// alone.
func (w *Windows) share(rate int64) int64 { return max(1, rate/w.replicas) }

// Decide decides p, a decision of one id (a look when its spans' Cost is
// 0), in this process, all or nothing, against each limit's share: it
// fills its spans (their Rate becomes the share) and replies, for the
// plan to derive. A Shadow limit is counted when its share alone admits
// the request, and denies nothing. All of an id's windows sit in one shard
// of the table, so the check and the counting are one step under its
// lock.
func (w *Windows) Decide(p *plan.Plan) {
	look := p.Spans[0].Cost == 0
	n := max(p.Spans[0].Cost, 1) // a look is asked as for a cost of 1
	for i := range p.Replies {
		p.Replies[i] = script.Reply{Allowed: !look}
	}
	key := w.key(p.Spans[0].ID)
	shard := w.table.Lock(key)
	defer shard.Mu.Unlock()
	for i := range p.Spans {
		s := &p.Spans[i]
		w.place(shard, key, s)
		if s.Pos.Estimate(&s.Seen)+n > s.Rate {
			p.Replies[s.Req].Allowed = false
		}
	}
	for i := range p.Spans {
		if s := &p.Spans[i]; p.Replies[s.Req].Allowed {
			count(shard, key, s, n)
		}
	}
}

// place fills s from what shard holds of it under key: its share, and the
// counts as they stand (at the later of the span's moment and the
// entry's).
func (w *Windows) place(shard *table.Shard, key string, s *plan.Span) {
	s.Rate = w.share(s.Rate)
	s.Seen = window.Counts{}
	if e, ok := shard.Entries[table.Of(key, s.Pos)]; ok {
		s.Pos = e.Later(s.Pos)
		s.Seen, _ = e.At(s.Pos)
	}
}

// count adds n to what shard holds of s under key.
func count(shard *table.Shard, key string, s *plan.Span, n int64) {
	c := s.Seen
	c[0] += n
	shard.Put(table.Of(key, s.Pos), table.Entry{I: s.Pos.I, E: s.Pos.E, W: s.Pos.W, Counts: c})
}

// key is the id, or for a longer id than maxID a stand-in of maxID+1
// bytes, so that an entry's memory is bounded: the id's first bytes and a
// 64-bit digest of the whole. Being longer than any id kept as it is, it
// cannot meet one; two long ids meet only if they share those first bytes
// and the digest.
func (w *Windows) key(id string) string {
	if len(id) <= maxID {
		return id
	}
	b := make([]byte, maxID+1)
	copy(b, id[:maxID-7])
	binary.BigEndian.PutUint64(b[maxID-7:], maphash.String(w.seed, id))
	return string(b)
}

// DecideMany decides p, an AllowMany's, in this process against each
// quota's share, all or nothing, as Decide does a decision of one id: it
// locks the shards of every id the decision counts under, in the order of
// the table (as nothing else locks two, no two decisions wait on each
// other), checks every quota, and counts each if all admit.
func (w *Windows) DecideMany(p *plan.Plan) {
	keys := make([]string, len(p.Spans))
	var shards []int
	for i := range p.Spans {
		keys[i] = w.key(p.Spans[i].ID)
		if at := w.table.Index(keys[i]); !slices.Contains(shards, at) {
			shards = append(shards, at)
		}
	}
	slices.Sort(shards)
	for _, at := range shards {
		w.table.Shards[at].Mu.Lock()
	}
	defer func() {
		for _, at := range shards {
			w.table.Shards[at].Mu.Unlock()
		}
	}()
	for i := range p.Replies {
		p.Replies[i] = script.Reply{Allowed: true}
	}
	ok := true
	for i := range p.Spans {
		s := &p.Spans[i]
		w.place(w.table.Shard(keys[i]), keys[i], s)
		if s.Pos.Estimate(&s.Seen)+s.Cost > s.Rate {
			p.Replies[s.Req].Allowed = false
			ok = ok && s.Shadow
		}
	}
	for i := range p.Spans {
		s := &p.Spans[i]
		if !s.Shadow && !ok {
			p.Replies[s.Req].Allowed = false
		}
		if p.Replies[s.Req].Allowed && s.Cost > 0 {
			count(w.table.Shard(keys[i]), keys[i], s, s.Cost)
		}
	}
}

// A Slot is a concurrency slot FailLocal holds: of the limit of key (its
// Redis key), for token, at most max held, each for lease.
type Slot struct {
	Key, Token string
	Max        int64
	Lease      time.Duration
}

// Acquire takes s in this process, against its limit's share, at now (the
// Limiter's clock): a slot is held here until it is released or its lease
// ends. It reports whether it acquired, the slots held after it, and when
// it did not, the wait until the earliest held lease ends.
func (w *Windows) Acquire(s Slot, now time.Time) (acquired bool, inFlight int64, retry time.Duration) {
	k := table.Key{ID: w.key(s.Key)} // no window's: W and Subs 0
	shard := w.table.Lock(k.ID)
	defer shard.Mu.Unlock()
	e := shard.Entries[k]
	var first time.Time
	for token, end := range e.Slots {
		if !end.After(now) {
			delete(e.Slots, token)
		} else if first.IsZero() || end.Before(first) {
			first = end
		}
	}
	inFlight = int64(len(e.Slots))
	if inFlight >= w.share(s.Max) {
		return false, inFlight, first.Sub(now)
	}
	if e.Slots == nil {
		e.Slots = map[string]time.Time{}
	}
	e.Slots[s.Token] = now.Add(s.Lease)
	shard.Put(k, e)
	return true, inFlight + 1, 0
}

// Release gives token's slot of the concurrency limit keyed key back, and
// reports whether it was held.
func (w *Windows) Release(key, token string) bool {
	k := table.Key{ID: w.key(key)}
	shard := w.table.Lock(k.ID)
	defer shard.Mu.Unlock()
	e := shard.Entries[k]
	_, ok := e.Slots[token]
	delete(e.Slots, token)
	if len(e.Slots) == 0 {
		delete(shard.Entries, k)
	}
	return ok
}

// Extend renews token's lease of the concurrency limit keyed key for lease
// from now, and reports whether it was still held.
func (w *Windows) Extend(key, token string, lease time.Duration, now time.Time) bool {
	k := table.Key{ID: w.key(key)}
	shard := w.table.Lock(k.ID)
	defer shard.Mu.Unlock()
	e := shard.Entries[k]
	end, ok := e.Slots[token]
	if !ok || !end.After(now) {
		delete(e.Slots, token)
		return false
	}
	e.Slots[token] = now.Add(lease)
	return true
}

// Size returns the number of entries.
func (w *Windows) Size() int { return w.table.Size() }
