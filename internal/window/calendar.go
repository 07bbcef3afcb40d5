// Calendar periods: where a day, an ISO week, a month or a year starts and
// ends in a time zone, to the instant, across DST changes and skipped
// midnights.

package window

import (
	"hash/maphash"
	"sync/atomic"
	"time"
)

// Period is a kind of calendar period, as the root's Period numbers them:
// 0 for none.
type Period uint8

// The calendar periods, as the root's Daily, Weekly, Monthly and Yearly.
const (
	Daily Period = iota + 1
	Weekly
	Monthly
	Yearly
)

// Valid reports whether p is one of Daily, Weekly, Monthly and Yearly.
func (p Period) Valid() bool { return p >= Daily && p <= Yearly }

// Name returns "daily", "weekly", "monthly" or "yearly"; "" for another p.
func (p Period) Name() string {
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
	return ""
}

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

// bounds returns the calendar period of p, in loc (nil: UTC), that holds t: its
// start, the first instant whose local date falls in it, and its end, the
// next period's start.
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
// its start and its end, in loc. p must be valid.
func Bounds(p Period, t time.Time, loc *time.Location) (start, end time.Time) {
	pos := locatePeriod(t.UnixMilli(), p, loc)
	return time.UnixMilli(pos.Start()).In(pos.Loc), time.UnixMilli(pos.End()).In(pos.Loc)
}

// ZoneName returns the name that tells loc's periods apart: "UTC" for nil.
func ZoneName(loc *time.Location) string {
	if loc == nil {
		return "UTC"
	}
	return loc.String()
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

// ZoneSeed hashes a zone's name: to its slot of the period cache, and for
// the keys of the tables a process keeps per count (see the table package).
var ZoneSeed = maphash.MakeSeed()

// locatePeriod returns the position of Unix millisecond t in the periods
// of p in loc (nil: UTC): I the period's start in Unix ms, W its length, E
// the ms since its start.
func locatePeriod(t int64, p Period, loc *time.Location) Position {
	if loc == nil {
		loc = time.UTC
	}
	slot := &periodCache[(maphash.String(ZoneSeed, loc.String())+uint64(p))%uint64(len(periodCache))]
	s := slot.Load()
	if s == nil || s.loc != loc || s.p != p || t < s.start || t >= s.end {
		start, end := p.bounds(time.UnixMilli(t), loc)
		s = &periodSpan{loc: loc, p: p, start: start.UnixMilli(), end: end.UnixMilli()}
		slot.Store(s)
	}
	return Position{W: s.end - s.start, I: s.start, E: t - s.start, Period: p, Loc: loc}
}
