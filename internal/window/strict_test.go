package window

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStrictCount(t *testing.T) {
	for _, tc := range []struct {
		name   string
		counts []int64
		want   int64
	}{
		{"empty", nil, 0},
		{"zeros", make([]int64, SubWindows+1), 0},
		{"current only", []int64{7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 7},
		{"oldest counted in full", []int64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9}, 9},
		{"all", []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 66},
		{"saturates", []int64{math.MaxInt64 - 1, 1, 1}, math.MaxInt64},
		{"saturates and stays", []int64{math.MaxInt64, math.MaxInt64, 5}, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, StrictCount(tc.counts))
		})
	}
}

func TestStrictWaitUntil(t *testing.T) {
	ms := time.Millisecond
	// k = 3 here: the count sums 4 sub-windows of s = 100 ms.
	for _, tc := range []struct {
		name   string
		counts []int64
		e      int64
		target int64
		want   time.Duration
	}{
		{"negative target", []int64{0, 0, 0, 0}, 0, -1, -1},
		{"already", []int64{1, 1, 1, 1}, 50, 4, 0},
		{"empty and target 0", []int64{0, 0, 0, 0}, 99, 0, 0},
		{"oldest leaves at the next sub-window", []int64{1, 1, 1, 1}, 30, 3, 70 * ms},
		{"two leave", []int64{1, 1, 1, 1}, 30, 2, 170 * ms},
		{"empty oldest leave for free", []int64{1, 1, 0, 0}, 0, 1, 300 * ms},
		{"the current count last", []int64{5, 0, 0, 0}, 1, 4, 399 * ms},
		{"target 0", []int64{1, 2, 3, 4}, 99, 0, 301 * ms},
		{"saturated counts", []int64{1, math.MaxInt64, math.MaxInt64, 2}, 0, 1, 300 * ms},
		{"no counts", nil, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, StrictWaitUntil(tc.counts, 100, tc.e, tc.target))
		})
	}
}

// strictCountAfter returns the strict count d ms from now with no request in
// between: the counts of sub-windows that have not left it, stepping the
// definition rather than StrictWaitUntil's shortcut.
func strictCountAfter(counts []int64, s, e, d int64) int64 {
	m := (e + d) / s
	keep := max(int64(len(counts))-m, 0)
	return StrictCount(counts[:keep])
}

// TestStrictWaitUntilBruteForce steps ms by ms from now and checks the first
// ms at which the strict count is at most target is the one
// StrictWaitUntil reports.
func TestStrictWaitUntilBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		counts := make([]int64, SubWindows+1)
		for i := range counts {
			if rng.IntN(3) > 0 {
				counts[i] = rng.Int64N(6)
			}
		}
		s := 1 + rng.Int64N(20)
		e := rng.Int64N(s)
		total := StrictCount(counts)
		target := rng.Int64N(total+3) - 1

		got := StrictWaitUntil(counts, s, e, target)
		if target < 0 {
			require.Negative(t, got, "counts %v s %d e %d target %d", counts, s, e, target)
			continue
		}
		var want int64
		for strictCountAfter(counts, s, e, want) > target {
			want++
		}
		require.Equal(t, time.Duration(want)*time.Millisecond, got,
			"counts %v s %d e %d target %d", counts, s, e, target)
	}
}

// strictLimiter is the strict decision of one client, as the core makes it:
// counts by sub-window index, the last SubWindows+1 of them summed.
type strictLimiter struct {
	rate, s int64
	subs    map[int64]int64
}

// allow decides a request of cost n at ms t; t never goes back.
func (l *strictLimiter) allow(t, n int64) bool {
	j := t / l.s
	counts := make([]int64, SubWindows+1)
	for i := range counts {
		counts[i] = l.subs[j-int64(i)]
	}
	if StrictCount(counts)+n > l.rate {
		return false
	}
	l.subs[j] += n
	return true
}

// admitted is a request a limiter allowed: its ms and cost.
type admitted struct{ t, n int64 }

// maxInSpan returns the most cost the admitted requests (in time order) put
// in any span of w ms, [t-w+1, t].
func maxInSpan(reqs []admitted, w int64) int64 {
	var sum, most int64
	first := 0
	for _, r := range reqs {
		sum += r.n
		for reqs[first].t <= r.t-w {
			sum -= reqs[first].n
			first++
		}
		most = max(most, sum)
	}
	return most
}

func TestMaxInSpan(t *testing.T) {
	reqs := []admitted{{0, 1}, {9, 2}, {10, 3}, {19, 1}, {30, 5}}
	require.Equal(t, int64(5), maxInSpan(reqs, 10)) // [1, 10] and [21, 30]
	require.Equal(t, int64(6), maxInSpan(reqs, 11)) // [0, 10] and [9, 19]
	require.Equal(t, int64(5), maxInSpan(reqs, 1))
	require.Equal(t, int64(12), maxInSpan(reqs, 31))
}

// randomTrace returns requests in time order over about dur ms: bursts of
// several requests in one ms, quiet spells, costs from 1 to maxCost.
func randomTrace(rng *rand.Rand, dur, maxCost int64) []admitted {
	var reqs []admitted
	for t := int64(0); t < dur; {
		for range 1 + rng.IntN(4) {
			reqs = append(reqs, admitted{t, 1 + rng.Int64N(maxCost)})
		}
		switch rng.IntN(10) {
		case 0:
			t += rng.Int64N(dur / 4)
		case 1, 2, 3:
			// same ms again
		default:
			t += 1 + rng.Int64N(5)
		}
	}
	return reqs
}

// TestStrictNeverExceedsRate replays random traces through the strict
// decision and checks that no span of W ms ever holds more than R admitted,
// while it does admit up to R.
func TestStrictNeverExceedsRate(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		s := 1 + rng.Int64N(30)
		w := SubWindows * s
		rate := 1 + rng.Int64N(40)
		l := &strictLimiter{rate: rate, s: s, subs: map[int64]int64{}}
		var got []admitted
		for _, r := range randomTrace(rng, 20*w, 3) {
			if l.allow(r.t, r.n) {
				got = append(got, r)
			}
		}
		require.NotEmpty(t, got)
		worst := maxInSpan(got, w)
		require.LessOrEqual(t, worst, rate, "rate %d window %d ms", rate, w)
	}
}

// TestStrictDeniedWaitIsExact checks, in live traces, that a denied request
// would be allowed after exactly the wait StrictWaitUntil reports, were it
// the next one, and not 1 ms sooner.
func TestStrictDeniedWaitIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 100 {
		s := 1 + rng.Int64N(30)
		rate := 1 + rng.Int64N(40)
		l := &strictLimiter{rate: rate, s: s, subs: map[int64]int64{}}
		for _, r := range randomTrace(rng, 20*SubWindows*s, 3) {
			if l.allow(r.t, r.n) {
				continue
			}
			j := r.t / s
			counts := make([]int64, SubWindows+1)
			for i := range counts {
				counts[i] = l.subs[j-int64(i)]
			}
			wait := StrictWaitUntil(counts, s, r.t-j*s, rate-r.n)
			if r.n > rate {
				require.Negative(t, wait)
				continue
			}
			require.Positive(t, wait)
			require.Zero(t, wait%time.Millisecond)
			d := int64(wait / time.Millisecond)
			allowedAt := func(d int64) bool {
				u := r.t + d
				c := make([]int64, SubWindows+1)
				for i := range c {
					c[i] = l.subs[u/s-int64(i)]
				}
				return StrictCount(c)+r.n <= rate
			}
			require.True(t, allowedAt(d), "at the wait")
			require.False(t, allowedAt(d-1), "1 ms before it")
		}
	}
}
