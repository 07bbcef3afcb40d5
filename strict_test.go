package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

func TestStrictMiniredis(t *testing.T) {
	t.Parallel()
	runStrict(t, miniredisEnv)
}

func TestStrictRedisServer(t *testing.T) {
	t.Parallel()
	runStrict(t, serverEnv(t))
}

func TestStrictRedisCluster(t *testing.T) {
	t.Parallel()
	runStrict(t, clusterEnv(t))
}

// runStrict runs every test of strict limits against one kind of Redis.
func runStrict(t *testing.T, mk newEnv) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, env)
	}{
		{"RetryAndResetAreExact", testStrictRetryAndResetAreExact},
		{"KeptApartFromSliding", testStrictKeptApart},
		{"Keys", testStrictKeys},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, mk(t)) })
	}
}

// admission is a request a limit admitted: its Unix ms and cost.
type admission struct{ at, cost int64 }

// mostInAnySpan returns the most cost the admissions put in any span of w
// ms, [t-w+1, t], trying every t from the first admission to the last: a
// brute force over every window, from a count per ms.
func mostInAnySpan(adm []admission, w int64) int64 {
	if len(adm) == 0 {
		return 0
	}
	first, last := adm[0].at, adm[len(adm)-1].at
	perMs := make([]int64, last-first+1)
	for _, a := range adm {
		perMs[a.at-first] += a.cost
	}
	var most int64
	for end := range perMs {
		var sum int64
		for ms := max(0, end-int(w)+1); ms <= end; ms++ {
			sum += perMs[ms]
		}
		most = max(most, sum)
	}
	return most
}

func TestMostInAnySpan(t *testing.T) {
	t.Parallel()
	adm := []admission{{100, 1}, {109, 2}, {110, 3}, {119, 1}, {130, 5}}
	require.Equal(t, int64(5), mostInAnySpan(adm, 10)) // [101, 110] and [121, 130]
	require.Equal(t, int64(6), mostInAnySpan(adm, 11)) // [100, 110] and [109, 119]
	require.Equal(t, int64(5), mostInAnySpan(adm, 1))
	require.Equal(t, int64(12), mostInAnySpan(adm, 31))
	require.Zero(t, mostInAnySpan(nil, 10))
}

// strictTrace returns requests in time order for a limit of rate per w ms,
// starting at start: honest traffic in bursts and pauses, costs 1 to 3,
// and attacks on the boundaries, which a sliding window lets through. The
// boundary attacker sends rate in the last ms of a window and rate more in
// the first ms of the next, then keeps sending a request every w/(2×rate)
// ms; the sub-window attacker does the same at sub-window boundaries. A
// burst of rate opens the trace.
func strictTrace(rng *rand.Rand, start, w, rate int64) []admission {
	var reqs []admission
	burst := func(at, n int64) {
		for range n {
			reqs = append(reqs, admission{at, 1})
		}
	}
	now := start
	burst(now, rate)
	for now < start+25*w {
		switch rng.IntN(4) {
		case 0: // honest: bursts of 1 to 4, a few ms apart, for a window or so
			for end := now + w; now < end; now += rng.Int64N(w / 8) {
				for range 1 + rng.IntN(4) {
					reqs = append(reqs, admission{now, 1 + rng.Int64N(3)})
				}
			}
		case 1: // boundary attacker
			now += w - now%w - 1
			burst(now, rate)
			now++
			burst(now, rate)
			for end := now + w; now < end; now += max(1, w/(2*rate)) {
				burst(now, 1)
			}
		case 2: // sub-window boundary attacker
			s := w / ratelimit.StrictSubWindows
			for range 2 * ratelimit.StrictSubWindows {
				now += s - now%s - 1
				burst(now, 1+rate/4)
				now++
				burst(now, 1+rate/4)
			}
		default: // a pause
			now += rng.Int64N(2 * w)
		}
	}
	return reqs
}

// A random trace of honest traffic and boundary attacks goes through a
// strict limit and, on the same id, a sliding limit of the same rate and
// window, one ms at a time on a fake clock. A brute force over every window
// of length W of the requests each admitted finds: the strict limit never
// more than Rate, and Rate itself (the opening burst); the sliding limit
// more than Rate somewhere, so that the trace can tell the two apart.
func TestStrictNeverExceedsRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate   int64
		window time.Duration
	}{
		{10, 100 * time.Millisecond},
		{7, 250 * time.Millisecond},
		{20, time.Second},
		{1, 30 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("%d per %v", tc.rate, tc.window), func(t *testing.T) {
			t.Parallel()
			e := miniredisEnv(t)
			ctx := context.Background()
			l := e.limiter()
			strict := ratelimit.Limit{Rate: tc.rate, Window: tc.window, Strict: true}
			sliding := ratelimit.Limit{Rate: tc.rate, Window: tc.window}
			w := tc.window.Milliseconds()
			rng := rand.New(rand.NewPCG(uint64(tc.rate), uint64(w)))
			var byStrict, bySliding []admission
			reqs := strictTrace(rng, epoch.UnixMilli()+3, w, tc.rate)
			for _, r := range reqs {
				e.clock.Set(time.UnixMilli(r.at))
				res, err := l.AllowN(ctx, "id", strict, r.cost)
				require.NoError(t, err)
				if res.Allowed {
					byStrict = append(byStrict, r)
				}
				res, err = l.AllowN(ctx, "id", sliding, r.cost)
				require.NoError(t, err)
				if res.Allowed {
					bySliding = append(bySliding, r)
				}
			}
			strictMost, slidingMost := mostInAnySpan(byStrict, w), mostInAnySpan(bySliding, w)
			t.Logf("%d requests: strict admitted %d, at most %d in a window; sliding admitted %d, at most %d",
				len(reqs), len(byStrict), strictMost, len(bySliding), slidingMost)
			require.Equal(t, tc.rate, strictMost)
			require.Greater(t, slidingMost, tc.rate)
		})
	}
}

// RetryAfter and ResetAfter of a strict limit are checked by moving the
// clock to exactly that point, where the request passes (or the count is
// 0), and to one millisecond before, where it does not. The counts are set
// by sub-window, current first; the hand-worked waits follow
// window.StrictWaitUntil: the oldest counts leave one sub-window at a time.
func testStrictRetryAndResetAreExact(t *testing.T, e env) {
	ctx := context.Background()
	ms := time.Millisecond
	for _, tc := range []struct {
		name       string
		window     time.Duration
		rate, cost int64
		subs       []int64       // counts of sub-windows j, j-1, ...
		at         time.Duration // into sub-window j
		retry      time.Duration
		reset      time.Duration
	}{
		// All in the current sub-window: it leaves when 11 have begun.
		{"full current sub-window", time.Second, 5, 1, []int64{5}, 50 * ms, 1050 * ms, 1050 * ms},
		// The oldest sub-window's 4 leave at the next sub-window; the
		// current one's 1 at the 11th.
		{"oldest leaves first", time.Second, 5, 1, []int64{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4}, 30 * ms, 70 * ms, 1070 * ms},
		// 9 + 4 > 10: at most 6 may stay, the newest 2, 0, 1, 0, 3, 0, 0;
		// sub-windows j-7 .. j-10 leave by the 4th sub-window: 400 - 25.
		{"cost of several", time.Second, 10, 4, []int64{2, 0, 1, 0, 3, 0, 0, 2, 0, 0, 1}, 25 * ms, 375 * ms, 1075 * ms},
		// Counts above the rate, as a larger limit of the same window may
		// leave: the 40 must leave entirely.
		{"count above rate", time.Second, 5, 1, []int64{0, 0, 0, 40}, 99 * ms, 701 * ms, 701 * ms},
		// Sub-windows of 1 ms: 11 counts of 1, rate 3: 2 may stay.
		{"1 ms sub-windows", 10 * ms, 3, 1, []int64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 0, 9 * ms, 11 * ms},
		// Sub-windows of 6 s.
		{"minute", time.Minute, 100, 10, []int64{50, 0, 0, 0, 0, 45}, 3 * time.Second, 33 * time.Second, 63 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit := ratelimit.Limit{Rate: tc.rate, Window: tc.window, Strict: true}
			l := e.limiter()
			s := tc.window / ratelimit.StrictSubWindows
			start := epoch.Add(7*s + tc.at)
			e.clock.Set(start)
			j := e.subWindow(tc.window)
			for back, c := range tc.subs {
				if c > 0 {
					require.NoError(t, e.client.Set(ctx, e.strictKey(tc.name, tc.window, j-int64(back)), c, 0).Err())
				}
			}

			res, err := l.AllowN(ctx, tc.name, limit, tc.cost)
			require.NoError(t, err)
			require.False(t, res.Allowed, "the case must start denied")
			require.Equal(t, tc.retry, res.RetryAfter)
			require.Equal(t, tc.reset, res.ResetAfter)

			e.clock.Set(start.Add(res.ResetAfter - ms))
			peek, err := l.Peek(ctx, tc.name, limit)
			require.NoError(t, err)
			require.Positive(t, peek.Count, "one ms before ResetAfter")
			e.clock.Set(start.Add(res.ResetAfter))
			peek, err = l.Peek(ctx, tc.name, limit)
			require.NoError(t, err)
			require.Zero(t, peek.Count, "at ResetAfter")

			e.clock.Set(start.Add(res.RetryAfter - ms))
			early, err := l.AllowN(ctx, tc.name, limit, tc.cost)
			require.NoError(t, err)
			require.False(t, early.Allowed, "one ms before RetryAfter")
			require.Equal(t, ms, early.RetryAfter)
			e.clock.Set(start.Add(res.RetryAfter))
			onTime, err := l.AllowN(ctx, tc.name, limit, tc.cost)
			require.NoError(t, err)
			require.True(t, onTime.Allowed, "at RetryAfter")
		})
	}
}

// A strict and a sliding limit of the same Window on one id keep separate
// keys and counts, and may be decided together.
func testStrictKeptApart(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	sliding := ratelimit.PerSecond(3)
	strict := ratelimit.Limit{Rate: 3, Window: time.Second, Strict: true}
	e.clock.Set(epoch.Add(420 * time.Millisecond))
	for n := int64(1); n <= 3; n++ {
		res, err := l.Allow(ctx, "id", sliding)
		require.NoError(t, err)
		require.Equal(t, n, res.Count)
	}
	for n := int64(1); n <= 3; n++ {
		res, err := l.Allow(ctx, "id", strict)
		require.NoError(t, err)
		require.True(t, res.Allowed, "the sliding limit's count was read")
		require.Equal(t, n, res.Count)
	}
	res, err := l.AllowAll(ctx, "id", []ratelimit.Limit{sliding, strict}, 1)
	require.NoError(t, err)
	require.False(t, res[0].Allowed)
	require.Equal(t, []int64{3, 3}, counts(res))
	require.ElementsMatch(t, []string{
		e.key("id", time.Second, e.windowIndex(time.Second)),
		e.strictKey("id", time.Second, e.subWindow(time.Second)),
	}, e.keys(t))
	require.Equal(t, int64(3), e.get(t, "id", time.Second, e.windowIndex(time.Second)))
	n, err := e.client.Get(ctx, e.strictKey("id", time.Second, e.subWindow(time.Second))).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(3), n)

	// Reset of one leaves the other.
	require.NoError(t, l.Reset(ctx, "id", strict))
	peek, err := l.PeekAll(ctx, "id", []ratelimit.Limit{sliding, strict})
	require.NoError(t, err)
	require.Equal(t, []int64{3, 0}, counts(peek))
}

// A strict key is named by its sub-window, lives 12 sub-windows (it is read
// for up to 11) and a margin, and Reset deletes every sub-window the limit
// reads.
func testStrictKeys(t *testing.T, e env) {
	ctx := context.Background()
	l := e.limiter()
	limit := ratelimit.Limit{Rate: 100, Window: time.Second, Strict: true}
	e.clock.Set(epoch.Add(2*time.Second + 345*time.Millisecond))
	_, err := l.Allow(ctx, "ttl", limit)
	require.NoError(t, err)
	j := e.subWindow(time.Second)
	require.Equal(t, (epoch.UnixMilli()+2345)/100, j)
	ttl, err := e.client.PTTL(ctx, e.strictKey("ttl", time.Second, j)).Result()
	require.NoError(t, err)
	// and a margin of min(Window, 1s) for a decision that reaches Redis
	// late: without it a key first written at its sub-window's start
	// expired as the last sub-window that reads it ended
	require.Greater(t, ttl, 2100*time.Millisecond)
	require.LessOrEqual(t, ttl, 2200*time.Millisecond)

	// Counts in the 11 sub-windows read and the one before them.
	for back := int64(0); back <= ratelimit.StrictSubWindows+1; back++ {
		require.NoError(t, e.client.Set(ctx, e.strictKey("r", time.Second, j-back), 1, 0).Err())
	}
	peek, err := l.Peek(ctx, "r", limit)
	require.NoError(t, err)
	require.Equal(t, int64(ratelimit.StrictSubWindows+1), peek.Count, "the 12th sub-window back is not read")
	require.NoError(t, l.Reset(ctx, "r", limit))
	peek, err = l.Peek(ctx, "r", limit)
	require.NoError(t, err)
	require.Zero(t, peek.Count)
	require.Equal(t, int64(1), e.client.Exists(ctx, e.strictKey("r", time.Second, j-ratelimit.StrictSubWindows-1)).Val(),
		"Reset deleted a sub-window no longer read")
}
