package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/transport"
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
	e.l.t.SetBreakerClock(e.clock.Now)
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
	t.Parallel()
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

func TestBreakerOff(t *testing.T) {
	t.Parallel()
	require.True(t, newBreakerEnv(t).l.t.HasBreaker(), "on by default")
	e := newBreakerEnv(t, WithCircuitBreaker(0, 0))
	require.False(t, e.l.t.HasBreaker())
	e.mr.SetError("LOADING Redis is loading the dataset in memory")
	for range 20 {
		err := e.allow(t)
		require.ErrorContains(t, err, "LOADING", "every decision tries Redis")
		require.NotErrorIs(t, err, ErrCircuitOpen)
	}
}

// heldCalls is a go-redis hook that holds the first hold script calls a
// client makes until release is closed, and records how many requests each
// script call carried. A held call whose ctx is done by then is not sent.
type heldCalls struct {
	hold    int
	held    chan struct{} // receives once for each call held
	release chan struct{}

	mu    sync.Mutex
	sizes []int // requests per script call, in the order they were made
}

// heldClient returns a client of the server at addr, with the script loaded
// so that each call is one EVALSHA, whose script calls a heldCalls holds
// (maxInFlight of them), and a fake clock for its Limiter.
func heldClient(t *testing.T, addr string) (*redis.Client, *heldCalls, *clock.Fake) {
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	require.NoError(t, client.ScriptLoad(context.Background(), slidingWindowSource).Err())
	hook := newHeldCalls(transport.MaxInFlight)
	client.AddHook(hook)
	return client, hook, clock.NewFake(time.UnixMilli(1_700_002_800_000))
}

func newHeldCalls(hold int) *heldCalls {
	return &heldCalls{hold: hold, held: make(chan struct{}, hold), release: make(chan struct{})}
}

func (h *heldCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		nreqs, _ := callShape(cmd.Args())
		h.mu.Lock()
		h.sizes = append(h.sizes, nreqs)
		hold := len(h.sizes) <= h.hold
		h.mu.Unlock()
		if hold {
			h.held <- struct{}{}
			<-h.release
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h *heldCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// calls returns the number of requests each script call carried.
func (h *heldCalls) calls() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.sizes)
}

// outcome is what one decision returned.
type outcome struct {
	id  string
	res Result
	err error
}

// batchAfterHeld makes one decision per id, all in one script call: it
// fills the batcher's calls in flight with decisions whose script calls
// hook holds (their ctx is holdCtx), queues the decisions for ids behind
// them, then lets the held calls go, after cancelling holdCtx if cancel is
// not nil. The queued decisions then go together in the next call. It
// returns the outcomes of the queued decisions, by id, and of the held ones.
func batchAfterHeld(t *testing.T, l *Limiter, hook *heldCalls, limit Limit, ids []string, holdCtx context.Context, cancel context.CancelFunc) (queued map[string]outcome, held []outcome) {
	t.Helper()
	allow := func(ctx context.Context, id string) (Result, error) { return l.Allow(ctx, id, limit) }
	return batchAfterHeldWith(t, l, hook, allow, ids, holdCtx, cancel)
}

// batchAfterHeldWith is batchAfterHeld with the decisions that decide
// makes, each of one script request.
func batchAfterHeldWith(t *testing.T, l *Limiter, hook *heldCalls, decide func(context.Context, string) (Result, error),
	ids []string, holdCtx context.Context, cancel context.CancelFunc) (queued map[string]outcome, held []outcome) {
	t.Helper()
	require.True(t, l.t.HasBatcher(), "batching is on by default for a *redis.Client")
	require.Equal(t, transport.MaxInFlight, hook.hold)
	BatchAlways(l) // from so few goroutines, decisions would go alone
	out := make(chan outcome, transport.MaxInFlight+len(ids))
	start := func(ctx context.Context, id string) {
		go func() {
			res, err := decide(ctx, id)
			out <- outcome{id, res, err}
		}()
	}
	for i := range transport.MaxInFlight {
		start(holdCtx, fmt.Sprint("held-", i))
		<-hook.held // in flight, held: the next decision cannot join it
	}
	for _, id := range ids {
		start(context.Background(), id)
	}
	require.Eventually(t, func() bool {
		waiting, _ := l.t.Queued()
		return waiting == len(ids)
	}, 10*time.Second, time.Millisecond, "the decisions queue behind the held calls")
	if cancel != nil {
		cancel()
	}
	close(hook.release)
	queued = map[string]outcome{}
	for range transport.MaxInFlight + len(ids) {
		o := <-out
		if strings.HasPrefix(o.id, "held-") {
			held = append(held, o)
		} else {
			queued[o.id] = o
		}
	}
	// Wait for the batch's own call to be over and counted: it may outlast
	// the callers, who stop waiting at their own deadlines.
	require.Eventually(t, func() bool {
		_, sending := l.t.Queued()
		return sending == 0
	}, 10*time.Second, time.Millisecond, "the batch's call ends")
	require.Equal(t, []int{1, 1, len(ids)}, hook.calls(), "requests per script call: the queued decisions went together")
	return queued, held
}

// While no more than fewDeciding decisions are under way, each goes alone at
// once, whatever is in flight: with fewDeciding calls held, all of them are
// in flight. One more decision then waits, and goes once they return; in a
// burst after that, decisions batch.
func TestFewDecisionsGoAlone(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	require.NoError(t, client.ScriptLoad(context.Background(), slidingWindowSource).Err())
	hook := newHeldCalls(transport.FewDeciding)
	client.AddHook(hook)
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hook.release) }) }) // if it fails first
	l := New(client, WithTimeout(time.Minute))
	limit := PerMinute(10)
	out := make(chan error, transport.FewDeciding+1)
	decide := func(id string) {
		go func() {
			_, err := l.Allow(context.Background(), id, limit)
			out <- err
		}()
	}
	for i := range transport.FewDeciding {
		decide(fmt.Sprint("alone-", i))
		select {
		case <-hook.held: // its call is in flight, although transport.MaxInFlight are
		case <-time.After(10 * time.Second):
			t.Fatalf("decision %d of %d was not sent at once", i+1, transport.FewDeciding)
		}
	}
	decide("one-more")
	require.Eventually(t, func() bool {
		waiting, sending := l.t.Queued()
		return waiting == 1 && sending == transport.FewDeciding
	}, 10*time.Second, time.Millisecond, "the decision past transport.FewDeciding waits")
	release.Do(func() { close(hook.release) })
	for range transport.FewDeciding + 1 {
		require.NoError(t, <-out)
	}
	want := slices.Repeat([]int{1}, transport.FewDeciding+1)
	require.Equal(t, want, hook.calls())

	// A burst, all at once: past fewDeciding under way, decisions batch.
	const burst = 8 * transport.FewDeciding
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			<-start
			_, err := l.Allow(context.Background(), fmt.Sprint("burst-", i), limit)
			assert.NoError(t, err)
		})
	}
	close(start)
	wg.Wait()
	calls := hook.calls()[len(want):]
	require.Less(t, len(calls), burst, "no call carried two decisions")
	// The last call hands out its replies before it counts itself out.
	require.Eventually(t, func() bool {
		_, sending := l.t.Queued()
		return sending == 0
	}, 10*time.Second, time.Millisecond, "the calls end")
}

// A batch that carries a request for an id whose key holds no count fails
// that request alone: the other decisions of the call are made by Redis,
// and the breaker hears of one call that Redis answered.
func TestBatchWithBadKey(t *testing.T) {
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
				client, hook, clk := heldClient(t, b.addr(t))
				var mu sync.Mutex
				handled := map[string][]error{}
				l := New(client, WithClock(clk.Now), WithTimeout(time.Minute), WithFailurePolicy(policy),
					WithErrorHandler(func(_ context.Context, id string, err error) {
						mu.Lock()
						defer mu.Unlock()
						handled[id] = append(handled[id], err)
					}))
				limit := PerMinute(10)
				bad := l.appendKeys(nil, "bad", locate(clk.Now().UnixMilli(), limit))[0]
				require.NoError(t, client.Set(ctx, bad, "not a number", 0).Err())

				ids := []string{"a", "b", "bad", "c", "d"}
				queued, held := batchAfterHeld(t, l, hook, limit, ids, ctx, nil)
				for _, o := range held {
					require.NoError(t, o.err)
					require.True(t, o.res.Allowed && !o.res.Degraded, "%+v", o)
				}
				for _, id := range ids {
					o := queued[id]
					if id == "bad" {
						require.True(t, o.res.Degraded, "%+v", o)
						require.Equal(t, policy == FailOpen, o.res.Allowed)
						continue
					}
					require.NoError(t, o.err, id)
					require.False(t, o.res.Degraded, "%s: another id's bad key failed it", id)
					require.True(t, o.res.Allowed, id)
					require.Equal(t, int64(1), o.res.Count, id)
				}
				mu.Lock()
				defer mu.Unlock()
				require.Len(t, handled, 1, "errors only for the bad id: %v", handled)
				require.Len(t, handled["bad"], 1)
				require.ErrorIs(t, handled["bad"][0], ErrBadReply)
				require.Zero(t, l.t.Failures(), "Redis answered")
			})
		}
	}
}

// A batched script call that fails counts once toward the breaker, however
// many decisions it carried: five decisions in one call to a server that
// never answers leave a breaker of threshold 5 closed, with one failure.
func TestBreakerCountsABatchOnce(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	addr := redistest.Silent(t)
	for _, ctxAware := range []bool{true, false} {
		t.Run(fmt.Sprint("ContextTimeoutEnabled=", ctxAware), func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: ctxAware,
				ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
			t.Cleanup(func() { _ = client.Close() })
			hook := newHeldCalls(transport.MaxInFlight)
			client.AddHook(hook)
			var mu sync.Mutex
			var handled []error
			l := New(client, WithTimeout(timeout), WithCircuitBreaker(5, time.Hour),
				WithErrorHandler(func(_ context.Context, _ string, err error) {
					mu.Lock()
					defer mu.Unlock()
					handled = append(handled, err)
				}))

			// The held decisions' callers leave before their calls go on:
			// that tells nothing of Redis, and counts nothing.
			holdCtx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ids := []string{"a", "b", "c", "d", "e"}
			queued, held := batchAfterHeld(t, l, hook, PerMinute(10), ids, holdCtx, cancel)
			for _, o := range held {
				require.ErrorIs(t, o.err, context.Canceled)
			}
			for _, id := range ids {
				o := queued[id]
				require.NoError(t, o.err, id) // FailOpen
				require.True(t, o.res.Degraded, id)
			}
			mu.Lock()
			require.Len(t, handled, len(ids))
			for _, err := range handled {
				// The caller's deadline, or the batch's a moment later.
				var netErr net.Error
				require.True(t, errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout(), "%v", err)
			}
			mu.Unlock()
			require.False(t, l.Stats().BreakerOpen, "one failed call of five decisions opened the breaker")
			require.Equal(t, int32(1), l.t.Failures(), "one failed call, one failure")
		})
	}
}
