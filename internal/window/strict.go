// The strict count: a window cut into SubWindows sub-windows, and the
// wait until their sum admits a cost.

package window

import "time"

// SubWindows is k, the number of sub-windows a strict limit's window is cut
// into.
//
// Strict mode trades the sliding window's estimate for a bound that holds by
// construction. A strict limit of Rate R per Window W ms (W a multiple of k
// ms) cuts time into sub-windows of s = W/k ms; sub-window j covers
// [j×s, (j+1)×s). At a moment in sub-window j the strict count is the sum of
// the counts of sub-windows j-k .. j, k+1 of them: the current one, the k-1
// whole ones before it, and the oldest, which only partly overlaps the last
// W ms but is counted in full. A request of cost n is allowed when
// count + n <= R, and then n is added to sub-window j.
//
// Those k+1 sub-windows hold every request of the last W ms (and some
// older ones), so no span of W ms ever admits more than R. The price: a
// request stays counted for up to W+s ms, so an honest client is denied a
// little sooner than by the exact log, never later; and a client takes k+1
// counts where the sliding window takes 2.
const SubWindows = 10

// StrictCount returns the strict count: the sum of counts, saturating at
// math.MaxInt64 rather than overflowing. counts[0] is the current
// sub-window j's count and counts[i] is sub-window j-i's, len(counts) =
// SubWindows+1; the counts are non-negative.
func StrictCount(counts []int64) int64 {
	var sum int64
	for _, c := range counts {
		sum = satAdd(sum, c)
	}
	return sum
}

// StrictWaitUntil returns the shortest wait after which the strict count
// would be at most target if no other request came, exact to the
// millisecond: 0 if it already is, or a negative duration if target is
// negative (it never would be). counts are as for StrictCount, s is the
// sub-window in ms (s >= 1), e the ms elapsed in the current sub-window
// (0 <= e < s).
//
// After a wait of d ms, m = floor((e+d)/s) sub-windows have begun, and of
// the counts only counts[0 .. k-m] are still in the strict count (k =
// len(counts)-1): the oldest leave it one sub-window at a time. The counts
// being non-negative, the count only falls as they leave, so the wait is
// m×s - e for the smallest m whose remaining counts sum to at most target.
func StrictWaitUntil(counts []int64, s, e, target int64) time.Duration {
	if target < 0 {
		return -1
	}
	// The counts that may remain are the newest ones whose sum fits target.
	var sum int64
	keep := 0
	for _, c := range counts {
		if sum = satAdd(sum, c); sum > target {
			break
		}
		keep++
	}
	m := int64(len(counts) - keep)
	if m == 0 {
		return 0
	}
	return ms(m*s - e)
}
