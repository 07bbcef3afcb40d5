package ratelimit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// redisT is what the tests' Redis says the time is; every local clock
// disagrees with it. TIME has microsecond resolution, so the tests' times are
// whole microseconds.
var redisT = time.Date(2031, 5, 6, 7, 8, 9, 123456000, time.UTC)

// manual returns a client of mr and a RedisClock on it that reads local and
// syncs only when told to: no background goroutine races the test.
func manual(t *testing.T, mr *miniredis.Miniredis, local *clock.Fake) (*redis.Client, *ratelimit.RedisClock) {
	t.Helper()
	client := newClient(t, &redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0), ratelimit.WithLocalClock(local.Now))
	t.Cleanup(func() { require.NoError(t, rc.Close()) })
	return client, rc
}

func TestRedisClockFollowsRedisTime(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	mr.SetTime(redisT)
	local := clock.NewFake(redisT.Add(-time.Hour + 17*time.Millisecond))
	_, rc := manual(t, mr, local)

	require.Equal(t, -time.Hour+17*time.Millisecond, rc.Now().Sub(redisT), "before the first sync: the local clock")

	require.NoError(t, rc.Sync(t.Context()))
	require.Equal(t, time.Duration(0), rc.Now().Sub(redisT))

	// Between samples it extrapolates by the local time elapsed; Redis's
	// TIME is frozen here, so only the sample can have put it on redisT.
	local.Add(1500 * time.Millisecond)
	require.Equal(t, 1500*time.Millisecond, rc.Now().Sub(redisT))
	local.Add(time.Hour)
	require.Equal(t, time.Hour+1500*time.Millisecond, rc.Now().Sub(redisT))

	// A new sample replaces the old: Redis moved 2h, the local clock 1h.
	mr.SetTime(redisT.Add(2 * time.Hour))
	require.NoError(t, rc.Sync(t.Context()))
	require.Equal(t, 2*time.Hour, rc.Now().Sub(redisT))
}

func TestRedisClockRoundTrip(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	mr.SetTime(redisT)
	local := clock.NewFake(redisT.Add(time.Minute))
	client, rc := manual(t, mr, local)
	client.AddHook(onCommand("time",
		func() { local.Add(4 * time.Millisecond) },
		func(error) { local.Add(6 * time.Millisecond) }))

	require.NoError(t, rc.Sync(t.Context()))
	// The round trip took 10ms of local time. Redis read its clock somewhere
	// in it, so when the reply came Redis's time was in [redisT, redisT+10ms];
	// the clock takes the middle, and is off by at most 5ms.
	require.Equal(t, 5*time.Millisecond, rc.Now().Sub(redisT))
	local.Add(time.Second)
	require.Equal(t, time.Second+5*time.Millisecond, rc.Now().Sub(redisT))
}

func TestRedisClockNeverGoesBack(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	mr.SetTime(redisT)
	local := clock.NewFake(redisT.Add(-time.Minute))
	_, rc := manual(t, mr, local)
	require.NoError(t, rc.Sync(t.Context()))
	local.Add(time.Second)
	require.Equal(t, time.Second, rc.Now().Sub(redisT))

	// A failover to a server whose clock is 30s behind: the new sample says
	// redisT-29s, but the clock has said redisT+1s already. Going back would
	// reopen windows whose counts the limiter has moved past, so it holds.
	mr.SetTime(redisT.Add(-30 * time.Second))
	require.NoError(t, rc.Sync(t.Context()))
	require.Equal(t, time.Second, rc.Now().Sub(redisT), "holds rather than going back")
	local.Add(10 * time.Second) // the estimate is redisT-20s
	require.Equal(t, time.Second, rc.Now().Sub(redisT), "still holding")
	local.Add(21 * time.Second) // the estimate is redisT+1s: caught up
	require.Equal(t, time.Second, rc.Now().Sub(redisT))
	local.Add(time.Millisecond)
	require.Equal(t, time.Second+time.Millisecond, rc.Now().Sub(redisT), "moves again once caught up")

	// A local clock stepped back holds too, before any sample as after;
	// the next sample, taken on the stepped clock, counts from the new
	// reading.
	local.Add(-time.Hour)
	require.Equal(t, time.Second+time.Millisecond, rc.Now().Sub(redisT))
	mr.SetTime(redisT.Add(time.Minute))
	require.NoError(t, rc.Sync(t.Context()))
	require.Equal(t, time.Minute, rc.Now().Sub(redisT))
	local.Add(time.Second)
	require.Equal(t, time.Minute+time.Second, rc.Now().Sub(redisT))

	unsynced := ratelimit.NewRedisClock(nil, ratelimit.WithLocalClock(local.Now))
	defer unsynced.Close()
	before := unsynced.Now()
	local.Add(-time.Second)
	require.Equal(t, before, unsynced.Now())
}

func TestRedisClockNowConcurrent(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	mr.SetTime(redisT)
	client := newClient(t, &redis.Options{Addr: mr.Addr()})
	rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0))
	defer rc.Close()
	require.NoError(t, rc.Sync(t.Context()))

	// Readers check that what each of them sees never goes back while
	// samples an hour apart, back and forth, replace one another.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	backs := make([]int, 4)
	for g := range backs {
		wg.Go(func() {
			prev := rc.Now()
			for {
				select {
				case <-stop:
					return
				default:
				}
				now := rc.Now()
				if now.Before(prev) {
					backs[g]++
				}
				prev = now
				runtime.Gosched() // leave the syncs room, under -race too
			}
		})
	}
	for i := range 50 {
		mr.SetTime(redisT.Add(time.Duration(i%2) * time.Hour))
		require.NoError(t, rc.Sync(t.Context()))
	}
	close(stop)
	wg.Wait()
	require.Equal(t, make([]int, 4), backs)
}

func TestRedisClockNowDoesNotAllocate(t *testing.T) {
	mr := miniredis.RunT(t)
	client := newClient(t, &redis.Options{Addr: mr.Addr()})
	rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0))
	defer rc.Close()
	require.NoError(t, rc.Sync(t.Context()))
	require.Equal(t, 0.0, testing.AllocsPerRun(1000, func() { _ = rc.Now() }))
}

func TestRedisClockErrors(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	mr.SetTime(redisT)
	local := clock.NewFake(redisT.Add(30 * time.Second))
	_, rc := manual(t, mr, local)
	require.NoError(t, rc.Sync(t.Context()))

	mr.Close()
	local.Add(5 * time.Second)
	require.Error(t, rc.Sync(t.Context()))
	require.Equal(t, 5*time.Second, rc.Now().Sub(redisT), "extrapolates from the last good sample")

	// Redis comes back (a failover, say) with a clock 2 minutes ahead.
	require.NoError(t, mr.Restart())
	mr.SetTime(redisT.Add(2 * time.Minute))
	require.NoError(t, rc.Sync(t.Context()))
	require.Equal(t, 2*time.Minute, rc.Now().Sub(redisT), "adopts the new server's time")
}

func TestRedisClockNilClient(t *testing.T) {
	t.Parallel()
	local := clock.NewFake(redisT)
	rc := ratelimit.NewRedisClock(nil, ratelimit.WithLocalClock(local.Now))
	require.ErrorIs(t, rc.Sync(t.Context()), ratelimit.ErrNilClient)
	require.Equal(t, redisT.UnixNano(), rc.Now().UnixNano())
	require.NoError(t, rc.Close())
}

// A sync that hangs gives up after a second, whatever the caller's ctx and
// the client's own timeouts.
func TestRedisClockSyncHungRedis(t *testing.T) {
	t.Parallel()
	client := newClient(t, &redis.Options{Addr: redistest.Silent(t), MaxRetries: -1, ReadTimeout: time.Minute})
	rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0))
	defer rc.Close()
	require.ErrorIs(t, rc.Sync(t.Context()), context.DeadlineExceeded)
}

func TestRedisClockClose(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(redisT)
	client := newClient(t, &redis.Options{Addr: mr.Addr()})
	require.NoError(t, client.Ping(t.Context()).Err())
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	local := clock.NewFake(redisT.Add(-time.Minute))
	rc := ratelimit.NewRedisClock(client, ratelimit.WithLocalClock(local.Now))
	// The background goroutine syncs at once: wait for it, not for time.
	require.Eventually(t, func() bool { return rc.Now().Equal(redisT) }, 10*time.Second, time.Millisecond)
	require.NoError(t, rc.Close())
	require.NoError(t, rc.Close(), "Close is idempotent")

	// Now and Sync go on working after Close.
	local.Add(time.Second)
	require.Equal(t, time.Second, rc.Now().Sub(redisT))
	mr.SetTime(redisT.Add(time.Hour))
	require.NoError(t, rc.Sync(t.Context()))
	require.Equal(t, time.Hour, rc.Now().Sub(redisT))
}

// Close does not wait for a sync that hangs: the goroutine returns at once.
// The sync it cuts short is no failure of Redis's, and reaches no handler.
func TestRedisClockCloseWhileHung(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	var once sync.Once
	client := newClient(t, &redis.Options{Addr: redistest.Silent(t), MaxRetries: -1, ReadTimeout: time.Minute})
	client.AddHook(onCommand("time", func() { once.Do(func() { close(started) }) }, nil))
	rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncErrorHandler(func(_ context.Context, err error) {
		if errors.Is(err, context.Canceled) {
			t.Errorf("the sync Close cut short reached the handler: %v", err)
		}
	}))
	<-started

	closed := make(chan struct{})
	go func() {
		_ = rc.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second): // far below the minute the client would wait
		t.Fatal("Close waited for the hung sync")
	}
}

// The background goroutine retries a failed sync within a second rather
// than after the interval, so that it adopts a new server soon after a
// failover.
func TestRedisClockRetriesSoon(t *testing.T) {
	t.Parallel()
	addr := deadAddr(t) // nothing listens there yet: syncs fail

	client := newClient(t, &redis.Options{Addr: addr, MaxRetries: -1})
	failed := make(chan struct{})
	var once sync.Once
	client.AddHook(onCommand("time", nil, func(err error) {
		if err != nil {
			once.Do(func() { close(failed) })
		}
	}))
	// The local clock is behind Redis: were it ahead, the Now calls made
	// before the first sync would hold the clock there (see
	// TestRedisClockNeverGoesBack), and the test could not see the sync.
	local := clock.NewFake(redisT.Add(-time.Minute))
	rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(time.Hour), ratelimit.WithLocalClock(local.Now))
	defer rc.Close()
	<-failed // the first sync, at once, failed

	mr := miniredis.NewMiniRedis()
	mr.SetTime(redisT)
	require.NoError(t, mr.StartAddr(addr))
	defer mr.Close()
	require.Eventually(t, func() bool { return rc.Now().Sub(redisT) == 0 }, 10*time.Second, 10*time.Millisecond,
		"a failed sync is retried long before the hour's interval")
}

// Every background sync that fails hands its error to the handler; a Sync
// call's error goes to its caller only.
func TestRedisClockSyncErrorHandler(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	mr.SetError("NOPERM this user has no permissions to run the 'time' command")
	client := newClient(t, &redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	errs := make(chan error)
	rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(time.Millisecond),
		ratelimit.WithSyncErrorHandler(func(ctx context.Context, err error) {
			select {
			case errs <- err:
			case <-ctx.Done(): // Close: the test has stopped listening
			}
		}))
	defer rc.Close()
	for i := range 3 { // the first sync, at once, then retries
		select {
		case err := <-errs:
			require.ErrorContains(t, err, "ratelimit: redis clock: TIME: NOPERM this user has no permissions to run the 'time' command")
			var redisErr redis.Error
			require.ErrorAs(t, err, &redisErr, "Redis's reply is wrapped")
		case <-time.After(10 * time.Second): // bounds the wait for a goroutine
			t.Fatalf("background sync %d: no error reached the handler", i+1)
		}
	}

	called := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0),
		ratelimit.WithSyncErrorHandler(func(_ context.Context, err error) {
			t.Errorf("a Sync call's error reached the handler: %v", err)
		}))
	defer called.Close()
	require.ErrorContains(t, called.Sync(t.Context()), "NOPERM")
}

// Under a Redis ACL user allowed the Limiter's commands but not TIME, the
// background sync's NOPERM reaches the handler; a user with those rules and
// +time syncs. go-redis needs no more to connect: HELLO runs under any ACL,
// and it ignores the errors of the CLIENT MAINT_NOTIFICATIONS and CLIENT
// SETINFO it sends next, so neither +hello nor +client is in the rules.
func TestRedisClockRealServerACL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	user := func(name string, rules ...string) *redis.Client {
		args := []any{"ACL", "SETUSER", name, "reset", "on", ">secret", "~ratelimit:*"}
		for _, r := range strings.Fields(limiterACL) { // the Limiter's, but for TIME
			if r != "+time" {
				args = append(args, r)
			}
		}
		for _, r := range rules {
			args = append(args, r)
		}
		require.NoError(t, admin.Do(t.Context(), args...).Err())
		return newClient(t, &redis.Options{Addr: srv.Addr, Username: name, Password: "secret", MaxRetries: -1})
	}

	limiterOnly := user("limiter")
	res, err := ratelimit.New(limiterOnly, ratelimit.WithTimeout(time.Minute)).Allow(t.Context(), "acl", ratelimit.PerMinute(10))
	require.NoError(t, err)
	require.False(t, res.Degraded, "the rules allow the Limiter's commands")

	errs := make(chan error, 1)
	rc := ratelimit.NewRedisClock(limiterOnly, ratelimit.WithSyncInterval(time.Hour),
		ratelimit.WithSyncErrorHandler(func(_ context.Context, err error) {
			select {
			case errs <- err:
			default: // a retry's, while the test checks the first
			}
		}))
	defer rc.Close()
	select {
	case err := <-errs:
		require.ErrorContains(t, err, "NOPERM")
		require.ErrorContains(t, err, "'time' command")
		var redisErr redis.Error
		require.ErrorAs(t, err, &redisErr, "Redis's reply is wrapped")
	case <-time.After(10 * time.Second): // bounds the wait for a goroutine
		t.Fatal("the background sync's NOPERM did not reach the handler")
	}

	withTime := user("limiter-and-clock", "+time")
	synced := ratelimit.NewRedisClock(withTime, ratelimit.WithSyncInterval(0))
	defer synced.Close()
	require.NoError(t, synced.Sync(t.Context()))
}

// The default handler logs a failing sync once, then at most one line every
// 10 seconds of the clock's local clock, counting the errors it left out, and
// says what Now does meanwhile.
func TestRedisClockSyncErrorsLogged(t *testing.T) {
	logs := captureLog(t)
	mr := miniredis.RunT(t)
	mr.SetError("ERR no time today")
	client := newClient(t, &redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	var fails, oks atomic.Int64
	client.AddHook(onCommand("time", nil, func(err error) {
		if err != nil {
			fails.Add(1)
		} else {
			oks.Add(1)
		}
	}))
	local := clock.NewFake(redisT)
	rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(time.Millisecond),
		ratelimit.WithLocalClock(local.Now),
		ratelimit.WithSyncErrorHandler(func(context.Context, error) { t.Error("the handler that nil replaced was called") }),
		ratelimit.WithSyncErrorHandler(nil))
	defer rc.Close()
	// These wait for the clock's goroutine, which retries every millisecond;
	// the local clock, by which it paces its lines, moves only when told to.
	waitFor := func(cond func() bool, msg string) {
		t.Helper()
		require.Eventually(t, cond, 10*time.Second, time.Millisecond, msg)
	}
	lines := func(n int) func() bool { return func() bool { return len(logs.lines()) >= n } }

	waitFor(func() bool { return fails.Load() >= 10 }, "ten syncs failed")
	got := logs.lines()
	require.Len(t, got, 1, "one line for ten failures")
	require.Contains(t, got[0], "level=WARN")
	require.Contains(t, got[0], "Now reads the local clock, as the clock has never synced")
	require.Contains(t, got[0], "a Redis ACL user needs the TIME command: +time")
	require.Contains(t, got[0], `error="ratelimit: redis clock: TIME: ERR no time today"`)
	require.Contains(t, got[0], "errors_not_logged=0")

	local.Add(logEvery - time.Millisecond)
	before := fails.Load()
	waitFor(func() bool { return fails.Load() >= before+10 }, "ten more syncs failed")
	require.Len(t, logs.lines(), 1, "a second line before 10 seconds passed")

	local.Add(time.Millisecond)
	waitFor(lines(2), "a second line once 10 seconds passed")
	require.GreaterOrEqual(t, notLogged(t, logs.lines()[1]), int64(18), "the failures between the lines")

	// Once it has synced, a failure leaves it extrapolating.
	mr.SetError("")
	waitFor(func() bool { return oks.Load() > 0 }, "a sync succeeded")
	mr.SetError("ERR no time today")
	local.Add(logEvery)
	waitFor(lines(3), "a third line once 10 more seconds passed")
	require.Contains(t, logs.lines()[2], "Now extrapolates from the last sample with the local clock")

}

// logEvery is how often, at most, the default handlers log.
const logEvery = 10 * time.Second

// notLogged returns the errors_not_logged count of a log line.
func notLogged(t *testing.T, line string) int64 {
	t.Helper()
	_, rest, ok := strings.Cut(line, "errors_not_logged=")
	require.True(t, ok, line)
	n, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
	require.NoError(t, err, line)
	return n
}

// lockedLog collects what slog's default logger writes, for a test that
// reads it while another goroutine logs.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines returns the RedisClock's lines so far: another test's leftover
// goroutine may log something else.
func (l *lockedLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for line := range strings.Lines(l.buf.String()) {
		if strings.Contains(line, "ratelimit: redis clock") {
			out = append(out, line)
		}
	}
	return out
}

// captureLog makes slog's default logger write text into a lockedLog until
// t ends. Close the clocks that log before then: cleanups run after the
// test's defers.
func captureLog(t *testing.T) *lockedLog {
	l := new(lockedLog)
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(l, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return l
}

// Against a real redis-server, on this machine's clock: a local clock a
// minute off is corrected to within the round trip.
func TestRedisClockRealServer(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	for _, skew := range []time.Duration{0, time.Minute, -time.Minute} {
		rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0),
			ratelimit.WithLocalClock(func() time.Time { return time.Now().Add(skew) }))
		rtt := timedSync(t, rc)
		before := time.Now()
		got := rc.Now()
		after := time.Now()
		// redis-server reads the same system clock as time.Now; the sample
		// is off by at most half its round trip, and TIME's microseconds.
		slack := rtt/2 + time.Millisecond
		require.WithinRange(t, got, before.Add(-slack), after.Add(slack), "skew %v", skew)
		require.NoError(t, rc.Close())
	}
}

func TestRedisClockRealCluster(t *testing.T) {
	t.Parallel()
	addrs := redistest.SharedCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer client.Close()
	rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0),
		ratelimit.WithLocalClock(func() time.Time { return time.Now().Add(-time.Minute) }))
	defer rc.Close()
	// TIME goes to some node each time; all read this machine's clock.
	var rtt time.Duration // the longest round trip so far
	for range 5 {
		rtt = max(rtt, timedSync(t, rc))
		before := time.Now()
		got := rc.Now()
		after := time.Now()
		// Each sample is off by at most half its round trip. The clock
		// holds rather than go back, so it can stay as far ahead as the
		// worst sample put it (the first, which loads the cluster's slots).
		slack := rtt/2 + time.Millisecond
		require.WithinRange(t, got, before.Add(-slack), after.Add(slack))
	}
}

// Application servers whose clocks disagree share windows by following
// Redis's clock rather than their own.
func ExampleRedisClock() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	mr.SetTime(time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)) // what TIME says
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	ctx := context.Background()

	rc := ratelimit.NewRedisClock(client)
	defer rc.Close()
	if err := rc.Sync(ctx); err != nil { // follow Redis from the first request
		fmt.Println("sync:", err)
	}
	limiter := ratelimit.New(client, ratelimit.WithClock(rc.Now))

	res, err := limiter.Allow(ctx, "user-42", ratelimit.PerMinute(100))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Allowed, res.Remaining)
	fmt.Println(rc.Now().UTC().Truncate(time.Second))
	// Output:
	// true 99
	// 2031-05-06 07:08:09 +0000 UTC
}
