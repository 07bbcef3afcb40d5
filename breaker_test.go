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
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// breakerEnv is a Limiter on a miniredis the test can make fail, and the
// errors its handler saw. How a breaker passes its cooldown, on a fake
// clock, is internal/transport's TestBreakerProbesAfterCooldown.
type breakerEnv struct {
	mr   *miniredis.Miniredis
	l    *Limiter
	mu   sync.Mutex
	errs []error
}

func newBreakerEnv(t *testing.T, opts ...Option) *breakerEnv {
	e := &breakerEnv{mr: miniredis.RunT(t)}
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
	t.Parallel()
	e := newBreakerEnv(t, WithCircuitBreaker(3, time.Hour))
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

// The cooldown is the Limiter's: once it has passed (here at once), the
// next decision tries Redis as the probe, which a failure opens again and a
// success closes.
func TestBreakerProbesAfterCooldown(t *testing.T) {
	t.Parallel()
	e := newBreakerEnv(t, WithCircuitBreaker(2, time.Nanosecond))
	e.mr.SetError("MASTERDOWN Link with MASTER is down")
	require.Error(t, e.allow(t))
	require.Error(t, e.allow(t))
	require.True(t, e.l.Stats().BreakerOpen)
	for range 3 {
		err := e.allow(t)
		require.ErrorContains(t, err, "MASTERDOWN", "the probe tried Redis")
		require.NotErrorIs(t, err, ErrCircuitOpen)
		require.True(t, e.l.Stats().BreakerOpen, "a failed probe opens it for another cooldown")
	}
	e.mr.SetError("")
	require.NoError(t, e.allow(t), "the probe succeeds")
	require.False(t, e.l.Stats().BreakerOpen)
	for range 5 {
		require.NoError(t, e.allow(t), "closed again")
	}
}

func TestBreakerOff(t *testing.T) {
	t.Parallel()
	on := newBreakerEnv(t)
	on.mr.SetError("LOADING Redis is loading the dataset in memory")
	for range DefaultBreakerFailures {
		require.ErrorContains(t, on.allow(t), "LOADING")
	}
	require.True(t, on.l.Stats().BreakerOpen, "on by default")
	e := newBreakerEnv(t, WithCircuitBreaker(0, 0))
	e.mr.SetError("LOADING Redis is loading the dataset in memory")
	for range 20 {
		err := e.allow(t)
		require.ErrorContains(t, err, "LOADING", "every decision tries Redis")
		require.NotErrorIs(t, err, ErrCircuitOpen)
	}
	require.False(t, e.l.Stats().BreakerOpen)
}

// A decision whose key holds no count fails alone: the failure policy
// decides it, the error handler hears ErrBadReply for its id only, the
// decisions of other ids made at the same time (batched, when they meet in
// a call) are Redis's, and the breaker, told that Redis answered, stays
// closed however often it happens. That a batch carrying it fails that
// request alone is internal/transport's TestBatchWithBadKey.
func TestBadKeyFailsItsDecisionAlone(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"miniredis", func(t *testing.T) string { return miniredis.RunT(t).Addr() }},
		{"RedisServer", func(t *testing.T) string { return redistest.Start(t).Addr }},
	} {
		for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
			t.Run(b.name+"/"+policy.String(), func(t *testing.T) {
				ctx := context.Background()
				client := redis.NewClient(&redis.Options{Addr: b.addr(t), MaxRetries: -1, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = client.Close() })
				clk := clock.NewFake(time.UnixMilli(1_700_002_800_000))
				var mu sync.Mutex
				handled := map[string][]error{}
				l := New(client, WithClock(clk.Now), WithTimeout(time.Minute), WithFailurePolicy(policy), BatchAlways(),
					WithErrorHandler(func(_ context.Context, id string, err error) {
						mu.Lock()
						defer mu.Unlock()
						handled[id] = append(handled[id], err)
					}))
				limit := PerMinute(10)
				bad := l.keys.Append(nil, "bad", locate(clk.Now().UnixMilli(), &limit))[0]
				require.NoError(t, client.Set(ctx, bad, "not a number", 0).Err())

				ids := []string{"a", "b", "bad", "c", "d"}
				const rounds = 2 * DefaultBreakerFailures
				for round := range rounds {
					results := make([]Result, len(ids))
					errs := make([]error, len(ids))
					var wg sync.WaitGroup
					for i, id := range ids {
						wg.Go(func() { results[i], errs[i] = l.Allow(ctx, id, limit) })
					}
					wg.Wait()
					for i, id := range ids {
						res, err := results[i], errs[i]
						if id == "bad" {
							require.True(t, res.Degraded, "%+v", res)
							require.Equal(t, policy == FailOpen, res.Allowed)
							if policy == FailClosed {
								require.ErrorIs(t, err, ErrBadReply)
							} else {
								require.NoError(t, err)
							}
							continue
						}
						require.NoError(t, err, id)
						require.False(t, res.Degraded, "%s: another id's bad key failed it", id)
						require.True(t, res.Allowed, id)
						require.Equal(t, int64(round+1), res.Count, id)
					}
				}
				mu.Lock()
				defer mu.Unlock()
				require.Len(t, handled, 1, "errors only for the bad id: %v", handled)
				require.Len(t, handled["bad"], rounds)
				for _, err := range handled["bad"] {
					require.ErrorIs(t, err, ErrBadReply)
				}
				require.False(t, l.Stats().BreakerOpen, "Redis answered")
			})
		}
	}
}
