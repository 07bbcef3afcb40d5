package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// clientTimeout is the read, write and pool timeout of the clients in the
// tests of the Limiter's timeout: a decision that only the client bounded
// would take this long, far more than those tests allow (requireLatencies).
const clientTimeout = 30 * time.Second

// The tests of the Limiter's timeout, and of callers' deadlines, check how
// long their decisions took together, not one by one: a loaded 2-core
// machine makes a few of them late by far more than the bound, never most
// by more than a few times it (under -race beside three busy loops, 2,000
// callers bounded by 50 ms: medians of 60 to 220 ms). Of the decisions that waited for the bound (half of it or
// more: the others were decided at once, by an open breaker or a refused
// dial), the median must stay within medianBound times the bound, so that a
// bound that regresses fails the test; and each decision must end within
// outlierBound, well below clientTimeout and go-redis's own 3 s
// ReadTimeout, so that none waited for the client's own timeout. (A slack
// of 2 s on each decision let a 50 ms bound regress 40-fold unnoticed.)
const (
	medianBound  = 5
	outlierBound = 2 * time.Second
)

// requireLatencies checks took, how long decisions each bounded by bound
// took: the median of those that waited within medianBound × bound, and
// each within outlierBound.
func requireLatencies(t *testing.T, took []time.Duration, bound time.Duration, what string) {
	t.Helper()
	var waited []time.Duration
	for _, d := range took {
		if d >= bound/2 {
			waited = append(waited, d)
		}
	}
	median := percentile(waited, 50)
	t.Logf("%s: %d decisions bounded by %v, %d of which waited: median %v, p90 %v, max %v",
		what, len(took), bound, len(waited), median, percentile(waited, 90), percentile(took, 100))
	require.LessOrEqual(t, median, medianBound*bound, "%s: the median of %d decisions that waited for %v", what, len(waited), bound)
	require.Less(t, percentile(took, 100), outlierBound, "%s: the slowest of %d decisions bounded by %v", what, len(took), bound)
}

// slowClient returns options for a client of addr whose own timeouts are
// clientTimeout, and that stops at ctx deadlines itself or not.
func slowClient(addr string, ctxAware bool) *redis.Options {
	return &redis.Options{
		Addr: addr, ContextTimeoutEnabled: ctxAware,
		ReadTimeout: clientTimeout, WriteTimeout: clientTimeout, PoolTimeout: clientTimeout,
	}
}

func TestRedisDown(t *testing.T) {
	t.Parallel()
	for _, p := range policyCases {
		t.Run(p.name, func(t *testing.T) {
			h := &errorLog{}
			l := ratelimit.New(downClient(t), p.with(ratelimit.WithErrorHandler(h.handle))...)
			limit := ratelimit.PerSecond(10)
			res, err := l.Allow(context.Background(), "id", limit)
			requireDegraded(t, p, "id", limit, res, err, h)
		})
	}
}

// A Redis that accepts connections and never answers holds a decision for
// the Limiter's timeout and not for the client's own (30s here), whether or
// not the client watches ctx deadlines itself: the Limiter stops waiting
// for a client that does not. Each decision takes the timeout at least;
// how much longer is checked on all of them together.
func TestRedisHangs(t *testing.T) {
	t.Parallel()
	const timeout = 50 * time.Millisecond
	addr := redistest.Silent(t)
	var took []time.Duration
	for _, ctxAware := range []bool{false, true} {
		for _, p := range policyCases {
			t.Run(fmt.Sprintf("%s/ContextTimeoutEnabled=%v", p.name, ctxAware), func(t *testing.T) {
				client := newClient(t, slowClient(addr, ctxAware))
				h := &errorLog{}
				l := ratelimit.New(client, p.with(ratelimit.WithErrorHandler(h.handle), ratelimit.WithTimeout(timeout))...)
				limit := ratelimit.PerSecond(10)
				start := time.Now()
				res, err := l.Allow(context.Background(), "id", limit)
				elapsed := time.Since(start)
				redisErr := requireDegraded(t, p, "id", limit, res, err, h)
				require.True(t, isTimeout(redisErr), "%v", redisErr)
				require.ErrorContains(t, redisErr, "no reply within 50ms")
				require.GreaterOrEqual(t, elapsed, timeout)
				took = append(took, elapsed)
			})
		}
	}
	requireLatencies(t, took, timeout, "a hung Redis")
}

// A caller that gives up is not a Redis failure: its own error comes back,
// with no decision and nothing for the error handler.
func TestCallerContextDone(t *testing.T) {
	t.Parallel()
	client := newClient(t, &redis.Options{Addr: redistest.Silent(t)})
	h := &errorLog{}
	l := ratelimit.New(client, ratelimit.WithErrorHandler(h.handle), ratelimit.WithTimeout(time.Minute))
	limit := ratelimit.PerSecond(10)

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := l.Allow(canceled, "id", limit)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, ratelimit.Result{Limit: limit}, res)

	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	res, err = l.Allow(short, "id", limit)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, ratelimit.Result{Limit: limit}, res)
	require.Empty(t, h.seen())
}

// badReply is a way Redis can fail a decision while answering: a value
// stored under the current window's key that is not a count (on
// miniredis), or a raw reply no real Redis would send (from a fake server).
type badReply struct {
	name   string
	stored string // a value stored under the current window's key
	reply  string // the raw RESP reply a fake server gives the script
	want   error  // what the error handler's error wraps, if known
	says   string // what its message contains
	// unavailable: the reply says Redis cannot serve at all, and the
	// circuit breaker counts it.
	unavailable bool
}

var badReplies = []badReply{
	{name: "not a number stored", stored: "abc", want: ratelimit.ErrBadReply, says: "holds no count"},
	{name: "negative count stored", stored: "-5", want: ratelimit.ErrBadReply, says: "holds no count"},
	{name: "fraction stored", stored: "1.5", want: ratelimit.ErrBadReply, says: "holds no count"},
	{name: "status, not a list", reply: "+OK\r\n", want: ratelimit.ErrBadReply},
	{name: "list too short", reply: "*1\r\n:1\r\n", want: ratelimit.ErrBadReply, says: "1 values for 1 requests, want 3"},
	{name: "list too long", reply: "*4\r\n:1\r\n:0\r\n:0\r\n:0\r\n", want: ratelimit.ErrBadReply},
	{name: "list of words", reply: "*3\r\n$3\r\nyes\r\n$2\r\nno\r\n$5\r\nmaybe\r\n", want: ratelimit.ErrBadReply},
	{name: "nested list", reply: "*3\r\n*0\r\n:0\r\n:0\r\n", want: ratelimit.ErrBadReply},
	{name: "flag out of range", reply: "*3\r\n:7\r\n:0\r\n:0\r\n", want: ratelimit.ErrBadReply, says: "allowed flag 7"},
	{name: "negative count", reply: "*3\r\n:1\r\n:-1\r\n:0\r\n", want: ratelimit.ErrBadReply},
	{name: "nil", reply: "*-1\r\n", want: ratelimit.ErrBadReply},
	{name: "busy", reply: "-BUSY Redis is busy running a script\r\n", says: "BUSY", unavailable: true},
	{name: "loading", reply: "-LOADING Redis is loading the dataset in memory\r\n", says: "LOADING", unavailable: true},
	{name: "readonly", reply: "-READONLY You can't write against a read only replica.\r\n", says: "READONLY", unavailable: true},
	{name: "masterdown", reply: "-MASTERDOWN Link with MASTER is down\r\n", says: "MASTERDOWN", unavailable: true},
}

// env returns an environment whose Redis fails decisions for "id" as tc
// says.
func (tc badReply) env(t *testing.T) env {
	t.Helper()
	e := miniredisEnv(t)
	if tc.stored != "" {
		require.NoError(t, e.client.Set(context.Background(), e.key("id", time.Second, e.windowIndex(time.Second)), tc.stored, 0).Err())
	}
	if tc.reply != "" {
		addr := redistest.Fake(t, map[string]string{"evalsha": tc.reply, "eval": tc.reply})
		e.client = newClient(t, &redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	}
	return e
}

// Redis errors that are not about the network, and replies of the wrong
// shape, are failures too: decided by the policy, never a panic.
func TestBadReplies(t *testing.T) {
	t.Parallel()
	for _, tc := range badReplies {
		for _, p := range policyCases {
			t.Run(tc.name+"/"+p.name, func(t *testing.T) {
				h := &errorLog{}
				l := tc.env(t).limiter(p.with(ratelimit.WithErrorHandler(h.handle))...)
				limit := ratelimit.PerSecond(10)
				res, err := l.Allow(context.Background(), "id", limit)
				redisErr := requireDegraded(t, p, "id", limit, res, err, h)
				if tc.want != nil {
					require.ErrorIs(t, redisErr, tc.want)
				}
				require.ErrorContains(t, redisErr, tc.says)
			})
		}
	}
}

// The circuit breaker counts only what says Redis cannot serve: many
// decisions in a row failed by a reply of the wrong shape or a stored value
// that is not a count leave it closed, while as many BUSY or LOADING
// replies open it.
func TestBadRepliesAndTheBreaker(t *testing.T) {
	t.Parallel()
	const threshold = ratelimit.DefaultBreakerFailures
	for _, tc := range badReplies {
		t.Run(tc.name, func(t *testing.T) {
			h := &errorLog{}
			// A cooldown that cannot pass within the test: an open breaker
			// stays open.
			l := tc.env(t).limiter(ratelimit.WithErrorHandler(h.handle), ratelimit.WithCircuitBreaker(threshold, time.Hour))
			for range 3 * threshold {
				res, err := l.Allow(context.Background(), "id", ratelimit.PerSecond(10))
				require.NoError(t, err) // FailOpen
				require.True(t, res.Degraded)
			}
			errs := h.all()
			require.Len(t, errs, 3*threshold)
			require.Equal(t, tc.unavailable, l.Stats().BreakerOpen)
			if tc.unavailable {
				for _, err := range errs[:threshold] {
					require.NotErrorIs(t, err, ratelimit.ErrCircuitOpen)
				}
				for _, err := range errs[threshold:] {
					require.ErrorIs(t, err, ratelimit.ErrCircuitOpen)
				}
				return
			}
			for _, err := range errs {
				require.ErrorIs(t, err, tc.want, "every decision tried Redis")
			}
		})
	}
}

// One client's corrupted key does not open the breaker for everyone: with
// "not a number" under the current window's key of one id, 50 decisions in
// a row for it go to the policy, each with ErrBadReply for the error
// handler, and a decision for another id is still made by Redis, under
// every policy.
func TestCorruptedKeyKeepsBreakerClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limit := ratelimit.PerMinute(100)
	for _, b := range singleServers(t) {
		for _, p := range policyCases {
			t.Run(b.name+"/"+p.name, func(t *testing.T) {
				e := b.mk(t)
				require.NoError(t, e.client.Set(ctx, e.key("bad", time.Minute, e.windowIndex(time.Minute)), "not a number", 0).Err())
				h := &errorLog{}
				// The default threshold, and a cooldown that cannot pass
				// within the test: an open breaker stays open. The policy's
				// own options come after, for the entry without a breaker.
				opts := append([]ratelimit.Option{
					ratelimit.WithCircuitBreaker(ratelimit.DefaultBreakerFailures, time.Hour),
				}, p.with(ratelimit.WithErrorHandler(h.handle))...)
				l := e.limiter(opts...)
				for i := range 50 {
					res, err := l.Allow(ctx, "bad", limit)
					require.NoError(t, p.degraded(limit, res, err), "decision %d", i)
				}
				require.False(t, l.Stats().BreakerOpen, "one id's bad key opened the breaker")
				errs := h.all()
				require.Len(t, errs, 50)
				for _, err := range errs {
					require.ErrorIs(t, err, ratelimit.ErrBadReply)
				}
				require.Equal(t, slices.Repeat([]string{"bad"}, 50), h.seen())

				res, err := l.Allow(ctx, "good", limit)
				require.NoError(t, err)
				require.False(t, res.Degraded, "the breaker opened for everyone")
				require.True(t, res.Allowed)
				require.Equal(t, int64(1), res.Count)
				require.Len(t, h.all(), 50, "no error for the other id")
				require.Equal(t, "not a number", e.client.Get(ctx, e.key("bad", time.Minute, e.windowIndex(time.Minute))).Val(),
					"the bad value is left as it is")
			})
		}
	}
}

// A refused connection: with one dial attempt, go-redis gives up at once,
// and FailClosed returns well within the Limiter's timeout with an error
// that says why. With go-redis's default dial retries (5, 100ms apart) the
// command outlasts the Limiter's timeout, and the error names both the
// timeout and the last dial error (dial.go).
func TestConnectionRefused(t *testing.T) {
	t.Parallel()
	addr := deadAddr(t)
	limit := ratelimit.PerSecond(10)
	decide := func(t *testing.T, opt *redis.Options, timeout time.Duration) (time.Duration, error) {
		t.Helper()
		h := &errorLog{}
		l := ratelimit.New(newClient(t, opt), ratelimit.WithFailurePolicy(ratelimit.FailClosed),
			ratelimit.WithTimeout(timeout), ratelimit.WithErrorHandler(h.handle))
		start := time.Now()
		res, err := l.Allow(context.Background(), "id", limit)
		elapsed := time.Since(start)
		require.NoError(t, failClosed(limit, res, err))
		require.Len(t, h.all(), 1)
		require.ErrorIs(t, err, h.all()[0])
		return elapsed, err
	}
	for _, ctxAware := range []bool{true, false} {
		t.Run(fmt.Sprintf("DialerRetries=1/ContextTimeoutEnabled=%v", ctxAware), func(t *testing.T) {
			const timeout = 2 * time.Second
			elapsed, err := decide(t, &redis.Options{Addr: addr, DialerRetries: 1, ContextTimeoutEnabled: ctxAware}, timeout)
			require.Less(t, elapsed, timeout/2, "FailClosed waited for the timeout on a refused connection")
			require.ErrorIs(t, err, syscall.ECONNREFUSED)
			require.ErrorContains(t, err, "connection refused")
			require.NotContains(t, err.Error(), "no reply within")
		})
		t.Run(fmt.Sprintf("DefaultDialerRetries/ContextTimeoutEnabled=%v", ctxAware), func(t *testing.T) {
			// Far below the 400ms that go-redis's five tries take at least,
			// and long enough for the first try to fail on a loaded machine.
			const timeout = 250 * time.Millisecond
			elapsed, err := decide(t, &redis.Options{Addr: addr, ContextTimeoutEnabled: ctxAware}, timeout)
			require.GreaterOrEqual(t, elapsed, timeout)
			require.ErrorContains(t, err, "no reply within 250ms")
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.ErrorContains(t, err, "last dial error")
			require.ErrorIs(t, err, syscall.ECONNREFUSED, "the last dial error is wrapped")
			require.ErrorContains(t, err, "connection refused")
		})
	}
}

// On a Cluster too, a timeout names the master and quotes its last dial
// error, and that master's alone: go-redis dials through each node's own
// client, which the Limiter hooks as it meets them.
func TestConnectionRefusedCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterWithReplicas(t, 3, 0)
	addrs := c.Addrs()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	e := env{client: cc, clock: clock.NewFake(epoch), prefix: t.Name()}
	limit := ratelimit.PerSecond(10)
	// an id on each master, found before one dies
	onMaster := map[string]string{}
	for i := 0; len(onMaster) < len(addrs); i++ {
		id := fmt.Sprint("id-", i)
		node, err := cc.MasterForKey(context.Background(), e.key(id, time.Second, e.windowIndex(time.Second)))
		require.NoError(t, err)
		onMaster[node.Options().Addr] = id
	}
	l := ratelimit.New(cc, ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix(e.prefix), ratelimit.WithTimeout(250*time.Millisecond),
		ratelimit.WithFailurePolicy(ratelimit.FailClosed), ratelimit.WithCircuitBreaker(0, 0), ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	for _, id := range onMaster { // the nodes the Limiter will use
		_, err := l.Allow(context.Background(), id, limit)
		require.NoError(t, err)
	}
	victim := c.Masters()[0].Addr
	c.Masters()[0].Stop()
	_, err := l.Allow(context.Background(), onMaster[victim], limit)
	require.ErrorContains(t, err, "no reply within 250ms from "+victim)
	require.ErrorContains(t, err, "last dial error")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	for addr, id := range onMaster {
		if addr == victim {
			continue
		}
		res, err := l.Allow(context.Background(), id, limit)
		require.NoError(t, err, "a live master's id")
		require.False(t, res.Degraded)
	}
}

// A call whose caller left, on a client that ignores ctx deadlines
// (go-redis's default), goes on until its reply comes, within the Limiter's
// timeout. That late reply must reach nothing the callers still use: not
// the requests of the decisions made meanwhile, nor the next batch's.
// Redis hangs while callers whose deadlines are shorter than the
// Limiter's timeout leave, batched and not, then answers every script it
// was sent; each caller gets its ctx's error, and under -race the detector
// sees the late replies' goroutines read the slice of requests that the
// next batch would have reused. (A call whose caller waits for the
// Limiter's timeout is no late one: its socket's deadline ends it; see
// TestSilentServerManyCallers.)
func TestLateRepliesReachNoDecision(t *testing.T) {
	const timeout, deadline = 10 * time.Second, 50 * time.Millisecond
	srv := redistest.Start(t)
	limit := ratelimit.PerMinute(1000)
	ids := []string{"a", "b", "c", "d"}
	proxy := redistest.StartProxy(t, srv.Addr)
	client := newClient(t, &redis.Options{Addr: proxy.Addr, MaxRetries: -1})
	l := ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(timeout),
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	res, err := l.Allow(context.Background(), "warm-up", limit) // the server has the script
	require.NoError(t, err)
	require.False(t, res.Degraded)
	require.Eventually(t, func() bool { return watchGoroutines() == 0 }, 10*time.Second, time.Millisecond,
		"goroutines of earlier calls have ended")

	proxy.Hang()
	var failed firstError
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 4 {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				_, err := l.Allow(ctx, ids[(g+i)%len(ids)], limit)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					failed.report(fmt.Errorf("a caller that left got %v, not its ctx's error", err))
				}
			}
		})
	}
	wg.Wait()
	left := watchGoroutines()
	proxy.Resume() // the late replies come now
	require.Eventually(t, func() bool { return watchGoroutines() == 0 }, 10*time.Second, time.Millisecond,
		"the calls whose callers left end with their replies")
	require.NoError(t, failed.get())
	require.Positive(t, left, "calls went on after their callers left")
	t.Logf("%d calls outlived their callers", left)
	for _, id := range ids { // what came late reached no decision made since
		res, err := l.Peek(context.Background(), id, limit)
		require.NoError(t, err)
		require.False(t, res.Degraded)
	}
}

// With a client that stops at ctx deadlines, a batch's call can outlast the
// decisions it carries: each caller waits until its own deadline, the call
// until its own, later. A reply that comes in between must not reach the
// requests in which FailLocal decides meanwhile. The reply comes from a
// timer, so that nothing the callers do orders it for the race detector,
// which saw such a write here (on a loaded machine, not on every run)
// before FailLocal decided in requests of its own.
func TestBatchReplyAfterItsCallersLeft(t *testing.T) {
	const timeout = 200 * time.Millisecond
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	client := newClient(t, &redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	i := slices.IndexFunc(policyCases, func(p policyCase) bool { return p.policy == ratelimit.FailLocal })
	p := policyCases[i]
	limit := ratelimit.PerMinute(1000)
	l := ratelimit.New(client, p.with(ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(timeout),
		ratelimit.WithCircuitBreaker(0, 0), ratelimit.WithErrorHandler(func(context.Context, string, error) {}))...)
	res, err := l.Allow(context.Background(), "warm-up", limit) // the server has the script
	require.NoError(t, err)
	require.False(t, res.Degraded)

	proxy.Hang()
	resume := time.AfterFunc(timeout*3/2, proxy.Resume)
	defer resume.Stop()
	var failed firstError
	var wg sync.WaitGroup
	for i := range 2 + 8 { // two calls in flight, then a batch of eight behind them
		wg.Go(func() {
			res, err := l.Allow(context.Background(), fmt.Sprint("id-", i), limit)
			failed.report(p.degraded(limit, res, err))
		})
	}
	wg.Wait()
	require.NoError(t, failed.get())
	require.Eventually(t, func() bool { return goroutinesIn("github.com/slidingwindow/ratelimit.(*batcher).flush") == 0 },
		10*time.Second, time.Millisecond, "the batch's call ends")
}

// isTimeout reports whether err says that a reply did not come in time: the
// ctx's deadline, or a client's read deadline set to it.
func isTimeout(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout()
}
