package ratelimit

import (
	"time"

	"github.com/slidingwindow/ratelimit/internal/window"
)

// The sliding window's arithmetic lives in internal/window; these types
// carry its inputs through the decision.

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

// estimate returns cur + floor(prev × (w-e) / w); see window.Estimate.
func (p position) estimate(c counts) int64 { return window.Estimate(c.cur, c.prev, p.w, p.e) }

// waitUntil returns the shortest wait after which the estimate would be at
// most target; see window.WaitUntil.
func (p position) waitUntil(c counts, target int64) time.Duration {
	return window.WaitUntil(c.cur, c.prev, p.w, p.e, target)
}
