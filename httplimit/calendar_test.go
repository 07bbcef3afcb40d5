package httplimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// A plan of a rolling burst limit and a monthly quota in New York: the
// IETF fields carry the month (w its length, 30 days and the hour DST gave
// back in November, then December's 31 days; t the seconds to its end),
// and a denial's Retry-After is the seconds to the month's end.
func TestCalendarHeaders(t *testing.T) {
	e := newEnv(t)
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	e.clock.Set(time.Date(2026, 11, 30, 23, 0, 0, 0, ny)) // an hour before December
	served := 0
	month := ratelimit.PerPeriod(3, ratelimit.Monthly, ny)
	h := e.handler(&served, ratelimit.PerSecond(100), httplimit.WithLimits(month))
	policy := `"100-per-1s";q=100;w=1, "3-per-month@America/New_York";q=3;w=2595600`
	for i, want := range []struct {
		status int
		month  string // the month's item of RateLimit
		x      []string
	}{
		{200, `"3-per-month@America/New_York";r=2;t=3600`, []string{"3", "2", "3600"}},
		{200, `"3-per-month@America/New_York";r=1;t=3600`, []string{"3", "1", "3600"}},
		{200, `"3-per-month@America/New_York";r=0;t=3600`, []string{"3", "0", "3600"}},
		{429, `"3-per-month@America/New_York";r=0;t=3600`, []string{"3", "0", "3600"}},
	} {
		got := serve(h, request("192.0.2.1:1234"))
		require.Equal(t, want.status, got.Code, "request %d", i+1)
		hs := headersOf(t, got)
		require.Equal(t, policy, hs[httplimit.HeaderPolicy], "request %d", i+1)
		require.Contains(t, hs[httplimit.HeaderRateLimit], ", "+want.month, "request %d", i+1)
		require.Equal(t, want.x, []string{hs[httplimit.HeaderLimit], hs[httplimit.HeaderRemaining], hs[httplimit.HeaderReset]}, "request %d", i+1)
		if want.status == 429 {
			require.Equal(t, "3600", hs[httplimit.HeaderRetryAfter])
		}
	}
	require.Equal(t, 3, served)

	e.clock.Add(2 * time.Hour) // December 1, 01:00
	got := serve(h, request("192.0.2.1:1234"))
	require.Equal(t, 200, got.Code)
	hs := headersOf(t, got)
	require.Equal(t, `"100-per-1s";q=100;w=1, "3-per-month@America/New_York";q=3;w=2678400`, hs[httplimit.HeaderPolicy])
	require.Contains(t, hs[httplimit.HeaderRateLimit], `, "3-per-month@America/New_York";r=2;t=2674800`)
}

// Plan.PoliciesAt gives each Calendar limit the length of its period at
// the time asked: a 23-hour day in Berlin, then a 24-hour one.
func TestPoliciesAt(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	pl, err := httplimit.NewPlan(ratelimit.PerMinute(10), ratelimit.PerPeriod(1000, ratelimit.Daily, berlin), ratelimit.PerPeriod(5000, ratelimit.Weekly, nil))
	require.NoError(t, err)
	at := time.Date(2026, 3, 29, 12, 0, 0, 0, berlin)
	require.Equal(t, []string{`"10-per-60s";q=10;w=60`, `"1000-per-day@Europe/Berlin";q=1000;w=82800`, `"5000-per-week";q=5000;w=604800`}, pl.PoliciesAt(at))
	require.Equal(t, `"1000-per-day@Europe/Berlin";q=1000;w=86400`, pl.PoliciesAt(at.AddDate(0, 0, 1))[1])
}
