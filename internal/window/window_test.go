package window

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEstimate(t *testing.T) {
	for _, tc := range []struct {
		name            string
		cur, prev, w, e int64
		want            int64
	}{
		{"window start: prev in full", 3, 10, 100, 0, 13},
		{"the article's 30%", 30, 80, 60000, 18000, 86},
		{"floored", 0, 10, 3, 1, 6}, // 10×2/3 = 6.67
		{"last ms", 5, 99, 100, 99, 5},
		{"no prev", 7, 0, 100, 50, 7},
		{"product past 2^64", 1, math.MaxInt64, math.MaxInt64, 1, math.MaxInt64},
		{"saturates", math.MaxInt64, 5, 10, 0, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Estimate(tc.cur, tc.prev, tc.w, tc.e))
		})
	}
}

// estimateAfter returns the estimate d ms from now with no request in
// between: within this window, in the next (where cur has become the
// previous count), or two windows on (nothing left).
func estimateAfter(cur, prev, w, e, d int64) int64 {
	switch p := e + d; {
	case p < w:
		return Estimate(cur, prev, w, p)
	case p < 2*w:
		return Estimate(0, cur, w, p-w)
	}
	return 0
}

// TestWaitUntilBruteForce steps ms by ms from now and checks the first ms at
// which the estimate is at most target is the one WaitUntil reports.
func TestWaitUntilBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 20000 {
		w := 1 + rng.Int64N(60)
		e := rng.Int64N(w)
		cur, prev := rng.Int64N(3*w), rng.Int64N(3*w)
		if rng.IntN(4) == 0 {
			cur = 0
		}
		target := rng.Int64N(cur+prev+3) - 1

		got := WaitUntil(cur, prev, w, e, target)
		if target < 0 {
			require.Negative(t, got)
			continue
		}
		var want int64
		for estimateAfter(cur, prev, w, e, want) > target {
			want++
		}
		require.Equal(t, time.Duration(want)*time.Millisecond, got,
			"cur %d prev %d w %d e %d target %d", cur, prev, w, e, target)
	}
}

// TestWaitUntilLongWindow: a wait of up to two windows does not fit a
// Duration once a window is over 146 years; it saturates instead of
// wrapping to a negative wait.
func TestWaitUntilLongWindow(t *testing.T) {
	w := int64(200 * 365 * 24 * time.Hour / time.Millisecond)
	require.Equal(t, time.Duration(math.MaxInt64), WaitUntil(5, 0, w, 0, 0), "about 1.8 windows")
	require.Equal(t, time.Duration(w+1)*time.Millisecond, WaitUntil(1, 0, w, 0, 0), "one window and a ms still fits")
}

// TestWaitUntilProperty checks, on windows too long to step through, that
// at the wait WaitUntil reports the estimate is at most target and 1 ms
// before it is not.
func TestWaitUntilProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range 100000 {
		w := 1 + rng.Int64N(int64(24*time.Hour/time.Millisecond))
		e := rng.Int64N(w)
		cur, prev := rng.Int64N(1_000_000), rng.Int64N(1_000_000)
		target := rng.Int64N(cur+prev+3) - 1

		got := WaitUntil(cur, prev, w, e, target)
		if target < 0 {
			require.Negative(t, got)
			continue
		}
		require.Zero(t, got%time.Millisecond)
		d := int64(got / time.Millisecond)
		require.LessOrEqual(t, estimateAfter(cur, prev, w, e, d), target,
			"at the wait: cur %d prev %d w %d e %d target %d", cur, prev, w, e, target)
		if d > 0 {
			require.Greater(t, estimateAfter(cur, prev, w, e, d-1), target,
				"1 ms before: cur %d prev %d w %d e %d target %d", cur, prev, w, e, target)
		}
	}
}

// TestSlidingBounds replays random traces through the sliding window's
// decision (allowed when Estimate + n <= R): no fixed window admits more
// than R, so no span of W ms admits more than 2R. That 2R is the worst
// case strict mode exists to remove.
func TestSlidingBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for range 300 {
		w := 1 + rng.Int64N(300)
		rate := 1 + rng.Int64N(40)
		counts := map[int64]int64{}
		var got []admitted
		for _, r := range randomTrace(rng, 20*w, 3) {
			i := r.t / w
			if Estimate(counts[i], counts[i-1], w, r.t-i*w)+r.n > rate {
				continue
			}
			counts[i] += r.n
			got = append(got, r)
		}
		for i, c := range counts {
			require.LessOrEqual(t, c, rate, "window %d", i)
		}
		require.LessOrEqual(t, maxInSpan(got, w), 2*rate)
	}
}
