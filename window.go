// Where the clock stands in a limit's windows, and the Results derived
// from the counts the script saw.

package ratelimit

import (
	"hash/maphash"
	"time"

	"github.com/slidingwindow/ratelimit/internal/window"
)

// The sliding window's arithmetic lives in internal/window; these types
// carry its inputs through a decision.

// position places a moment in the windows of one limit: index i of the
// window it falls in (window i covers [i×w, (i+1)×w) in Unix ms) and e, the
// ms elapsed since that window began. For a strict limit the windows are its
// sub-windows, w is a sub-window's length and subs their number per Window.
//
// For a calendar limit, i is its period's start in Unix ms, w the period's
// length (a day may last 23 or 25 hours) and e the ms since its start; cal
// is the kind of period and loc its zone. A period is one count, read from
// one key.
type position struct {
	w, i, e int64
	subs    int64 // 0: the sliding window counter; else strict, with subs sub-windows
	cal     Period
	loc     *time.Location
}

// counts are what the script saw of one limit before a request, current
// window first: for a sliding limit the current and the previous window's
// counts; for a strict limit the subs+1 sub-windows' counts.
type counts [window.SubWindows + 1]int64

// locate returns the position of Unix millisecond t for limit.
func locate(t int64, limit Limit) position {
	if limit.Calendar != 0 {
		return locateCalendar(t, limit)
	}
	w, subs := limit.Window.Milliseconds(), int64(0)
	if limit.Strict {
		subs = StrictSubWindows
		w /= subs
	}
	i := floorDiv(t, w)
	return position{w: w, i: i, e: t - i*w, subs: subs}
}

// floorDiv returns t / w rounded down, not truncated: for clocks before 1970.
func floorDiv(t, w int64) int64 {
	i := t / w
	if t%w < 0 {
		i--
	}
	return i
}

// keys returns the number of keys (and counts) the limit reads.
func (p position) keys() int {
	if p.cal != 0 {
		return 1
	}
	if p.subs == 0 {
		return 2
	}
	return int(p.subs) + 1
}

// estimate returns the usage the decision is made on: for a sliding limit
// cur + floor(prev × (w-e) / w) (see window.Estimate), for a strict one the
// sum of its sub-windows, for a calendar period its count.
func (p position) estimate(c *counts) int64 {
	if p.cal != 0 {
		return c[0]
	}
	if p.subs == 0 {
		return window.Estimate(c[0], c[1], p.w, p.e)
	}
	return window.StrictCount(c[:p.keys()])
}

// waitUntil returns the shortest wait after which the estimate would be at
// most target if no other request came; InfDuration if target is negative
// (it never would be), or if the wait is as long (windows of centuries).
func (p position) waitUntil(c *counts, target int64) time.Duration {
	if target < 0 {
		return InfDuration
	}
	if p.cal != 0 { // the count falls only when the period ends
		if c[0] <= target {
			return 0
		}
		return time.Duration(p.w-p.e) * time.Millisecond
	}
	if p.subs == 0 {
		return min(window.WaitUntil(c[0], c[1], p.w, p.e, target), InfDuration)
	}
	return min(window.StrictWaitUntil(c[:p.keys()], p.w, p.e, target), InfDuration)
}

// start and end return where the window (sub-window, period) p is in
// starts and ends, in Unix ms.
func (p position) start() int64 {
	if p.cal != 0 {
		return p.i
	}
	return p.i * p.w
}

func (p position) end() int64 { return p.start() + p.w }

// holds reports whether Unix ms t is in the window (sub-window, period)
// of p.
func (p position) holds(t int64) bool { return t >= p.start() && t < p.end() }

// tableKey returns the key under which the window table and the lease
// table hold id's count of the limit placed at p.
func (p position) tableKey(id string) tableKey {
	if p.cal != 0 {
		// A zone's name, hashed: a string in the key cost every decision's
		// lookup a tenth (BenchmarkLeased), calendar or not. Two zones of
		// one id and kind of period meet only if 64-bit hashes of their
		// names collide.
		return tableKey{id: id, w: int64(maphash.String(periodSeed, p.loc.String())), subs: -int64(p.cal)}
	}
	return tableKey{id: id, w: p.w, subs: p.subs}
}

// shift returns c as it stands d windows later with no traffic in between:
// each count moves d places older, and those past the oldest are gone. For
// a calendar period, d is the ms between the periods' starts: any later
// period starts at 0.
func (p position) shift(c counts, d int64) counts {
	var out counts
	n := int64(p.keys())
	for j := d; j < n; j++ {
		out[j] = c[j-d]
	}
	return out
}
