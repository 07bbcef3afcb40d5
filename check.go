// The one validator: every operation's input is checked before anything
// is sent, by these rules, each written once: the client, the id, the
// limits (Limit.Validate, ValidateLimits), the cost, a concurrency limit
// (Concurrency.Validate), a Result to refund.

package ratelimit

import (
	"fmt"
	"hash/maphash"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// checkClient reports a Limiter made with a nil client.
func (l *Limiter) checkClient() error {
	if l.t == nil {
		return ErrNilClient
	}
	return nil
}

// checkID reports an id no count can be kept under.
func checkID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: id is empty", ErrInvalidID)
	}
	return nil
}

// checkCost reports a cost that no decision takes: below least (1, or 0
// for an AllowMany's quota), or above what a count holds.
func checkCost(n, least int64) error {
	if n < least {
		return fmt.Errorf("%w: cost %d is below %d", ErrInvalidCost, n, least)
	}
	if n > script.MaxCount {
		return fmt.Errorf("%w: cost %d is above 2^53, the most a count holds", ErrInvalidCost, n)
	}
	return nil
}

// checkLen checks the length n of a call's list of what (limits, quotas):
// at least one, at most maxLimits.
func checkLen(n int, what string) error {
	if n == 0 {
		return fmt.Errorf("%w: no %s", ErrInvalidLimit, what)
	}
	if n > maxLimits {
		return fmt.Errorf("%w: %d %s, more than %d", ErrInvalidLimit, n, what, maxLimits)
	}
	return nil
}

// sameCount reports whether limits a and b of one id share one count:
// their windows are the same length and kind, or their calendar periods
// the same kind in the same zone (by name).
func sameCount(a, b Limit) bool {
	return a.Window == b.Window && a.Strict == b.Strict && a.Calendar == b.Calendar &&
		(a.Calendar == 0 || window.ZoneName(a.Location) == window.ZoneName(b.Location))
}

// checkDecision validates a decision (or a look, a charge, a give-back, a
// Reset) of cost n by id against limits, after Close ErrClosed: the
// limits' number, the client, the id, the first limit, the cost, then the
// limits together.
func (l *Limiter) checkDecision(id string, limits []Limit, n int64) error {
	if l.closed.Load() {
		return ErrClosed
	}
	if len(limits) == 0 {
		return ValidateLimits(limits)
	}
	if err := l.checkClient(); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	if err := limits[0].Validate(); err != nil {
		return err
	}
	if err := checkCost(n, 1); err != nil {
		return err
	}
	if len(limits) == 1 {
		return nil // checked in full
	}
	return ValidateLimits(limits)
}

// checkMany validates the quotas of AllowMany: each one's id, limit and
// cost (from 0), and no two of one id that would share a count.
func (l *Limiter) checkMany(quotas []Quota) error {
	if err := l.checkClient(); err != nil {
		return err
	}
	if err := checkLen(len(quotas), "quotas"); err != nil {
		return err
	}
	for i, q := range quotas {
		err := checkID(q.ID)
		if err == nil {
			err = q.Limit.Validate()
		}
		if err == nil {
			err = checkCost(q.Cost, 0)
		}
		if err != nil {
			return wrap(fmt.Sprintf("ratelimit: quota %d", i), err)
		}
		for j, o := range quotas[:i] {
			if o.ID == q.ID && sameCount(o.Limit, q.Limit) {
				return fmt.Errorf("%w: quotas %d and %d have the same id and window (%v and %v), and would share one count", ErrInvalidLimit, j, i, o.Limit, q.Limit)
			}
		}
	}
	return nil
}

// checkConcurrency validates an Acquire of c by id.
func (l *Limiter) checkConcurrency(id string, c Concurrency) error {
	if err := l.checkClient(); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	return c.Validate()
}

// checkRefund validates a refund of n of what results, of a decision for
// id, counted: each Result's limit valid, and those that counted made by
// this Limiter for id, in the count their limit names, of at least n, each
// count once; and at least one that counted.
func (l *Limiter) checkRefund(id string, results []Result, n int64) error {
	if err := l.checkClient(); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	if len(results) == 0 {
		return fmt.Errorf("%w: no Results to refund", ErrInvalidLimit)
	}
	if n < 1 {
		return fmt.Errorf("%w: refund %d is below 1", ErrInvalidCost, n)
	}
	counted := false
	for i := range results {
		limit, r := results[i].Limit, &results[i].receipt
		if err := limit.Validate(); err != nil {
			return wrap(fmt.Sprintf("ratelimit: Result %d", i), err)
		}
		if r.counted == 0 {
			continue
		}
		if r.by != l.serial || r.id != idHash(id) {
			return fmt.Errorf("%w: a Result of limit %v was not made by this Limiter for this id", ErrInvalidCost, limit)
		}
		if !r.of(limit) {
			was := Limit{Rate: limit.Rate, Window: time.Duration(r.ms) * time.Millisecond, Strict: r.strict, Calendar: r.cal, Location: r.loc}
			return fmt.Errorf("%w: a Result's limit %v is not the one it counted in (%v)", ErrInvalidLimit, limit, was)
		}
		if n > r.counted {
			return fmt.Errorf("%w: refund of %d is more than the %d that limit %v counted", ErrInvalidCost, n, r.counted, limit)
		}
		for _, other := range results[:i] {
			if other.receipt.counted > 0 && sameCount(other.Limit, limit) && other.receipt.window == r.window {
				// One count given twice would take back more than it counted.
				return fmt.Errorf("%w: two Results of the same count (limits %v and %v)", ErrInvalidLimit, other.Limit, limit)
			}
		}
		counted = true
	}
	if !counted {
		return fmt.Errorf("%w: the decision counted nothing to refund (denied, a look, degraded, or not this Limiter's)", ErrInvalidCost)
	}
	return nil
}

// Validate reports what makes l unusable, as every method of a Limiter would:
// a Rate below 1, a Window below 1ms or not a whole number of milliseconds,
// a Rate × Window (in ms) above 2^53, or a Strict Window that is not a
// multiple of StrictSubWindows ms; for a Calendar limit, a Calendar outside
// Daily..Yearly, a Window, Strict, a Rate above 2^53, or a Location named
// "Local" or nothing; a Location without a Calendar. The error wraps
// ErrInvalidLimit. Check limits from configuration with it at start-up.
func (l Limit) Validate() error {
	if p := l.window().Problem(); p != "" {
		return fmt.Errorf("%w: %s", ErrInvalidLimit, p)
	}
	return nil
}

// ParseLimit parses a limit from configuration as String prints it: a rate,
// "/", a window as time.ParseDuration reads it or a calendar period (daily,
// weekly, monthly or yearly, then optionally "@" and a zone that
// time.LoadLocation finds, "10000/daily@Europe/Berlin", or an offset from
// UTC, which it reads as a time.FixedZone of that name, "10/daily@UTC+1",
// "10/daily@UTC-05:30"), then any of the flags
// strict, shadow and leased, each at most once, in any order, separated by
// spaces: "100/1m0s", "100/1m", "10/1s strict shadow leased". The window
// may also start with a whole number of days, "1000/1d", "10/7d",
// "5/1d12h", or be a unit alone for one of it, "10/s", "1000/d" (a day of
// 24 hours, sliding; "daily" is the calendar day). It also reads
// ulule/limiter's short form, a rate, "-" and a window of S, M, H or D (a
// second, a minute, an hour, a day; in either case, as ulule reads it):
// "1000-H", which flags may follow too. String does not print Name, so
// ParseLimit leaves it empty: ParseLimit(l.String()) is l without its Name.
//
// The error wraps ErrInvalidLimit, quotes s and says what is wrong: no
// rate or window, a rate that is not a whole number or does not fit an
// int64, a window that ParseDuration rejects, an unknown or repeated flag,
// or a limit that Limit.Validate rejects.
func ParseLimit(s string) (Limit, error) {
	w, problem := window.ParseLimit(s)
	if problem != "" {
		return Limit{}, fmt.Errorf("%w %q: %s", ErrInvalidLimit, s, problem)
	}
	return Limit{Rate: w.Rate, Window: w.Window, Strict: w.Strict, Shadow: w.Shadow, Leased: w.Leased,
		Calendar: Period(w.Period), Location: w.Loc}, nil
}

// ValidateLimits reports what makes limits unusable together in one
// AllowAll or PeekAll, as those would: none at all, more than 16, a limit
// that Limit.Validate rejects, or two limits of the same Window and Strict
// (or Calendar and Location), which would share one count (named both). The error wraps
// ErrInvalidLimit. Check a plan from configuration with it at start-up;
// httplimit and grpclimit check theirs with it.
func ValidateLimits(limits []Limit) error {
	if err := checkLen(len(limits), "limits"); err != nil {
		return err
	}
	for i, limit := range limits {
		if err := limit.Validate(); err != nil {
			return err
		}
		for _, other := range limits[:i] {
			if sameCount(other, limit) {
				what := "window"
				if limit.Calendar != 0 {
					what = "period and zone"
				}
				return fmt.Errorf("%w: limits %v and %v have the same %s and would share one count", ErrInvalidLimit, other, limit, what)
			}
		}
	}
	return nil
}

// Validate reports what is wrong with c, as an error that wraps
// ErrInvalidLimit, or nil.
func (c Concurrency) Validate() error {
	switch {
	case c.Max < 1:
		return fmt.Errorf("%w: concurrency Max %d is below 1", ErrInvalidLimit, c.Max)
	case c.Lease < time.Millisecond:
		return fmt.Errorf("%w: concurrency Lease %v is below 1ms", ErrInvalidLimit, c.Lease)
	case c.Lease%time.Millisecond != 0:
		return fmt.Errorf("%w: concurrency Lease %v is not a whole number of ms", ErrInvalidLimit, c.Lease)
	}
	return nil
}

// of reports whether the receipt was counted in limit's count.
func (r *receipt) of(limit Limit) bool {
	return limit.Window.Milliseconds() == r.ms && limit.Strict == r.strict &&
		limit.Calendar == r.cal && (r.cal == 0 || window.ZoneName(limit.Location) == window.ZoneName(r.loc))
}

// idHash hashes an id for a Result, so that Refund can tell a Result made
// for another id.
func idHash(id string) uint64 { return maphash.String(idSeed, id) | 1 } // never 0: 0 is "none yet"

// idSeed hashes ids for idHash.
var idSeed = maphash.MakeSeed()
