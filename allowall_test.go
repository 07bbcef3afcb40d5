package ratelimit_test

import (
	"context"
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
)

// scriptCalls is a go-redis hook that counts the script calls a client
// makes: EVALSHA and EVAL, less an EVALSHA that NOSCRIPT refused (the
// script did not run; it is sent again as EVAL).
type scriptCalls struct{ n atomic.Int64 }

func (c *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		name := strings.ToLower(cmd.Name())
		if (name == "evalsha" || name == "eval") && (err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT")) {
			c.n.Add(1)
		}
		return err
	}
}

func (c *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestAllowAllMiniredis(t *testing.T) {
	t.Parallel()
	runAllowAll(t, miniredisEnv)
}

func TestAllowAllRedisServer(t *testing.T) {
	t.Parallel()
	runAllowAll(t, serverEnv(t))
}

func TestAllowAllRedisCluster(t *testing.T) {
	t.Parallel()
	runAllowAll(t, clusterEnv(t))
}

// runAllowAll runs every test of AllowAll's and PeekAll's meaning against
// one kind of Redis.
func runAllowAll(t *testing.T, mk newEnv) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, env)
	}{
		{"AllOrNothing", testAllOrNothing},
		{"PerLimitResults", testAllowAllPerLimitResults},
		{"InvalidInput", testAllowAllInvalidInput},
		{"MaxLimits", testAllowAllMaxLimits},
		{"OneScriptCall", testAllowAllOneScriptCall},
		{"ConcurrentMixed", testAllowAllConcurrentMixed},
		{"ConcurrentBinding", testAllowAllConcurrentBinding},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, mk(t)) })
	}
}

// strictKey spells out the documented key of a strict limit's sub-window j
// for an id that needs no escaping.
func (e env) strictKey(id string, window time.Duration, j int64) string {
	return fmt.Sprintf("%s:{%s}:%d/%d:%d", e.prefix, id, window.Milliseconds(), ratelimit.StrictSubWindows, j)
}

// subWindow is the index of the strict sub-window the clock is in.
func (e env) subWindow(window time.Duration) int64 {
	return e.clock.Now().UnixMilli() / (window.Milliseconds() / ratelimit.StrictSubWindows)
}

// dump returns every key under the test's prefix with its value.
func (e env) dump(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range e.keys(t) {
		v, err := e.client.Get(context.Background(), k).Result()
		require.NoError(t, err, k)
		out[k] = v
	}
	return out
}

// counts returns each Result's Count.
func counts(res []ratelimit.Result) []int64 {
	out := make([]int64, len(res))
	for i, r := range res {
		out[i] = r.Count
	}
	return out
}

// A request that one limit denies is counted under none: the other limits'
// keys, and what PeekAll reports, are as they were, whichever limit denies
// and whatever its kind.
func testAllOrNothing(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	sec := ratelimit.PerSecond(5)
	minute := ratelimit.PerMinute(3)
	strict := ratelimit.Limit{Rate: 4, Window: time.Second, Strict: true}
	limits := []ratelimit.Limit{sec, minute, strict}
	e.clock.Set(epoch.Add(250 * time.Millisecond))

	// Two requests fit all three.
	for n := int64(1); n <= 2; n++ {
		res, err := l.AllowAll(ctx, "id", limits, 1)
		require.NoError(t, err)
		require.Equal(t, []int64{n, n, n}, counts(res))
		require.True(t, res[0].Allowed && res[1].Allowed && res[2].Allowed)
	}
	// A cost of 2 fits the per-second 5 and the strict 4, not the
	// per-minute 3: nothing is counted anywhere.
	before := e.dump(t)
	require.Len(t, before, 3)
	res, err := l.AllowAll(ctx, "id", limits, 2)
	require.NoError(t, err)
	require.False(t, res[0].Allowed || res[1].Allowed || res[2].Allowed)
	require.Zero(t, res[0].RetryAfter, "the per-second limit admits it")
	require.Positive(t, res[1].RetryAfter)
	require.Zero(t, res[2].RetryAfter, "the strict limit admits it")
	require.Equal(t, before, e.dump(t), "a denied AllowAll wrote")
	peek, err := l.PeekAll(ctx, "id", limits)
	require.NoError(t, err)
	require.Equal(t, []int64{2, 2, 2}, counts(peek))

	// A third request fits the per-minute limit: counted under all three.
	res, err = l.AllowAll(ctx, "id", limits, 1)
	require.NoError(t, err)
	require.True(t, res[0].Allowed)
	require.Equal(t, []int64{3, 3, 3}, counts(res))

	// Now the per-minute limit denies every cost, where the strict one
	// alone would still take 1 and the per-second one 2: neither counts.
	before = e.dump(t)
	for _, n := range []int64{1, 2, 5} {
		res, err = l.AllowAll(ctx, "id", limits, n)
		require.NoError(t, err)
		require.False(t, res[0].Allowed, "cost %d", n)
		require.Equal(t, before, e.dump(t), "cost %d", n)
	}
	require.Equal(t, int64(3), e.get(t, "id", time.Second, e.windowIndex(time.Second)))
	require.Equal(t, int64(3), e.get(t, "id", time.Minute, e.windowIndex(time.Minute)))
	n, err := e.client.Get(ctx, e.strictKey("id", time.Second, e.subWindow(time.Second))).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(3), n)

	// The other two on their own still have room, untouched by the
	// denials: the per-second limit takes 2 more, the strict one 1.
	res, err = l.AllowAll(ctx, "id", []ratelimit.Limit{sec, strict}, 1)
	require.NoError(t, err)
	require.True(t, res[0].Allowed)
	require.Equal(t, []int64{4, 4}, counts(res))
	res, err = l.AllowAll(ctx, "id", []ratelimit.Limit{sec, strict}, 1)
	require.NoError(t, err)
	require.False(t, res[0].Allowed, "the strict limit is full")
	require.Equal(t, []int64{4, 4}, counts(res))
	require.Zero(t, res[0].RetryAfter, "the per-second limit would admit it")
	require.Positive(t, res[1].RetryAfter)
	got, err := l.AllowN(ctx, "id", sec, 1)
	require.NoError(t, err)
	require.Equal(t, int64(5), got.Count, "the strict limit's denial counted nothing per second")
}

// Each Result of a multi-limit decision is the limit's own, with AllowN's
// meaning, whichever limit denies; Binding picks the longest wait, a
// "never" first of all, and when allowed the least Remaining.
func testAllowAllPerLimitResults(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	a := ratelimit.Limit{Rate: 10, Window: time.Second, Name: "a"}
	b := ratelimit.Limit{Rate: 100, Window: time.Minute, Name: "b"}
	c := ratelimit.Limit{Rate: 5, Window: time.Second, Strict: true, Name: "c"}
	d := ratelimit.Limit{Rate: 6, Window: time.Hour, Name: "d"}
	limits := []ratelimit.Limit{a, b, c, d}
	start := epoch.Add(250 * time.Millisecond)
	e.clock.Set(start)
	e.set(t, "id", time.Second, 10, 0)
	e.set(t, "id", time.Minute, 100, 0)
	require.NoError(t, e.client.Set(ctx, e.strictKey("id", time.Second, e.subWindow(time.Second)), 2, 0).Err())
	ms := time.Millisecond

	// a: its 10 weigh floor(10 × (1000-e)/1000) in the next second, 750 ms
	// away: at most 9 from e = 1, 0 from e = 901. b likewise: 59750 ms to
	// the next minute, then 99 from e = 1 and 0 from e = 59401. c: 2 of 5
	// in sub-window 2 (of 100 ms, 50 ms in), which leaves the strict count
	// when 11 sub-windows have begun: 1100 - 50 ms. d: nothing yet.
	want := []ratelimit.Result{
		{Count: 10, Limit: a, Remaining: 0, RetryAfter: 751 * ms, ResetAfter: 1651 * ms},
		{Count: 100, Limit: b, Remaining: 0, RetryAfter: 59751 * ms, ResetAfter: 119151 * ms},
		{Count: 2, Limit: c, Remaining: 3, RetryAfter: 0, ResetAfter: 1050 * ms},
		{Count: 0, Limit: d, Remaining: 6, RetryAfter: 0, ResetAfter: 0},
	}
	res, err := l.AllowAll(ctx, "id", limits, 1)
	require.NoError(t, err)
	require.Equal(t, want, res)
	require.Equal(t, want[1], ratelimit.Binding(res))
	peek, err := l.PeekAll(ctx, "id", limits)
	require.NoError(t, err)
	require.Equal(t, want, peek, "PeekAll is what a cost-1 AllowAll gets")

	// A cost of 7 is above c's and d's rates: they never admit it, and the
	// first of them binds. a needs at most 3: e >= 601 in the next second;
	// b at most 93: e >= 3601 in the next minute.
	res, err = l.AllowAll(ctx, "id", limits, 7)
	require.NoError(t, err)
	require.Equal(t, []ratelimit.Result{
		{Count: 10, Limit: a, Remaining: 0, RetryAfter: 1351 * ms, ResetAfter: 1651 * ms},
		{Count: 100, Limit: b, Remaining: 0, RetryAfter: 63351 * ms, ResetAfter: 119151 * ms},
		{Count: 2, Limit: c, Remaining: 3, RetryAfter: ratelimit.InfDuration, ResetAfter: 1050 * ms},
		{Count: 0, Limit: d, Remaining: 6, RetryAfter: ratelimit.InfDuration, ResetAfter: 0},
	}, ratelimit.PublicAll(res))
	require.Equal(t, c, ratelimit.Binding(res).Limit)

	// At a's RetryAfter a admits the request; b still denies it.
	e.clock.Set(start.Add(751 * ms))
	res, err = l.AllowAll(ctx, "id", limits, 1)
	require.NoError(t, err)
	require.False(t, res[0].Allowed)
	require.Equal(t, []time.Duration{0, 59000 * ms, 0, 0},
		[]time.Duration{res[0].RetryAfter, res[1].RetryAfter, res[2].RetryAfter, res[3].RetryAfter})
	require.Equal(t, b, ratelimit.Binding(res).Limit)

	// 1 ms before b's RetryAfter it still denies; at it, all four count.
	e.clock.Set(start.Add(59750 * ms))
	res, err = l.AllowAll(ctx, "id", limits, 1)
	require.NoError(t, err)
	require.False(t, res[0].Allowed)
	require.Equal(t, ms, res[1].RetryAfter)
	e.clock.Set(start.Add(59751 * ms))
	res, err = l.AllowAll(ctx, "id", limits, 1)
	require.NoError(t, err)
	// The clock is 1 ms into a minute, a second, a sub-window and 60001 ms
	// into the hour. b: floor(100 × 59999/60000) = 99, and this request;
	// the 100 are gone in the next minute, the 1 weighs 0 from its 2nd ms.
	// a and c: their counts are a minute old. d: the hour's first.
	require.Equal(t, []ratelimit.Result{
		{Allowed: true, Count: 1, Limit: a, Remaining: 9, ResetAfter: 1000 * ms},
		{Allowed: true, Count: 100, Limit: b, Remaining: 0, ResetAfter: 60000 * ms},
		{Allowed: true, Count: 1, Limit: c, Remaining: 4, ResetAfter: 1099 * ms},
		{Allowed: true, Count: 1, Limit: d, Remaining: 5, ResetAfter: (3600000 - 60001 + 1) * ms},
	}, ratelimit.PublicAll(res))
	require.Equal(t, b, ratelimit.Binding(res).Limit, "least Remaining")
}

func TestBinding(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	lim := func(i int64) ratelimit.Limit { return ratelimit.Limit{Rate: i, Window: time.Second} }
	for _, tc := range []struct {
		name    string
		results []ratelimit.Result
		want    int // index; -1 for the zero Result
	}{
		{"none", nil, -1},
		{"one", []ratelimit.Result{{Limit: lim(1), RetryAfter: 5 * ms}}, 0},
		{"allowed: least remaining", []ratelimit.Result{
			{Allowed: true, Limit: lim(1), Remaining: 4},
			{Allowed: true, Limit: lim(2), Remaining: 1},
			{Allowed: true, Limit: lim(3), Remaining: 2},
		}, 1},
		{"allowed: a tie goes to the first", []ratelimit.Result{
			{Allowed: true, Limit: lim(1), Remaining: 3},
			{Allowed: true, Limit: lim(2), Remaining: 0},
			{Allowed: true, Limit: lim(3), Remaining: 0},
		}, 1},
		{"denied: longest wait", []ratelimit.Result{
			{Limit: lim(1), RetryAfter: 0, Remaining: 0},
			{Limit: lim(2), RetryAfter: 30 * ms},
			{Limit: lim(3), RetryAfter: 20 * ms},
		}, 1},
		{"denied: a tie goes to the first", []ratelimit.Result{
			{Limit: lim(1), RetryAfter: 20 * ms},
			{Limit: lim(2), RetryAfter: 30 * ms},
			{Limit: lim(3), RetryAfter: 30 * ms},
		}, 1},
		{"denied: never is longest", []ratelimit.Result{
			{Limit: lim(1), RetryAfter: time.Hour},
			{Limit: lim(2), RetryAfter: ratelimit.InfDuration},
			{Limit: lim(3), RetryAfter: 2 * time.Hour},
		}, 1},
		{"denied: the first never", []ratelimit.Result{
			{Limit: lim(1), RetryAfter: ratelimit.InfDuration},
			{Limit: lim(2), RetryAfter: ratelimit.InfDuration},
		}, 0},
		{"denied: not the least remaining", []ratelimit.Result{
			{Limit: lim(1), RetryAfter: 0, Remaining: 0},
			{Limit: lim(2), RetryAfter: 10 * ms, Remaining: 7},
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := ratelimit.Result{}
			if tc.want >= 0 {
				want = tc.results[tc.want]
			}
			require.Equal(t, want, ratelimit.Binding(tc.results))
		})
	}
}

// Input that cannot be decided is refused before Redis, whatever the
// failure policy: the error names what is wrong, each Result is zero but
// for its Limit, nothing is written and no Redis error is reported.
func testAllowAllInvalidInput(t *testing.T, e env) {
	ctx := context.Background()
	sec, minute := ratelimit.PerSecond(10), ratelimit.PerMinute(5)
	strict := ratelimit.Limit{Rate: 5, Window: time.Second, Strict: true}
	for _, tc := range []struct {
		name   string
		id     string
		limits []ratelimit.Limit
		cost   int64
		is     error
		says   string
	}{
		{"no limits", "a", nil, 1, ratelimit.ErrInvalidLimit, "no limits"},
		{"empty limits", "a", []ratelimit.Limit{}, 1, ratelimit.ErrInvalidLimit, "no limits"},
		{"invalid limit", "a", []ratelimit.Limit{sec, ratelimit.PerMinute(0)}, 1, ratelimit.ErrInvalidLimit, "rate 0 is below 1"},
		{"fractional window", "a", []ratelimit.Limit{sec, {Rate: 1, Window: 1500 * time.Microsecond}}, 1,
			ratelimit.ErrInvalidLimit, "window 1.5ms is not a whole number of milliseconds"},
		{"strict window not a multiple of 10ms", "a", []ratelimit.Limit{sec, {Rate: 1, Window: 15 * time.Millisecond, Strict: true}}, 1,
			ratelimit.ErrInvalidLimit, "strict window 15ms is not a multiple of 10ms"},
		{"same window", "a", []ratelimit.Limit{sec, minute, ratelimit.PerSecond(7)}, 1,
			ratelimit.ErrInvalidLimit, "limits 10/1s and 7/1s have the same window and would share one count"},
		{"same window, one shadow", "a", []ratelimit.Limit{sec, {Rate: 3, Window: time.Second, Shadow: true, Name: "n"}}, 1,
			ratelimit.ErrInvalidLimit, "limits 10/1s and 3/1s shadow have the same window"},
		{"same strict window", "a", []ratelimit.Limit{strict, minute, {Rate: 7, Window: time.Second, Strict: true, Shadow: true}}, 1,
			ratelimit.ErrInvalidLimit, "limits 5/1s strict and 7/1s strict shadow have the same window"},
		{"zero cost", "a", []ratelimit.Limit{sec, minute}, 0, ratelimit.ErrInvalidCost, "cost 0 is below 1"},
		{"negative cost", "a", []ratelimit.Limit{sec, minute}, -2, ratelimit.ErrInvalidCost, "cost -2 is below 1"},
		{"empty id", "", []ratelimit.Limit{sec, minute}, 1, ratelimit.ErrInvalidID, "id is empty"},
	} {
		for _, policy := range []ratelimit.FailurePolicy{ratelimit.FailOpen, ratelimit.FailClosed, ratelimit.FailLocal} {
			t.Run(tc.name+"/"+policy.String(), func(t *testing.T) {
				var handled atomic.Int32
				l := e.limiter(ratelimit.WithFailurePolicy(policy), ratelimit.WithShadow(policy == ratelimit.FailOpen),
					ratelimit.WithErrorHandler(func(context.Context, string, error) { handled.Add(1) }))
				zero := make([]ratelimit.Result, len(tc.limits))
				for i, limit := range tc.limits {
					zero[i].Limit = limit
				}
				res, err := l.AllowAll(ctx, tc.id, tc.limits, tc.cost)
				require.ErrorIs(t, err, tc.is)
				require.ErrorContains(t, err, tc.says)
				require.Equal(t, zero, res)
				if tc.cost == 1 { // PeekAll takes no cost
					res, err = l.PeekAll(ctx, tc.id, tc.limits)
					require.ErrorIs(t, err, tc.is)
					require.ErrorContains(t, err, tc.says)
					require.Equal(t, zero, res)
				}
				require.Zero(t, handled.Load(), "invalid input is not a Redis error")
				require.Empty(t, e.keys(t))
			})
		}
	}
}

// MaxLimits limits are decided in one call; one more is refused, writing
// nothing.
func testAllowAllMaxLimits(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	var limits []ratelimit.Limit
	for i := range ratelimit.MaxLimits + 1 {
		limits = append(limits, ratelimit.Limit{Rate: 3, Window: time.Duration(i+1) * time.Second, Strict: i%3 == 0, Shadow: i%5 == 4})
	}
	res, err := l.AllowAll(ctx, "id", limits[:ratelimit.MaxLimits], 1)
	require.NoError(t, err)
	require.Len(t, res, ratelimit.MaxLimits)
	for i, r := range res {
		require.Equal(t, ratelimit.Result{Allowed: true, Count: 1, Limit: limits[i], Remaining: 2, ResetAfter: r.ResetAfter}, ratelimit.Public(r))
		require.Positive(t, r.ResetAfter)
	}
	before := e.dump(t)
	require.Len(t, before, ratelimit.MaxLimits)

	res, err = l.AllowAll(ctx, "id", limits, 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
	require.ErrorContains(t, err, "17 limits, more than 16")
	require.Len(t, res, ratelimit.MaxLimits+1)
	_, err = l.PeekAll(ctx, "id", limits)
	require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
	require.Equal(t, before, e.dump(t))
}

// Every decision is one script call, whatever the number of limits, Shadow
// ones (a request of their own) among them, allowed or denied, a look or
// not.
func testAllowAllOneScriptCall(t *testing.T, e env) {
	ctx := context.Background()
	var calls scriptCalls
	l := ratelimit.New(hookedClient(t, e.client, &calls),
		ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix(e.prefix), ratelimit.WithTimeout(time.Minute))
	// A redis-server's own count of script calls, from INFO commandstats;
	// miniredis keeps none, and a Cluster one per node.
	server, _ := e.client.(*redis.Client)
	if _, _, err := scriptStats(e.client); err != nil {
		server = nil
	}
	commandStats := func() float64 {
		if server == nil {
			return 0
		}
		n, _, err := scriptStats(server)
		require.NoError(t, err)
		return n
	}
	_, err := l.Allow(ctx, "warm", ratelimit.PerSecond(1)) // loads the script
	require.NoError(t, err)
	for k := 1; k <= ratelimit.MaxLimits; k++ {
		var limits []ratelimit.Limit
		for i := range k {
			limits = append(limits, ratelimit.Limit{Rate: 2, Window: time.Duration(i+1) * time.Second, Strict: i%2 == 1, Shadow: i%4 == 3})
		}
		id := fmt.Sprint("k", k)
		for _, step := range []string{"allowed", "allowed", "denied", "peek"} {
			before, stats := calls.n.Load(), commandStats()
			var res []ratelimit.Result
			if step == "peek" {
				res, err = l.PeekAll(ctx, id, limits)
			} else {
				res, err = l.AllowAll(ctx, id, limits, 1)
			}
			require.NoError(t, err)
			require.Equal(t, step == "allowed", res[0].Allowed, "%d limits: %s", k, step)
			require.Equal(t, int64(1), calls.n.Load()-before, "%d limits: %s", k, step)
			if server != nil {
				require.Equal(t, 1.0, commandStats()-stats, "%d limits: %s (INFO commandstats)", k, step)
			}
		}
	}
}

// 64 goroutines decide for one id at once, a quarter with AllowN under one
// limit, the rest with AllowAll under it and a second: batched into shared
// script calls on a single server, each decision sees the ones before it.
// The first limit (200) has room for all 80 single requests and 60 more;
// the second (60) admits exactly 60 of the 240 AllowAll requests. Every
// count is handed out once.
func testAllowAllConcurrentMixed(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	a := ratelimit.PerMinute(200)
	b := ratelimit.PerSecond(60)
	var mu sync.Mutex
	seenA, seenB := map[int64]int{}, map[int64]int{}
	var singles, alls int
	var failed atomic.Value
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			for range 5 {
				var res []ratelimit.Result
				var err error
				if g%4 == 0 {
					var r ratelimit.Result
					r, err = l.AllowN(ctx, "hot", a, 1)
					res = []ratelimit.Result{r}
				} else {
					res, err = l.AllowAll(ctx, "hot", []ratelimit.Limit{a, b}, 1)
				}
				if err != nil || res[0].Degraded {
					failed.Store(fmt.Sprintf("%v, degraded %v", err, res[0].Degraded))
					return
				}
				if !res[0].Allowed {
					continue
				}
				mu.Lock()
				seenA[res[0].Count]++
				if len(res) == 2 {
					seenB[res[1].Count]++
					alls++
				} else {
					singles++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Nil(t, failed.Load())
	require.Equal(t, 80, singles)
	require.Equal(t, 60, alls)
	for n := int64(1); n <= 140; n++ {
		require.Equal(t, 1, seenA[n], "count %d of the first limit", n)
	}
	for n := int64(1); n <= 60; n++ {
		require.Equal(t, 1, seenB[n], "count %d of the second limit", n)
	}
	require.Len(t, seenA, 140)
	require.Len(t, seenB, 60)
	require.Equal(t, int64(140), e.get(t, "hot", time.Minute, e.windowIndex(time.Minute)))
	require.Equal(t, int64(60), e.get(t, "hot", time.Second, e.windowIndex(time.Second)))
}

// 64 goroutines, 320 AllowAll requests under 100 per minute and 1000 per
// second: exactly 100 are admitted, each counted under both limits at once
// (equal counts, 1 to 100 once each), and the minute binds every decision.
func testAllowAllConcurrentBinding(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	minute, second := ratelimit.PerMinute(100), ratelimit.PerSecond(1000)
	limits := []ratelimit.Limit{second, minute}
	var mu sync.Mutex
	seen := map[int64]int{}
	var failed atomic.Value
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 5 {
				res, err := l.AllowAll(ctx, "hot", limits, 1)
				switch {
				case err != nil || res[0].Degraded:
					failed.Store(fmt.Sprintf("%v, degraded %v", err, res[0].Degraded))
					return
				case ratelimit.Binding(res).Limit != minute:
					failed.Store(fmt.Sprintf("binding %+v", ratelimit.Binding(res)))
					return
				case res[0].Allowed && res[0].Count != res[1].Count:
					failed.Store(fmt.Sprintf("counted apart: %+v", res))
					return
				case res[0].Allowed:
					mu.Lock()
					seen[res[1].Count]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Nil(t, failed.Load())
	require.Len(t, seen, 100)
	for n := int64(1); n <= 100; n++ {
		require.Equal(t, 1, seen[n], "count %d", n)
	}
	require.Equal(t, int64(100), e.get(t, "hot", time.Second, e.windowIndex(time.Second)))
}

// With Redis down, each failure policy decides every limit of a decision
// alike: FailOpen allows them all, FailClosed denies them all with
// ErrUnavailable, and FailLocal decides all or nothing in this process
// against each limit's share (Rate/2 here), a Shadow limit counted when its
// share alone admits the request.
func TestAllowAllFailurePolicies(t *testing.T) {
	t.Parallel()
	a := ratelimit.Limit{Rate: 10, Window: time.Second}
	b := ratelimit.Limit{Rate: 6, Window: time.Minute, Strict: true}
	s := ratelimit.Limit{Rate: 2, Window: time.Hour, Shadow: true}
	limits := []ratelimit.Limit{a, b, s}
	ctx := context.Background()
	ms := time.Millisecond
	for _, policy := range []ratelimit.FailurePolicy{ratelimit.FailOpen, ratelimit.FailClosed, ratelimit.FailLocal} {
		t.Run(policy.String(), func(t *testing.T) {
			mr := miniredis.RunT(t)
			client := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
			t.Cleanup(func() { _ = client.Close() })
			mr.Close()
			var handled atomic.Int32
			l := ratelimit.New(client, ratelimit.WithClock(clock.NewFake(epoch).Now),
				ratelimit.WithFailurePolicy(policy), ratelimit.WithReplicas(2),
				ratelimit.WithErrorHandler(func(context.Context, string, error) { handled.Add(1) }))
			allow := func(n int64) ([]ratelimit.Result, error) { return l.AllowAll(ctx, "id", limits, n) }
			switch policy {
			case ratelimit.FailOpen, ratelimit.FailClosed:
				open := policy == ratelimit.FailOpen
				want := make([]ratelimit.Result, len(limits))
				for i, limit := range limits {
					want[i] = ratelimit.Result{Allowed: open, Limit: limit, Degraded: true}
					if open {
						want[i].Remaining = limit.Rate
					}
				}
				for _, call := range []func() ([]ratelimit.Result, error){
					func() ([]ratelimit.Result, error) { return allow(1) },
					func() ([]ratelimit.Result, error) { return allow(5) },
					func() ([]ratelimit.Result, error) { return l.PeekAll(ctx, "id", limits) },
				} {
					res, err := call()
					if open {
						require.NoError(t, err)
					} else {
						require.ErrorIs(t, err, ratelimit.ErrUnavailable)
					}
					require.Equal(t, want, res)
				}
				require.Equal(t, int32(3), handled.Load())
			case ratelimit.FailLocal:
				// Shares: a 5 per second, b 3 per minute (strict, sub-windows
				// of 6 s), s 1 per hour. The clock stands at the start of all.
				for n := int64(1); n <= 3; n++ {
					res, err := allow(1)
					require.NoError(t, err)
					sRes := ratelimit.Result{Allowed: true, Count: 1, Limit: s, Remaining: 0, ResetAfter: 3600001 * ms, Degraded: true}
					if n > 1 { // s's share is full: not counted, would have denied
						sRes.RetryAfter, sRes.Shadowed = 3600001*ms, true
					}
					require.Equal(t, []ratelimit.Result{
						{Allowed: true, Count: n, Limit: a, Remaining: 5 - n, ResetAfter: 2*time.Second - time.Duration(999/n)*ms, Degraded: true},
						{Allowed: true, Count: n, Limit: b, Remaining: 3 - n, ResetAfter: 66 * time.Second, Degraded: true},
						sRes,
					}, ratelimit.PublicAll(res), "request %d", n)
				}
				// b's share is full: denied, and a counts nothing.
				res, err := allow(1)
				require.NoError(t, err)
				require.Equal(t, []ratelimit.Result{
					{Allowed: false, Count: 3, Limit: a, Remaining: 2, ResetAfter: 1667 * ms, Degraded: true},
					{Allowed: false, Count: 3, Limit: b, Remaining: 0, RetryAfter: 66 * time.Second, ResetAfter: 66 * time.Second, Degraded: true},
					{Allowed: false, Count: 1, Limit: s, Remaining: 0, RetryAfter: 3600001 * ms, ResetAfter: 3600001 * ms, Degraded: true, Shadowed: true},
				}, res)
				for n := int64(4); n <= 6; n++ {
					got, err := l.Allow(ctx, "id", a)
					require.NoError(t, err)
					require.Equal(t, n <= 5, got.Allowed, "a's share takes 2 more, not 3")
				}
			}
		})
	}
}

// A Limiter with the deny cache denies an AllowAll locally when the counts
// it cached for any one limit already deny it: the deletion of that limit's
// keys behind its back goes unseen until its RetryAfter, and the other
// limit is never counted.
func TestAllowAllDenyCacheLocal(t *testing.T) {
	t.Parallel()
	e := miniredisEnv(t)
	ctx := context.Background()
	var sources []ratelimit.Source
	l := e.limiter(ratelimit.WithDenyCache(10), ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, ev *ratelimit.Event) {
		sources = append(sources, ev.Source)
	})))
	a, b := ratelimit.PerSecond(3), ratelimit.PerMinute(100)
	start := epoch.Add(250 * time.Millisecond)
	e.clock.Set(start)
	for range 3 {
		res, err := l.Allow(ctx, "id", a)
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	first, err := l.Allow(ctx, "id", a) // Redis denies; the cache learns
	require.NoError(t, err)
	require.False(t, first.Allowed)
	require.NoError(t, e.client.Del(ctx, e.key("id", time.Second, e.windowIndex(time.Second))).Err())

	for range 10 {
		res, err := l.AllowAll(ctx, "id", []ratelimit.Limit{a, b}, 1)
		require.NoError(t, err)
		require.Equal(t, []ratelimit.Result{first, {Limit: b, Remaining: 100}}, res)
	}
	require.Equal(t, ratelimit.SourceCache, sources[len(sources)-1])
	require.Empty(t, e.keys(t), "b was counted")

	e.clock.Set(start.Add(first.RetryAfter - time.Millisecond))
	res, err := l.AllowAll(ctx, "id", []ratelimit.Limit{a, b}, 1)
	require.NoError(t, err)
	require.False(t, res[0].Allowed, "1 ms before a's RetryAfter")
	e.clock.Set(start.Add(first.RetryAfter))
	res, err = l.AllowAll(ctx, "id", []ratelimit.Limit{a, b}, 1)
	require.NoError(t, err)
	require.True(t, res[0].Allowed)
	require.Equal(t, ratelimit.SourceRedis, sources[len(sources)-1])
	require.Equal(t, []int64{1, 1}, counts(res), "Redis had nothing for either")
}

// The deny cache changes no decision of AllowAll either. A Limiter with it
// and one without, each on its own miniredis and reading the same clock,
// take the mixed trace of the differential tests: every decision is the
// same; where the cache decided, each Result's counts and waits are lower
// bounds of Redis's (the cached counts are), and elsewhere equal.
func TestAllowAllDenyCacheChangesNoDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := clock.NewFake(epoch)
	newLimiter := func(opts ...ratelimit.Option) *ratelimit.Limiter {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return ratelimit.New(c, append(opts, ratelimit.WithClock(clk.Now), ratelimit.WithTimeout(time.Minute))...)
	}
	var source ratelimit.Source
	plain := newLimiter()
	cached := newLimiter(ratelimit.WithDenyCache(1000), ratelimit.WithObserver(ratelimit.ObserverFunc(
		func(_ context.Context, ev *ratelimit.Event) { source = ev.Source })))
	local, localMulti := 0, 0
	for step, o := range mixedTrace(11, depth(t, 2000), tinyPool, "") {
		clk.Set(time.UnixMilli(o.at))
		where := fmt.Sprintf("step %d %v", step, o)
		want, err := do(ctx, plain, o)
		require.NoError(t, err, where)
		got, err := do(ctx, cached, o)
		require.NoError(t, err, where)
		if o.kind == opReset || source != ratelimit.SourceCache {
			require.Equal(t, ratelimit.PublicAll(want), ratelimit.PublicAll(got), where)
			continue
		}
		local++
		if len(got) > 1 {
			localMulti++
		}
		require.False(t, want[0].Allowed, "the cache denied what Redis allows: "+where)
		for i := range want {
			w, g := want[i], got[i]
			require.False(t, g.Allowed, where)
			require.LessOrEqual(t, g.Count, w.Count, where)
			require.LessOrEqual(t, g.ResetAfter, w.ResetAfter, where)
			if w.RetryAfter == ratelimit.InfDuration {
				require.Equal(t, w.RetryAfter, g.RetryAfter, where)
			} else {
				require.True(t, g.RetryAfter >= 0 && g.RetryAfter <= w.RetryAfter, where)
			}
		}
	}
	t.Logf("%d denials by the cache, %d of them of several limits", local, localMulti)
	require.Greater(t, localMulti, 30)
}
