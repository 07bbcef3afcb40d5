package ratelimittest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/slidingwindow/ratelimit"
)

// The Clock starts where New's comment says, and the Limiter reads it.
func TestStart(t *testing.T) {
	l, c := New(t)
	want := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	assert.Equal(t, want, c.Now())
	assert.Equal(t, want, l.Now())
	for _, w := range []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour} {
		assert.Zero(t, want.UnixMilli()%w.Milliseconds(), "%v into a window of %v", want, w)
	}
}

// Wait on the kit's Limiter moves the Clock on by what it would sleep, and
// passes as it would in real time: at once, in real time, with the Clock
// moved past the denial's RetryAfter (and its jitter). Before the kit gave
// the Limiter its sleep, the Clock stood still while Wait slept in real
// time, and Wait failed at its deadline.
func TestWaitMovesTheClock(t *testing.T) {
	l, c := New(t)
	limit := ratelimit.PerSecond(1)
	res, err := l.Allow(context.Background(), "u", limit)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	before := c.Now()
	denied, err := l.Peek(context.Background(), "u", limit)
	require.NoError(t, err)
	require.False(t, denied.Allowed)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a Wait in real time fails at it
	defer cancel()
	require.NoError(t, l.Wait(ctx, "u", limit))
	moved := c.Now().Sub(before)
	require.GreaterOrEqual(t, moved, denied.RetryAfter, "the Clock moved at least the wait")
	require.LessOrEqual(t, moved, denied.RetryAfter+10*time.Millisecond, "and at most its jitter more (a hundredth of the window)")
	res, err = l.Peek(context.Background(), "u", limit)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Count, "Wait's try was counted on the Clock")
}

// A window crossed by Advance admits again, at the millisecond the denial's
// RetryAfter names and not one before.
func TestAdvanceCrossesWindow(t *testing.T) {
	l, c := New(t)
	ctx, limit := context.Background(), ratelimit.PerSecond(2)
	for range 2 {
		res, err := l.Allow(ctx, "u", limit)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		require.False(t, res.Degraded)
	}
	res, err := l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	require.False(t, res.Allowed)
	require.Equal(t, 1001*time.Millisecond, res.RetryAfter)

	c.Advance(res.RetryAfter - time.Millisecond)
	res, err = l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	require.False(t, res.Allowed, "a ms before RetryAfter")
	require.Equal(t, time.Millisecond, res.RetryAfter)

	c.Advance(time.Millisecond)
	res, err = l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	require.True(t, res.Allowed, "at RetryAfter")
	assert.Equal(t, start.Add(1001*time.Millisecond), l.Now())
}

// Advance moves the in-process Redis's expiries by exactly d: a key's time
// to live shrinks by d, and once the windows that read it are past, the
// Redis holds no key.
func TestAdvanceExpiresKeys(t *testing.T) {
	l, c := New(t)
	res, err := l.Allow(context.Background(), "u", ratelimit.PerSecond(1))
	require.NoError(t, err)
	require.True(t, res.Allowed)
	keys := c.mr.Keys()
	require.Len(t, keys, 1)
	ttl := c.mr.TTL(keys[0])
	require.Greater(t, ttl, 2*time.Second, "the key outlives the next window, which reads it")

	c.Advance(1500 * time.Millisecond)
	assert.Equal(t, ttl-1500*time.Millisecond, c.mr.TTL(keys[0]))
	c.Set(c.Now().Add(ttl - 1500*time.Millisecond - time.Millisecond))
	assert.Equal(t, []string{keys[0]}, c.mr.Keys(), "a ms before its time to live ends")
	c.Advance(time.Millisecond)
	assert.Empty(t, c.mr.Keys())
}

// Set back moves decisions back, and expires nothing; a key's time to live
// runs on from there.
func TestSetBack(t *testing.T) {
	l, c := New(t)
	ctx, limit := context.Background(), ratelimit.PerMinute(1)
	res, err := l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	keys := c.mr.Keys()
	require.Len(t, keys, 1)
	ttl := c.mr.TTL(keys[0])

	c.Advance(30 * time.Second)
	back := start.Add(-time.Hour)
	c.Set(back)
	assert.Equal(t, back, c.Now())
	assert.Equal(t, back, l.Now())
	assert.Equal(t, ttl-30*time.Second, c.mr.TTL(keys[0]), "nothing moved on the way back")
	res, err = l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	assert.True(t, res.Allowed, "an hour back is another window, of its own count")

	c.Set(back.Add(ttl - 30*time.Second))
	assert.NotContains(t, c.mr.Keys(), keys[0])
}

// Advance refuses to move the clock back.
func TestAdvanceNegative(t *testing.T) {
	_, c := New(t)
	assert.Panics(t, func() { c.Advance(-time.Millisecond) })
	assert.Equal(t, start, c.Now())
}

// The Redis's TIME is the Clock's, so a concurrency slot's lease, which
// runs on Redis's clock, ends on the Clock.
func TestAcquireLeaseOnClock(t *testing.T) {
	l, c := New(t)
	ctx, conc := context.Background(), ratelimit.Concurrency{Max: 1, Lease: time.Second}
	slot, err := l.Acquire(ctx, "u", conc)
	require.NoError(t, err)
	require.True(t, slot.Acquired)
	slot, err = l.Acquire(ctx, "u", conc)
	require.NoError(t, err)
	require.False(t, slot.Acquired)
	require.Equal(t, time.Second, slot.RetryAfter)

	c.Advance(999 * time.Millisecond)
	slot, err = l.Acquire(ctx, "u", conc)
	require.NoError(t, err)
	require.False(t, slot.Acquired)
	require.Equal(t, time.Millisecond, slot.RetryAfter)

	c.Advance(time.Millisecond)
	slot, err = l.Acquire(ctx, "u", conc)
	require.NoError(t, err)
	require.True(t, slot.Acquired, "the first lease has ended")
	require.NoError(t, slot.Release(ctx))
	assert.Empty(t, c.mr.Keys())
}

// opts come after the kit's, so they override them.
func TestOptions(t *testing.T) {
	l, c := New(t, ratelimit.WithPrefix("mine"))
	_, err := l.Allow(context.Background(), "u", ratelimit.PerSecond(1))
	require.NoError(t, err)
	keys := c.mr.Keys()
	require.Len(t, keys, 1)
	assert.True(t, strings.HasPrefix(keys[0], "mine:"), keys[0])

	fixed := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	l, _ = New(t, ratelimit.WithClock(func() time.Time { return fixed }))
	assert.Equal(t, fixed, l.Now())
}

// Goroutines deciding and moving the clock at once: no decision fails or
// degrades, no move is lost, each goroutine sees time go forward only, and
// no window admits more than the limit's Rate.
func TestConcurrent(t *testing.T) {
	l, c := New(t)
	const (
		goroutines = 8
		decisions  = 100 // each
		step       = 50 * time.Millisecond
		every      = 10 // decisions between a goroutine's Advances
	)
	ctx, limit := context.Background(), ratelimit.PerSecond(5)
	window := func(t time.Time) int64 { return t.UnixMilli() / limit.Window.Milliseconds() }

	var mu sync.Mutex
	admitted := map[int64]int64{} // by window, the decisions known to have been made in it
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			last := c.Now()
			for i := range decisions {
				if i%every == every-1 {
					c.Advance(step)
				}
				before := c.Now()
				res, err := l.Allow(ctx, "hot", limit)
				after := c.Now()
				if !assert.NoError(t, err) || !assert.False(t, res.Degraded) {
					return
				}
				assert.False(t, before.Before(last), "time went back")
				last = after
				if res.Allowed && window(before) == window(after) {
					mu.Lock()
					admitted[window(before)]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()

	moves := goroutines * (decisions / every)
	require.Equal(t, start.Add(time.Duration(moves)*step), c.Now(), "a move was lost")
	require.NotEmpty(t, admitted)
	for w, n := range admitted {
		assert.LessOrEqual(t, n, limit.Rate, "window %d", w)
	}
	c.Advance(3 * limit.Window)
	assert.Empty(t, c.mr.Keys())
}

// When t ends, the Limiter is closed and no goroutine of the kit's is left,
// after work that starts some (decisions at once, a leased limit's sweeper,
// a slot kept) as after none (a client never used keeps goroutines of
// go-redis's until it is closed).
func TestCleanup(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	var l *ratelimit.Limiter
	t.Run("kit", func(t *testing.T) {
		New(t) // never used
		var c *Clock
		l, c = New(t)
		ctx := context.Background()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				_, err := l.Allow(ctx, "v", ratelimit.PerSecond(100))
				assert.NoError(t, err)
			})
		}
		wg.Wait()
		res, err := l.Allow(ctx, "u", ratelimit.Limit{Rate: 1000, Window: time.Second, Leased: true})
		require.NoError(t, err)
		require.True(t, res.Allowed)
		slot, err := l.Acquire(ctx, "u", ratelimit.Concurrency{Max: 1, Lease: time.Second})
		require.NoError(t, err)
		require.True(t, slot.Acquired)
		slot.Keep(ctx) // not released: Close stops it
		c.Advance(time.Second)
	})
	_, err := l.Allow(context.Background(), "u", ratelimit.PerSecond(1))
	require.ErrorIs(t, err, ratelimit.ErrClosed)
	goleak.VerifyNone(t, ignore)
}
