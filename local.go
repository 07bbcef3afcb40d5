package ratelimit

import (
	"encoding/binary"
	"hash/maphash"
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

// share returns the part of limit that this process enforces alone.
func (w *localWindows) share(limit Limit) Limit {
	return Limit{Rate: max(1, limit.Rate/w.replicas), Window: limit.Window}
}

// decide counts a request of cost n (0 looks without counting) against
// id's share of limit. The Result's Limit is the caller's; Count, Remaining
// and the waits are of the local share.
func (w *localWindows) decide(id string, limit Limit, pos position, n int64) Result {
	share := w.share(limit)
	var seen counts
	allowed := false
	w.table.update(w.key(id), pos.w, func(e windowEntry, ok bool) (windowEntry, bool) {
		if ok {
			seen, _ = e.at(pos.i)
		}
		cost := max(n, 1) // a look is asked as for a cost of 1
		allowed = pos.estimate(seen)+cost <= share.Rate
		return windowEntry{i: pos.i, counts: counts{cur: seen.cur + n, prev: seen.prev}}, allowed && n > 0
	})
	var r Result
	if n == 0 {
		r = result(share, pos, seen, allowed, 1)
		r.Count = pos.estimate(seen)
		r.Remaining = max(0, share.Rate-r.Count)
	} else {
		r = result(share, pos, seen, allowed, n)
	}
	r.Limit = limit
	r.Degraded = true
	return r
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
