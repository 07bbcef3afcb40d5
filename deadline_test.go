package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// leftEvents records the Events of calls whose callers left (Event.Left),
// which come from other goroutines.
type leftEvents struct {
	mu   sync.Mutex
	errs []error
	bad  error // an Event of the kind that is not what Left says
}

func (o *leftEvents) Observe(_ context.Context, e *ratelimit.Event) {
	if e.Left {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.bad = fmt.Errorf("a Left Event reached Observe: %+v", *e)
	}
}

func (o *leftEvents) ObserveCall(_ context.Context, e *ratelimit.Event) {
	if !e.Left {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, e.Err)
	if e.Allowed || e.Err == nil || len(e.Results) != 1 || e.Results[0].Limit.Rate == 0 || e.Results[0].Allowed {
		o.bad = fmt.Errorf("a Left Event: %+v", *e)
	}
}

func (o *leftEvents) get() ([]error, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]error(nil), o.errs...), o.bad
}

// judgeLate is the function that waits, in a goroutine of its own, for the
// end of a call whose caller left, and judges it.
const judgeLate = "github.com/slidingwindow/ratelimit/internal/transport.(*Transport).judgeLate"

// lateCalls counts the calls whose callers left that have not ended: each
// is watched by a goroutine of its own and judged by another.
func lateCalls() int { return goroutinesIn(judgeLate) + watchGoroutines() }

// proxiedLimiter returns a Limiter of the default timeout on a client of
// srv through a proxy, whose breaker opens after DefaultBreakerFailures and
// stays open for a minute (no probe within a run, however slow the
// machine), with the error handler and Observer that record what they get,
// once a decision of limit has succeeded: on a connection already made,
// with the script already loaded, so that its 100 ms bound it by 10 times
// and more on a loaded machine.
func proxiedLimiter(t *testing.T, srv *redistest.Server, ctxAware bool, limit ratelimit.Limit) (*ratelimit.Limiter, *redistest.Proxy, *errorLog, *leftEvents) {
	proxy := redistest.StartProxy(t, srv.Addr)
	opts := slowClient(proxy.Addr, ctxAware)
	opts.MaxRetries = -1
	client := newClient(t, opts)
	warmPool(t, client, 1)
	loadScript(t, client)
	h, events := &errorLog{}, &leftEvents{}
	l := ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithErrorHandler(h.handle), ratelimit.WithObserver(events),
		ratelimit.WithCircuitBreaker(ratelimit.DefaultBreakerFailures, time.Minute))
	res, err := l.Allow(context.Background(), "warm-up", limit)
	require.NoError(t, err)
	require.False(t, res.Degraded)
	return l, proxy, h, events
}

// With Redis blackholed and callers whose deadlines (50 ms) are shorter than
// the Limiter's timeout (the default, 100 ms), each call on the wire is
// judged by that timeout: its failure is counted by the breaker, which
// opens after DefaultBreakerFailures of them; decisions after that come from
// the policy before their callers' deadlines; and every failure reaches the
// error handler and the Observer, as an Event with Left set. Before the
// Limiter judged them by its own bound, each of the 20 waited its 50 ms, the
// breaker never opened, and no one heard of the outage.
func TestShortDeadlinesOpenTheBreaker(t *testing.T) {
	const (
		deadline = 50 * time.Millisecond
		calls    = 20
	)
	srv := redistest.Start(t)
	limit := ratelimit.PerMinute(1000)
	for _, ctxAware := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxAware), func(t *testing.T) {
			l, proxy, h, events := proxiedLimiter(t, srv, ctxAware, limit)

			proxy.Hang()
			defer proxy.Resume()
			left, fast, lastLeft := 0, -1, -1
			var fastTook time.Duration
			var took []time.Duration
			for i := range calls {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				begin := time.Now()
				res, err := l.Allow(ctx, "id", limit)
				took = append(took, time.Since(begin))
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					left, lastLeft = left+1, i
				case err == nil && res.Degraded && res.Allowed:
					if fast < 0 {
						fast, fastTook = i, took[i]
					}
				default:
					t.Fatalf("decision %d: %+v, %v", i, res, err)
				}
			}
			requireLatencies(t, took, deadline, "callers with deadlines")
			require.Positive(t, fast, "no decision came from the open breaker's policy")
			require.Less(t, lastLeft, fast, "once the breaker opened, every decision came from the policy (its cooldown outlasts the run)")
			require.True(t, l.Stats().BreakerOpen)
			require.GreaterOrEqual(t, left, ratelimit.DefaultBreakerFailures, "callers that left before the breaker opened")
			// Each caller that left while its call was on the wire is told
			// of, late, when the Limiter's timeout ends the call: all of
			// them but any whose deadline passed before its call was sent
			// (on a loaded machine).
			require.Eventually(t, func() bool { return goroutinesIn(judgeLate) == 0 },
				10*time.Second, time.Millisecond, "the calls whose callers left end")
			errs, bad := events.get()
			require.NoError(t, bad)
			require.GreaterOrEqual(t, len(errs), ratelimit.DefaultBreakerFailures)
			require.LessOrEqual(t, len(errs), left)
			require.Len(t, h.all(), len(errs)+calls-left, "an error handled for each Left Event and each decision of the policy")
			for _, err := range errs {
				require.ErrorContains(t, err, "no reply within 100ms from "+proxy.Addr)
			}
			handled := h.all()
			t.Logf("%d callers left; the breaker opened, and decision %d came from the policy in %v; %d errors handled",
				left, fast, fastTook, len(handled))
		})
	}
}

// A healthy Redis that answers in 300 ms, well within the Limiter's
// timeout, is no outage because its callers gave up after 5 ms: their calls,
// judged by the Limiter's timeout, succeed; the breaker stays closed and
// the error handler hears nothing. So with a timeout past an hour, whose
// deadlines are timers of their own, not ticks: one canceled as its caller
// left had made each call a failure ("no reply within 2h0m0s … context
// canceled").
//
// Each bound is 10 times or more what it races on a loaded machine: a
// caller's 5 ms timer against the 300 ms reply (with 10 ms against 30 ms, a
// late timer let replies come first), and that reply against the 3 s timeout.
func TestSlowRedisShortCallersNoOutage(t *testing.T) {
	const (
		deadline = 5 * time.Millisecond
		delay    = 300 * time.Millisecond
	)
	srv := redistest.Start(t)
	limit := ratelimit.PerMinute(1000)
	for _, tc := range []struct {
		timeout  time.Duration // ample for the delayed reply on a loaded machine
		ctxAware bool
	}{{3 * time.Second, false}, {3 * time.Second, true}, {2 * time.Hour, false}, {2 * time.Hour, true}} {
		timeout, ctxAware := tc.timeout, tc.ctxAware
		t.Run(fmt.Sprintf("%v/ContextTimeoutEnabled=%v", timeout, ctxAware), func(t *testing.T) {
			proxy := redistest.StartProxy(t, srv.Addr)
			opts := slowClient(proxy.Addr, ctxAware)
			opts.MaxRetries = -1
			const poolSize = 20 // a connection for each decision
			opts.PoolSize = poolSize
			client := newClient(t, opts)
			h := &errorLog{}
			events := &leftEvents{}
			// A clock that stands still: every decision in one window, so
			// that Peek's count is the calls counted, whatever the minute.
			l := ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(timeout),
				ratelimit.WithClock(clock.NewFake(epoch).Now), ratelimit.WithErrorHandler(h.handle), ratelimit.WithObserver(events))
			_, err := l.Allow(context.Background(), "warm-up", limit)
			require.NoError(t, err)
			// The pool's connections are made, each through its handshake,
			// before the replies are late: a call then waits for one reply,
			// a tenth of the timeout, not for a handshake's few on top.
			warmPool(t, client, poolSize)

			proxy.Delay(delay)
			before := proxy.Commands("evalsha")
			for i := range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				_, err := l.Allow(ctx, "id", limit)
				cancel()
				require.ErrorIs(t, err, context.DeadlineExceeded, "decision %d", i)
				require.False(t, l.Stats().BreakerOpen, "decision %d", i)
			}
			// The calls sent went on and were counted. (A caller may leave
			// before its call is sent: queued behind fewDeciding calls in
			// flight, or, on a loaded machine, its 5 ms gone before it asks.)
			// A call may go out a moment after its caller left: the count is
			// taken once every call has ended.
			require.Eventually(t, func() bool { return lateCalls() == 0 }, 10*time.Second, time.Millisecond,
				"the calls of the callers that left end")
			sent := int64(proxy.Commands("evalsha") - before)
			require.Positive(t, sent)
			res, err := l.Peek(context.Background(), "id", limit)
			require.NoError(t, err)
			require.Equal(t, sent, res.Count, "the calls of the callers that left were decided")
			t.Logf("%d of 20 decisions sent, all counted", sent)
			require.False(t, l.Stats().BreakerOpen)
			require.Empty(t, h.all())
			errs, _ := events.get()
			require.Empty(t, errs)
		})
	}
}

// A Cluster client that has no slot map yet, whose seed node accepts
// connections and never answers, costs each decision the Limiter's timeout
// and not go-redis's own (about 5 s with its defaults): the map is loaded in
// a goroutine that decisions wait for within their deadlines, and they go
// to the policy.
func TestClusterWithoutSlotMap(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	seed := redistest.Silent(t)
	for _, ctxAware := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxAware), func(t *testing.T) {
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{seed}, ContextTimeoutEnabled: ctxAware})
			defer func() { _ = client.Close() }()
			var handled atomic.Int64
			var last atomic.Value
			l := ratelimit.New(client, ratelimit.WithTimeout(timeout),
				ratelimit.WithErrorHandler(func(_ context.Context, _ string, err error) { handled.Add(1); last.Store(err) }))
			var took []time.Duration
			for i := range 5 {
				begin := time.Now()
				res, err := l.Allow(context.Background(), fmt.Sprint("id-", i), ratelimit.PerSecond(10))
				took = append(took, time.Since(begin))
				require.NoError(t, err)
				require.True(t, res.Degraded && res.Allowed, "decision %d: %+v", i, res)
			}
			requireLatencies(t, took, timeout, "decisions from the policy")
			require.Equal(t, int64(5), handled.Load())
			require.ErrorContains(t, last.Load().(error), "loading its slot map")
		})
	}
}

// The same outage with callers deciding at once, so that their decisions
// wait and go in batches: each batch's call is judged by the Limiter's
// timeout, not by its callers' shorter deadlines, and the breaker opens.
func TestShortDeadlinesOpenTheBreakerBatched(t *testing.T) {
	const (
		deadline = 50 * time.Millisecond
		callers  = 32
	)
	srv := redistest.Start(t)
	limit := ratelimit.PerMinute(1000)
	for _, ctxAware := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxAware), func(t *testing.T) {
			l, proxy, h, events := proxiedLimiter(t, srv, ctxAware, limit)

			proxy.Hang()
			defer proxy.Resume()
			var left, policy atomic.Int64
			var failed firstError
			var wg sync.WaitGroup
			for g := range callers {
				wg.Go(func() {
					for policy.Load() == 0 || left.Load() == 0 { // until the breaker has opened
						ctx, cancel := context.WithTimeout(context.Background(), deadline)
						res, err := l.Allow(ctx, fmt.Sprint("id-", g), limit)
						cancel()
						switch {
						case errors.Is(err, context.DeadlineExceeded):
							left.Add(1)
						case err == nil && res.Degraded && res.Allowed:
							policy.Add(1)
						default:
							failed.report(fmt.Errorf("%+v, %v", res, err))
							return
						}
					}
				})
			}
			wg.Wait()
			require.NoError(t, failed.get())
			require.True(t, l.Stats().BreakerOpen)
			require.Eventually(t, func() bool { errs, _ := events.get(); return len(errs) >= ratelimit.DefaultBreakerFailures },
				10*time.Second, time.Millisecond, "the failures of the calls whose callers left are reported")
			errs, bad := events.get()
			require.NoError(t, bad)
			for _, err := range errs {
				require.ErrorContains(t, err, "no reply within 100ms from "+proxy.Addr)
			}
			t.Logf("%d callers left, %d decisions from the policy, %d Left Events, %d errors handled",
				left.Load(), policy.Load(), len(errs), len(h.all()))
		})
	}
}
