package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// epoch is a Unix time that starts a second, a minute and an hour, so that
// epoch.Add(d) lies d into a window of any of those lengths.
var epoch = time.UnixMilli(1_700_002_800_000)

// env is what one semantic test runs against: a client of some Redis, a
// fake clock, and a key prefix no other test uses.
type env struct {
	client redis.UniversalClient
	clock  *clock.Fake
	prefix string
	opts   []ratelimit.Option // for every Limiter of the env
}

// limiter returns a Limiter on the env's client, clock and prefix. Its
// timeout is long: these tests compare exact results, and a busy machine
// must not turn one into a failure-policy decision. The timeout has tests of
// its own.
func (e env) limiter(opts ...ratelimit.Option) *ratelimit.Limiter {
	return ratelimit.New(e.client, append([]ratelimit.Option{
		ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix(e.prefix),
		ratelimit.WithTimeout(time.Minute),
	}, append(e.opts, opts...)...)...)
}

// key spells out the documented key format independently of the library.
func (e env) key(id string, window time.Duration, index int64) string {
	esc := strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(id)
	return fmt.Sprintf("%s:{%s}:%d:%d", e.prefix, esc, window.Milliseconds(), index)
}

// windowIndex is the index of the window the clock is in.
func (e env) windowIndex(window time.Duration) int64 {
	return e.clock.Now().UnixMilli() / window.Milliseconds()
}

// set stores counts for id's current and previous windows.
func (e env) set(t *testing.T, id string, window time.Duration, cur, prev int64) {
	t.Helper()
	ctx := context.Background()
	i := e.windowIndex(window)
	if cur > 0 {
		require.NoError(t, e.client.Set(ctx, e.key(id, window, i), cur, 0).Err())
	}
	if prev > 0 {
		require.NoError(t, e.client.Set(ctx, e.key(id, window, i-1), prev, 0).Err())
	}
}

// get returns the count stored for id in the window index, 0 when none is.
func (e env) get(t *testing.T, id string, window time.Duration, index int64) int64 {
	t.Helper()
	n, err := e.client.Get(context.Background(), e.key(id, window, index)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(t, err)
	return n
}

// keys returns every key under the test's prefix, on every node.
func (e env) keys(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	if cc, ok := e.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var all []string
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			keys, err := c.Keys(ctx, e.prefix+":*").Result()
			mu.Lock()
			all = append(all, keys...)
			mu.Unlock()
			return err
		}))
		return all
	}
	keys, err := e.client.Keys(ctx, e.prefix+":*").Result()
	require.NoError(t, err)
	return keys
}

// newEnv is how a backend gives a test a fresh environment.
type newEnv func(t *testing.T) env

func miniredisEnv(t *testing.T) env {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return env{client: c, clock: clock.NewFake(epoch), prefix: "test"}
}

// serverEnv starts one redis-server for all the tests it serves; each gets
// its own prefix.
func serverEnv(t *testing.T) newEnv {
	c := redistest.Start(t).Client(t)
	return func(t *testing.T) env {
		return env{client: c, clock: clock.NewFake(epoch), prefix: t.Name()}
	}
}

// clusterEnv starts a 3-master Redis Cluster for all the tests it serves.
func clusterEnv(t *testing.T) newEnv {
	addrs := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	return func(t *testing.T) env {
		return env{client: c, clock: clock.NewFake(epoch), prefix: t.Name()}
	}
}

func TestSemanticsMiniredis(t *testing.T) { runSemantics(t, miniredisEnv) }

func TestSemanticsRedisServer(t *testing.T) { runSemantics(t, serverEnv(t)) }

func TestSemanticsRedisCluster(t *testing.T) { runSemantics(t, clusterEnv(t)) }

// withOpts returns mk with opts added to every Limiter of its envs.
func withOpts(mk newEnv, opts ...ratelimit.Option) newEnv {
	return func(t *testing.T) env {
		e := mk(t)
		e.opts = opts
		return e
	}
}

func TestSemanticsBatchedMiniredis(t *testing.T) {
	runSemantics(t, withOpts(miniredisEnv, ratelimit.WithBatching(64)))
}

func TestSemanticsBatchedRedisServer(t *testing.T) {
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
		require.Equal(t, ratelimit.Result{Allowed: true, Count: n, Limit: limit, Remaining: 5 - n, ResetAfter: reset}, res)
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
// very start of the next window and one a millisecond later.
func testBoundaryBurst(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.PerSecond(100)
	e.clock.Set(epoch.Add(999 * time.Millisecond))
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
	require.Equal(t, 0, allowedAt(time.Second))
	require.Equal(t, 1, allowedAt(time.Second+time.Millisecond))
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
	require.Negative(t, res.RetryAfter)
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
			flushScripts(t, e.client)
		}
		res, err := l.Allow(ctx, "id", limit)
		require.NoError(t, err)
		require.False(t, res.Degraded)
		require.Equal(t, n, res.Count)
	}
}

// flushScripts empties the script cache of every node.
func flushScripts(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	if cc, ok := c.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachShard(ctx, func(ctx context.Context, s *redis.Client) error {
			return s.ScriptFlush(ctx).Err()
		}))
		return
	}
	require.NoError(t, c.ScriptFlush(ctx).Err())
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
	for range 64 {
		wg.Go(func() {
			for range 5 {
				res, err := l.Allow(ctx, "hot", limit)
				if err != nil || res.Degraded {
					t.Errorf("Allow: %v (degraded %v)", err, res.Degraded)
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
	require.Greater(t, ttl, 119*time.Second)
	require.LessOrEqual(t, ttl, 120*time.Second)
}

func TestNilClient(t *testing.T) {
	l := ratelimit.New(nil)
	_, err := l.Allow(context.Background(), "id", ratelimit.PerSecond(1))
	require.ErrorIs(t, err, ratelimit.ErrNilClient)
	require.ErrorIs(t, l.Reset(context.Background(), "id", ratelimit.PerSecond(1)), ratelimit.ErrNilClient)
}

func TestLimitConstructors(t *testing.T) {
	require.Equal(t, ratelimit.Limit{Rate: 3, Window: time.Second}, ratelimit.PerSecond(3))
	require.Equal(t, ratelimit.Limit{Rate: 4, Window: time.Minute}, ratelimit.PerMinute(4))
	require.Equal(t, ratelimit.Limit{Rate: 5, Window: time.Hour}, ratelimit.PerHour(5))
	require.Equal(t, "5/1h0m0s", ratelimit.PerHour(5).String())
}
