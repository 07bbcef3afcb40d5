package rls

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

const calendarConfig = `
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 2, calendar: America/New_York}
  - key: user
    rate_limit: {unit: month, requests_per_unit: 2}
  - key: plan
    rate_limit: {unit: day, requests_per_unit: 3, calendar: UTC}
`

// A rule with calendar is a calendar period in that zone; a month without
// it stays the reference's 30 days from the epoch.
func TestCalendarRules(t *testing.T) {
	c := load(t, calendarConfig)
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	for key, want := range map[string]ratelimit.Limit{
		"tenant": {Rate: 2, Calendar: ratelimit.Monthly, Location: ny},
		"user":   {Rate: 2, Window: 30 * 24 * time.Hour},
		"plan":   {Rate: 3, Calendar: ratelimit.Daily},
	} {
		m := c.Match("api", desc(key, "x"))
		require.NotNil(t, m, key)
		require.Equal(t, want.String(), m.Rule.Limit.String(), key)
	}

	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	now := time.Date(2026, 11, 30, 23, 0, 0, 0, ny) // an hour before December in New York
	l := ratelimit.New(client, ratelimit.WithClock(func() time.Time { return now }), ratelimit.WithTimeout(time.Minute))
	s := NewServer(l, c)
	ask := func() *pb.RateLimitResponse {
		resp, err := s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("tenant", "acme")}})
		require.NoError(t, err)
		return resp
	}
	require.Equal(t, pb.RateLimitResponse_OK, ask().OverallCode)
	require.Equal(t, pb.RateLimitResponse_OK, ask().OverallCode)
	r := ask()
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, time.Hour, r.Statuses[0].DurationUntilReset.AsDuration())
	require.Equal(t, &pb.RateLimitResponse_RateLimit{RequestsPerUnit: 2, Unit: pb.RateLimitResponse_RateLimit_MONTH}, r.Statuses[0].CurrentLimit)
	now = now.Add(time.Hour)
	require.Equal(t, pb.RateLimitResponse_OK, ask().OverallCode)
}

func TestCalendarRuleErrors(t *testing.T) {
	for yaml, says := range map[string]string{
		`{unit: minute, requests_per_unit: 2, calendar: UTC}`:            "a calendar period is a day, a week, a month or a year",
		`{window: 1h, requests_per_unit: 2, calendar: UTC}`:              "needs a unit of day, week, month or year",
		`{unit: day, requests_per_unit: 2, calendar: Mars/Olympus}`:      "calendar 'Mars/Olympus'",
		`{unit: day, requests_per_unit: 2, calendar: UTC, strict: true}`: "a period is already a hard bound",
	} {
		_, err := LoadConfig([]File{{Name: "config.yaml", Data: []byte("domain: api\ndescriptors:\n  - key: k\n    rate_limit: " + yaml + "\n")}})
		require.ErrorContains(t, err, says, yaml)
	}
}

// Within its limit, a descriptor's duration_until_reset is the wait until
// its remaining grows (httplimit's t), not until its count is 0: two
// requests 30 s into a minute weigh one a ms into the next minute, and
// nothing only 30 s later.
func TestWithinLimitWaitsForRefill(t *testing.T) {
	f := newFixture(t)
	r := f.ask(t, 0, desc("user", "ann"))
	require.Equal(t, 30*time.Second+time.Millisecond, r.Statuses[0].DurationUntilReset.AsDuration(), "one request: gone as it fades")
	r = f.ask(t, 0, desc("user", "ann"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Equal(t, 30*time.Second+time.Millisecond, r.Statuses[0].DurationUntilReset.AsDuration(), "not 60.001 s, when both are gone")
}

// WithCalendar (RLS_CALENDAR_ZONE) makes the units of a day and up of the
// domains it names calendar periods in its zone: what a configuration over
// xDS, which has no calendar key, needs for "10,000 a month, from the 1st,
// in Berlin". A window, a calendar of a rule's own, a shorter unit and
// another domain stay as they are.
func TestWithCalendar(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	c := load(t, calendarConfig+`
  - key: week
    rate_limit: {unit: week, requests_per_unit: 4, strict: true}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: window
    rate_limit: {window: 24h, requests_per_unit: 6}
`)
	other, err := LoadConfig([]File{{Name: "a.yaml", Data: []byte(calendarConfig)}, {Name: "b.yaml", Data: []byte("domain: other\ndescriptors:\n  - key: user\n    rate_limit: {unit: month, requests_per_unit: 2}\n")}})
	require.NoError(t, err)
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	cal := c.WithCalendar(berlin)
	for key, want := range map[string]ratelimit.Limit{
		"tenant": {Rate: 2, Calendar: ratelimit.Monthly, Location: ny},
		"user":   {Rate: 2, Calendar: ratelimit.Monthly, Location: berlin},
		"plan":   {Rate: 3, Calendar: ratelimit.Daily},
		"week":   {Rate: 4, Calendar: ratelimit.Weekly, Location: berlin},
		"minute": {Rate: 5, Window: time.Minute},
		"window": {Rate: 6, Window: 24 * time.Hour},
	} {
		require.Equal(t, want.String(), cal.Match("api", desc(key, "x")).Rule.Limit.String(), key)
	}
	require.Equal(t, 30*24*time.Hour, c.Match("api", desc("user", "x")).Rule.Limit.Window, "c itself unchanged")

	named := other.WithCalendar(berlin, "other")
	require.Equal(t, ratelimit.Monthly, named.Match("other", desc("user", "x")).Rule.Limit.Calendar)
	require.Equal(t, 30*24*time.Hour, named.Match("api", desc("user", "x")).Rule.Limit.Window, "a domain not named")

	override := desc("anything", "x")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: 5} // a month
	require.Equal(t, ratelimit.Limit{Rate: 7, Calendar: ratelimit.Monthly, Location: berlin}.String(),
		named.Match("other", override).Rule.Limit.String(), "Envoy's own limit too")
	require.Equal(t, 30*24*time.Hour, named.Match("api", override).Rule.Limit.Window)

	// decided so: the 3rd of 2 a month is over until the 1st, in Berlin
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	now := time.Date(2026, 11, 30, 22, 0, 0, 0, berlin)
	l := ratelimit.New(client, ratelimit.WithClock(func() time.Time { return now }), ratelimit.WithTimeout(time.Minute))
	s := NewServer(l, named)
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		resp, err := s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "other", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann")}})
		require.NoError(t, err)
		require.Equal(t, want, resp.OverallCode, "request %d", i+1)
		if want == pb.RateLimitResponse_OVER_LIMIT {
			require.Equal(t, 2*time.Hour, resp.Statuses[0].DurationUntilReset.AsDuration(), "midnight in Berlin")
		}
	}
}
