// Where a moment stands in one limit's windows, and the counts a decision
// reads there.

package window

import (
	"math"
	"time"
)

// Never is the wait until something that never happens: the root's
// InfDuration, about 292 years.
const Never = time.Duration(math.MaxInt64 - (time.Second - 1))

// Position places a moment in the windows of one limit: index I of the
// window it falls in (window I covers [I×W, (I+1)×W) in Unix ms) and E, the
// ms elapsed since that window began. For a strict limit the windows are
// its sub-windows: W is a sub-window's length and Subs their number per
// Window (0 for the sliding window counter).
//
// For a calendar limit, I is its period's start in Unix ms, W the period's
// length (a day may last 23 or 25 hours) and E the ms since its start;
// Period is the kind of period and Loc its zone. A period is one count,
// read from one key.
type Position struct {
	W, I, E int64
	Subs    int64
	Period  Period
	Loc     *time.Location
}

// Counts are what the script saw of one limit before a request, current
// window first: for a sliding limit the current and the previous window's
// counts; for a strict limit the Subs+1 sub-windows' counts; for a
// calendar limit the period's.
type Counts [SubWindows + 1]int64

// Locate returns the position of Unix millisecond t in the windows of a
// limit: of period in loc when period is not 0; else of windows of
// windowMS ms, cut into SubWindows sub-windows when strict.
func Locate(t, windowMS int64, strict bool, period Period, loc *time.Location) Position {
	if period != 0 {
		return locatePeriod(t, period, loc)
	}
	w, subs := windowMS, int64(0)
	if strict {
		subs = SubWindows
		w /= subs
	}
	i := floorDiv(t, w)
	return Position{W: w, I: i, E: t - i*w, Subs: subs}
}

// floorDiv returns t / w rounded down, not truncated: for clocks before 1970.
func floorDiv(t, w int64) int64 {
	i := t / w
	if t%w < 0 {
		i--
	}
	return i
}

// Keys returns the number of keys (and counts) the limit reads.
func (p Position) Keys() int {
	switch {
	case p.Period != 0:
		return 1
	case p.Subs == 0:
		return 2
	}
	return int(p.Subs) + 1
}

// Estimate returns the usage the decision is made on: for a sliding limit
// cur + floor(prev × (W-E) / W) (see the package's Estimate), for a strict
// one the sum of its sub-windows, for a calendar period its count.
func (p Position) Estimate(c *Counts) int64 {
	switch {
	case p.Period != 0:
		return c[0]
	case p.Subs == 0:
		return Estimate(c[0], c[1], p.W, p.E)
	}
	return StrictCount(c[:p.Keys()])
}

// WaitUntil returns the shortest wait after which the estimate would be at
// most target if no other request came; Never if target is negative (it
// never would be), or if the wait is as long (windows of centuries).
func (p Position) WaitUntil(c *Counts, target int64) time.Duration {
	switch {
	case target < 0:
		return Never
	case p.Period != 0: // the count falls only when the period ends
		if c[0] <= target {
			return 0
		}
		return time.Duration(p.W-p.E) * time.Millisecond
	case p.Subs == 0:
		return min(WaitUntil(c[0], c[1], p.W, p.E, target), Never)
	}
	return min(StrictWaitUntil(c[:p.Keys()], p.W, p.E, target), Never)
}

// Start returns where the window (sub-window, period) p is in starts, in
// Unix ms.
func (p Position) Start() int64 {
	if p.Period != 0 {
		return p.I
	}
	return p.I * p.W
}

// End returns where the window (sub-window, period) p is in ends, in Unix
// ms: the next one's start.
func (p Position) End() int64 { return p.Start() + p.W }

// Holds reports whether Unix ms t is in the window (sub-window, period) of
// p.
func (p Position) Holds(t int64) bool { return t >= p.Start() && t < p.End() }

// Shift returns c as it stands d windows later with no traffic in between:
// each count moves d places older, and those past the oldest are gone. For
// a calendar period, d is the ms between the periods' starts: any later
// period starts at 0.
func (p Position) Shift(c Counts, d int64) Counts {
	var out Counts
	n := int64(p.Keys())
	for j := d; j < n; j++ {
		out[j] = c[j-d]
	}
	return out
}

// Gone reports whether the count of window (sub-window, period) i of p's
// limit is no longer read at p: a later decision's estimate no longer
// weighs it (a sliding window is read until the end of the next; a strict
// sub-window for Subs sub-windows after its own), or its period has ended.
func (p Position) Gone(i int64) bool {
	if p.Period != 0 {
		return p.I > i
	}
	return p.I > i+max(1, p.Subs)
}
