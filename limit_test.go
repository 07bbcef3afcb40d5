package ratelimit_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

func TestPerDay(t *testing.T) {
	require.Equal(t, ratelimit.Limit{Rate: 10_000, Window: 24 * time.Hour}, ratelimit.PerDay(10_000))
	require.NoError(t, ratelimit.PerDay(10_000).Validate())
	require.Equal(t, "10000/24h0m0s", ratelimit.PerDay(10_000).String())
}

func TestParseLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ratelimit.Limit
	}{
		{"10/1m0s", ratelimit.PerMinute(10)},
		{"10/1m", ratelimit.PerMinute(10)},
		{"100/1.5s", ratelimit.Limit{Rate: 100, Window: 1500 * time.Millisecond}},
		{"10/1s strict shadow leased", ratelimit.Limit{Rate: 10, Window: time.Second, Strict: true, Shadow: true, Leased: true}},
		{"10/1s leased strict", ratelimit.Limit{Rate: 10, Window: time.Second, Strict: true, Leased: true}},
		{"  10/1s \tshadow ", ratelimit.Limit{Rate: 10, Window: time.Second, Shadow: true}},
		{"10-S", ratelimit.PerSecond(10)},
		{"10-M", ratelimit.PerMinute(10)},
		{"1000-H", ratelimit.PerHour(1000)},
		{"2000-D", ratelimit.PerDay(2000)},
		{"5-m", ratelimit.PerMinute(5)}, // ulule reads the letter in either case: m is a minute
		{"2000-D strict", ratelimit.Limit{Rate: 2000, Window: 24 * time.Hour, Strict: true}},
		// as configuration is often written: days, and a unit alone
		{"1000/1d", ratelimit.PerDay(1000)},
		{"10/7d", ratelimit.Limit{Rate: 10, Window: 7 * 24 * time.Hour}},
		{"5/1d12h", ratelimit.Limit{Rate: 5, Window: 36 * time.Hour}},
		{"10/s", ratelimit.PerSecond(10)},
		{"10/m", ratelimit.PerMinute(10)},
		{"10/h leased", ratelimit.Limit{Rate: 10, Window: time.Hour, Leased: true}},
		{"1000/d", ratelimit.PerDay(1000)},
		{"10/ms", ratelimit.Limit{Rate: 10, Window: time.Millisecond}},
		{"10000/daily", ratelimit.PerPeriod(10000, ratelimit.Daily, nil)},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ratelimit.ParseLimit(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestParseLimitErrors(t *testing.T) {
	for _, tc := range []struct {
		in, msg string
	}{
		{"", `ratelimit: invalid limit "": empty`},
		{"   ", `ratelimit: invalid limit "   ": empty`},
		{"10", `ratelimit: invalid limit "10": no window`},
		{"x/1s", `"x/1s": rate "x" is not a whole number`},
		{"/1s", `"/1s": rate "" is not a whole number`},
		{"1.5/1s", `"1.5/1s": rate "1.5" is not a whole number`},
		{"10/", `"10/": window "" is not a duration`},
		{"10/1", `"10/1": window "1" is not a duration`},
		{"10/1s/2", `"10/1s/2": window "1s/2" is not a duration`},
		{"10/1.5d", `"10/1.5d": window "1.5d" is not a duration`},
		{"10/1dx", `"10/1dx": window "1dx" is not a duration`},
		{"10/106752d", `"10/106752d": window "106752d" is not a duration`}, // past 292 years
		{"10/x", `"10/x": window "x" is not a duration`},
		{"10/-1s", `"10/-1s": window -1s is shorter than 1ms`},
		{"10/0s", `"10/0s": window 0s is shorter than 1ms`},
		{"10/1.5ms", `"10/1.5ms": window 1.5ms is not a whole number of milliseconds`},
		{"0/1s", `"0/1s": rate 0 is below 1`},
		{"-1/1s", `"-1/1s": rate -1 is below 1`},
		{"10/1s bogus", `"10/1s bogus": unknown flag "bogus": want strict, shadow or leased`},
		{"10/1s Strict", `unknown flag "Strict"`},
		{"10/1s strict strict", `"10/1s strict strict": flag "strict" given twice`},
		{"10/15ms strict", `"10/15ms strict": strict window 15ms is not a multiple of 10ms`},
		{"10-X", `"10-X": window "X" is none of S, M, H and D`},
		{"10-", `"10-": window "" is none of S, M, H and D`},
		{"10-SS", `window "SS" is none of S, M, H and D`},
		{"-5-S", `"-5-S": rate "" is not a whole number`},
		{"x-S", `"x-S": rate "x" is not a whole number`},
		{"99999999999999999999/1s", `"99999999999999999999/1s": rate 99999999999999999999 does not fit an int64`},
		{"9223372036854775808-S", `rate 9223372036854775808 does not fit an int64`},
		{"10/3000000h", `"10/3000000h": window "3000000h" is not a duration`}, // past math.MaxInt64 ns
		{"9223372036854775807/1s", `rate 9223372036854775807 per 1s is too large`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ratelimit.ParseLimit(tc.in)
			require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
			require.ErrorContains(t, err, tc.msg)
			require.Equal(t, ratelimit.Limit{}, got)
		})
	}
}

// TestParseLimitRoundTrip: whatever valid limit String prints, ParseLimit
// reads back, but for Name, which String does not print.
func TestParseLimitRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 3))
	const maxMS = math.MaxInt64 / int64(time.Millisecond) // the longest Window, in ms
	for range 20_000 {
		ms := max(1, int64(math.Exp(rng.Float64()*math.Log(float64(maxMS))))) // log-uniform: as many short windows as long
		if rng.IntN(4) == 0 {
			ms = []int64{1, 10, 999, 1000, 1001, 60_000, 3_600_000, 86_400_000, maxMS}[rng.IntN(9)]
		}
		l := ratelimit.Limit{
			Window: time.Duration(ms) * time.Millisecond,
			Name:   "dropped",
			Strict: rng.IntN(2) == 0 && ms%ratelimit.StrictSubWindows == 0,
			Shadow: rng.IntN(2) == 0,
			Leased: rng.IntN(2) == 0,
		}
		most := (1 << 53) / ms
		l.Rate = 1 + int64(math.Exp(rng.Float64()*math.Log(float64(most))))
		l.Rate = min(l.Rate, most)
		require.NoError(t, l.Validate(), "%v", l)

		got, err := ratelimit.ParseLimit(l.String())
		require.NoError(t, err, "%q", l.String())
		l.Name = ""
		require.Equal(t, l, got, "%q", l.String())
	}
}

// A Result compares by its exported fields as the Result doc says: one that
// counted carries what Refund needs, one that counted nothing carries
// nothing unexported, so a user's test can hold either against a literal.
func TestResultComparesByExportedFields(t *testing.T) {
	e := miniredisEnv(t)
	l := e.limiter()
	ctx := context.Background()
	limit := ratelimit.PerMinute(2)
	e.clock.Set(epoch.Add(15 * time.Second))

	got, err := l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	// 15 s into a minute: the count is 1 until the window ends, 0 a ms after,
	// when the previous window's 1 is weighted below 1.
	want := ratelimit.Result{Allowed: true, Count: 1, Limit: limit, Remaining: 1, ResetAfter: 45*time.Second + time.Millisecond}
	require.EqualExportedValues(t, want, got)
	require.NotEqual(t, want, got, "an allowed Result carries its receipt for Refund")
	require.NoError(t, l.Refund(ctx, "u", []ratelimit.Result{got}, 1))

	_, err = l.AllowN(ctx, "u", limit, 2)
	require.NoError(t, err)
	denied, err := l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	// 2 weighs below 2 a ms into the next window, below 1 past its half.
	require.Equal(t, ratelimit.Result{Count: 2, Limit: limit, RetryAfter: 45*time.Second + time.Millisecond, ResetAfter: 75*time.Second + time.Millisecond}, denied)
	peek, err := l.Peek(ctx, "u", limit)
	require.NoError(t, err)
	require.Equal(t, denied, peek)
}
