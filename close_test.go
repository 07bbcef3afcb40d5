package ratelimit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

func TestCloseMiniredis(t *testing.T) {
	t.Parallel()
	runClose(t, miniredisEnv)
}

func TestCloseRedisServer(t *testing.T) {
	t.Parallel()
	runClose(t, serverEnv(t))
}

func TestCloseRedisCluster(t *testing.T) {
	t.Parallel()
	runClose(t, clusterEnv(t))
}

// runClose runs every test of Close's meaning against one kind of Redis.
func runClose(t *testing.T, mk newEnv) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, env)
	}{
		{"RollingDeploy", testCloseRollingDeploy},
		{"Refuses", testCloseRefuses},
		{"SlotsStillRelease", testCloseSlotsRelease},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, mk(t)) })
	}
}

// A rolling deploy: Limiters that decided a leased limit, each closed in
// turn, leave in Redis exactly what they admitted, where without Close
// their leases would hold up to Rate/20 each until the window ends.
func testCloseRollingDeploy(t *testing.T, e env) {
	ctx := context.Background()
	limit := ratelimit.PerDay(10_000) // leases of up to 500
	limit.Leased = true
	e.clock.Set(epoch.Add(time.Hour))
	admitted := int64(0)
	for pod := range 3 {
		l := e.limiter()
		for range 40 + pod {
			res, err := l.Allow(ctx, "tenant", limit)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			admitted++
		}
		require.Positive(t, l.Stats().LeasedUnits, "pod %d holds a lease", pod)
		require.NoError(t, l.Close(ctx))
		require.Zero(t, l.Stats().Leases, "pod %d gave its leases back", pod)
		require.Equal(t, admitted, e.get(t, "tenant", limit.Window, e.windowIndex(limit.Window)), "after pod %d closed", pod)
	}
}

// After Close, every method that can reach Redis returns ErrClosed and
// writes nothing; a second Close returns nil.
func testCloseRefuses(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerMinute(10)
	res, err := l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	require.NoError(t, l.Close(ctx))
	before := e.keys(t)
	calls := map[string]func() error{
		"Allow":  func() error { _, err := l.Allow(ctx, "u", limit); return err },
		"AllowN": func() error { _, err := l.AllowN(ctx, "u", limit, 2); return err },
		"AllowAll": func() error {
			_, err := l.AllowAll(ctx, "u", []ratelimit.Limit{limit, ratelimit.PerHour(100)}, 1)
			return err
		},
		"Peek":     func() error { _, err := l.Peek(ctx, "u", limit); return err },
		"PeekAll":  func() error { _, err := l.PeekAll(ctx, "u", []ratelimit.Limit{limit}); return err },
		"Charge":   func() error { _, err := l.Charge(ctx, "u", []ratelimit.Limit{limit}, 1); return err },
		"Refund":   func() error { return l.Refund(ctx, "u", []ratelimit.Result{res}, 1) },
		"GiveBack": func() error { return l.GiveBack(ctx, "u", []ratelimit.Limit{limit}, 1) },
		"Reset":    func() error { return l.Reset(ctx, "u", limit) },
		"AllowMany": func() error {
			_, err := l.AllowMany(ctx, []ratelimit.Quota{{ID: "u", Limit: limit, Cost: 1}, {ID: "v", Limit: limit, Cost: 1}})
			return err
		},
		"Acquire": func() error {
			_, err := l.Acquire(ctx, "u", ratelimit.Concurrency{Max: 1, Lease: time.Minute})
			return err
		},
		"Wait":  func() error { return l.Wait(ctx, "u", limit) },
		"WaitN": func() error { return l.WaitN(ctx, "u", limit, 2) },
	}
	for name, call := range calls {
		require.ErrorIs(t, call(), ratelimit.ErrClosed, name)
	}
	require.Equal(t, before, e.keys(t), "nothing written after Close")
	require.Equal(t, int64(1), e.get(t, "u", time.Minute, e.windowIndex(time.Minute)))
	require.NoError(t, l.Close(ctx), "a second Close")
}

// A slot acquired before Close can still be Extended and Released after
// it: a handler finishing during a graceful shutdown releases its slot.
func testCloseSlotsRelease(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	c := ratelimit.Concurrency{Max: 1, Lease: time.Minute}
	s, err := l.Acquire(ctx, "u", c)
	require.NoError(t, err)
	require.True(t, s.Acquired)
	kept, err := l.Acquire(ctx, "v", c)
	require.NoError(t, err)
	release := kept.Keep(ctx)
	require.NoError(t, l.Close(ctx))
	require.NoError(t, s.Extend(ctx))
	require.NoError(t, s.Release(ctx))
	release()
	require.Empty(t, e.keys(t), "both slots released")
	require.Equal(t, []int64{2, 2}, []int64{l.Stats().SlotsAcquired, l.Stats().SlotsReleased})
}

// Close ends a Wait's sleep at once, with ErrClosed.
func TestCloseEndsWait(t *testing.T) {
	e := miniredisEnv(t)
	l := ratelimit.New(e.client, ratelimit.WithPrefix(e.prefix), ratelimit.WithTimeout(time.Minute)) // real time: Wait sleeps for real
	ctx := context.Background()
	limit := ratelimit.PerHour(1)
	_, err := l.Allow(ctx, "u", limit)
	require.NoError(t, err)
	waited := make(chan error, 1)
	go func() { waited <- l.Wait(ctx, "u", limit) }() // about an hour
	require.Eventually(t, func() bool {
		res, err := l.Peek(ctx, "u", limit)
		return err == nil && !res.Allowed
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, l.Close(ctx))
	select {
	case err := <-waited:
		require.ErrorIs(t, err, ratelimit.ErrClosed)
	case <-time.After(time.Minute):
		t.Fatal("Wait still sleeps after Close")
	}
}

// Close waits for what runs in the background, and returns ctx's error if
// ctx ends first; once it has returned nil, no goroutine of the library is
// left: not the batches, the calls whose callers left, their late reports,
// the lease sweeper, nor Slot.Keep's timers.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	client := newClient(t, &redis.Options{Addr: proxy.Addr, MaxRetries: -1})
	ctx := context.Background()
	require.NoError(t, client.Ping(ctx).Err())
	// Those of earlier tests' Limiters, never closed, end by themselves
	// (a lease sweeper about a second after its last leased decision).
	require.Eventually(t, func() bool { return len(libraryGoroutines()) == 0 }, 10*time.Second, time.Millisecond, "before the Limiter")

	l := ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(5*time.Second), ratelimit.BatchAlways())
	leased := ratelimit.PerMinute(1000)
	leased.Leased = true
	for i := range 20 {
		_, err := l.Allow(ctx, fmt.Sprint("id", i%3), leased)
		require.NoError(t, err)
	}
	s, err := l.Acquire(ctx, "slot", ratelimit.Concurrency{Max: 2, Lease: time.Minute})
	require.NoError(t, err)
	stop := s.Keep(ctx)
	defer stop()

	// Calls whose callers leave: they go on, to the Limiter's timeout.
	proxy.Delay(300 * time.Millisecond)
	for range 4 {
		short, cancel := context.WithTimeout(ctx, time.Millisecond)
		_, err := l.Allow(short, "late", ratelimit.PerMinute(10))
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	soon, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, l.Close(soon), context.DeadlineExceeded, "the late calls still run")
	require.NotEmpty(t, libraryGoroutines(), "the calls whose callers left")
	require.NoError(t, l.Close(ctx), "a second Close")
	// The first Close's work ends by itself: the calls end (300 ms), their
	// reports and the give-backs are sent.
	require.Eventually(t, func() bool { return len(libraryGoroutines()) == 0 }, 10*time.Second, time.Millisecond)
	proxy.Delay(0)

	// A Limiter whose Close returns nil leaves none.
	l = ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(5*time.Second), ratelimit.BatchAlways())
	for i := range 20 {
		_, err := l.Allow(ctx, fmt.Sprint("id", i%3), leased)
		require.NoError(t, err)
	}
	s, err = l.Acquire(ctx, "slot", ratelimit.Concurrency{Max: 2, Lease: time.Minute})
	require.NoError(t, err)
	defer s.Keep(ctx)()
	for range 4 {
		short, cancel := context.WithTimeout(ctx, time.Millisecond)
		_, _ = l.Allow(short, "late", ratelimit.PerMinute(10))
		cancel()
	}
	require.NoError(t, l.Close(ctx))
	// A tick's timer (the deadline decisions share) may still fire, and
	// close its channel, within the Limiter's timeout.
	require.Eventually(t, func() bool { return len(libraryGoroutines()) == 0 }, time.Second, time.Millisecond, "%v", libraryGoroutines())
}

// libraryGoroutines returns the stacks of the goroutines that run the
// library's code, but for the tests' and their servers'.
func libraryGoroutines() []string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var found []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/slidingwindow/ratelimit") && !strings.Contains(g, "_test.go") &&
			!strings.Contains(g, "ratelimit/internal/redistest") && !strings.Contains(g, "runtime.Stack") {
			found = append(found, g)
		}
	}
	return found
}

// Close waits for every call under way before it gives leases back.
func TestCloseWaitsForCalls(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	// The Observer sees a decision on its caller's goroutine before the call
	// ends for Close: what it saw when Close returned had ended before.
	var observed atomic.Int64
	l := ratelimit.New(newClient(t, &redis.Options{Addr: proxy.Addr}), ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(time.Minute),
		ratelimit.WithObserver(ratelimit.ObserverFunc(func(context.Context, *ratelimit.Event) { observed.Add(1) })))
	ctx := context.Background()
	_, err := l.Allow(ctx, "u", ratelimit.PerMinute(10)) // loads the script
	require.NoError(t, err)
	proxy.Delay(200 * time.Millisecond)
	decided := make(chan error, 1)
	go func() {
		_, err := l.Allow(ctx, "u", ratelimit.PerMinute(10))
		decided <- err
	}()
	require.Eventually(t, func() bool { return proxy.Commands("evalsha") >= 2 }, 10*time.Second, time.Millisecond)
	require.NoError(t, l.Close(ctx))
	require.Equal(t, int64(2), observed.Load(), "the call under way ended before Close returned")
	require.NoError(t, <-decided)
	_, err = l.Allow(ctx, "u", ratelimit.PerMinute(10))
	require.True(t, errors.Is(err, ratelimit.ErrClosed))
}

// A rolling deploy of real processes: each decides a leased daily limit,
// closes its Limiter and exits; Redis then holds exactly what they
// admitted. A process killed without Close leaves its lease counted.
func TestRollingDeployProcesses(t *testing.T) {
	if addr := os.Getenv("RATELIMIT_ROLLING_POD"); addr != "" {
		rollingPod(addr, os.Getenv("RATELIMIT_ROLLING_CLOSE") == "1")
		return
	}
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	pod := func(close bool) int64 {
		t.Helper()
		child := exec.Command(os.Args[0], "-test.run", "^TestRollingDeployProcesses$")
		child.Env = append(os.Environ(), "RATELIMIT_ROLLING_POD="+srv.Addr, fmt.Sprintf("RATELIMIT_ROLLING_CLOSE=%d", map[bool]int{true: 1}[close]))
		out, err := child.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, child.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		_ = child.Wait() // an unclosed pod kills itself
		var admitted int64
		_, err = fmt.Sscanf(line, "admitted %d", &admitted)
		require.NoError(t, err, "%s", line)
		return admitted
	}
	count := func() int64 {
		keys, err := client.Keys(ctx, "rolling:*").Result()
		require.NoError(t, err)
		total := int64(0)
		for _, k := range keys {
			n, err := client.Get(ctx, k).Int64()
			require.NoError(t, err)
			total += n
		}
		return total
	}
	admitted := pod(true) + pod(true)
	t.Logf("two pods closed: admitted %d, counted in Redis %d", admitted, count())
	require.Equal(t, admitted, count(), "what closed pods admitted, exactly")
	admitted += pod(false)
	t.Logf("a third pod killed without Close: admitted %d, counted in Redis %d", admitted, count())
	require.Greater(t, count(), admitted, "a pod killed without Close leaves its lease counted")
}

// rollingPod is a child of TestRollingDeployProcesses: it decides a leased
// limit of 10,000 a day (leases of up to 500) 300 times, closes its
// Limiter if told to, and says how many it admitted; then it exits, or,
// not closed, kills itself before its lease sweeper can give back.
func rollingPod(addr string, close bool) {
	l := ratelimit.New(redis.NewClient(&redis.Options{Addr: addr}), ratelimit.WithPrefix("rolling"), ratelimit.WithTimeout(time.Minute))
	limit := ratelimit.PerDay(10_000)
	limit.Leased = true
	admitted := 0
	for range 300 {
		if res, err := l.Allow(context.Background(), "tenant", limit); err == nil && res.Allowed {
			admitted++
		}
	}
	if close {
		if err := l.Close(context.Background()); err != nil {
			fmt.Println("close:", err)
			os.Exit(1)
		}
	}
	fmt.Printf("admitted %d\n", admitted)
	if !close { // a process that dies within a second of its last decision
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	os.Exit(0)
}
