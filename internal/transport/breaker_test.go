package transport

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// breakerEnv is a Transport on a miniredis the test can make fail.
type breakerEnv struct {
	mr *miniredis.Miniredis
	tr *Transport
}

func newBreakerEnv(t *testing.T, set ...func(*Config)) *breakerEnv {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	return &breakerEnv{mr: mr, tr: newTestTransport(t, client, set...)}
}

// do makes one decision and returns its error: nil when Redis decided.
func (e *breakerEnv) do(t *testing.T) error {
	t.Helper()
	out := make([]script.Reply, 1)
	err := e.tr.Do(context.Background(), []*script.Request{oneRequest("id", 1000)}, out)
	if err == nil {
		require.NoError(t, out[0].Err)
		require.True(t, out[0].Allowed)
	}
	return err
}

// The breaker waits out its cooldown on its own clock: before it ends, no
// call is made; after it, one decision probes, and a failed probe opens the
// breaker for another cooldown, a successful one closes it.
func TestBreakerProbesAfterCooldown(t *testing.T) {
	t.Parallel()
	e := newBreakerEnv(t, func(c *Config) { c.BreakerFailures, c.BreakerCooldown = 2, time.Second })
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	e.tr.one.breaker.now = clk.Now
	e.mr.SetError("MASTERDOWN Link with MASTER is down")
	require.Error(t, e.do(t))
	require.Error(t, e.do(t))
	require.ErrorIs(t, e.do(t), ErrCircuitOpen)

	clk.Add(time.Second - time.Millisecond)
	require.ErrorIs(t, e.do(t), ErrCircuitOpen, "before the cooldown ends")
	clk.Add(time.Millisecond)
	err := e.do(t)
	require.ErrorContains(t, err, "MASTERDOWN", "the probe tried Redis")
	require.NotErrorIs(t, err, ErrCircuitOpen)
	require.ErrorIs(t, e.do(t), ErrCircuitOpen, "a failed probe opens it for another cooldown")

	e.mr.SetError("")
	clk.Add(time.Second)
	require.NoError(t, e.do(t), "the probe succeeds")
	for range 5 {
		require.NoError(t, e.do(t), "closed again")
	}
}

// A Transport made with BreakerFailures 0 has no breaker: every call tries
// Redis, however many fail.
func TestBreakerOff(t *testing.T) {
	t.Parallel()
	require.NotNil(t, newBreakerEnv(t).tr.one.breaker, "made with BreakerFailures 5")
	e := newBreakerEnv(t, func(c *Config) { c.BreakerFailures = 0 })
	require.Nil(t, e.tr.one.breaker)
	e.mr.SetError("LOADING Redis is loading the dataset in memory")
	for range 20 {
		err := e.do(t)
		require.ErrorContains(t, err, "LOADING", "every decision tries Redis")
		require.NotErrorIs(t, err, ErrCircuitOpen)
	}
	require.False(t, e.tr.BreakerOpen())
}
