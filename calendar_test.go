package ratelimit

import (
	"context"
	"testing"
	"time"
	_ "time/tzdata" // the zone below on a machine without /usr/share/zoneinfo

	"github.com/stretchr/testify/require"
)

func TestPeriodString(t *testing.T) {
	require.Equal(t, "daily", Daily.String())
	require.Equal(t, "weekly", Weekly.String())
	require.Equal(t, "monthly", Monthly.String())
	require.Equal(t, "yearly", Yearly.String())
	require.Equal(t, "Period(9)", Period(9).String())
	require.False(t, Period(0).valid())
	require.True(t, Yearly.valid())
}

// Wait on a daily limit that is used up sleeps until the next day starts
// (and a little jitter), then admits.
func TestCalendarWait(t *testing.T) {
	t.Parallel()
	e := newWaitEnv(t)
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	e.clock.Set(time.Date(2026, 3, 7, 22, 30, 0, 0, ny))
	limit := PerPeriod(2, Daily, ny)
	e.fill(t, "a", limit, 2)
	require.NoError(t, e.l.Wait(context.Background(), "a", limit))
	slept := e.sleeps()
	require.Len(t, slept, 1)
	require.GreaterOrEqual(t, slept[0], 90*time.Minute)
	require.LessOrEqual(t, slept[0], 90*time.Minute+10*time.Millisecond)
	res, err := e.l.Peek(context.Background(), "a", limit)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Count)
	end := time.Date(2026, 3, 9, 0, 0, 0, 0, ny) // March 8 lasts 23 hours
	require.Equal(t, time.Duration(end.UnixMilli()-e.clock.Now().UnixMilli())*time.Millisecond, res.ResetAfter)
	require.Greater(t, res.ResetAfter, 22*time.Hour+59*time.Minute)
}
