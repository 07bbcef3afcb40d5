package bench

import (
	"math"
	"math/bits"
)

// Call is one admitted decision as its caller saw it: the Unix ms at which
// the call started and returned, and, where a Placer tells, the ms at
// which the limiter placed it (read from its clock), noPlace where not.
type Call struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	At    int64 `json:"at"`
}

// noPlace is Call.At for a decision whose ms the limiter did not tell.
const noPlace = math.MinInt64

// Admission is what a fleet admitted, window by window, against a limit of
// Rate per window of W ms: how far over the limit it went, if at all.
type Admission struct {
	// Admitted counts the admitted decisions, warm-up included; Windows the
	// windows (Unix ms / W, as this library places them) from the first
	// one's to the last one's.
	Admitted int64 `json:"admitted"`
	Windows  int   `json:"windows"`
	// Placed says every decision is placed at the ms its limiter read
	// (Call.At); if not, every decision is placed at the ms its call
	// started, a few microseconds before the limiter reads its clock,
	// unless the goroutine is descheduled in between.
	Placed bool `json:"placed"`
	// PerWindow is what each window admitted, the first window first.
	PerWindow []int64 `json:"per_window"`
	// WorstWindow is the most admitted in one window, over Rate.
	WorstWindow float64 `json:"worst_window"`
	// WorstEstimate is the greatest sliding estimate of what was admitted,
	// estimate(the current window's, the previous window's, W, ms into the
	// window), at any ms, over Rate. This library admits a
	// request only if the estimate of what Redis has counted, with it,
	// stays at most Rate; Redis counts every admitted request, and leased
	// units before they are used.
	WorstEstimate float64 `json:"worst_estimate"`
	// WorstEstimateMs is the ms into its window at which WorstEstimate was
	// first reached.
	WorstEstimateMs int64 `json:"worst_estimate_ms"`
	// WorstWindowBound and WorstEstimateBound are the same as upper
	// bounds from the calls' times alone: a call counts from the ms it
	// started, and in every window its span touches.
	WorstWindowBound   float64 `json:"worst_window_bound"`
	WorstEstimateBound float64 `json:"worst_estimate_bound"`
	// WorstInterval is the most admitted in any W ms long interval that
	// begins a window's length or more after the first admission (the
	// cold start left out), not aligned to windows (ms resolution), over
	// Rate. A limiter of fixed windows can reach 2 here without breaking
	// its rule (a window's worth at the end of one and at the start of the
	// next), a sliding window nearly so (a burst into an empty previous
	// window, then the next at its pace); under a steady overload both stay
	// near 1. 0 for calls that span less than two windows' length.
	WorstInterval float64 `json:"worst_interval"`
	// WorstFromFirst is the most admitted in one of the W ms long windows
	// that follow one another from the first admission's ms, over Rate:
	// the windows of a limiter whose first window begins with its first
	// request (a token bucket that refills all at once).
	WorstFromFirst float64 `json:"worst_from_first"`
	// Straddled counts the calls that span a window's edge.
	Straddled int64 `json:"straddled"`
}

// Account accounts for calls, admitted against a limit of rate per window
// of w ms. It returns the zero Admission for no calls.
func Account(calls []Call, w, rate int64) Admission {
	var a Admission
	if len(calls) == 0 || w < 1 || rate < 1 {
		return a
	}
	a.Placed = true
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for _, c := range calls {
		lo, hi = min(lo, c.Start), max(hi, c.End, c.Start)
		if c.At == noPlace {
			a.Placed = false
		}
	}
	for _, c := range calls {
		if a.Placed {
			lo, hi = min(lo, c.At), max(hi, c.At)
		}
	}
	n := hi - lo + 1
	// starts, ends, ats [t-lo]: calls that started, returned, were placed
	// at ms t; then summed up to t.
	starts, ends, ats := make([]int64, n), make([]int64, n), make([]int64, n)
	for _, c := range calls {
		end := max(c.End, c.Start)
		starts[c.Start-lo]++
		ends[end-lo]++
		at := c.Start
		if a.Placed {
			at = c.At
		}
		ats[at-lo]++
		if floorDiv(c.Start, w) != floorDiv(end, w) {
			a.Straddled++
		}
	}
	for i := int64(1); i < n; i++ {
		starts[i] += starts[i-1]
		ends[i] += ends[i-1]
		ats[i] += ats[i-1]
	}
	upTo := func(sums []int64, t int64) int64 { // calls counted in sums at or before ms t
		switch {
		case t < lo:
			return 0
		case t > hi:
			return sums[n-1]
		}
		return sums[t-lo]
	}
	a.Admitted = int64(len(calls))
	first, last := floorDiv(lo, w), floorDiv(hi, w)
	a.Windows = int(last - first + 1)
	r := float64(rate)
	for k := first; k <= last; k++ {
		begin, end := k*w, (k+1)*w-1
		in := upTo(ats, end) - upTo(ats, begin-1)
		a.PerWindow = append(a.PerWindow, in)
		a.WorstWindow = max(a.WorstWindow, float64(in)/r)
		// Could have been placed in window k: started by its end, returned
		// after its beginning.
		bound := upTo(starts, end) - upTo(ends, begin-1)
		a.WorstWindowBound = max(a.WorstWindowBound, float64(bound)/r)
		prev := upTo(ats, begin-1) - upTo(ats, begin-w-1)
		prevBound := upTo(starts, begin-1) - upTo(ends, begin-w-1)
		for t := max(begin, lo); t <= min(end, hi); t++ {
			cur := upTo(ats, t) - upTo(ats, begin-1)
			if e := float64(estimate(cur, prev, w, t-begin)) / r; e > a.WorstEstimate {
				a.WorstEstimate, a.WorstEstimateMs = e, t-begin
			}
			curBound := upTo(starts, t) - upTo(ends, begin-1)
			a.WorstEstimateBound = max(a.WorstEstimateBound, float64(estimate(curBound, prevBound, w, t-begin))/r)
		}
	}
	for t := lo + 2*w - 1; t <= hi; t++ {
		a.WorstInterval = max(a.WorstInterval, float64(upTo(ats, t)-upTo(ats, t-w))/r)
	}
	for t := lo; t <= hi; t += w {
		a.WorstFromFirst = max(a.WorstFromFirst, float64(upTo(ats, t+w-1)-upTo(ats, t-1))/r)
	}
	return a
}

// floorDiv returns t / w rounded down.
func floorDiv(t, w int64) int64 {
	i := t / w
	if t%w < 0 {
		i--
	}
	return i
}

// estimate is the sliding window counter's estimate, cur + floor(prev ×
// (w-e) / w), for 0 <= e < w: the rule as the reference article states
// it, written here apart from the library's own arithmetic so that the
// bench checks the library rather than repeating it.
func estimate(cur, prev, w, e int64) int64 {
	hi, lo := bits.Mul64(uint64(prev), uint64(w-e))
	q, _ := bits.Div64(hi, lo, uint64(w))
	return cur + int64(q)
}
