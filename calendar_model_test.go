package ratelimit_test

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the zones below on a machine without /usr/share/zoneinfo

	"github.com/slidingwindow/ratelimit"
)

// The model of calendar periods (issue 38) is written apart from the
// library's: a period is named by the first date of the local dates it
// holds, found with time.Time.Date, and it ends at the first millisecond
// whose local date is in another period, found by bisection. The library
// walks the zone's rules instead (Time.ZoneBounds). Bisection needs local
// dates that never go back, which holds in every zone of the pool below
// (not in America/Santiago, whose clocks go back over midnight: the
// library's own test of periods covers it).

// zoneOf returns the pool's location of a zone's name.
func zoneOf(name string) *time.Location {
	if name == "UTC" {
		return nil
	}
	loc, ok := calendarZones()[name]
	if !ok {
		panic("no zone " + name + " in the pool")
	}
	return loc
}

// calendarZones are the zones issue 38 names, each loaded once.
var calendarZones = sync.OnceValue(func() map[string]*time.Location {
	zones := map[string]*time.Location{}
	for _, name := range []string{"America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Havana", "Asia/Kolkata", "Pacific/Chatham"} {
		loc, err := time.LoadLocation(name)
		if err != nil {
			panic(err)
		}
		zones[name] = loc
	}
	return zones
})

// periodOf returns the first local date of the period of p in loc that
// holds Unix ms t, as yyyymmdd.
func periodOf(p ratelimit.Period, loc *time.Location, t int64) int64 {
	if loc == nil {
		loc = time.UTC
	}
	y, m, d := time.UnixMilli(t).In(loc).Date()
	switch p {
	case ratelimit.Weekly:
		day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
		back := (int(day.Weekday()) + 6) % 7 // days since Monday
		y, m, d = day.AddDate(0, 0, -back).Date()
	case ratelimit.Monthly:
		d = 1
	case ratelimit.Yearly:
		m, d = time.January, 1
	}
	return int64(y)*10000 + int64(m)*100 + int64(d)
}

// periodEnd returns the first Unix ms after t in another period than t's.
func periodEnd(p ratelimit.Period, loc *time.Location, t int64) int64 {
	cur := periodOf(p, loc, t)
	return bisect(t, t+400*24*3600*1000, func(u int64) bool { return periodOf(p, loc, u) != cur })
}

// periodStart returns the first Unix ms in t's period.
func periodStart(p ratelimit.Period, loc *time.Location, t int64) int64 {
	cur := periodOf(p, loc, t)
	return bisect(t-400*24*3600*1000, t, func(u int64) bool { return periodOf(p, loc, u) == cur })
}

// bisect returns the first ms in (lo, hi] at which past holds, for a past
// false at lo and true at hi that changes once between them.
func bisect(lo, hi int64, past func(int64) bool) int64 {
	for hi-lo > 1 {
		if mid := lo + (hi-lo)/2; past(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// calendarPool returns limits of every period in the zones of
// calendarZones and UTC, with two sliding limits to mix with them.
// Windows are long enough for a real server (see realPool).
func calendarPool() []ratelimit.Limit {
	z := calendarZones()
	pool := []ratelimit.Limit{
		{Rate: 6, Window: time.Second},
		{Rate: 20, Window: 2 * time.Second},
		ratelimit.PerPeriod(9, ratelimit.Daily, nil),
		ratelimit.PerPeriod(30, ratelimit.Weekly, nil),
		ratelimit.PerPeriod(40, ratelimit.Monthly, nil),
		ratelimit.PerPeriod(60, ratelimit.Yearly, nil),
		{Rate: 4, Calendar: ratelimit.Daily, Location: z["America/New_York"], Shadow: true},
	}
	for _, name := range []string{"America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Havana", "Asia/Kolkata", "Pacific/Chatham"} {
		pool = append(pool, ratelimit.PerPeriod(7, ratelimit.Daily, z[name]))
	}
	pool = append(pool,
		ratelimit.PerPeriod(25, ratelimit.Weekly, z["Europe/Berlin"]),
		ratelimit.PerPeriod(35, ratelimit.Monthly, z["America/New_York"]),
		ratelimit.PerPeriod(30, ratelimit.Monthly, z["Pacific/Chatham"]),
		ratelimit.PerPeriod(50, ratelimit.Yearly, z["Australia/Lord_Howe"]),
	)
	return pool
}

// calendarTargets returns the instants a calendar trace visits, in order:
// each zone's clock changes from 2026 to 2028 and the ends of the days
// that hold them, the ends of Feb 28 and 29 2028 and of that February, the
// end of 2026 and of the ISO week that spans it, in every zone of the pool.
func calendarTargets() []int64 {
	locs := []*time.Location{nil}
	for _, loc := range calendarZones() {
		locs = append(locs, loc)
	}
	var out []int64
	for _, loc := range locs {
		if loc != nil {
			for t := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC); t.Year() < 2029; {
				_, end := t.In(loc).ZoneBounds()
				if end.IsZero() {
					break
				}
				out = append(out, end.UnixMilli(), periodEnd(ratelimit.Daily, loc, end.UnixMilli()))
				t = end
			}
		}
		at := func(y int, m time.Month, d int) int64 { return time.Date(y, m, d, 12, 0, 0, 0, time.UTC).UnixMilli() }
		out = append(out,
			periodEnd(ratelimit.Daily, loc, at(2028, 2, 28)), periodEnd(ratelimit.Daily, loc, at(2028, 2, 29)),
			periodEnd(ratelimit.Monthly, loc, at(2028, 2, 15)),
			periodEnd(ratelimit.Yearly, loc, at(2026, 7, 1)), periodEnd(ratelimit.Weekly, loc, at(2026, 12, 30)))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// calendarTrace is mixedTrace on the calendar pool, at the times of a
// walk through calendarTargets: at each, a run of steps from up to a few
// seconds before it to after it, mostly ms apart, now and then an hour or
// a few.
func calendarTrace(seed uint64, steps int, pool []ratelimit.Limit, suffix string) []op {
	ops := mixedTrace(seed, steps, pool, suffix)
	rng := rand.New(rand.NewPCG(seed, 5))
	targets := calendarTargets()
	per := max(1, steps/len(targets))
	now := int64(0)
	for i := range ops {
		if i%per == 0 && i/per < len(targets) {
			now = max(now, targets[i/per]-rng.Int64N(3000)) // a new target: from a few seconds before it
		}
		switch r := rng.IntN(100); {
		case r < 70:
		case r < 96:
			now += rng.Int64N(40)
		case r < 99:
			now += rng.Int64N(1500)
		default:
			now += rng.Int64N(3 * 3600 * 1000)
		}
		ops[i].at = now
	}
	return ops
}

// The differential test on calendar limits: the model above against the
// Limiter on every backend, over AllowN, AllowAll mixed with sliding and
// Shadow limits, Peek, PeekAll, Reset, and Charges and Refunds; the Valkey
// pass of .ci/run runs the real servers' tests on Valkey.
func TestCalendarDifferentialMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: calendarPool(), calendar: true, charges: true})
}

func TestCalendarDifferentialBatchedMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: calendarPool(), calendar: true, lanes: 8, batched: true})
}

func TestCalendarDifferentialCountDeniedMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: calendarPool(), calendar: true, lanes: 4, countDenied: true, steps: 2000,
		opts: []ratelimit.Option{ratelimit.WithCountDenied(true)}})
}

func TestCalendarDifferentialRedisServer(t *testing.T) {
	t.Parallel()
	runDifferential(t, serverEnv(t)(t), diffConfig{pool: calendarPool(), calendar: true, realTime: true, charges: true})
}

func TestCalendarDifferentialBatchedRedisServer(t *testing.T) {
	t.Parallel()
	runDifferential(t, serverEnv(t)(t), diffConfig{pool: calendarPool(), calendar: true, lanes: 8, batched: true, realTime: true})
}

func TestCalendarDifferentialRedisCluster(t *testing.T) {
	t.Parallel()
	runDifferential(t, clusterEnv(t)(t), diffConfig{pool: calendarPool(), calendar: true, realTime: true, charges: true})
}

func TestCalendarDifferentialBatchedRedisCluster(t *testing.T) {
	t.Parallel()
	runDifferential(t, clusterEnv(t)(t), diffConfig{pool: calendarPool(), calendar: true, lanes: 8, batched: true, realTime: true})
}

// calendarCoverage returns, of the model's counts, how many periods were
// counted in, and how many of those were days not 24 hours long (a clock
// change, Lord Howe's half hour, Havana's skipped midnight), with how many
// days of each length.
func calendarCoverage(m *model) (periods, oddDays int, lengths map[time.Duration]int) {
	lengths = map[time.Duration]int{}
	seen := map[windowKey]bool{}
	for k := range m.counts {
		if k.cal == 0 {
			continue
		}
		k.id = ""
		if seen[k] {
			continue
		}
		seen[k] = true
		periods++
		if k.cal != ratelimit.Daily {
			continue
		}
		loc := zoneOf(k.zone)
		if loc == nil {
			loc = time.UTC
		}
		noon := time.Date(int(k.index/10000), time.Month(k.index/100%100), int(k.index%100), 12, 0, 0, 0, loc).UnixMilli()
		if d := periodEnd(k.cal, loc, noon) - periodStart(k.cal, loc, noon); d != 24*3600*1000 {
			oddDays++
			lengths[time.Duration(d)*time.Millisecond]++
		}
	}
	return periods, oddDays, lengths
}
