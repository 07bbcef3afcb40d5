package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
)

// Calendar limits (issue 38) on each kind of Redis, beside the
// differential model of calendar_model_test.go: what the model does not
// say (keys, TTLs, validation, AllowMany, leases, GiveBack, Reset).
func TestCalendarMiniredis(t *testing.T) {
	t.Parallel()
	runCalendar(t, miniredisEnv)
}

func TestCalendarRedisServer(t *testing.T) {
	t.Parallel()
	runCalendar(t, serverEnv(t))
}

func TestCalendarRedisCluster(t *testing.T) {
	t.Parallel()
	runCalendar(t, clusterEnv(t))
}

func runCalendar(t *testing.T, mk newEnv) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, env)
	}{
		{"KeyAndTTL", testCalendarKeyAndTTL},
		{"OneCountPerZoneName", testCalendarOneCountPerZoneName},
		{"InvalidInput", testCalendarInvalidInput},
		{"AllowMany", testCalendarAllowMany},
		{"LeasedNeverOver", testCalendarLeasedNeverOver},
		{"GiveBackAndReset", testCalendarGiveBackAndReset},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, mk(t)) })
	}
}

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

// The key is the documented one, and it lives until its period ends and
// at most a minute past it, by a TTL relative to when it was written: the
// Limiter's clock need not be Redis's (here it is in 2026, 2027 and 2028).
func testCalendarKeyAndTTL(t *testing.T, e env) {
	berlin, havana := mustZone(t, "Europe/Berlin"), mustZone(t, "America/Havana")
	ctx := context.Background()
	l := e.limiter()
	for _, tc := range []struct {
		limit ratelimit.Limit
		at    time.Time
		key   string
		end   time.Time
	}{
		{ratelimit.PerPeriod(5, ratelimit.Monthly, berlin), time.Date(2026, 12, 4, 23, 15, 0, 0, berlin), "monthly:Europe/Berlin:2026-12-01", time.Date(2027, 1, 1, 0, 0, 0, 0, berlin)},
		{ratelimit.PerPeriod(5, ratelimit.Daily, nil), time.Date(2028, 2, 29, 23, 59, 59, 0, time.UTC), "daily:UTC:2028-02-29", time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC)},
		{ratelimit.PerPeriod(5, ratelimit.Weekly, berlin), time.Date(2027, 1, 1, 9, 0, 0, 0, berlin), "weekly:Europe/Berlin:2026-12-28", time.Date(2027, 1, 4, 0, 0, 0, 0, berlin)},
		{ratelimit.PerPeriod(5, ratelimit.Yearly, berlin), time.Date(2026, 12, 31, 23, 59, 0, 0, berlin), "yearly:Europe/Berlin:2026-01-01", time.Date(2027, 1, 1, 0, 0, 0, 0, berlin)},
		// Havana skips midnight on 2026-03-08: the day starts at 01:00, and its key is the 8th's.
		{ratelimit.PerPeriod(5, ratelimit.Daily, havana), time.Date(2026, 3, 8, 5, 0, 0, 0, time.UTC), "daily:America/Havana:2026-03-08", time.Date(2026, 3, 9, 0, 0, 0, 0, havana)},
	} {
		e.clock.Set(tc.at)
		res, err := l.Allow(ctx, "u{1}", tc.limit)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		require.Equal(t, tc.end.Sub(tc.at), res.ResetAfter, tc.key)
		key := e.prefix + ":{u%7B1%7D}:" + tc.key
		require.Equal(t, "1", e.client.Get(ctx, key).Val(), "no count at %s among %v", key, e.keys(t))
		ttl, err := e.client.PTTL(ctx, key).Result()
		require.NoError(t, err)
		require.GreaterOrEqual(t, ttl, tc.end.Sub(tc.at)-5*time.Second, key) // less what the write took to get here, on a busy machine
		require.LessOrEqual(t, ttl, tc.end.Sub(tc.at)+time.Minute, key)
	}
}

// Limits of one Calendar and zone share one count whatever their Rate;
// zones are told apart by name: Berlin loaded twice is one, Berlin and
// Paris are two though their rules agree, and nil is UTC.
func testCalendarOneCountPerZoneName(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	e.clock.Set(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	berlin1, berlin2, paris := mustZone(t, "Europe/Berlin"), mustZone(t, "Europe/Berlin"), mustZone(t, "Europe/Paris")
	utc := mustZone(t, "UTC")
	for i, tc := range []struct {
		limit ratelimit.Limit
		count int64
	}{
		{ratelimit.PerPeriod(10, ratelimit.Daily, berlin1), 1},
		{ratelimit.PerPeriod(20, ratelimit.Daily, berlin2), 2}, // the same count, another Rate
		{ratelimit.PerPeriod(10, ratelimit.Daily, paris), 1},
		{ratelimit.PerPeriod(10, ratelimit.Weekly, berlin1), 1},
		{ratelimit.PerPeriod(10, ratelimit.Daily, nil), 1},
		{ratelimit.PerPeriod(10, ratelimit.Daily, utc), 2},
		{ratelimit.PerPeriod(10, ratelimit.Daily, time.UTC), 3},
	} {
		res, err := l.Allow(ctx, "u", tc.limit)
		require.NoError(t, err)
		require.Equal(t, tc.count, res.Count, "step %d: %v", i, tc.limit)
	}
	_, err := l.AllowAll(ctx, "u", []ratelimit.Limit{ratelimit.PerPeriod(10, ratelimit.Daily, berlin1), ratelimit.PerPeriod(20, ratelimit.Daily, berlin2)}, 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
	require.ErrorContains(t, err, "have the same period and zone and would share one count")
	_, err = l.AllowAll(ctx, "u", []ratelimit.Limit{ratelimit.PerPeriod(10, ratelimit.Daily, nil), ratelimit.PerPeriod(20, ratelimit.Daily, time.UTC)}, 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
	rs, err := l.AllowAll(ctx, "u", []ratelimit.Limit{ratelimit.PerPeriod(10, ratelimit.Daily, berlin1), ratelimit.PerPeriod(20, ratelimit.Daily, paris), ratelimit.PerSecond(5)}, 1)
	require.NoError(t, err)
	require.Equal(t, []int64{3, 2, 1}, []int64{rs[0].Count, rs[1].Count, rs[2].Count})
}

// Each invalid calendar limit is ErrInvalidLimit naming what is wrong,
// from every method, and nothing is written.
func testCalendarInvalidInput(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	berlin := mustZone(t, "Europe/Berlin")
	for _, tc := range []struct {
		limit ratelimit.Limit
		says  string
	}{
		{ratelimit.Limit{Rate: 5, Calendar: ratelimit.Yearly + 1}, "calendar Period(5) is none of Daily, Weekly, Monthly and Yearly"},
		{ratelimit.Limit{Rate: 5, Calendar: ratelimit.Daily, Window: time.Hour}, "a calendar limit has no Window"},
		{ratelimit.Limit{Rate: 5, Calendar: ratelimit.Daily, Strict: true}, "a period is already a hard bound"},
		{ratelimit.Limit{Rate: 5, Calendar: ratelimit.Daily, Location: time.Local}, `calendar location "Local"`},
		{ratelimit.Limit{Rate: 5, Window: time.Hour, Location: berlin}, "without a Calendar period"},
		{ratelimit.Limit{Rate: 0, Calendar: ratelimit.Daily}, "rate 0 is below 1"},
		{ratelimit.Limit{Rate: 1<<53 + 1, Calendar: ratelimit.Monthly}, "above 2^53"},
	} {
		require.ErrorContains(t, tc.limit.Validate(), tc.says)
		_, err := l.Allow(ctx, "u", tc.limit)
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit, "%v", tc.limit)
		require.ErrorContains(t, err, tc.says)
		_, err = l.AllowAll(ctx, "u", []ratelimit.Limit{ratelimit.PerSecond(5), tc.limit}, 1)
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
		_, err = l.Charge(ctx, "u", []ratelimit.Limit{tc.limit}, 1)
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
		_, err = l.AllowMany(ctx, []ratelimit.Quota{{ID: "u", Limit: tc.limit, Cost: 1}})
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
		require.ErrorIs(t, l.Reset(ctx, "u", tc.limit), ratelimit.ErrInvalidLimit)
	}
	require.Empty(t, e.keys(t))
}

// A user's daily limit and their tenant's monthly one, in the tenant's
// zone, decided together by AllowMany: all or nothing.
func testCalendarAllowMany(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	ny := mustZone(t, "America/New_York")
	e.clock.Set(time.Date(2026, 11, 30, 23, 0, 0, 0, ny)) // an hour before the month ends
	quotas := []ratelimit.Quota{
		{ID: "user", Limit: ratelimit.PerPeriod(3, ratelimit.Daily, ny), Cost: 1},
		{ID: "tenant", Limit: ratelimit.PerPeriod(4, ratelimit.Monthly, ny), Cost: 1},
	}
	for n := int64(1); n <= 3; n++ {
		rs, err := l.AllowMany(ctx, quotas)
		require.NoError(t, err)
		require.True(t, rs[0].Allowed)
		require.Equal(t, []int64{n, n}, []int64{rs[0].Count, rs[1].Count})
	}
	rs, err := l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	require.False(t, rs[0].Allowed)
	require.Equal(t, time.Hour, rs[0].RetryAfter) // the user's day ends at midnight
	require.Zero(t, rs[1].RetryAfter)             // the tenant's month admitted it
	require.Equal(t, int64(3), rs[1].Count)       // and counted nothing: all or nothing
	e.clock.Set(time.Date(2026, 12, 1, 0, 0, 0, 0, ny))
	rs, err = l.AllowMany(ctx, quotas)
	require.NoError(t, err)
	require.True(t, rs[0].Allowed)
	require.Equal(t, []int64{1, 1}, []int64{rs[0].Count, rs[1].Count})
	require.Equal(t, 31*24*time.Hour, rs[1].ResetAfter)
}

// Leased calendar limits on several servers never admit more than Rate in
// a period, across the end of a 25-hour day.
func testCalendarLeasedNeverOver(t *testing.T, e env) {
	ny := mustZone(t, "America/New_York")
	limit := ratelimit.Limit{Rate: 400, Calendar: ratelimit.Daily, Location: ny, Leased: true}
	e.clock.Set(time.Date(2026, 11, 1, 23, 50, 0, 0, ny))
	limiters := []*ratelimit.Limiter{leasing(t, e), leasing(t, e), leasing(t, e)}
	ctx := context.Background()
	admitted := map[string]int64{} // per day
	var mu sync.Mutex
	var errs firstError
	for round := range depth(t, 300) {
		now := e.clock.Add(8 * time.Second) // past midnight by the 76th round
		day := now.In(ny).Format(time.DateOnly)
		var wg sync.WaitGroup
		for s, l := range limiters {
			wg.Go(func() {
				for k := range 3 {
					cost := int64(1 + (round+s+k)%3)
					res, err := l.AllowN(ctx, "hot", limit, cost)
					if err != nil {
						errs.report(err)
						return
					}
					if res.Allowed {
						mu.Lock()
						admitted[day] += cost
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		require.NoError(t, errs.get())
	}
	t.Logf("admitted per day: %v", admitted)
	require.Len(t, admitted, 2)
	for day, n := range admitted {
		require.LessOrEqual(t, n, limit.Rate, day)
	}
	require.Greater(t, admitted["2026-11-01"], limit.Rate/2)
}

// GiveBack lowers the current period's count; Reset deletes it.
func testCalendarGiveBackAndReset(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerPeriod(10, ratelimit.Weekly, mustZone(t, "Asia/Kolkata"))
	e.clock.Set(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	_, err := l.AllowN(ctx, "u", limit, 7)
	require.NoError(t, err)
	require.NoError(t, l.GiveBack(ctx, "u", []ratelimit.Limit{limit}, 3))
	res, err := l.Peek(ctx, "u", limit)
	require.NoError(t, err)
	require.Equal(t, int64(4), res.Count)
	require.NoError(t, l.Reset(ctx, "u", limit))
	res, err = l.Peek(ctx, "u", limit)
	require.NoError(t, err)
	require.Zero(t, res.Count)
	require.Empty(t, e.keys(t))
}

// With Redis down, FailLocal admits this process's share of each period,
// and a new period starts from nothing.
func TestCalendarFailLocal(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 3, 7, 23, 0, 0, 0, time.UTC))
	l := ratelimit.New(refusingClient(t), ratelimit.WithClock(clk.Now),
		ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithReplicas(3),
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	limit := ratelimit.PerPeriod(9, ratelimit.Daily, nil)
	ctx := context.Background()
	var got []string
	for range 5 {
		res, err := l.Allow(ctx, "u", limit)
		require.NoError(t, err)
		got = append(got, fmt.Sprintf("%v %d %v", res.Allowed, res.Count, res.ResetAfter))
	}
	clk.Set(time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC))
	res, err := l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	got = append(got, fmt.Sprintf("%v %d %v", res.Allowed, res.Count, res.ResetAfter))
	require.Equal(t, []string{"true 1 1h0m0s", "true 2 1h0m0s", "true 3 1h0m0s", "false 3 1h0m0s", "false 3 1h0m0s", "true 1 24h0m0s"}, got)
}

// Limit.String and ParseLimit, both ways.
func TestCalendarParseLimit(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	for _, tc := range []struct {
		s     string
		limit ratelimit.Limit
	}{
		{"10000/daily", ratelimit.PerPeriod(10000, ratelimit.Daily, nil)},
		{"1000000/monthly@Europe/Berlin", ratelimit.PerPeriod(1000000, ratelimit.Monthly, berlin)},
		{"5/weekly@Asia/Kolkata shadow leased", ratelimit.Limit{Rate: 5, Calendar: ratelimit.Weekly, Location: mustZone(t, "Asia/Kolkata"), Shadow: true, Leased: true}},
		{"7/yearly", ratelimit.PerPeriod(7, ratelimit.Yearly, nil)},
	} {
		require.Equal(t, tc.s, tc.limit.String())
		got, err := ratelimit.ParseLimit(tc.s)
		require.NoError(t, err, tc.s)
		require.Equal(t, tc.limit.String(), got.String())
		require.Equal(t, tc.limit.Calendar, got.Calendar)
	}
	got, err := ratelimit.ParseLimit("5/daily@UTC")
	require.NoError(t, err)
	require.Nil(t, got.Location) // UTC is nil, and prints as none
	for s, says := range map[string]string{
		"5/daily@Mars/Olympus": `time zone "Mars/Olympus"`,
		"5/daily strict":       "a period is already a hard bound",
		"5/fortnightly":        `window "fortnightly" is not a duration`,
		// a unit as a word: what to write instead
		"1000/month": `write "monthly" for calendar months (from the 1st; "monthly@Europe/Berlin" in a zone), or "30d" for a sliding 30 days`,
		"5/Weeks":    `write "weekly" for calendar weeks`,
		"3/day":      `or "d" or "1d" for a sliding 24 hours`,
		"10/hour":    `write "h" or "1h" for a sliding hour`,
		"10/mins":    `write "m" or "1m"`,
	} {
		_, err := ratelimit.ParseLimit(s)
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit, s)
		require.ErrorContains(t, err, says, s)
	}
}

// A calendar limit in a zone of a fixed offset, named as calendar.go
// advises (time.FixedZone("UTC+1", 3600)), reads back from its String as
// the same limit: a zone of that name and offset, whose periods and keys
// are the same. ParseLimit once refused it (time.LoadLocation knows no
// "UTC+1"). A fixed zone whose name says another offset than its own is
// refused, as its keys would name the offset another server reads.
func TestCalendarFixedZoneRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 6, 23, 30, 0, 0, time.UTC)
	for _, zone := range []*time.Location{
		time.FixedZone("UTC+1", 3600), time.FixedZone("UTC-05:30", -5*3600-30*60),
		time.FixedZone("UTC+0545", 5*3600+45*60), time.FixedZone("UTC+14", 14*3600),
	} {
		limit := ratelimit.PerPeriod(100, ratelimit.Daily, zone)
		require.NoError(t, limit.Validate(), zone)
		got, err := ratelimit.ParseLimit(limit.String())
		require.NoError(t, err, limit.String())
		require.Equal(t, limit.String(), got.String())
		require.Equal(t, zone.String(), got.Location.String(), "the same name: the same keys")
		wantStart, wantEnd := ratelimit.Daily.Bounds(at, zone)
		start, end := ratelimit.Daily.Bounds(at, got.Location)
		require.True(t, wantStart.Equal(start) && wantEnd.Equal(end), "%s: the same periods", zone)
	}
	wrong := ratelimit.PerPeriod(100, ratelimit.Daily, time.FixedZone("UTC+1", 7200))
	require.ErrorIs(t, wrong.Validate(), ratelimit.ErrInvalidLimit)
	require.ErrorContains(t, wrong.Validate(), `"UTC+1" is not the offset from UTC its name says`)
	for _, s := range []string{"5/daily@UTC+15", "5/daily@UTC+1:5", "5/daily@UTC+01:60", "5/daily@UTC1", "5/daily@UTC+"} {
		_, err := ratelimit.ParseLimit(s)
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit, s)
		require.ErrorContains(t, err, "time zone", s)
	}
}
