package ratelimit_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

func TestSemanticsMiniredis(t *testing.T) {
	t.Parallel()
	runSemantics(t, miniredisEnv)
}

func TestSemanticsRedisServer(t *testing.T) {
	t.Parallel()
	runSemantics(t, serverEnv(t))
}

func TestSemanticsRedisCluster(t *testing.T) {
	t.Parallel()
	runSemantics(t, clusterEnv(t))
}

func TestSemanticsBatchedMiniredis(t *testing.T) {
	t.Parallel()
	runSemantics(t, withOpts(miniredisEnv, ratelimit.WithBatching(64)))
}

func TestSemanticsBatchedRedisServer(t *testing.T) {
	t.Parallel()
	runSemantics(t, withOpts(serverEnv(t), ratelimit.WithBatching(64)))
}

// runSemantics runs every test of the decision's meaning against one kind
// of Redis.
func runSemantics(t *testing.T, mk newEnv) {
	tests := []struct {
		name string
		fn   func(*testing.T, env)
	}{
		{"ArticleExample", testArticleExample},
		{"LimitReached", testLimitReached},
		{"BoundaryBurst", testBoundaryBurst},
		{"RetryAndResetAreExact", testRetryAndResetAreExact},
		{"CostAboveRate", testCostAboveRate},
		{"InvalidInput", testInvalidInput},
		{"IDsNeverCollide", testIDsNeverCollide},
		{"WindowsKeptApart", testWindowsKeptApart},
		{"PeekWritesNothing", testPeekWritesNothing},
		{"PeekResetAfterIsExact", testPeekResetAfterIsExact},
		{"LongIDKeys", testLongIDKeys},
		{"ResetClears", testResetClears},
		{"ScriptFlush", testScriptFlush},
		{"Concurrent", testConcurrent},
		{"KeysExpire", testKeysExpire},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, mk(t)) })
	}
}

// The article's worked example: 80 in the previous minute, 30 in this one,
// 18 seconds in. 30 + floor(80 × 42/60) = 86. With 90 in the previous minute
// the estimate is 30 + 63 = 93, where the article's floating-point weight
// gives floor(90 × 0.7) = floor(62.99…) = 62 and would admit a request at
// Rate 93.
func testArticleExample(t *testing.T, e env) {
	ctx := context.Background()
	e.clock.Set(epoch.Add(18 * time.Second))
	for _, tc := range []struct {
		prev, rate int64
		allowed    bool
		count      int64
	}{
		{prev: 80, rate: 100, allowed: true, count: 87},
		{prev: 80, rate: 87, allowed: true, count: 87},
		{prev: 80, rate: 86, allowed: false, count: 86},
		{prev: 90, rate: 94, allowed: true, count: 94},
		{prev: 90, rate: 93, allowed: false, count: 93},
	} {
		t.Run(fmt.Sprintf("prev%d/rate%d", tc.prev, tc.rate), func(t *testing.T) {
			id := fmt.Sprintf("client-%d-%d", tc.prev, tc.rate)
			e.set(t, id, time.Minute, 30, tc.prev)
			res, err := e.limiter().Allow(ctx, id, ratelimit.PerMinute(tc.rate))
			require.NoError(t, err)
			require.Equal(t, tc.allowed, res.Allowed)
			require.Equal(t, tc.count, res.Count)
			require.Equal(t, tc.rate-tc.count, res.Remaining)
			want := int64(30)
			if tc.allowed {
				want = 31
			}
			require.Equal(t, want, e.get(t, id, time.Minute, e.windowIndex(time.Minute)))
		})
	}
}

func testLimitReached(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerSecond(5)
	for n := int64(1); n <= 5; n++ {
		res, err := l.Allow(ctx, "user", limit)
		require.NoError(t, err)
		// The n requests weigh floor(n × m/1000) in the next window with m
		// ms left in it: 0 once m <= 999/n.
		reset := 2*time.Second - time.Duration(999/n)*time.Millisecond
		require.Equal(t, ratelimit.Result{Allowed: true, Count: n, Limit: limit, Remaining: 5 - n, ResetAfter: reset}, ratelimit.Public(res))
	}
	res, err := l.Allow(ctx, "user", limit)
	require.NoError(t, err)
	// Denied at the start of the window: in the next window, the 5 weigh
	// floor(5 × m/1000) with m ms left, which is at most 4 once m <= 999.
	require.Equal(t, ratelimit.Result{
		Allowed: false, Count: 5, Limit: limit, Remaining: 0,
		RetryAfter: 1001 * time.Millisecond, ResetAfter: 1801 * time.Millisecond,
	}, res)
	require.Equal(t, int64(5), e.get(t, "user", time.Second, e.windowIndex(time.Second)))
}

// A fixed window would take 100 in the last millisecond of one window and
// 100 more in the first of the next. The sliding window takes none at the
// very start of the next window and one a millisecond later. The window is
// a minute, not a second: the clock is the test's, but Redis expires keys
// in real time, and a loaded machine took more than a second window's TTL
// between the burst and the decisions after it (35 of 100 admitted).
func testBoundaryBurst(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerMinute(100)
	e.clock.Set(epoch.Add(time.Minute - time.Millisecond))
	res, err := l.AllowN(ctx, "burst", limit, 100)
	require.NoError(t, err)
	require.True(t, res.Allowed)

	allowedAt := func(offset time.Duration) int {
		e.clock.Set(epoch.Add(offset))
		n := 0
		for range 100 {
			res, err := l.Allow(ctx, "burst", limit)
			require.NoError(t, err)
			if res.Allowed {
				n++
			}
		}
		return n
	}
	require.Equal(t, 0, allowedAt(time.Minute))
	require.Equal(t, 1, allowedAt(time.Minute+time.Millisecond), "floor(100 × 59,999/60,000) = 99 of the last window")
}

// RetryAfter and ResetAfter are checked by moving the clock to exactly that
// point, where the request passes (or the count is 0), and to one
// millisecond before, where it does not.
func testRetryAndResetAreExact(t *testing.T, e env) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		window     time.Duration
		rate, cost int64
		cur, prev  int64
		at         time.Duration // into the window
	}{
		{"full current window", time.Second, 5, 1, 5, 0, 0},
		{"previous window fading", time.Second, 10, 1, 2, 9, 100 * time.Millisecond},
		{"cost of several", time.Second, 10, 4, 3, 8, 250 * time.Millisecond},
		{"article minute", time.Minute, 86, 1, 30, 80, 18 * time.Second},
		{"both windows full", 7 * time.Millisecond, 3, 2, 3, 3, 2 * time.Millisecond},
		{"count above rate", time.Second, 5, 1, 40, 40, 999 * time.Millisecond},
		{"one ms window", time.Millisecond, 1, 1, 1, 1, 0},
		{"hour", time.Hour, 1000, 10, 990, 900, 59 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit := ratelimit.Limit{Rate: tc.rate, Window: tc.window}
			l := e.limiter()
			start := epoch.Add(tc.at)
			e.clock.Set(start)
			e.set(t, tc.name, tc.window, tc.cur, tc.prev)

			res, err := l.AllowN(ctx, tc.name, limit, tc.cost)
			require.NoError(t, err)
			require.False(t, res.Allowed, "the case must start denied")
			require.Positive(t, res.RetryAfter)

			e.clock.Set(start.Add(res.ResetAfter - time.Millisecond))
			peek, err := l.Peek(ctx, tc.name, limit)
			require.NoError(t, err)
			require.Positive(t, peek.Count, "one ms before ResetAfter")
			e.clock.Set(start.Add(res.ResetAfter))
			peek, err = l.Peek(ctx, tc.name, limit)
			require.NoError(t, err)
			require.Zero(t, peek.Count, "at ResetAfter")

			e.clock.Set(start.Add(res.RetryAfter - time.Millisecond))
			early, err := l.AllowN(ctx, tc.name, limit, tc.cost)
			require.NoError(t, err)
			require.False(t, early.Allowed, "one ms before RetryAfter")
			require.Equal(t, time.Millisecond, early.RetryAfter)
			e.clock.Set(start.Add(res.RetryAfter))
			onTime, err := l.AllowN(ctx, tc.name, limit, tc.cost)
			require.NoError(t, err)
			require.True(t, onTime.Allowed, "at RetryAfter")
		})
	}
}

func testCostAboveRate(t *testing.T, e env) {
	res, err := e.limiter().AllowN(context.Background(), "big", ratelimit.PerSecond(5), 6)
	require.NoError(t, err)
	require.False(t, res.Allowed)
	require.Equal(t, ratelimit.InfDuration, res.RetryAfter)
	// A caller that rounds the wait up to whole seconds, as a Retry-After
	// header wants, is told to wait, never to retry at once.
	require.Positive(t, math.Ceil(res.RetryAfter.Seconds()))
	require.Positive(t, res.RetryAfter.Round(time.Second))
	require.Positive(t, (res.RetryAfter+time.Second-1)/time.Second, "the integer idiom wraps on math.MaxInt64")
	require.Equal(t, int64(0), res.Count)
	require.Equal(t, int64(0), e.get(t, "big", time.Second, e.windowIndex(time.Second)))
}

func testInvalidInput(t *testing.T, e env) {
	ctx := context.Background()
	ok := ratelimit.PerSecond(10)
	for _, tc := range []struct {
		name  string
		id    string
		limit ratelimit.Limit
		cost  int64
		is    error
		says  string
	}{
		{"empty id", "", ok, 1, ratelimit.ErrInvalidID, "id is empty"},
		{"zero rate", "a", ratelimit.PerSecond(0), 1, ratelimit.ErrInvalidLimit, "rate 0 is below 1"},
		{"negative rate", "a", ratelimit.PerMinute(-3), 1, ratelimit.ErrInvalidLimit, "rate -3 is below 1"},
		{"zero window", "a", ratelimit.Limit{Rate: 1}, 1, ratelimit.ErrInvalidLimit, "window 0s is shorter than 1ms"},
		{"sub-ms window", "a", ratelimit.Limit{Rate: 1, Window: 500 * time.Microsecond}, 1, ratelimit.ErrInvalidLimit, "shorter than 1ms"},
		{"fractional ms", "a", ratelimit.Limit{Rate: 1, Window: 1500 * time.Microsecond}, 1, ratelimit.ErrInvalidLimit, "window 1.5ms is not a whole number of milliseconds"},
		{"rate too large", "a", ratelimit.PerHour(1 << 40), 1, ratelimit.ErrInvalidLimit, "too large"},
		{"zero cost", "a", ok, 0, ratelimit.ErrInvalidCost, "cost 0 is below 1"},
		{"negative cost", "a", ok, -1, ratelimit.ErrInvalidCost, "cost -1 is below 1"},
	} {
		for _, policy := range []ratelimit.FailurePolicy{ratelimit.FailOpen, ratelimit.FailClosed} {
			t.Run(tc.name+"/"+policy.String(), func(t *testing.T) {
				var handled atomic.Int32
				l := e.limiter(ratelimit.WithFailurePolicy(policy),
					ratelimit.WithErrorHandler(func(context.Context, string, error) { handled.Add(1) }))
				calls := map[string]func() error{
					"AllowN": func() error { _, err := l.AllowN(ctx, tc.id, tc.limit, tc.cost); return err },
				}
				if tc.cost == 1 { // Allow, Peek and Reset take no cost
					calls["Allow"] = func() error { _, err := l.Allow(ctx, tc.id, tc.limit); return err }
					calls["Peek"] = func() error { _, err := l.Peek(ctx, tc.id, tc.limit); return err }
					calls["Reset"] = func() error { return l.Reset(ctx, tc.id, tc.limit) }
				}
				for name, call := range calls {
					err := call()
					require.ErrorIs(t, err, tc.is, name)
					require.ErrorContains(t, err, tc.says, name)
				}
				require.Zero(t, handled.Load(), "invalid input is not a Redis error")
				require.Empty(t, e.keys(t))
			})
		}
	}
}

// Ids that an unescaped key would merge, or whose hash tag would be empty
// or cut short, each get a count of their own.
func testIDsNeverCollide(t *testing.T, e env) {
	ctx := context.Background()
	ids := []string{
		"a", "a}", "{a}", "}a", "{", "}", "{}", "}{", "%", "%7D", "%257D", "a%7D",
		"a:1000:5", "a}:1000", "x:{a}", "with space", "tab\tnewline\n", "ünïcödé ✓",
		"\x00nul", strings.Repeat("k", 1024), strings.Repeat("{}", 512),
	}
	l := e.limiter()
	limit := ratelimit.PerSecond(1)
	for _, id := range ids {
		res, err := l.Allow(ctx, id, limit)
		require.NoError(t, err, "%q", id)
		require.True(t, res.Allowed, "%q shares a count with an earlier id", id)
		require.Equal(t, int64(1), e.get(t, id, time.Second, e.windowIndex(time.Second)), "%q", id)
	}
	for _, id := range ids {
		res, err := l.Allow(ctx, id, limit)
		require.NoError(t, err)
		require.False(t, res.Allowed, "%q was not counted", id)
	}
}

// The same id under a per-second and a per-minute limit keeps two counts.
func testWindowsKeptApart(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	for range 3 {
		_, err := l.Allow(ctx, "id", ratelimit.PerSecond(10))
		require.NoError(t, err)
	}
	res, err := l.Allow(ctx, "id", ratelimit.PerMinute(10))
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Count)
}

func testPeekWritesNothing(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerSecond(10)
	e.clock.Set(epoch.Add(400 * time.Millisecond))
	e.set(t, "id", time.Second, 4, 5)
	for range 3 {
		res, err := l.Peek(ctx, "id", limit)
		require.NoError(t, err)
		// 4 + floor(5 × 600/1000) = 7, which is 0 once the current count 4
		// weighs nothing in the next window: when at most 249 ms of it are
		// left, 2000 - 249 - 400 ms from now.
		require.Equal(t, ratelimit.Result{
			Allowed: true, Count: 7, Limit: limit, Remaining: 3,
			ResetAfter: 1351 * time.Millisecond,
		}, res)
	}
	require.Equal(t, int64(4), e.get(t, "id", time.Second, e.windowIndex(time.Second)))
	require.Len(t, e.keys(t), 2)

	// Empty windows: Count 0 now, so ResetAfter 0 (Result's contract).
	res, err := l.Peek(ctx, "nobody", limit)
	require.NoError(t, err)
	require.Equal(t, ratelimit.Result{Allowed: true, Count: 0, Limit: limit, Remaining: 10, ResetAfter: 0}, res)
	require.Zero(t, e.client.Exists(ctx, e.key("nobody", time.Second, e.windowIndex(time.Second))).Val())

	e.set(t, "full", time.Second, 10, 0)
	res, err = l.Peek(ctx, "full", limit)
	require.NoError(t, err)
	require.False(t, res.Allowed)
	require.Equal(t, int64(10), res.Count)
	require.Equal(t, 1001*time.Millisecond-400*time.Millisecond, res.RetryAfter)
}

// Peek's ResetAfter is the wait until Peek's Count is 0 (Result's
// contract): 0 when Count already is, else Count is positive one ms before
// it and 0 at it. A Peek counts nothing, so a request it would admit must
// not weigh in its ResetAfter. Each case writes its counts with AllowN at
// the times given (ms from epoch), then peeks at peekAt.
func testPeekResetAfterIsExact(t *testing.T, e env) {
	ctx := context.Background()
	type allow struct{ at, cost int64 }
	strict := ratelimit.Limit{Rate: 10, Window: time.Minute, Strict: true}
	for _, tc := range []struct {
		name   string
		limit  ratelimit.Limit
		allows []allow
		peekAt int64
	}{
		{"empty", ratelimit.PerMinute(10), nil, 25_000},
		{"current window", ratelimit.PerMinute(10), []allow{{1_000, 3}}, 25_000},
		{"previous window", ratelimit.PerMinute(10), []allow{{50_000, 9}}, 61_000},
		{"both windows", ratelimit.PerMinute(100), []allow{{10_000, 40}, {70_000, 30}}, 80_000},
		// 1 in the previous window weighs floor(1 × 1/60000) = 0: Count 0.
		{"previous weighs nothing", ratelimit.PerMinute(10), []allow{{0, 1}}, 119_999},
		{"full", ratelimit.PerMinute(5), []allow{{0, 5}}, 30_000},
		{"hour", ratelimit.PerHour(1000), []allow{{600_000, 500}, {4_200_000, 300}}, 6_000_000},
		{"strict", strict, []allow{{0, 2}, {21_000, 3}}, 30_000},
		{"strict previous window", strict, []allow{{54_000, 4}}, 90_000},
		{"strict empty", strict, nil, 30_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := e.limiter()
			for _, a := range tc.allows {
				e.clock.Set(epoch.Add(time.Duration(a.at) * time.Millisecond))
				res, err := l.AllowN(ctx, tc.name, tc.limit, a.cost)
				require.NoError(t, err)
				require.True(t, res.Allowed, "setting up the counts")
			}
			at := epoch.Add(time.Duration(tc.peekAt) * time.Millisecond)
			peekCount := func(d time.Duration) int64 {
				t.Helper()
				e.clock.Set(at.Add(d))
				res, err := l.Peek(ctx, tc.name, tc.limit)
				require.NoError(t, err)
				require.False(t, res.Degraded)
				return res.Count
			}
			e.clock.Set(at)
			res, err := l.Peek(ctx, tc.name, tc.limit)
			require.NoError(t, err)
			require.False(t, res.Degraded)
			require.GreaterOrEqual(t, res.ResetAfter, time.Duration(0))
			if res.Count == 0 {
				require.Zero(t, res.ResetAfter, "Count is 0 already")
				return
			}
			require.Positive(t, res.ResetAfter)
			require.Positive(t, peekCount(res.ResetAfter-time.Millisecond), "one ms before ResetAfter")
			require.Zero(t, peekCount(res.ResetAfter), "at ResetAfter")
		})
	}
}

// An id longer than MaxIDLength is keyed by "%H" and the hex of its
// SHA-256: a 1 MiB id is decided like any other, its keys are short, and
// two such ids that differ only in their last byte keep counts of their
// own. An id of exactly MaxIDLength bytes keeps the documented format.
func testLongIDKeys(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerMinute(1)
	index := e.windowIndex(time.Minute)
	mib := strings.Repeat("{x}%", 1<<18) // escaping would make it 3 MiB
	require.Len(t, mib, 1<<20)
	long := []string{
		mib[:len(mib)-1] + "a",
		mib[:len(mib)-1] + "b",
		strings.Repeat("{}", ratelimit.MaxIDLength/2) + "x", // one byte over
	}
	exact := strings.Repeat("{}", ratelimit.MaxIDLength/2)
	require.Len(t, exact, ratelimit.MaxIDLength)

	for _, id := range append(slices.Clone(long), exact) {
		res, err := l.Allow(ctx, id, limit)
		require.NoError(t, err, "%d bytes", len(id))
		require.False(t, res.Degraded)
		require.True(t, res.Allowed, "%d-byte id shares a count with an earlier id", len(id))
		require.Equal(t, int64(1), res.Count)
	}
	for _, id := range append(slices.Clone(long), exact) {
		res, err := l.Allow(ctx, id, limit)
		require.NoError(t, err)
		require.False(t, res.Allowed, "%d-byte id was not counted", len(id))
	}

	want := []string{e.key(exact, time.Minute, index)}
	for _, id := range long {
		want = append(want, fmt.Sprintf("%s:{%%H%x}:%d:%d", e.prefix, sha256.Sum256([]byte(id)), time.Minute.Milliseconds(), index))
	}
	got := e.keys(t)
	for _, key := range got {
		require.LessOrEqual(t, len(key), len(want[0]), "a key of %d bytes: a long id as it is", len(key))
	}
	require.ElementsMatch(t, want, got, "one key each, as documented")
	for _, key := range want[1:] {
		require.Less(t, len(key), 200)
	}

	res, err := l.Peek(ctx, long[0], limit)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Count)
	require.NoError(t, l.Reset(ctx, long[0], limit))
	res, err = l.Allow(ctx, long[0], limit)
	require.NoError(t, err)
	require.True(t, res.Allowed, "Reset cleared the digest's key")
	res, err = l.Allow(ctx, long[1], limit)
	require.NoError(t, err)
	require.False(t, res.Allowed, "Reset left the other id alone")
}

func testResetClears(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerSecond(3)
	e.clock.Set(epoch.Add(500 * time.Millisecond))
	e.set(t, "id", time.Second, 3, 3)
	e.set(t, "other", time.Second, 3, 3)
	res, err := l.Allow(ctx, "id", limit)
	require.NoError(t, err)
	require.False(t, res.Allowed)

	require.NoError(t, l.Reset(ctx, "id", limit))
	res, err = l.Allow(ctx, "id", limit)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Count)
	i := e.windowIndex(time.Second)
	require.Zero(t, e.client.Exists(ctx, e.key("id", time.Second, i-1)).Val())
	require.Equal(t, int64(3), e.get(t, "other", time.Second, i), "Reset touched another id")
}

func testScriptFlush(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerSecond(10)
	for n := int64(1); n <= 4; n++ {
		if n%2 == 0 {
			require.NoError(t, flushScripts(ctx, e.client))
		}
		res, err := l.Allow(ctx, "id", limit)
		require.NoError(t, err)
		require.False(t, res.Degraded)
		require.Equal(t, n, res.Count)
	}
}

// 64 goroutines asking at once for one id get exactly Rate admissions,
// with every count from 1 to Rate handed out once.
func testConcurrent(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerMinute(100)
	var mu sync.Mutex
	seen := map[int64]int{}
	var wg sync.WaitGroup
	var failed firstError
	for range 64 {
		wg.Go(func() {
			for range 5 {
				res, err := l.Allow(ctx, "hot", limit)
				if err != nil || res.Degraded {
					failed.report(fmt.Errorf("Allow: %v (degraded %v)", err, res.Degraded))
					return
				}
				if res.Allowed {
					mu.Lock()
					seen[res.Count]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, failed.get())
	require.Len(t, seen, 100)
	for n := int64(1); n <= 100; n++ {
		require.Equal(t, 1, seen[n], "count %d", n)
	}
}

// Every key written has a TTL of two windows.
func testKeysExpire(t *testing.T, e env) {
	ctx := context.Background()
	_, err := e.limiter().Allow(ctx, "ttl", ratelimit.PerMinute(10))
	require.NoError(t, err)
	ttl, err := e.client.PTTL(ctx, e.key("ttl", time.Minute, e.windowIndex(time.Minute))).Result()
	require.NoError(t, err)
	// Two windows, and a margin of min(Window, 1s) for a decision that
	// reaches Redis late: without it a key first written at its window's
	// start expired as the next window, which reads it, ended.
	require.Greater(t, ttl, 120*time.Second)
	require.LessOrEqual(t, ttl, 121*time.Second)
}

// A nil client of any type, a typed nil pointer included, makes a Limiter
// whose every method says so: New does not panic on it.
func TestNilClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limit := ratelimit.PerSecond(1)
	for name, client := range map[string]redis.UniversalClient{
		"nil":                      nil,
		"nil *redis.Client":        (*redis.Client)(nil),
		"nil *redis.ClusterClient": (*redis.ClusterClient)(nil),
		"nil *redis.Ring":          (*redis.Ring)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			l := ratelimit.New(client, ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithDenyCache(10))
			_, err := l.Allow(ctx, "id", limit)
			require.ErrorIs(t, err, ratelimit.ErrNilClient)
			_, err = l.AllowAll(ctx, "id", []ratelimit.Limit{limit}, 1)
			require.ErrorIs(t, err, ratelimit.ErrNilClient)
			_, err = l.Peek(ctx, "id", limit)
			require.ErrorIs(t, err, ratelimit.ErrNilClient)
			require.ErrorIs(t, l.Wait(ctx, "id", limit), ratelimit.ErrNilClient)
			require.ErrorIs(t, l.Reset(ctx, "id", limit), ratelimit.ErrNilClient)
			require.Equal(t, ratelimit.Stats{}, l.Stats())
		})
	}
}

func TestLimitConstructors(t *testing.T) {
	t.Parallel()
	require.Equal(t, ratelimit.Limit{Rate: 3, Window: time.Second}, ratelimit.PerSecond(3))
	require.Equal(t, ratelimit.Limit{Rate: 4, Window: time.Minute}, ratelimit.PerMinute(4))
	require.Equal(t, ratelimit.Limit{Rate: 5, Window: time.Hour}, ratelimit.PerHour(5))
	require.Equal(t, "5/1h0m0s", ratelimit.PerHour(5).String())
}

// Least privilege: the semantic, multi-limit, strict, batched and
// differential tests run once more with every Limiter logged in as a Redis
// ACL user granted only the commands docs/failure-modes.md lists, on its
// own keys, on a server and on a Cluster.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	mk := aclEnv(t)
	t.Run("Semantics", func(t *testing.T) { runSemantics(t, mk) })
	t.Run("AllowAll", func(t *testing.T) { runAllowAll(t, mk) })
	t.Run("Strict", func(t *testing.T) { runStrict(t, mk) })
	t.Run("Batched", func(t *testing.T) { runSemantics(t, withOpts(mk, ratelimit.WithBatching(64))) })
	t.Run("Differential", func(t *testing.T) {
		runDifferential(t, mk(t), diffConfig{pool: realPool, lanes: 8, batched: true, realTime: true})
	})
	t.Run("RedisClock", func(t *testing.T) {
		rc := ratelimit.NewRedisClock(mk(t).limited, ratelimit.WithSyncInterval(0))
		defer rc.Close()
		require.NoError(t, rc.Sync(context.Background()), "TIME is granted")
	})
	t.Run("Cluster", func(t *testing.T) {
		mk := aclClusterEnv(t)
		runSemantics(t, mk)
		runDifferential(t, mk(t), diffConfig{pool: realPool, lanes: 8, batched: true, realTime: true})
	})
}

// An error a command of the script meets that is not a key of another type
// (here a user not granted GET: NOPERM) is the call's error, not a foreign
// value: the request is not reported as ErrBadReply, and nothing is written.
// The script reads one request's keys with redis.pcall, which hands it every
// error; it must pass on all but WRONGTYPE.
func TestScriptCommandErrorIsNotForeign(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	args := []any{"ACL", "SETUSER", "noget", "reset", "on", ">secret", "~nokeys-*", "resetchannels"}
	for _, rule := range strings.Fields(limiterACL) {
		if rule != "+get" {
			args = append(args, rule)
		}
	}
	require.NoError(t, admin.Do(ctx, args...).Err())
	client := newClient(t, &redis.Options{Addr: srv.Addr, Username: "noget", Password: "secret"})
	l := ratelimit.New(client, ratelimit.WithPrefix("nokeys-"), ratelimit.WithFailurePolicy(ratelimit.FailClosed),
		ratelimit.WithTimeout(time.Minute), // the error asserted is NOPERM's, not a busy machine's deadline
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	res, err := l.Allow(ctx, "id", ratelimit.PerMinute(10))
	// NOPERM, as Redis 7 words it in a script, or Valkey 8
	require.Error(t, err)
	require.Regexp(t, `can't run this command|no permissions to run the 'get' command`, err.Error())
	require.NotErrorIs(t, err, ratelimit.ErrBadReply)
	require.False(t, res.Allowed)
	n, err := admin.DBSize(ctx).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the failed call wrote a key")
}
