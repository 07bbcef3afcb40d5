package ratelimit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

func TestConcurrencyMiniredis(t *testing.T) {
	t.Parallel()
	runConcurrency(t, miniredisEnv)
}

func TestConcurrencyRedisServer(t *testing.T) {
	t.Parallel()
	runConcurrency(t, serverEnv(t))
}

func TestConcurrencyRedisCluster(t *testing.T) {
	t.Parallel()
	runConcurrency(t, clusterEnv(t))
}

func TestConcurrencyACL(t *testing.T) {
	t.Parallel()
	e := aclEnv(t)(t)
	testAcquireRelease(t, e)
}

// runConcurrency runs every test of Acquire's meaning against one kind of
// Redis.
func runConcurrency(t *testing.T, mk newEnv) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, env)
	}{
		{"AcquireRelease", testAcquireRelease},
		{"LeaseEnds", testLeaseEnds},
		{"InvalidInput", testAcquireInvalidInput},
		{"OtherLimiter", testSlotOfOtherLimiter},
		{"NeverMoreThanMax", testNeverMoreThanMax},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, mk(t)) })
	}
}

func testAcquireRelease(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	c := ratelimit.Concurrency{Max: 2, Lease: time.Minute, Name: "export"}
	a, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.Equal(t, []any{true, int64(1), int64(1), time.Duration(0)}, []any{a.Acquired, a.InFlight, a.Remaining, a.RetryAfter})
	b, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.Equal(t, []any{true, int64(2), int64(0)}, []any{b.Acquired, b.InFlight, b.Remaining})
	full, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.False(t, full.Acquired)
	require.Equal(t, int64(2), full.InFlight)
	require.Positive(t, full.RetryAfter)
	require.LessOrEqual(t, full.RetryAfter, c.Lease, "until the earliest lease ends")
	require.ErrorIs(t, full.Release(ctx), ratelimit.ErrInvalidSlot, "a slot not acquired")
	require.ErrorIs(t, full.Extend(ctx), ratelimit.ErrInvalidSlot)
	require.Equal(t, c, full.Concurrency)

	require.NoError(t, a.Extend(ctx))
	require.NoError(t, a.Release(ctx))
	require.NoError(t, a.Release(ctx), "a second Release does nothing")
	require.ErrorIs(t, a.Extend(ctx), ratelimit.ErrLeaseEnded, "a released slot")
	again, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.True(t, again.Acquired, "the released slot is free")
	require.Equal(t, int64(2), again.InFlight)
	other, err := l.Acquire(ctx, "u", ratelimit.Concurrency{Max: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, other.Acquired, "a limit of another name is counted apart")
	var zero ratelimit.Slot
	require.ErrorIs(t, zero.Release(ctx), ratelimit.ErrInvalidSlot)
	require.ErrorIs(t, zero.Extend(ctx), ratelimit.ErrInvalidSlot)
	s := l.Stats()
	require.Equal(t, []int64{4, 1}, []int64{s.SlotsAcquired, s.SlotsReleased})
	require.NoError(t, b.Release(ctx))
	require.NoError(t, again.Release(ctx))
	require.NoError(t, other.Release(ctx))
	require.Empty(t, e.keys(t), "an id that holds no slot keeps no key")
}

// A lease ends on Redis's clock: its slot is free again, Release of it does
// nothing, Extend of it is ErrLeaseEnded.
func testLeaseEnds(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	c := ratelimit.Concurrency{Max: 1, Lease: 30 * time.Millisecond}
	held, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.True(t, held.Acquired)
	var next ratelimit.Slot
	deadline := time.Now().Add(10 * time.Second)
	long := c // the new holder's lease must outlast the calls below on a loaded machine
	long.Lease = time.Minute
	for !next.Acquired {
		require.True(t, time.Now().Before(deadline), "the lease never ended")
		next, err = l.Acquire(ctx, "u", long)
		require.NoError(t, err)
		if !next.Acquired {
			require.LessOrEqual(t, next.RetryAfter, c.Lease, "held's lease ends first")
			time.Sleep(next.RetryAfter) // Redis's clock, which the test cannot move
		}
	}
	require.NoError(t, held.Release(ctx), "after its lease ended: nothing to do")
	require.ErrorIs(t, held.Extend(ctx), ratelimit.ErrLeaseEnded)
	require.NoError(t, next.Extend(ctx), "the new holder's slot was not freed")
	full, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.False(t, full.Acquired)
}

func testAcquireInvalidInput(t *testing.T, e env) {
	l := e.limiter()
	ctx := context.Background()
	for _, tc := range []struct {
		id   string
		c    ratelimit.Concurrency
		is   error
		says string
	}{
		{"u", ratelimit.Concurrency{Max: 0, Lease: time.Second}, ratelimit.ErrInvalidLimit, "Max 0"},
		{"u", ratelimit.Concurrency{Max: 1, Lease: 0}, ratelimit.ErrInvalidLimit, "Lease 0s"},
		{"u", ratelimit.Concurrency{Max: 1, Lease: 1500 * time.Microsecond}, ratelimit.ErrInvalidLimit, "Lease 1.5ms is not a whole number"},
		{"", ratelimit.Concurrency{Max: 1, Lease: time.Second}, ratelimit.ErrInvalidID, "id is empty"},
	} {
		s, err := l.Acquire(ctx, tc.id, tc.c)
		require.ErrorIs(t, err, tc.is)
		require.ErrorContains(t, err, tc.says)
		require.False(t, s.Acquired)
	}
	require.Empty(t, e.keys(t), "nothing is sent for invalid input")
	_, err := ratelimit.New(nil).Acquire(ctx, "u", ratelimit.Concurrency{Max: 1, Lease: time.Second})
	require.ErrorIs(t, err, ratelimit.ErrNilClient)
}

// A Slot releases in its own Limiter's keys, and nothing else's.
func testSlotOfOtherLimiter(t *testing.T, e env) {
	ctx := context.Background()
	a := e.limiter()
	b := e.limiter(ratelimit.WithPrefix(e.prefix + "-b"))
	c := ratelimit.Concurrency{Max: 1, Lease: time.Minute}
	sa, err := a.Acquire(ctx, "u", c)
	require.NoError(t, err)
	sb, err := b.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.True(t, sa.Acquired && sb.Acquired, "two prefixes, two sets of slots")
	require.NoError(t, sa.Release(ctx))
	again, err := b.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.False(t, again.Acquired, "b's slot is still held")
	require.NoError(t, sb.Release(ctx))
}

// 4 Limiters × 8 goroutines on one id, Max 5, random hold times: a monitor
// raised after Acquired and lowered before Release never sees more than 5;
// with demand under Max, every acquisition succeeds.
func testNeverMoreThanMax(t *testing.T, e env) {
	ctx := context.Background()
	c := ratelimit.Concurrency{Max: 5, Lease: time.Minute}
	limiters := make([]*ratelimit.Limiter, 4)
	for i := range limiters {
		limiters[i] = e.limiter()
	}
	var inFlight, most, acquired, refused atomic.Int64
	var first firstError
	work := func(l *ratelimit.Limiter, n int) {
		for range n {
			s, err := l.Acquire(ctx, "shared", c)
			if err != nil {
				first.report(err)
				return
			}
			if !s.Acquired {
				refused.Add(1)
				continue
			}
			acquired.Add(1)
			now := inFlight.Add(1)
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond) // the work the slot is held for
			inFlight.Add(-1)
			if err := s.Release(ctx); err != nil {
				first.report(err)
				return
			}
		}
	}
	var wg sync.WaitGroup
	for _, l := range limiters {
		for range 8 {
			wg.Go(func() { work(l, 20) })
		}
	}
	wg.Wait()
	require.NoError(t, first.get())
	require.LessOrEqual(t, most.Load(), c.Max, "never more than Max in flight")
	require.Positive(t, acquired.Load())
	require.Positive(t, refused.Load(), "32 goroutines against 5 slots are refused sometimes")

	acquired.Store(0)
	refused.Store(0)
	for i := range 4 { // demand under Max
		wg.Go(func() { work(limiters[i], 20) })
	}
	wg.Wait()
	require.NoError(t, first.get())
	require.Equal(t, int64(80), acquired.Load(), "every acquisition succeeds under Max")
	require.Empty(t, e.keys(t))
}

// When Redis cannot decide: FailOpen acquires, Degraded; FailClosed does
// not, and returns the error; FailLocal holds this process's share.
func TestAcquireFailurePolicies(t *testing.T) {
	ctx := context.Background()
	c := ratelimit.Concurrency{Max: 8, Lease: time.Minute}
	for _, p := range policyCases {
		t.Run(p.name, func(t *testing.T) {
			h := &errorLog{}
			l := ratelimit.New(downClient(t), p.with(ratelimit.WithErrorHandler(h.handle))...)
			s, err := l.Acquire(ctx, "u", c)
			require.True(t, s.Degraded)
			require.NotEmpty(t, h.all(), "the error handler hears of it")
			switch p.policy {
			case ratelimit.FailClosed:
				require.ErrorIs(t, err, ratelimit.ErrUnavailable)
				require.False(t, s.Acquired)
			case ratelimit.FailOpen:
				require.NoError(t, err)
				require.True(t, s.Acquired)
				require.NoError(t, s.Release(ctx))
				require.NoError(t, s.Extend(ctx))
			case ratelimit.FailLocal: // a share of 8/4
				require.NoError(t, err)
				require.True(t, s.Acquired)
				s2, _ := l.Acquire(ctx, "u", c)
				s3, _ := l.Acquire(ctx, "u", c)
				require.True(t, s2.Acquired)
				require.False(t, s3.Acquired, "the share of 2 is held")
				require.Positive(t, s3.RetryAfter)
				require.LessOrEqual(t, s3.RetryAfter, c.Lease, "until the earliest local lease ends")
				require.NoError(t, s2.Extend(ctx))
				require.NoError(t, s2.Release(ctx))
				s4, _ := l.Acquire(ctx, "u", c)
				require.True(t, s4.Acquired, "released here")
			}
		})
	}
}

// The slots of a process killed while it held them are free again once
// their leases end, seen from another process.
func TestCrashedHolder(t *testing.T) {
	if addr := os.Getenv("RATELIMIT_SLOT_HOLDER"); addr != "" {
		holdSlotsAndWait(addr)
		return
	}
	srv := redistest.Start(t)
	c := ratelimit.Concurrency{Max: 3, Lease: 500 * time.Millisecond}
	child := exec.Command(os.Args[0], "-test.run", "^TestCrashedHolder$")
	child.Env = append(os.Environ(), "RATELIMIT_SLOT_HOLDER="+srv.Addr)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held 3\n", line)
	held := time.Now() // the child acquired its 3 slots before it said so
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))

	l := ratelimit.New(newClient(t, &redis.Options{Addr: srv.Addr}), ratelimit.WithTimeout(time.Minute))
	s, err := l.Acquire(context.Background(), "crash", c)
	require.NoError(t, err)
	require.False(t, s.Acquired, "the dead holder's slots are held until their leases end")
	for !s.Acquired {
		time.Sleep(5 * time.Millisecond) // Redis's clock, which the test cannot move
		s, err = l.Acquire(context.Background(), "crash", c)
		require.NoError(t, err)
	}
	free := time.Since(held)
	t.Logf("free again %v after the holder said it held them (Lease %v)", free, c.Lease)
	require.Less(t, free, c.Lease+100*time.Millisecond)
}

// holdSlotsAndWait is the child of TestCrashedHolder: it takes 3 slots,
// says so, and waits to be killed.
func holdSlotsAndWait(addr string) {
	l := ratelimit.New(redis.NewClient(&redis.Options{Addr: addr}), ratelimit.WithTimeout(time.Minute))
	c := ratelimit.Concurrency{Max: 3, Lease: 500 * time.Millisecond}
	for range 3 {
		if s, err := l.Acquire(context.Background(), "crash", c); err != nil || !s.Acquired {
			fmt.Println("could not acquire:", err)
			os.Exit(1)
		}
	}
	fmt.Println("held 3")
	select {}
}

// A Release or Extend that cannot reach Redis goes to the error handler and
// returns the error; the lease still ends by itself.
func TestReleaseRedisDown(t *testing.T) {
	e := miniredisEnv(t)
	h := &errorLog{}
	l := e.limiter(ratelimit.WithErrorHandler(h.handle), ratelimit.WithTimeout(time.Second))
	s, err := l.Acquire(context.Background(), "u", ratelimit.Concurrency{Max: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, s.Acquired)
	require.NoError(t, e.client.(*redis.Client).Close())
	require.Error(t, s.Release(context.Background()))
	require.Error(t, s.Extend(context.Background()))
	require.Len(t, h.all(), 2, "both reported")
}

// Callers whose deadlines are shorter than a slow but healthy Redis's
// answers (300 ms here) get their ctx's error, and the breaker counts
// nothing against Redis: their calls go on, and Redis answers them within
// the Limiter's timeout (5 s). What those late acquires took is released
// once they end.
func TestAcquireShortDeadlines(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	for _, aware := range []bool{false, true} {
		l := ratelimit.New(newClient(t, &redis.Options{Addr: proxy.Addr, MaxRetries: -1, ContextTimeoutEnabled: aware}),
			ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(5*time.Second))
		// 300 ms against 5 ms callers: a loaded machine's late timers must
		// not let the replies come first
		proxy.Delay(300 * time.Millisecond)
		c := ratelimit.Concurrency{Max: 100, Lease: time.Minute}
		left := 0
		for range 4 * ratelimit.DefaultBreakerFailures {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			s, err := l.Acquire(ctx, "u", c)
			cancel()
			if err == nil { // the proxy let a reply through in time
				require.False(t, s.Degraded)
				continue
			}
			require.ErrorIs(t, err, context.DeadlineExceeded)
			left++
		}
		require.Greater(t, left, ratelimit.DefaultBreakerFailures, "enough callers left to open the breaker, were they counted")
		proxy.Delay(0)
		require.False(t, l.Stats().BreakerOpen, "client honours ctx: %v", aware)
		ratelimit.Settle(l)
		n, err := srv.Client(t).ZCard(context.Background(), t.Name()+":{u}:slots").Result()
		require.NoError(t, err)
		require.Zero(t, n, "the late acquires' slots were released")
		res, err := l.Allow(context.Background(), "u", ratelimit.PerMinute(10))
		require.NoError(t, err)
		require.False(t, res.Degraded)
	}
}

// Under WithShadow a full limit refuses nothing, and the slot holds nothing.
func TestAcquireShadowMode(t *testing.T) {
	e := miniredisEnv(t)
	l := e.limiter(ratelimit.WithShadow(true))
	ctx := context.Background()
	c := ratelimit.Concurrency{Max: 1, Lease: time.Minute}
	a, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	b, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.True(t, b.Acquired, "shadow mode refuses nothing")
	require.Zero(t, b.RetryAfter)
	require.NoError(t, b.Extend(ctx))
	require.NoError(t, b.Release(ctx))
	require.NoError(t, a.Release(ctx))
	require.Equal(t, []int64{1, 1}, []int64{l.Stats().SlotsAcquired, l.Stats().SlotsReleased}, "the shadow slot held nothing")
}

// With Max lowered below what is held, RetryAfter is the wait until enough
// leases end for one slot to be free, not the earliest.
func TestAcquireMaxLowered(t *testing.T) {
	e := miniredisEnv(t)
	l := e.limiter()
	ctx := context.Background()
	for _, lease := range []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second} {
		s, err := l.Acquire(ctx, "u", ratelimit.Concurrency{Max: 3, Lease: lease})
		require.NoError(t, err)
		require.True(t, s.Acquired)
	}
	s, err := l.Acquire(ctx, "u", ratelimit.Concurrency{Max: 2, Lease: time.Second})
	require.NoError(t, err)
	require.False(t, s.Acquired)
	require.Greater(t, s.RetryAfter, 19*time.Second, "two must end: the one of 20 s")
	require.LessOrEqual(t, s.RetryAfter, 20*time.Second)
}

// A slot kept outlives its Lease while the work runs, and is free once it
// is released. The lease is long enough that a loaded machine's late
// timers (Keep extends every half lease, on a fixed cadence) keep it: a
// lease of 30 ms lost 4 runs in 60 at a load of 9.6.
func TestSlotKeep(t *testing.T) {
	e := miniredisEnv(t)
	l := e.limiter()
	ctx := context.Background()
	c := ratelimit.Concurrency{Max: 1, Lease: 400 * time.Millisecond}
	s, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.True(t, s.Acquired)
	release := s.Keep(ctx)
	held := time.Now()
	for time.Since(held) < 3*c.Lease { // the lease runs on Redis's clock: real time must pass
		other, err := l.Acquire(ctx, "u", c)
		require.NoError(t, err)
		require.False(t, other.Acquired, "kept after %v", time.Since(held))
		time.Sleep(20 * time.Millisecond)
	}
	release()
	free, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.True(t, free.Acquired)
}

// The outage a short deadline used to hide: with Redis blackholed and
// callers whose deadlines (50 ms) are shorter than the Limiter's timeout
// (the default, 100 ms), each Acquire's call goes on and is judged by that
// timeout, as a decision's is: the breaker opens after
// DefaultBreakerFailures of them, the Acquires after that come from the
// failure policy (FailOpen: acquired, Degraded) before their callers'
// deadlines, and every failure reaches the error handler, late for the
// callers who left.
func TestAcquireShortDeadlinesOpenTheBreaker(t *testing.T) {
	const (
		deadline = 50 * time.Millisecond
		calls    = 12
	)
	srv := redistest.Start(t)
	for _, ctxAware := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxAware), func(t *testing.T) {
			l, proxy, h, _ := proxiedLimiter(t, srv, ctxAware, ratelimit.PerMinute(10))
			c := ratelimit.Concurrency{Max: 100, Lease: time.Minute}
			proxy.Hang()
			defer proxy.Resume()
			left, degraded := 0, 0
			var waited time.Duration
			for i := range calls {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				begin := time.Now()
				s, err := l.Acquire(ctx, "u", c)
				waited += time.Since(begin)
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					left++
				case err == nil && s.Degraded && s.Acquired:
					degraded++
				default:
					t.Fatalf("Acquire %d: %+v, %v", i, s, err)
				}
			}
			require.True(t, l.Stats().BreakerOpen, "the outage opened the breaker")
			require.GreaterOrEqual(t, left, ratelimit.DefaultBreakerFailures)
			require.Positive(t, degraded, "Acquires after the breaker opened came from the policy")
			// The calls whose callers left are judged at the Limiter's
			// timeout, and reported then: all of them but any whose
			// deadline passed before its call was sent (on a loaded
			// machine), which failed nothing.
			require.Eventually(t, func() bool { return len(h.all()) >= degraded+ratelimit.DefaultBreakerFailures }, 10*time.Second, time.Millisecond,
				"every failure was handled, late or not")
			require.LessOrEqual(t, len(h.all()), calls)
			t.Logf("%d Acquires waited %v in all: %d callers left, %d from the policy; %d errors handled; breaker open: %v",
				calls, waited.Round(time.Millisecond), left, degraded, len(h.all()), l.Stats().BreakerOpen)
		})
	}
}

// A Slot's Release and Extend use what it was acquired with: a Concurrency
// changed on the Slot since names neither another key nor another lease.
func TestSlotKeepsWhatItAcquired(t *testing.T) {
	e := miniredisEnv(t)
	l := e.limiter()
	ctx := context.Background()
	s, err := l.Acquire(ctx, "u", ratelimit.Concurrency{Max: 1, Lease: time.Hour, Name: "export"})
	require.NoError(t, err)
	require.True(t, s.Acquired)
	s.Concurrency = ratelimit.Concurrency{Max: 9, Lease: time.Millisecond, Name: "other"}
	require.NoError(t, s.Extend(ctx))
	key := e.prefix + ":{u}:slots:export"
	ttl, err := e.client.PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 59*time.Minute, "extended by the lease it was acquired with")
	require.NoError(t, s.Release(ctx))
	require.Empty(t, e.keys(t), "released from the key it was acquired at")
}
