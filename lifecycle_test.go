package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// The Limiter's life where it meets calls under way, on a real server
// behind a proxy that holds replies back: a Close retried after its ctx
// ended, a Close during a Slot.Keep extension, an Acquire whose caller
// cancels, and a Reset that fails while its caller waits.

// A Close whose ctx ends while a call is under way returns ctx's error; a
// second Close goes on from where the first stopped: it waits for the
// call, gives back what the leases hold unused, waits for that give-back,
// and only then returns nil, leaving Redis with exactly what was admitted
// and no goroutine of the library. At 8f5de62 the second Close returned
// nil at once, the lease still held (counted in Redis, never used) and the
// call still under way.
func TestCloseRetriedGivesBackLeases(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	client := newClient(t, &redis.Options{Addr: proxy.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	direct := srv.Client(t)
	ctx := context.Background()
	prefix := t.Name()
	count := func(id string) int64 {
		t.Helper()
		n, err := redisCount(ctx, direct, prefix, id)
		require.NoError(t, err)
		return n
	}
	// Those of earlier tests' Limiters, never closed, end by themselves.
	require.Eventually(t, func() bool { return len(lifecycleGoroutines()) == 0 }, 10*time.Second, time.Millisecond, "before the Limiter")

	l := ratelimit.New(client, ratelimit.WithPrefix(prefix), ratelimit.WithTimeout(5*time.Second))
	leased := ratelimit.PerHour(1000) // leases of up to 50
	leased.Leased = true
	const admitted = 10
	for range admitted {
		res, err := l.Allow(ctx, "hot", leased)
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	// The sweeper would give an idle lease back after about a second; the
	// Close below comes within milliseconds.
	require.Equal(t, 1, l.Stats().Leases)
	require.Equal(t, admitted+l.Stats().LeasedUnits, count("hot"), "the lease's units are counted in Redis")

	proxy.Delay(time.Hour) // replies wait for Delay(0): the call stays under way
	decided := make(chan error, 1)
	go func() {
		_, err := l.Allow(ctx, "other", ratelimit.PerHour(10))
		decided <- err
	}()
	require.Eventually(t, func() bool {
		n, err := redisCount(ctx, direct, prefix, "other")
		return err == nil && n == 1
	}, 10*time.Second, time.Millisecond, "the call reached Redis")
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, l.Close(short), context.DeadlineExceeded, "the call under way outlasts the first Close's ctx")
	proxy.Delay(0)

	require.NoError(t, l.Close(ctx), "the second Close")
	require.Zero(t, l.Stats().Leases, "leases held when the second Close returned nil")
	require.Equal(t, int64(admitted), count("hot"), "Redis counts what was admitted, exactly")
	require.Empty(t, lifecycleGoroutines(), "goroutines of the library when the second Close returned nil")
	require.NoError(t, <-decided, "the call under way")
	require.NoError(t, l.Close(ctx), "a third Close")
}

// Close waits for a Slot.Keep extension on the wire: once it has returned
// nil, no goroutine of the library is left, at once, not a reply later.
// At 8f5de62 Close stopped Keep's timer but counted no extension under
// way: on a client that stops at its ctx deadline (ContextTimeoutEnabled,
// as the README recommends) it returned nil while the extension's
// goroutine still waited for Redis's reply; on go-redis's default client
// it waited for the transport's watcher of the call, and could still find
// the extension's goroutine returning from it.
func TestCloseWaitsForKeepExtension(t *testing.T) {
	srv := redistest.Start(t)
	for _, aware := range []bool{true, false} {
		name := map[bool]string{true: "ContextTimeoutEnabled", false: "DefaultClient"}[aware]
		t.Run(name, func(t *testing.T) {
			proxy := redistest.StartProxy(t, srv.Addr)
			client := newClient(t, &redis.Options{Addr: proxy.Addr, MaxRetries: -1, ContextTimeoutEnabled: aware})
			// Connections ready: the extension finds one idle, whatever the
			// Limiter's first call started beside it (an eviction check).
			warmPool(t, client, 4)
			ctx := context.Background()
			require.Eventually(t, func() bool { return len(lifecycleGoroutines()) == 0 }, 10*time.Second, time.Millisecond, "before the Limiter")

			l := ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(5*time.Second))
			s, err := l.Acquire(ctx, "job", ratelimit.Concurrency{Max: 1, Lease: 100 * time.Millisecond})
			require.NoError(t, err)
			require.True(t, s.Acquired)
			sent := proxy.Commands("evalsha")
			// Each reply 300 ms late, within the Limiter's timeout (5 s): the
			// first extension, due 50 ms after Keep, stays that long on the
			// wire, where the old Close took milliseconds to return.
			proxy.Delay(300 * time.Millisecond)
			release := s.Keep(ctx)
			require.Eventually(t, func() bool { return proxy.Commands("evalsha") > sent }, 10*time.Second, time.Millisecond,
				"the first extension reached Redis")

			require.NoError(t, l.Close(ctx))
			require.Empty(t, lifecycleGoroutines(), "goroutines of the library when Close returned nil")
			proxy.Delay(0)
			release() // after Close, a call of its own
		})
	}
}

// An Acquire whose caller's ctx is canceled after its call reached Redis
// and took the slot gets ctx's error, and the slot is given back: the next
// Acquire of the id, on a limit of one slot with a lease of a minute, is
// Acquired. With go-redis's default client (ContextTimeoutEnabled false) a
// ctx without a deadline is the case at issue: its call runs on the
// caller's goroutine, bounded by the socket's deadlines, and Acquire sees
// ctx ended when Redis answers. A ctx whose deadline comes before the
// Limiter's timeout, canceled, is the other path: its call is watched, and
// followed to its end once the caller has left. At 8f5de62 the first kept
// its slot until the lease ended: nothing gave it back.
func TestAcquireCanceledReleasesSlot(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	client := newClient(t, &redis.Options{Addr: proxy.Addr, MaxRetries: -1}) // go-redis's default options otherwise
	direct := srv.Client(t)
	ctx := context.Background()
	const timeout = 5 * time.Second
	prefix := t.Name()
	l := ratelimit.New(client, ratelimit.WithPrefix(prefix), ratelimit.WithTimeout(timeout))
	t.Cleanup(func() { require.NoError(t, l.Close(ctx)) })
	c := ratelimit.Concurrency{Max: 1, Lease: time.Minute}
	// The server has the script, so that the acquires below take their
	// slots with their first command.
	warm, err := l.Acquire(ctx, "warm-up", c)
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"NoDeadline", func() (context.Context, context.CancelFunc) { return context.WithCancel(ctx) }},
		{"DeadlineBeforeTimeout", func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, timeout/2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := tc.name
			key := prefix + ":{" + id + "}:slots"
			held := func(want int64) func() bool { // for Eventually, which calls it on a goroutine of its own
				return func() bool {
					n, err := direct.ZCard(ctx, key).Result()
					return err == nil && n == want
				}
			}
			proxy.Delay(time.Hour) // the reply waits for Delay(0), the call for its reply
			callCtx, cancel := tc.ctx()
			defer cancel()
			type outcome struct {
				s   ratelimit.Slot
				err error
			}
			acquired := make(chan outcome, 1)
			go func() {
				s, err := l.Acquire(callCtx, id, c)
				acquired <- outcome{s, err}
			}()
			require.Eventually(t, held(1), 10*time.Second, time.Millisecond,
				"the call reached Redis and took the slot")
			cancel()
			proxy.Delay(0)
			got := <-acquired
			require.ErrorIs(t, got.err, context.Canceled)
			require.False(t, got.s.Acquired)

			// The give-back is sent in the background.
			require.Eventually(t, held(0), 5*time.Second, time.Millisecond,
				"the canceled Acquire's slot is still held")
			s, err := l.Acquire(ctx, id, c)
			require.NoError(t, err)
			require.True(t, s.Acquired, "the next Acquire of the id")
			require.NoError(t, s.Release(ctx))
		})
	}
}

// A Reset that fails while its caller waits (the caller's ctx outlasts the
// Limiter's timeout) reaches the error handler before it returns, once per
// failed Reset, as Refund, GiveBack and Charge do; the error handled is
// the one Reset returns wrapped. At 8f5de62 Reset told the error handler
// only of a failure whose caller had left.
func TestResetFailureReported(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background() // outlasts the Limiter's timeout
	limit := ratelimit.PerMinute(10)
	for _, tc := range []struct {
		name string
		call func(l *ratelimit.Limiter, res ratelimit.Result) error
	}{
		{"Reset", func(l *ratelimit.Limiter, _ ratelimit.Result) error { return l.Reset(ctx, "u", limit) }},
		{"Refund", func(l *ratelimit.Limiter, res ratelimit.Result) error {
			return l.Refund(ctx, "u", []ratelimit.Result{res}, 1)
		}},
		{"GiveBack", func(l *ratelimit.Limiter, _ ratelimit.Result) error {
			return l.GiveBack(ctx, "u", []ratelimit.Limit{limit}, 1)
		}},
		{"Charge", func(l *ratelimit.Limiter, _ ratelimit.Result) error {
			_, err := l.Charge(ctx, "u", []ratelimit.Limit{limit}, 1)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy := redistest.StartProxy(t, srv.Addr)
			client := newClient(t, &redis.Options{Addr: proxy.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
			// The script loaded and a connection ready: the first decision,
			// within a timeout of 100 ms, is one round trip.
			warmPool(t, client, 2)
			loadScript(t, client)
			h := &errorLog{}
			// The breaker off: every call goes to the silent server and fails
			// by the timeout, which nothing races (the proxy hangs until told).
			l := ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(100*time.Millisecond),
				ratelimit.WithCircuitBreaker(0, 0), ratelimit.WithErrorHandler(h.handle))
			res, err := l.Allow(ctx, "u", limit)
			require.NoError(t, err)
			require.False(t, res.Degraded)

			proxy.Hang()
			for n := 1; n <= 2; n++ {
				err := tc.call(l, res)
				require.Error(t, err)
				require.Len(t, h.all(), n, "errors handled when failed call %d returned", n)
				require.ErrorIs(t, err, h.all()[n-1], "the error handled is the one returned")
			}
			proxy.Resume()
			require.NoError(t, l.Close(ctx)) // waits for any late report
			require.Equal(t, []string{"u", "u"}, h.seen(), "once per failed call")
		})
	}
}

// redisCount returns what Redis counts for id under prefix, its windows'
// keys together: a test that crosses a window's end still sees the sum.
func redisCount(ctx context.Context, c *redis.Client, prefix, id string) (int64, error) {
	keys, err := c.Keys(ctx, prefix+":{"+id+"}:*").Result()
	if err != nil {
		return 0, err
	}
	total := int64(0)
	for _, k := range keys {
		n, err := c.Get(ctx, k).Int64()
		switch {
		case errors.Is(err, redis.Nil): // expired since KEYS
		case err != nil:
			return 0, err
		}
		total += n
	}
	return total, nil
}

// lifecycleGoroutines returns libraryGoroutines but for the timer of a
// deadline that decisions share (a tick of internal/transport's) while it
// fires: it closes a channel and ends. Every call whose ctx is never
// canceled leaves one armed for the Limiter's timeout, the Limiter closed or
// not, and one may fire while the stacks are taken.
func lifecycleGoroutines() []string {
	var left []string
	for _, g := range libraryGoroutines() {
		if !strings.Contains(g, ".tickAfter.func") {
			left = append(left, g)
		}
	}
	return left
}
