package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/clock"
)

// waitEpoch starts a second, a minute and an hour, so that waitEpoch.Add(d)
// lies d into a window of any of those lengths.
var waitEpoch = time.UnixMilli(1_700_002_800_000)

// waitEnv is a Limiter on a miniredis and a fake clock, whose sleeps move
// that clock at once and are recorded.
type waitEnv struct {
	mr    *miniredis.Miniredis
	clock *clock.Fake
	l     *Limiter
	mu    sync.Mutex
	slept []time.Duration
}

func newWaitEnv(t *testing.T, opts ...Option) *waitEnv {
	e := &waitEnv{mr: miniredis.RunT(t), clock: clock.NewFake(waitEpoch)}
	// One try, one dial: a test that stops Redis gets its failures at once.
	client := redis.NewClient(&redis.Options{Addr: e.mr.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })
	e.l = New(client, append([]Option{
		WithClock(e.clock.Now),
		WithTimeout(time.Minute), // exact results, even on a busy machine
		WithErrorHandler(func(context.Context, string, error) {}),
	}, opts...)...)
	e.l.sleep = e.sleep
	return e
}

// sleep stands in for a real sleep of d: it moves the clock by d at once.
func (e *waitEnv) sleep(ctx context.Context, d time.Duration) error {
	e.mu.Lock()
	e.slept = append(e.slept, d)
	e.mu.Unlock()
	e.clock.Add(d)
	return ctx.Err()
}

// sleeps returns the sleeps so far.
func (e *waitEnv) sleeps() []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.slept)
}

// fill makes n requests of cost 1 that must all be allowed.
func (e *waitEnv) fill(t *testing.T, id string, limit Limit, n int) {
	t.Helper()
	for range n {
		res, err := e.l.Allow(context.Background(), id, limit)
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
}

// count returns Redis's estimate of id's usage now.
func (e *waitEnv) count(t *testing.T, id string, limit Limit) int64 {
	t.Helper()
	res, err := e.l.Peek(context.Background(), id, limit)
	require.NoError(t, err)
	return res.Count
}

// waitModel is the sliding window worked out by brute force from the
// admissions themselves, independently of window.go: the cost admitted in
// each window, by index, and the documented estimate
// cur + floor(prev × (w-e) / w) at any millisecond.
type waitModel struct {
	limit    Limit
	w        int64 // window, in ms
	admitted map[int64]int64
}

func newWaitModel(limit Limit) *waitModel {
	return &waitModel{limit: limit, w: limit.Window.Milliseconds(), admitted: map[int64]int64{}}
}

func (m *waitModel) estimate(t int64) int64 {
	i, e := t/m.w, t%m.w
	return m.admitted[i] + m.admitted[i-1]*(m.w-e)/m.w
}

func (m *waitModel) allows(t, n int64) bool { return m.estimate(t)+n <= m.limit.Rate }

// earliest returns the first millisecond from t on at which a cost of n
// fits, trying every one.
func (m *waitModel) earliest(t, n int64) int64 {
	for !m.allows(t, n) {
		t++
	}
	return t
}

func (m *waitModel) admit(t, n int64) { m.admitted[t/m.w] += n }

// waitSim runs goroutines that call WaitN on a fake clock as if their sleeps
// were real, one goroutine at a time: when none is running, the sleeper due
// first wakes, the clock jumping to its time; ties wake in the order they
// fell asleep. The run is serial, so its log is in true order, yet waiters
// released together contend as real ones would.
type waitSim struct {
	clock   *clock.Fake
	mu      sync.Mutex
	running int
	asleep  []waitSleeper // in the order they fell asleep
	log     []waitEvent
}

type waitSleeper struct {
	at   time.Time
	wake chan struct{}
}

// waitEvent is one step of a waiter: a denial then a sleep of d, or, when d
// is 0, an admission.
type waitEvent struct {
	worker int
	at     time.Time
	d      time.Duration
}

// waitWorker is the context key of the worker a call is made for.
type waitWorker struct{}

// sleep is the Limiter's sleep hook.
func (s *waitSim) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.log = append(s.log, waitEvent{worker: ctx.Value(waitWorker{}).(int), at: s.clock.Now(), d: d})
	wake := s.suspendLocked(d)
	s.mu.Unlock()
	<-wake
	return ctx.Err()
}

// start blocks a new worker until it is its turn to run.
func (s *waitSim) start() {
	s.mu.Lock()
	wake := s.suspendLocked(0)
	s.mu.Unlock()
	<-wake
}

func (s *waitSim) admitted(worker int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, waitEvent{worker: worker, at: s.clock.Now()})
}

func (s *waitSim) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	s.advanceLocked()
}

func (s *waitSim) suspendLocked(d time.Duration) chan struct{} {
	sl := waitSleeper{at: s.clock.Now().Add(d), wake: make(chan struct{})}
	s.asleep = append(s.asleep, sl)
	s.running--
	s.advanceLocked()
	return sl.wake
}

func (s *waitSim) advanceLocked() {
	if s.running > 0 || len(s.asleep) == 0 {
		return
	}
	next := 0
	for i, sl := range s.asleep {
		if sl.at.Before(s.asleep[next].at) {
			next = i
		}
	}
	sl := s.asleep[next]
	s.asleep = slices.Delete(s.asleep, next, next+1)
	if sl.at.After(s.clock.Now()) {
		s.clock.Set(sl.at)
	}
	s.running++
	close(sl.wake)
}

// runWaiters has workers goroutines make calls WaitN calls each, of cost n,
// on one id, and returns the log of the run and the Limiter's env.
func runWaiters(t *testing.T, limit Limit, n int64, workers, calls int) ([]waitEvent, *waitEnv) {
	t.Helper()
	e := newWaitEnv(t)
	s := &waitSim{clock: e.clock, running: workers}
	e.l.sleep = s.sleep
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			s.start()
			ctx := context.WithValue(context.Background(), waitWorker{}, w)
			var err error
			for range calls {
				if err = e.l.WaitN(ctx, "shared", limit, n); err != nil {
					break
				}
				s.admitted(w)
			}
			s.done()
			errs <- err
		}()
	}
	stuck := time.After(time.Minute)
	for range workers {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-stuck:
			t.Fatal("waiters stuck")
		}
	}
	return s.log, e
}

// checkWaitLog replays a run against the brute-force window and returns it.
// Every denial is one the window makes, followed by a sleep of its exact
// RetryAfter plus a jitter within bounds; every admission is one the window
// allows, made the instant the waiter's sleep ended, and comes at most the
// jitter's cap after the earliest moment the previous admission left for it.
func checkWaitLog(t *testing.T, limit Limit, n int64, log []waitEvent) *waitModel {
	t.Helper()
	m := newWaitModel(limit)
	// The jitter's cap, rounded up to whole ms: the clock's sub-ms part and the
	// jitter together stay below 1ms past it.
	jitterCap := (jitterMax(limit.Window, limit.Window) + time.Millisecond - 1).Truncate(time.Millisecond)
	woke := map[int]time.Time{} // when each worker's last sleep ended
	last := int64(-1)           // ms of the last admission
	for k, ev := range log {
		at := ev.at.UnixMilli()
		offset := ev.at.Sub(waitEpoch)
		if ev.d > 0 {
			require.False(t, m.allows(at, n), "event %d: worker %d denied at +%v, where the window allows", k, ev.worker, offset)
			r := time.Duration(m.earliest(at, n)-at) * time.Millisecond
			require.GreaterOrEqual(t, ev.d, r, "event %d: slept less than RetryAfter", k)
			require.LessOrEqual(t, ev.d-r, jitterMax(r, limit.Window), "event %d: jitter above its bound, after RetryAfter %v", k, r)
			woke[ev.worker] = ev.at.Add(ev.d)
			continue
		}
		require.True(t, m.allows(at, n), "event %d: worker %d admitted at +%v, where the window denies", k, ev.worker, offset)
		if end, ok := woke[ev.worker]; ok {
			require.Equal(t, end, ev.at, "event %d: admitted later than its sleep ended", k)
			delete(woke, ev.worker)
		}
		if last >= 0 {
			due := m.earliest(last, n)
			require.LessOrEqual(t, at-due, jitterCap.Milliseconds(), "event %d: admitted at +%v, due at +%dms", k, offset, due-waitEpoch.UnixMilli())
		}
		m.admit(at, n)
		last = at
	}
	for i, c := range m.admitted {
		require.LessOrEqual(t, c, limit.Rate, "window %d", i)
	}
	return m
}

func TestWaitAdmitsWhenTheWindowAllows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		limit          Limit
		n              int64
		workers, calls int
		first          []time.Duration // the first admissions' offsets, when fixed
	}{
		{"one waiter, 5 per second", PerSecond(5), 1, 1, 20, []time.Duration{0, 0, 0, 0, 0}},
		{"one waiter, cost 2 of 7 per 250ms", Limit{Rate: 7, Window: 250 * time.Millisecond}, 2, 1, 15, []time.Duration{0, 0, 0}},
		{"8 waiters, 5 per second", PerSecond(5), 1, 8, 10, []time.Duration{0, 0, 0, 0, 0}},
		{"3 waiters, cost 3 of 10 per minute", PerMinute(10), 3, 3, 4, []time.Duration{0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log, e := runWaiters(t, tc.limit, tc.n, tc.workers, tc.calls)
			m := checkWaitLog(t, tc.limit, tc.n, log)

			var admissions []time.Duration
			perWorker := map[int]int{}
			for _, ev := range log {
				if ev.d == 0 {
					admissions = append(admissions, ev.at.Sub(waitEpoch))
					perWorker[ev.worker]++
				}
			}
			require.Len(t, admissions, tc.workers*tc.calls)
			for w := range tc.workers {
				require.Equal(t, tc.calls, perWorker[w], "worker %d", w)
			}
			require.Equal(t, tc.first, admissions[:len(tc.first)])
			// Redis counted the admissions and nothing else.
			now := e.clock.Now().UnixMilli()
			require.Equal(t, m.estimate(now), e.count(t, "shared", tc.limit))
			t.Logf("admissions at %v", admissions)
		})
	}
}

// The figures of the sliding window, spelled out: with 5 per second used up
// at +0, the 6th request fits at +1001ms (floor(5 × 999/1000) = 4), the 7th
// at +1201ms (1 + floor(5 × 799/1000) = 4).
func TestWaitSleepsExactRetryAfter(t *testing.T) {
	t.Parallel()
	e := newWaitEnv(t)
	limit := PerSecond(5)
	ctx := context.Background()
	for range 5 {
		require.NoError(t, e.l.Wait(ctx, "a", limit))
	}
	require.Empty(t, e.sleeps())
	require.Equal(t, waitEpoch, e.clock.Now())

	require.NoError(t, e.l.Wait(ctx, "a", limit))
	slept := e.sleeps()
	require.Len(t, slept, 1)
	require.GreaterOrEqual(t, slept[0], 1001*time.Millisecond)
	require.LessOrEqual(t, slept[0], 1011*time.Millisecond) // + min(1001ms/4, 1s/100)
	require.Equal(t, waitEpoch.Add(slept[0]), e.clock.Now())

	before := e.clock.Now()
	require.NoError(t, e.l.Wait(ctx, "a", limit))
	slept = e.sleeps()
	require.Len(t, slept, 2)
	r := 1201*time.Millisecond - before.Sub(waitEpoch).Truncate(time.Millisecond)
	require.GreaterOrEqual(t, slept[1], r)
	require.LessOrEqual(t, slept[1], r+min(r/4, 10*time.Millisecond))
	require.Equal(t, before.Add(slept[1]), e.clock.Now())
	require.Equal(t, int64(5), e.count(t, "a", limit)) // 2 + floor(5 × (1000-e)/1000), e in [201, 212]
}

func TestWaitJitterBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait, window, want time.Duration
	}{
		{0, time.Second, 0},
		{time.Millisecond, time.Second, 250 * time.Microsecond},
		{20 * time.Millisecond, time.Second, 5 * time.Millisecond},
		{40 * time.Millisecond, time.Second, 10 * time.Millisecond},
		{1001 * time.Millisecond, time.Second, 10 * time.Millisecond},
		{30 * time.Minute, time.Hour, 36 * time.Second},
		{time.Millisecond, time.Millisecond, 10 * time.Microsecond},
	} {
		t.Run(fmt.Sprintf("%v of %v", tc.wait, tc.window), func(t *testing.T) {
			require.Equal(t, tc.want, jitterMax(tc.wait, tc.window))
			lo, hi := tc.want, time.Duration(0)
			for range 10_000 {
				j := jitter(tc.wait, tc.window)
				lo, hi = min(lo, j), max(hi, j)
			}
			require.GreaterOrEqual(t, lo, time.Duration(0))
			require.LessOrEqual(t, hi, tc.want)
			// Spread over the whole range, not stuck at one end.
			require.LessOrEqual(t, lo, tc.want/10)
			require.GreaterOrEqual(t, hi, tc.want-tc.want/10)
		})
	}
}

func TestWaitCostAboveRate(t *testing.T) {
	t.Parallel()
	for _, policy := range []FailurePolicy{FailOpen, FailClosed, FailLocal} {
		t.Run(policy.String(), func(t *testing.T) {
			e := newWaitEnv(t, WithFailurePolicy(policy))
			before := e.mr.CommandCount()
			err := e.l.WaitN(context.Background(), "a", PerSecond(5), 6)
			require.ErrorIs(t, err, ErrNeverAllowed)
			require.Empty(t, e.sleeps())
			require.Equal(t, before, e.mr.CommandCount(), "asked Redis")

			// The same with Redis down: the answer does not depend on it.
			e.mr.Close()
			require.ErrorIs(t, e.l.WaitN(context.Background(), "a", PerSecond(5), 6), ErrNeverAllowed)
			require.Empty(t, e.sleeps())
		})
	}
}

func TestWaitInvalidInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		id    string
		limit Limit
		n     int64
		want  error
	}{
		{"empty id", "", PerSecond(5), 1, ErrInvalidID},
		{"rate 0", "a", Limit{Rate: 0, Window: time.Second}, 1, ErrInvalidLimit},
		{"window 1.5ms", "a", Limit{Rate: 5, Window: 1500 * time.Microsecond}, 1, ErrInvalidLimit},
		{"cost 0", "a", PerSecond(5), 0, ErrInvalidCost},
		{"cost -1", "a", PerSecond(5), -1, ErrInvalidCost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newWaitEnv(t)
			require.ErrorIs(t, e.l.WaitN(context.Background(), tc.id, tc.limit, tc.n), tc.want)
			require.Empty(t, e.sleeps())
		})
	}
	t.Run("nil client", func(t *testing.T) {
		l := New(nil)
		l.sleep = func(context.Context, time.Duration) error { panic("slept") }
		require.ErrorIs(t, l.Wait(context.Background(), "a", PerSecond(5)), ErrNilClient)
	})
}

func TestWaitDeadline(t *testing.T) {
	t.Parallel()
	// 3 a minute used up at +0: the 4th fits at +60001ms (floor(3 × 59999/60000) = 2).
	const need = 60001 * time.Millisecond
	limit := PerMinute(3)

	t.Run("too short", func(t *testing.T) {
		e := newWaitEnv(t)
		e.fill(t, "a", limit, 3)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := e.l.Wait(ctx, "a", limit)
		require.ErrorIs(t, err, ErrWaitExceedsDeadline)
		require.ErrorContains(t, err, "1m0.001s to wait for 3/1m0s")
		require.NoError(t, ctx.Err(), "returned at the deadline rather than at once")
		require.Empty(t, e.sleeps())
		require.Equal(t, waitEpoch, e.clock.Now())
		require.Equal(t, int64(3), e.count(t, "a", limit))
	})

	t.Run("long enough", func(t *testing.T) {
		e := newWaitEnv(t)
		e.fill(t, "a", limit, 3)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		require.NoError(t, e.l.Wait(ctx, "a", limit))
		slept := e.sleeps()
		require.Len(t, slept, 1)
		require.GreaterOrEqual(t, slept[0], need)
		require.LessOrEqual(t, slept[0], need+600*time.Millisecond) // min(need/4, 1m/100)
		require.Equal(t, int64(3), e.count(t, "a", limit))          // floor(3 × 59999/60000) + 1
	})

	t.Run("no jitter past it", func(t *testing.T) {
		// 1 an hour used up at +0: the next fits at +1h0m0.001s, with up to
		// 36s of jitter; the deadline leaves half a second past the wait.
		e := newWaitEnv(t)
		hourly := PerHour(1)
		e.fill(t, "a", hourly, 1)
		r := time.Hour + time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), r+500*time.Millisecond)
		defer cancel()
		require.NoError(t, e.l.Wait(ctx, "a", hourly))
		slept := e.sleeps()
		require.Len(t, slept, 1)
		require.GreaterOrEqual(t, slept[0], r)
		require.Less(t, slept[0], r+500*time.Millisecond)
	})
}

func TestWaitContextDone(t *testing.T) {
	t.Parallel()
	limit := PerSecond(5)

	t.Run("cancelled during the sleep", func(t *testing.T) {
		e := newWaitEnv(t)
		e.fill(t, "a", limit, 5)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		e.l.sleep = func(ctx context.Context, d time.Duration) error {
			cancel() // part-way through
			return e.sleep(ctx, d/2)
		}
		require.ErrorIs(t, e.l.Wait(ctx, "a", limit), context.Canceled)
		require.Len(t, e.sleeps(), 1)
		require.Equal(t, int64(5), e.count(t, "a", limit))
	})

	t.Run("cancelled before", func(t *testing.T) {
		e := newWaitEnv(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.ErrorIs(t, e.l.Wait(ctx, "a", limit), context.Canceled)
		require.Empty(t, e.sleeps())
		require.Equal(t, int64(0), e.count(t, "a", limit))
	})

	t.Run("deadline passed", func(t *testing.T) {
		e := newWaitEnv(t)
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		require.ErrorIs(t, e.l.Wait(ctx, "a", limit), context.DeadlineExceeded)
		require.Empty(t, e.sleeps())
	})

	t.Run("real sleep", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.ErrorIs(t, sleepCtx(ctx, time.Hour), context.Canceled)
		require.NoError(t, sleepCtx(context.Background(), 0))
	})
}

func TestWaitRedisDown(t *testing.T) {
	t.Parallel()
	limit := PerSecond(5)
	ctx := context.Background()

	t.Run("FailOpen", func(t *testing.T) {
		e := newWaitEnv(t, WithFailurePolicy(FailOpen))
		e.mr.Close()
		for range 10 { // twice the rate: no one counts
			require.NoError(t, e.l.Wait(ctx, "a", limit))
		}
		require.Empty(t, e.sleeps())
	})

	t.Run("FailClosed", func(t *testing.T) {
		e := newWaitEnv(t, WithFailurePolicy(FailClosed))
		e.mr.Close()
		require.ErrorIs(t, e.l.Wait(ctx, "a", limit), ErrUnavailable)
		require.Empty(t, e.sleeps())
	})

	t.Run("FailLocal waits on the local share", func(t *testing.T) {
		e := newWaitEnv(t, WithFailurePolicy(FailLocal))
		e.mr.Close()
		for range 5 {
			require.NoError(t, e.l.Wait(ctx, "a", limit))
		}
		require.Empty(t, e.sleeps())
		require.NoError(t, e.l.Wait(ctx, "a", limit))
		slept := e.sleeps()
		require.Len(t, slept, 1)
		require.GreaterOrEqual(t, slept[0], 1001*time.Millisecond)
		require.LessOrEqual(t, slept[0], 1011*time.Millisecond)
	})

	t.Run("FailLocal polls for a cost above the share", func(t *testing.T) {
		// A share of 4/4 = 1 never holds a cost of 2; Redis, back, would.
		e := newWaitEnv(t, WithFailurePolicy(FailLocal), WithReplicas(4))
		e.mr.Close()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		e.l.sleep = func(ctx context.Context, d time.Duration) error {
			if len(e.sleeps()) == 2 {
				cancel()
			}
			return e.sleep(ctx, d)
		}
		require.ErrorIs(t, e.l.WaitN(ctx, "a", PerSecond(4), 2), context.Canceled)
		slept := e.sleeps()
		require.Len(t, slept, 3)
		for _, d := range slept {
			require.GreaterOrEqual(t, d, time.Second) // min(window, DefaultBreakerCooldown)
			require.LessOrEqual(t, d, time.Second+10*time.Millisecond)
		}
	})
}

// Wait paces a worker: it returns once the request is allowed, and counted.
// A wait that could never end, or that would outlast ctx's deadline, fails
// at once instead of sleeping.
func ExampleLimiter_Wait() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	now := time.UnixMilli(1_700_002_800_000) // a clock that stands still
	limiter := New(client, WithClock(func() time.Time { return now }))
	limit := PerMinute(3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for i := range 3 {
		err := limiter.Wait(ctx, "worker-1", limit)
		fmt.Printf("call %d: err=%v\n", i+1, err)
	}
	// The 4th would have to wait about a minute; ctx ends in 10s.
	err = limiter.Wait(ctx, "worker-1", limit)
	fmt.Println("call 4: exceeds deadline:", errors.Is(err, ErrWaitExceedsDeadline))
	// No minute ever holds a cost of 4.
	fmt.Println("cost 4:", limiter.WaitN(ctx, "worker-1", limit, 4))
	// Output:
	// call 1: err=<nil>
	// call 2: err=<nil>
	// call 3: err=<nil>
	// call 4: exceeds deadline: true
	// cost 4: ratelimit: cost is above the limit's rate; waiting would never help: cost 4, limit 3/1m0s
}
