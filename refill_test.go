package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

// RefillAfter is the wait until Count falls, never longer than ResetAfter:
// a previous window of 10 fades by one request in a ms, while the count
// reaches 0 only after the next window; a strict limit's oldest sub-window;
// a calendar period's end. A Result that counted nothing has none.
func TestRefillAfter(t *testing.T) {
	e := miniredisEnv(t)
	ctx := context.Background()
	l := e.limiter()
	e.clock.Set(epoch.Add(30 * time.Second))
	e.set(t, "slide", time.Minute, 0, 10) // estimate floor(10 × 30/60) = 5
	res, err := l.Allow(ctx, "slide", ratelimit.PerMinute(100))
	require.NoError(t, err)
	require.Equal(t, int64(6), res.Count)
	require.Equal(t, time.Millisecond, res.RefillAfter(), "floor(10 × 29999/60000) = 4: 5 at 30.001 s")
	require.Equal(t, 30*time.Second+time.Millisecond, res.ResetAfter, "the 10 gone with this window, the 1 a ms into the next")

	res, err = l.Allow(ctx, "fresh", ratelimit.PerMinute(100))
	require.NoError(t, err)
	require.Equal(t, res.ResetAfter, res.RefillAfter(), "one request: it fades as the count reaches 0")

	strict := ratelimit.Limit{Rate: 100, Window: time.Minute, Strict: true}
	_, err = l.Allow(ctx, "strict", strict) // in the sub-window [24 s, 30 s)? at 30 s: [30 s, 36 s)
	require.NoError(t, err)
	e.clock.Add(12 * time.Second)
	res, err = l.Allow(ctx, "strict", strict)
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Count)
	require.Equal(t, 54*time.Second, res.RefillAfter(), "the first leaves the Window with its sub-window, at 96 s")
	require.Equal(t, 66*time.Second, res.ResetAfter)

	res, err = l.Allow(ctx, "cal", ratelimit.PerPeriod(100, ratelimit.Daily, nil))
	require.NoError(t, err)
	require.Equal(t, res.ResetAfter, res.RefillAfter())

	peek, err := l.Peek(ctx, "slide", ratelimit.PerMinute(100))
	require.NoError(t, err)
	require.Zero(t, peek.RefillAfter(), "a Peek counted nothing")
}
