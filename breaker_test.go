package ratelimit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/clock"
)

// breakerEnv is a Limiter whose breaker reads a fake clock, on a miniredis
// the test can stop and start, and the errors its handler saw.
type breakerEnv struct {
	mr    *miniredis.Miniredis
	l     *Limiter
	clock *clock.Fake
	mu    sync.Mutex
	errs  []error
}

func newBreakerEnv(t *testing.T, opts ...Option) *breakerEnv {
	e := &breakerEnv{mr: miniredis.RunT(t), clock: clock.NewFake(time.Unix(1_700_000_000, 0))}
	client := redis.NewClient(&redis.Options{Addr: e.mr.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	e.l = New(client, append([]Option{
		WithTimeout(time.Minute),
		WithErrorHandler(func(_ context.Context, _ string, err error) {
			e.mu.Lock()
			e.errs = append(e.errs, err)
			e.mu.Unlock()
		}),
	}, opts...)...)
	e.l.breaker.now = e.clock.Now
	return e
}

// allow makes one decision and returns the error the handler saw for it, or
// nil when Redis decided.
func (e *breakerEnv) allow(t *testing.T) error {
	t.Helper()
	e.mu.Lock()
	before := len(e.errs)
	e.mu.Unlock()
	res, err := e.l.Allow(context.Background(), "id", PerMinute(1000))
	require.NoError(t, err) // FailOpen
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.errs) == before {
		require.False(t, res.Degraded)
		return nil
	}
	require.True(t, res.Degraded)
	return e.errs[len(e.errs)-1]
}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	e := newBreakerEnv(t, WithCircuitBreaker(3, time.Second))
	e.mr.SetError("LOADING Redis is loading the dataset in memory")
	for range 2 {
		require.ErrorContains(t, e.allow(t), "LOADING")
	}
	e.mr.SetError("")
	require.NoError(t, e.allow(t), "a success resets the count")
	e.mr.SetError("LOADING Redis is loading the dataset in memory")
	for range 3 {
		err := e.allow(t)
		require.ErrorContains(t, err, "LOADING")
		require.NotErrorIs(t, err, ErrCircuitOpen)
	}
	e.mr.SetError("") // Redis is fine again, but the breaker does not know yet
	for range 10 {
		require.ErrorIs(t, e.allow(t), ErrCircuitOpen)
	}
}

func TestBreakerProbesAfterCooldown(t *testing.T) {
	e := newBreakerEnv(t, WithCircuitBreaker(2, time.Second))
	e.mr.SetError("MASTERDOWN Link with MASTER is down")
	require.Error(t, e.allow(t))
	require.Error(t, e.allow(t))
	require.ErrorIs(t, e.allow(t), ErrCircuitOpen)

	e.clock.Add(time.Second - time.Millisecond)
	require.ErrorIs(t, e.allow(t), ErrCircuitOpen, "before the cooldown ends")
	e.clock.Add(time.Millisecond)
	err := e.allow(t)
	require.ErrorContains(t, err, "MASTERDOWN", "the probe tried Redis")
	require.NotErrorIs(t, err, ErrCircuitOpen)
	require.ErrorIs(t, e.allow(t), ErrCircuitOpen, "a failed probe opens it for another cooldown")

	e.mr.SetError("")
	e.clock.Add(time.Second)
	require.NoError(t, e.allow(t), "the probe succeeds")
	for range 5 {
		require.NoError(t, e.allow(t), "closed again")
	}
}

// While the breaker is open, concurrent decisions send one probe at a time.
func TestBreakerOneProbe(t *testing.T) {
	e := newBreakerEnv(t, WithCircuitBreaker(1, time.Second))
	e.mr.SetError("BUSY Redis is busy running a script")
	require.Error(t, e.allow(t))
	e.clock.Add(time.Second)
	ok, probe := e.l.breaker.allow()
	require.True(t, ok)
	require.True(t, probe)
	for range 10 {
		ok, _ := e.l.breaker.allow()
		require.False(t, ok, "a second probe while the first is out")
	}
	e.l.breaker.abandon(true) // its caller left: the turn goes back
	ok, probe = e.l.breaker.allow()
	require.True(t, ok && probe)
	e.l.breaker.done(true, nil)
	require.Equal(t, closed, e.l.breaker.state.Load())
}

func TestBreakerOff(t *testing.T) {
	require.NotNil(t, newBreakerEnv(t).l.breaker, "on by default")
	e := newBreakerEnv(t)
	e.l.breaker = nil // as WithCircuitBreaker(0, 0) leaves it
	require.Nil(t, New(redis.NewClient(&redis.Options{}), WithCircuitBreaker(0, 0)).breaker)
	e.mr.SetError("LOADING Redis is loading the dataset in memory")
	for range 20 {
		err := e.allow(t)
		require.ErrorContains(t, err, "LOADING", "every decision tries Redis")
		require.NotErrorIs(t, err, ErrCircuitOpen)
	}
}
