package bench

import (
	"math"
	"math/bits"
	"time"
)

// histogram counts durations in log-linear buckets: exact below 128ns, then
// 64 buckets per power of two, so a percentile is within 1/64 (1.6%) of the
// truth. Recording is an index computation and an increment: it never
// allocates, so the harness does not pollute allocations per decision.
// A histogram is not safe for simultaneous use; each goroutine has its own
// and they are merged at the end.
type histogram struct {
	counts [nBuckets]uint64
	n      uint64
}

const (
	subBits  = 6
	sub      = 1 << subBits // buckets per power of two
	nBuckets = (64-subBits)*sub + sub
)

// bucketOf returns the bucket of v ns.
func bucketOf(v uint64) int {
	if v < 2*sub {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1 // v>>shift is in [sub, 2*sub)
	return shift*sub + int(v>>shift)
}

// bucketMid returns the middle of bucket i, in ns.
func bucketMid(i int) float64 {
	if i < 2*sub {
		return float64(i)
	}
	shift := i/sub - 1
	low := uint64(i-shift*sub) << shift
	return float64(low) + float64(uint64(1)<<shift)/2
}

// record counts one duration; negative ones count as 0.
func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(uint64(max(d, 0)))]++
	h.n++
}

// merge adds o's counts to h's.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the q-quantile (0 < q ≤ 1) in ns, 0 if h is empty: the
// middle of the bucket that holds the ceil(q×n)-th smallest duration.
func (h *histogram) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return bucketMid(i)
		}
	}
	return bucketMid(nBuckets - 1)
}
