// What an Envoy may spend under the quota assignments of one bucket,
// counted in Redis before it may, and given back when its reports show it
// unused: the arithmetic of the quota service's bound (docs/envoy.md,
// "Quota service (RLQS)").

package rls

import (
	"context"
	"math"
	"math/bits"
	"time"

	"github.com/slidingwindow/ratelimit"
)

// shape is a token bucket sent to Envoy: it holds up to max tokens, full
// when Envoy creates it, and gains fill tokens every fill interval.
type shape struct{ max, fill int64 }

// term is one token bucket Envoy may hold: from the assignment that made
// it (or that found the previous one expired) until the last of the
// assignments that renewed it expires, or another replaced it.
type term struct {
	shape shape
	start time.Time // sent: Envoy's bucket is no older
	// expires is when Envoy's own timer may end it at the earliest (the
	// last send + its TTL): a renewal sent before it reaches Envoy in time
	expires time.Time
	end     time.Time // the last moment Envoy may spend from it
}

// spendable returns the most Envoy may spend from e after from, with
// tokens refilled every fill: a full bucket and what refills to its end.
// Envoy's token bucket refills continuously, fill tokens over each fill
// interval (its TokenBucketImpl), so a whole token less than that is all
// it may spend of them.
func (e *term) spendable(from time.Time, fill time.Duration) int64 {
	from = later(from, e.start)
	if !e.end.After(from) {
		return 0
	}
	d := e.end.Sub(from)
	whole := satMul(e.shape.fill, int64(d/fill))
	hi, lo := bits.Mul64(uint64(e.shape.fill), uint64(d%fill)) // hi < fill: no overflow
	part, _ := bits.Div64(hi, lo, uint64(fill))
	return satAdd(e.shape.max, satAdd(whole, int64(part)))
}

// fills returns how many fills of length fill d spans, rounded up.
func fills(d, fill time.Duration) int64 {
	return int64((d + fill - 1) / fill)
}

// grant is one count in Redis for a bucket, and what of it may still be
// given back.
type grant struct {
	res  ratelimit.Result
	left int64
}

// ledger is a bucket's account in one unit of its limit (a window, a
// strict limit's sub-window, a calendar period): what was counted, what
// reports showed spent, and the token buckets it pays for. Every
// assignment counted in a unit ends by that unit's end, so no token
// counted in one unit is spent in another. A unit that has ended is
// settled by the reports that follow, as the current one is, until its
// last token bucket has ended before a report was made: all it counted
// is then spent or given back.
type ledger struct {
	id      string // what it counts under
	unitEnd time.Time
	// weighs is when the unit's count stops weighing on decisions: a
	// refund after it does nothing
	weighs     time.Time
	grants     []grant
	counted    int64 // what the grants hold, net of what was given back
	attributed int64 // what reports showed spent, at most counted
	terms      []term
}

// newLedger returns the ledger of the unit of limit, counted under id,
// that now falls in.
func newLedger(id string, limit ratelimit.Limit, now time.Time) ledger {
	end, _ := quotaUnit(limit, now)
	weighs := end
	if limit.Calendar == 0 {
		// a window is read until the next one ends; a strict sub-window
		// for StrictSubWindows more, as long
		weighs = end.Add(limit.Window)
	}
	return ledger{id: id, unitEnd: end, weighs: weighs}
}

// settled reports whether l, just settled, holds nothing more to give
// back: none of its terms can spend after the settlement (so all it
// counted was attributed or given back), or its count no longer weighs at
// now.
func (l *ledger) settled(now time.Time) bool {
	return len(l.terms) == 0 || !now.Before(l.weighs)
}

// live returns the term Envoy may still be spending from, or nil.
func (l *ledger) live() *term {
	if len(l.terms) == 0 {
		return nil
	}
	return &l.terms[len(l.terms)-1]
}

// spent attributes n reported spent to the unit, at most what it counted
// and was not shown spent. A unit's first token bucket is sent only at a
// report made after the last one of the unit before had ended (assign
// waits for it), so no report is a sum of two units' spending: the unit
// that could not have spent any of it has counted nothing yet, and takes
// none.
func (l *ledger) spent(n int64) {
	l.attributed = min(satAdd(l.attributed, n), l.counted)
}

// owed returns what Envoy may still spend of the unit's tokens after a
// report made at from or later, at most what is counted and not spent.
func (l *ledger) owed(from time.Time, fill time.Duration) int64 {
	var n int64
	for i := range l.terms {
		n = satAdd(n, l.terms[i].spendable(from, fill))
	}
	return min(n, l.counted-l.attributed)
}

// forget drops the terms that can spend nothing after from.
func (l *ledger) forget(from time.Time) {
	kept := l.terms[:0]
	for _, e := range l.terms {
		if e.end.After(from) {
			kept = append(kept, e)
		}
	}
	l.terms = kept
}

// unused returns what the unit may give back after a report made at from
// or later: what is counted, neither spent nor still spendable.
func (l *ledger) unused(from time.Time, fill time.Duration) int64 {
	return l.counted - l.attributed - l.owed(from, fill)
}

// giveBack refunds n of the unit's grants, newest first, each to the
// window it was counted in. A refund that fails may have landed, so it is
// never sent again: it is taken off all the same, which can only leave
// the count higher than the spending.
func (l *ledger) giveBack(ctx context.Context, lim *ratelimit.Limiter, n int64) (given int64, err error) {
	for i := len(l.grants) - 1; i >= 0 && n > 0; i-- {
		g := &l.grants[i]
		k := min(g.left, n)
		if k == 0 {
			continue
		}
		if e := lim.Refund(ctx, l.id, []ratelimit.Result{g.res}, k); e != nil && err == nil {
			err = e
		}
		g.left -= k
		n -= k
		given += k
	}
	l.counted -= given
	l.attributed = min(l.attributed, l.counted)
	return given, err
}

// quotaUnit returns when the unit of limit that now falls in ends: the
// window's, a strict limit's sub-window's (ratelimit.StrictSubWindows to a
// window), or a calendar period's; and the length its Rate is spread
// over (the window, or the period).
func quotaUnit(limit ratelimit.Limit, now time.Time) (end time.Time, span time.Duration) {
	if limit.Calendar != 0 {
		start, end := limit.Calendar.Bounds(now, limit.Location)
		return end, end.Sub(start)
	}
	w := limit.Window.Milliseconds()
	if limit.Strict {
		w /= ratelimit.StrictSubWindows
	}
	t := now.UnixMilli()
	i := t / w
	if t%w < 0 {
		i--
	}
	return time.UnixMilli((i + 1) * w), limit.Window
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
