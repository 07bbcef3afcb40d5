// Package window holds the arithmetic of the sliding window counter, in
// exact integers: the estimate the Lua script decides on, and the waits a
// Result reports. It is the one Go model of the script's arithmetic, used by
// the limiter and by the accuracy study.
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
package window

import (
	"math"
	"math/bits"
	"time"
)

// Estimate returns cur + floor(prev × (w-e) / w), saturating rather than
// overflowing on counts no script would store. 0 <= e < w.
func Estimate(cur, prev, w, e int64) int64 {
	return satAdd(cur, mulDiv(prev, w-e, w))
}

// WaitUntil returns the shortest wait after which the estimate would be at
// most target if no other request came, or a negative duration if target is
// negative (it never would be).
func WaitUntil(cur, prev, w, e, target int64) time.Duration {
	if target < 0 {
		return -1
	}
	// Still in this window, m ms before its end: cur + floor(prev×m/w).
	if cur <= target {
		m := maxLeft(prev, target-cur, w)
		if m >= w-e {
			return 0
		}
		if m >= 1 {
			return ms(w - m - e)
		}
	}
	// In the next window, m ms before its end: floor(cur×m/w).
	m := maxLeft(cur, target, w)
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

// ms returns n ms as a Duration, math.MaxInt64 for more than a Duration
// holds (a wait of two windows of more than 146 years): the product would
// wrap to a negative wait.
func ms(n int64) time.Duration {
	if n > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Millisecond
}
