package main

import (
	"math/bits"

	"github.com/slidingwindow/ratelimit"
)

// The library's arithmetic, as doc.go and docs/design.md state it. This
// module may import no internal package of the root module's (they are
// versioned apart), so it is written here again, and window_test.go holds
// it to the library's own decisions, request by request, on a Redis.

// subWindows is the number of sub-windows a strict limit's window is cut
// into.
const subWindows = ratelimit.StrictSubWindows

// estimate returns cur + floor(prev × (w-e) / w), exactly: the usage a
// sliding limit decides on, e ms into a window of w ms, with cur and prev
// the counts of the current and the previous window.
func estimate(cur, prev, w, e int64) int64 {
	hi, lo := bits.Mul64(uint64(prev), uint64(w-e))
	q, _ := bits.Div64(hi, lo, uint64(w))
	return cur + int64(q)
}

// strictCount returns the usage a strict limit decides on: the sum of its
// sub-windows' counts, each counted in full.
func strictCount(counts []int64) int64 {
	var sum int64
	for _, c := range counts {
		sum += c
	}
	return sum
}
