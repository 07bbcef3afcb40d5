// Calendar periods: where a day, an ISO week, a month or a year starts and
// ends in a time zone, to the instant, across DST changes and skipped
// midnights.

package ratelimit

import (
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"
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

// String returns "daily", "weekly", "monthly" or "yearly", or
// "Period(n)" for another value.
func (p Period) String() string {
	switch p {
	case Daily:
		return "daily"
	case Weekly:
		return "weekly"
	case Monthly:
		return "monthly"
	case Yearly:
		return "yearly"
	}
	return fmt.Sprintf("Period(%d)", uint8(p))
}

// valid reports whether p is one of Daily, Weekly, Monthly and Yearly.
func (p Period) valid() bool { return p >= Daily && p <= Yearly }

// date is a calendar date, without a time or a zone.
type date struct {
	y int
	m time.Month
	d int
}

// dateOf returns the date t shows in loc.
func dateOf(t time.Time, loc *time.Location) date {
	y, m, d := t.In(loc).Date()
	return date{y, m, d}
}

// first returns the first date of the period of p that holds c.
func (p Period) first(c date) date {
	switch p {
	case Weekly:
		// ISO weeks start on Monday; time.Weekday counts from Sunday
		wd := time.Date(c.y, c.m, c.d, 12, 0, 0, 0, time.UTC).Weekday()
		back := (int(wd) + 6) % 7
		t := time.Date(c.y, c.m, c.d-back, 12, 0, 0, 0, time.UTC)
		return date{t.Year(), t.Month(), t.Day()}
	case Monthly:
		return date{c.y, c.m, 1}
	case Yearly:
		return date{c.y, time.January, 1}
	}
	return c
}

// next returns the first date of the period of p after the one that
// starts on c (c a first date).
func (p Period) next(c date) date {
	var t time.Time
	switch p {
	case Weekly:
		t = time.Date(c.y, c.m, c.d+7, 12, 0, 0, 0, time.UTC)
	case Monthly:
		t = time.Date(c.y, c.m+1, 1, 12, 0, 0, 0, time.UTC)
	case Yearly:
		t = time.Date(c.y+1, time.January, 1, 12, 0, 0, 0, time.UTC)
	default:
		t = time.Date(c.y, c.m, c.d+1, 12, 0, 0, 0, time.UTC)
	}
	return date{t.Year(), t.Month(), t.Day()}
}

// prev returns the first date of the period of p before the one that
// starts on c (c a first date).
func (p Period) prev(c date) date {
	t := time.Date(c.y, c.m, c.d, 12, 0, 0, 0, time.UTC).AddDate(0, 0, -1)
	return p.first(date{t.Year(), t.Month(), t.Day()})
}

// midnight returns the first instant at or after which loc shows date c
// or a later one: the instant its clocks read c 00:00, or, where loc skips
// that local midnight (America/Havana on 2026-03-08), the instant of the
// skip (01:00 there). Where loc's clocks go back over a midnight, it is
// the first time they read c.
//
// It walks loc's zone periods (Time.ZoneBounds) around c: within one,
// the offset is fixed and the local clock is the instant plus the offset,
// so the first instant there that shows c or later is the later of the
// period's start and c 00:00 less the offset.
func midnight(c date, loc *time.Location) time.Time {
	local := time.Date(c.y, c.m, c.d, 0, 0, 0, 0, time.UTC) // c 00:00 as if loc were UTC
	// no zone is more than a day from UTC: a window of two days either
	// side holds every instant that may show c 00:00
	from, to := local.Add(-48*time.Hour), local.Add(48*time.Hour)
	var best time.Time
	for s := from; s.Before(to); {
		lt := s.In(loc)
		_, off := lt.Zone()
		start, end := lt.ZoneBounds()
		if start.IsZero() || start.Before(s) {
			start = s // a period before the window: only from s on
		}
		cand := local.Add(-time.Duration(off) * time.Second)
		if cand.Before(start) {
			cand = start
		}
		if (end.IsZero() || cand.Before(end)) && !cand.Before(from) && (best.IsZero() || cand.Before(best)) {
			best = cand
		}
		if end.IsZero() || !end.After(s) {
			break
		}
		s = end
	}
	return best
}

// bounds returns the calendar period of p, in loc (nil: UTC), that holds
// t: its start, the first instant whose local date falls in it, and its
// end, the next period's start.
func (p Period) bounds(t time.Time, loc *time.Location) (start, end time.Time) {
	if loc == nil {
		loc = time.UTC
	}
	c := p.first(dateOf(t, loc))
	start, end = midnight(c, loc), midnight(p.next(c), loc)
	// where clocks go back over a midnight, t's date may be of the period
	// before the one its instant is in, or the other way round
	for t.Before(start) {
		c = p.prev(c)
		start, end = midnight(c, loc), start
	}
	for !t.Before(end) {
		c = p.next(c)
		start, end = end, midnight(p.next(c), loc)
	}
	return start, end
}

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
	pos := locateCalendar(t.UnixMilli(), Limit{Calendar: p, Location: loc})
	return time.UnixMilli(pos.start()).In(pos.loc), time.UnixMilli(pos.end()).In(pos.loc)
}

// PerPeriod returns a Limit of rate requests per calendar period p in loc
// (nil: UTC): PerPeriod(10_000, Daily, berlin) starts again at each
// midnight in Berlin.
func PerPeriod(rate int64, p Period, loc *time.Location) Limit {
	return Limit{Rate: rate, Calendar: p, Location: loc}
}

// zoneName returns the name that tells loc's periods apart: "UTC" for nil.
func zoneName(loc *time.Location) string {
	if loc == nil {
		return "UTC"
	}
	return loc.String()
}

// calendarProblem says what makes a calendar limit unusable; "" for
// nothing.
func (l Limit) calendarProblem() string {
	switch {
	case !l.Calendar.valid():
		return fmt.Sprintf("calendar %v is none of Daily, Weekly, Monthly and Yearly", l.Calendar)
	case l.Window != 0:
		return fmt.Sprintf("calendar %v with a window of %v: a calendar limit has no Window", l.Calendar, l.Window)
	case l.Strict:
		return fmt.Sprintf("calendar %v with Strict: a period is already a hard bound within itself", l.Calendar)
	case l.Location != nil && (l.Location.String() == "Local" || l.Location.String() == ""):
		// time.Local is each machine's own zone, named "Local" on all of
		// them: servers whose zones differ would share keys and disagree
		// on where periods start.
		return fmt.Sprintf("calendar location %q: name the zone (time.LoadLocation(\"Europe/Berlin\"), time.FixedZone(\"UTC+1\", 3600)), "+
			"so that every server counts in the same one", l.Location.String())
	case l.Rate > maxProduct:
		return fmt.Sprintf("rate %d is above 2^53, the most a count holds", l.Rate)
	}
	return ""
}

// periodSpan is a calendar period as found once: its start and end in Unix
// ms, for the zone loc, as bounds finds them.
type periodSpan struct {
	loc        *time.Location
	p          Period
	start, end int64
}

// periodCache holds the periods found last, per slot: a decision in the
// same period as the last one of its zone and kind finds it there, with no
// walk of the zone's rules. A slot holds one zone at a time; zones whose
// slots collide find their periods again, which costs time, never a wrong
// period (an entry is used only for its own *time.Location).
var periodCache [64]atomic.Pointer[periodSpan]

// periodSeed hashes a zone's name: to its slot of periodCache, and for the
// tables' keys (position.tableKey).
var periodSeed = maphash.MakeSeed()

// locateCalendar returns the position of Unix millisecond t in limit's
// calendar periods: i the period's start in Unix ms, w its length, e the
// ms since its start.
func locateCalendar(t int64, limit Limit) position {
	loc := limit.Location
	if loc == nil {
		loc = time.UTC
	}
	slot := &periodCache[(maphash.String(periodSeed, loc.String())+uint64(limit.Calendar))%uint64(len(periodCache))]
	s := slot.Load()
	if s == nil || s.loc != loc || s.p != limit.Calendar || t < s.start || t >= s.end {
		start, end := limit.Calendar.bounds(time.UnixMilli(t), loc)
		s = &periodSpan{loc: loc, p: limit.Calendar, start: start.UnixMilli(), end: end.UnixMilli()}
		slot.Store(s)
	}
	return position{w: s.end - s.start, i: s.start, e: t - s.start, cal: limit.Calendar, loc: loc}
}

// appendPeriod appends what a calendar period's key holds after the id's
// tag: ":<period>:<zone>:<the period's first date>", as in
// ":monthly:Europe/Berlin:2026-12-01".
func appendPeriod(b []byte, p position) []byte {
	b = append(b, ':')
	b = append(b, p.cal.String()...)
	b = append(b, ':')
	b = append(b, p.loc.String()...)
	b = append(b, ':')
	return time.UnixMilli(p.i).In(p.loc).AppendFormat(b, time.DateOnly)
}
