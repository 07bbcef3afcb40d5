package ratelimit

import (
	"math"
	"math/bits"
	"time"
)

// The arithmetic of the sliding window, in exact integers. The script makes
// the one decision that must be atomic; everything a Result reports besides
// is derived here from the counts the script saw.
//
// With w the window in ms, e the ms elapsed in the current window, cur and
// prev the counts of the current and previous windows, the estimate of the
// sliding window's usage is
//
//	cur + floor(prev × (w-e) / w)
//
// With no further traffic it only falls: prev's weight shrinks to nothing by
// the end of the window; then cur becomes the previous window and fades in
// turn, and two windows on the estimate is 0.

// position places a moment in a window: index i (window i covers
// [i×w, (i+1)×w) in Unix ms) and e, the ms elapsed since it began.
type position struct {
	w, i, e int64
}

// locate returns the position of Unix millisecond t in windows of w ms.
func locate(t, w int64) position {
	i := t / w
	if t%w < 0 { // floor, not truncation, for clocks before 1970
		i--
	}
	return position{w: w, i: i, e: t - i*w}
}

// left returns the ms left in the current window, the previous count's weight
// in w-ths.
func (p position) left() int64 { return p.w - p.e }

// estimate returns cur + floor(prev × (w-e) / w), saturating rather than
// overflowing on counts no script would store.
func (p position) estimate(c counts) int64 {
	return satAdd(c.cur, mulDiv(c.prev, p.left(), p.w))
}

// waitUntil returns the shortest wait after which the estimate would be at
// most target if no other request came, or a negative duration if target is
// negative (it never would be).
func (p position) waitUntil(c counts, target int64) time.Duration {
	if target < 0 {
		return -1
	}
	w, e := p.w, p.e
	// Still in this window, m ms before its end: cur + floor(prev×m/w).
	if c.cur <= target {
		m := maxLeft(c.prev, target-c.cur, w)
		if m >= w-e {
			return 0
		}
		if m >= 1 {
			return ms(w - m - e)
		}
	}
	// In the next window, m ms before its end: floor(cur×m/w).
	m := maxLeft(c.cur, target, w)
	switch {
	case m >= w:
		return ms(w - e)
	case m >= 1:
		return ms(2*w - m - e)
	}
	// Two windows on, nothing is left of either count.
	return ms(2*w - e)
}

// maxLeft returns the largest m with floor(count × m / w) <= slack, that is
// count × m < (slack+1) × w; math.MaxInt64 when count is 0. slack >= 0.
func maxLeft(count, slack, w int64) int64 {
	if count == 0 {
		return math.MaxInt64
	}
	hi, lo := bits.Mul64(uint64(slack)+1, uint64(w))
	if hi != 0 || lo-1 > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo-1) / count
}

// mulDiv returns floor(a × b / d) for a, b >= 0 and d > 0, exactly, or
// math.MaxInt64 if that does not fit.
func mulDiv(a, b, d int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(d) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(d))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
