package window

import (
	"math/rand/v2"
	"testing"
	"time"
	_ "time/tzdata" // the zones below on a machine without /usr/share/zoneinfo

	"github.com/stretchr/testify/require"
)

// zones are the ones issue 38 names: DST changes (New York, Berlin, Lord
// Howe's half-hour shift), a skipped midnight (Havana), odd offsets
// (Kolkata, Chatham), and UTC.
var zones = []string{"UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Havana",
	"Asia/Kolkata", "Pacific/Chatham", "America/Santiago", "Asia/Tehran"}

func load(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

// Known periods, each written out by hand from the zone's rules.
func TestPeriodBounds(t *testing.T) {
	at := func(loc *time.Location, y int, m time.Month, d, h, min int) time.Time {
		return time.Date(y, m, d, h, min, 0, 0, loc)
	}
	ny, berlin, havana := load(t, "America/New_York"), load(t, "Europe/Berlin"), load(t, "America/Havana")
	lordHowe, kolkata, chatham := load(t, "Australia/Lord_Howe"), load(t, "Asia/Kolkata"), load(t, "Pacific/Chatham")
	for _, tc := range []struct {
		name       string
		p          Period
		loc        *time.Location
		t          time.Time
		start, end time.Time
		length     time.Duration
	}{
		{"a day in UTC", Daily, nil, time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC),
			time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC), 24 * time.Hour},
		{"New York springs forward: 23 hours", Daily, ny, at(ny, 2026, 3, 8, 12, 0), at(ny, 2026, 3, 8, 0, 0), at(ny, 2026, 3, 9, 0, 0), 23 * time.Hour},
		{"New York falls back: 25 hours", Daily, ny, at(ny, 2026, 11, 1, 12, 0), at(ny, 2026, 11, 1, 0, 0), at(ny, 2026, 11, 2, 0, 0), 25 * time.Hour},
		{"Berlin springs forward", Daily, berlin, at(berlin, 2026, 3, 29, 12, 0), at(berlin, 2026, 3, 29, 0, 0), at(berlin, 2026, 3, 30, 0, 0), 23 * time.Hour},
		{"Lord Howe's half hour", Daily, lordHowe, at(lordHowe, 2026, 4, 5, 12, 0), at(lordHowe, 2026, 4, 5, 0, 0), at(lordHowe, 2026, 4, 6, 0, 0), 24*time.Hour + 30*time.Minute},
		{"Havana skips midnight: the day starts at 01:00", Daily, havana, at(havana, 2026, 3, 8, 12, 0),
			time.Date(2026, 3, 8, 5, 0, 0, 0, time.UTC), at(havana, 2026, 3, 9, 0, 0), 23 * time.Hour},
		{"Kolkata, +05:30", Daily, kolkata, at(kolkata, 2026, 6, 1, 3, 0), at(kolkata, 2026, 6, 1, 0, 0), at(kolkata, 2026, 6, 2, 0, 0), 24 * time.Hour},
		{"Chatham, +13:45 in summer", Daily, chatham, at(chatham, 2026, 1, 1, 0, 10), at(chatham, 2026, 1, 1, 0, 0), at(chatham, 2026, 1, 2, 0, 0), 24 * time.Hour},
		{"an ISO week across a year's end", Weekly, berlin, at(berlin, 2027, 1, 1, 9, 0), at(berlin, 2026, 12, 28, 0, 0), at(berlin, 2027, 1, 4, 0, 0), 7 * 24 * time.Hour},
		{"the week of New York's fall", Weekly, ny, at(ny, 2026, 11, 4, 0, 0), at(ny, 2026, 11, 2, 0, 0), at(ny, 2026, 11, 9, 0, 0), 7 * 24 * time.Hour},
		{"February 2028, a leap year", Monthly, nil, time.Date(2028, 2, 29, 23, 59, 0, 0, time.UTC),
			time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC), 29 * 24 * time.Hour},
		{"March in Berlin: an hour short", Monthly, berlin, at(berlin, 2026, 3, 31, 23, 0), at(berlin, 2026, 3, 1, 0, 0), at(berlin, 2026, 4, 1, 0, 0), 31*24*time.Hour - time.Hour},
		{"a year's last instant", Yearly, nil, time.Date(2026, 12, 31, 23, 59, 59, 999_000_000, time.UTC),
			time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), 365 * 24 * time.Hour},
		{"a leap year in New York", Yearly, ny, at(ny, 2028, 7, 4, 12, 0), at(ny, 2028, 1, 1, 0, 0), at(ny, 2029, 1, 1, 0, 0), 366 * 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, end := tc.p.bounds(tc.t, tc.loc)
			require.True(t, start.Equal(tc.start), "start %v, want %v", start, tc.start)
			require.True(t, end.Equal(tc.end), "end %v, want %v", end, tc.end)
			require.Equal(t, tc.length, end.Sub(start))
		})
	}
}

// A model of the periods, checked at random instants over 2026 to 2029 in
// every zone: the period holds the instant; its start is the first instant
// of a date of the period (the instant before it shows an earlier date);
// the next period starts where it ends; its length is within an hour of
// its days' (a DST change moves it by at most that, Lord Howe's by half).
func TestPeriodModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(38, 1))
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	span := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli() - from
	for _, name := range zones {
		loc := load(t, name)
		for _, p := range []Period{Daily, Weekly, Monthly, Yearly} {
			for range 2000 {
				at := time.UnixMilli(from + rng.Int64N(span))
				start, end := p.bounds(at, loc)
				require.False(t, at.Before(start), "%s %v %v: starts after it, at %v", name, p, at, start)
				require.True(t, at.Before(end), "%s %v %v: ends before it, at %v", name, p, at, end)
				first := p.first(dateOf(start, loc))
				require.Equal(t, first, p.first(dateOf(end.Add(-time.Millisecond), loc)), "%s %v %v: one period from start to end", name, p, at)
				before := dateOf(start.Add(-time.Millisecond), loc)
				require.NotEqual(t, first, p.first(before), "%s %v %v: the ms before the start is in the same period", name, p, at)
				nextStart, _ := p.bounds(end, loc)
				require.True(t, nextStart.Equal(end), "%s %v %v: the next period starts at %v, not at the end %v", name, p, at, nextStart, end)
				days := time.Date(p.next(first).y, p.next(first).m, p.next(first).d, 0, 0, 0, 0, time.UTC).
					Sub(time.Date(first.y, first.m, first.d, 0, 0, 0, 0, time.UTC))
				diff := end.Sub(start) - days
				require.LessOrEqual(t, diff.Abs(), time.Hour, "%s %v %v: %v long for %v of days", name, p, at, end.Sub(start), days)
			}
		}
	}
}
