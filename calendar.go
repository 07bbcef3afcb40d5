// Calendar periods: Period, its kinds, and where a period starts and ends
// (internal/window finds it, to the instant, across DST changes and
// skipped midnights).

package ratelimit

import (
	"time"

	"github.com/slidingwindow/ratelimit/internal/window"
)

// Period is a calendar period.
type Period uint8

// The calendar periods a Limit's Calendar takes, in its Location.
const (
	Daily   Period = iota + 1 // from local midnight
	Weekly                    // ISO weeks: from Monday 00:00
	Monthly                   // from the first of the month
	Yearly                    // from the first of January
)

// internal/window numbers them alike: a difference below 0 overflows, and
// any above makes the index 1 or more.
var _ = [1]struct{}{}[(Daily-Period(window.Daily))|(Weekly-Period(window.Weekly))|(Monthly-Period(window.Monthly))|(Yearly-Period(window.Yearly))]

// String returns "daily", "weekly", "monthly" or "yearly", or
// "Period(n)" for another value.
func (p Period) String() string { return window.Period(p).String() }

// valid reports whether p is one of Daily, Weekly, Monthly and Yearly.
func (p Period) valid() bool { return window.Period(p).Valid() }

// Bounds returns the calendar period of p in loc (nil: UTC) that holds t:
// its start, the first instant whose local date falls in it, and its end,
// the next period's start. A day of a DST change lasts 23 or 25 hours;
// where loc skips local midnight, the day starts when its clocks jump.
// A Calendar limit counts from start to end; with Limiter.Now, Bounds says
// when the period a decision fell in started and ends (httplimit's w).
// For a p that is not one of Daily..Yearly, both are t.
func (p Period) Bounds(t time.Time, loc *time.Location) (start, end time.Time) {
	if !p.valid() {
		return t, t
	}
	return window.Bounds(window.Period(p), t, loc)
}

// PerPeriod returns a Limit of rate requests per calendar period p in loc
// (nil: UTC): PerPeriod(10_000, Daily, berlin) starts again at each
// midnight in Berlin.
func PerPeriod(rate int64, p Period, loc *time.Location) Limit {
	return Limit{Rate: rate, Calendar: p, Location: loc}
}
