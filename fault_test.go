package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// Fault injection against real servers: replies lost after the script ran,
// a server killed under load and restarted, the script cache flushed under
// load, a server that never answers, and many application servers at once.

// A reply lost after the script ran is a failure for the policy, never a
// second run: go-redis, with its default three retries, would otherwise
// send the script again on a new connection and count the request twice.
func TestLostReplyIsNotRetried(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	limit := ratelimit.PerHour(10)
	for _, p := range policyCases {
		t.Run(p.name, func(t *testing.T) {
			proxy := redistest.StartProxy(t, srv.Addr)
			client := newClient(t, &redis.Options{Addr: proxy.Addr}) // default options: MaxRetries 3
			e := env{client: client, clock: clock.NewFake(epoch), prefix: t.Name()}
			h := &errorLog{}
			l := e.limiter(p.with(ratelimit.WithErrorHandler(h.handle))...)

			// Another id first, so that the server has the script and the
			// EVALSHA whose reply is lost runs it.
			res, err := l.Allow(ctx, "warm-up", limit)
			require.NoError(t, err)
			require.False(t, res.Degraded)
			sent := proxy.Commands("evalsha")

			proxy.DropNextReply("evalsha")
			res, err = l.Allow(ctx, "id", limit)
			require.NoError(t, p.degraded(limit, res, err))
			require.Equal(t, 1, proxy.Commands("evalsha")-sent, "the script was sent once")
			require.Equal(t, int64(1), e.get(t, "id", time.Hour, e.windowIndex(time.Hour)),
				"the script ran once and counted the request once")
			errs := h.all()
			require.Len(t, errs, 1)
			require.ErrorIs(t, errs[0], io.EOF, "the handler saw the connection end")

			res, err = l.Allow(ctx, "id", limit)
			require.NoError(t, err)
			require.False(t, res.Degraded)
			require.Equal(t, int64(2), res.Count)

			// Two limits go in the script's long form, a command of
			// another kind: not sent twice either.
			sent = proxy.Commands("evalsha")
			proxy.DropNextReply("evalsha")
			both := []ratelimit.Limit{limit, ratelimit.PerMinute(10)}
			all, err := l.AllowAll(ctx, "both", both, 1)
			require.Len(t, all, 2)
			require.NoError(t, p.degraded(limit, all[0], err))
			require.Equal(t, 1, proxy.Commands("evalsha")-sent, "the long form was sent once")
			require.Equal(t, int64(1), e.get(t, "both", time.Hour, e.windowIndex(time.Hour)),
				"the long form ran once and counted the request once")
		})
	}

	// The danger the limiter avoids: go-redis's own Script.Run, through the
	// same proxy, sends the EVALSHA again after the lost reply, and the
	// script's INCR runs twice for one call.
	t.Run("ScriptRunCountsTwice", func(t *testing.T) {
		proxy := redistest.StartProxy(t, srv.Addr)
		client := newClient(t, &redis.Options{Addr: proxy.Addr})
		incr := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
		require.NoError(t, incr.Load(ctx, client).Err())
		key := t.Name()

		proxy.DropNextReply("evalsha")
		n, err := incr.Run(ctx, client, []string{key}).Int64()
		require.NoError(t, err, "go-redis hid the lost reply by sending the script again")
		require.Equal(t, int64(2), n, "one call, two increments")
		require.Equal(t, 2, proxy.Commands("evalsha"))
		stored, err := srv.Client(t).Get(ctx, key).Int64()
		require.NoError(t, err)
		require.Equal(t, int64(2), stored)
	})
}

// faultCall is one decision made under load: when it started and ended
// relative to the outage, what it decided, and the Redis error the handler
// was given for it, if any.
type faultCall struct {
	id                   string
	startPhase, endPhase int32
	start, end           time.Time
	res                  ratelimit.Result
	err, redisErr        error
}

// The phases of TestRedisKilledUnderLoad, as a call sees them when it
// starts and when it ends.
const (
	phaseUp         int32 = iota // the first server is up, or being killed
	phaseDown                    // the server is dead: no process listens
	phaseRestarting              // a new server starts on the same port
	phaseRecovering              // the new server answers; clients and Limiters come back
)

// redisErrKey carries, in a call's ctx, where the error handler puts the
// Redis error of that call.
type redisErrKey struct{}

// Four application servers, each with its own client and Limiter, hammer
// one hot id and a few others; the server is killed mid-load and, after a
// fixed number of decisions, a new empty one starts on the same port. The
// clock never moves: every decision falls in one window.
func TestRedisKilledUnderLoad(t *testing.T) {
	long(t)
	t.Parallel()
	for _, p := range policyCases {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel() // each with a server of its own
			testKilledUnderLoad(t, p)
		})
	}
}

func testKilledUnderLoad(t *testing.T, p policyCase) {
	const (
		appServers = 4
		workers    = 16 // goroutines per application server
		// The Limiter's timeout: long enough that, once the server is
		// back, a loaded machine under -race seldom needs more.
		timeout    = 200 * time.Millisecond
		beforeKill = 400  // decisions before the kill
		duringDown = 2000 // decisions started while no server runs
		cleanRun   = 1200 // decisions in a row that must succeed after the restart
		// recoveryBound bounds how long after the new server answers the
		// last decision fails: go-redis's pool probes a dial once a second
		// after a run of failed dials, and a circuit breaker may wait its
		// cooldown on top.
		recoveryBound = 5 * time.Second
	)
	limits := map[string]ratelimit.Limit{
		"hot": ratelimit.PerHour(100),
		"a":   ratelimit.PerHour(20),
		"b":   ratelimit.PerHour(20),
		"c":   ratelimit.PerHour(20),
	}
	ids := []string{"hot", "a", "hot", "b", "hot", "c", "hot", "hot"}

	srv := redistest.Start(t)
	clk := clock.NewFake(epoch)
	var (
		phase   atomic.Int32
		started [4]atomic.Int64 // calls started, by phase
		clean   atomic.Int64    // calls in a row since the restart that did not fail fast
		handled atomic.Int64
		mu      sync.Mutex
		calls   []faultCall
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for range appServers {
		client := newClient(t, &redis.Options{Addr: srv.Addr})
		l := ratelimit.New(client, p.with(
			ratelimit.WithClock(clk.Now), ratelimit.WithPrefix("killed"), ratelimit.WithTimeout(timeout),
			ratelimit.WithErrorHandler(func(ctx context.Context, _ string, err error) {
				handled.Add(1)
				if slot, ok := ctx.Value(redisErrKey{}).(*error); ok {
					*slot = err
				}
			}))...)
		for w := range workers {
			wg.Go(func() {
				var mine []faultCall
				defer func() {
					mu.Lock()
					calls = append(calls, mine...)
					mu.Unlock()
				}()
				for n := w; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					id := ids[n%len(ids)]
					c := faultCall{id: id, startPhase: phase.Load()}
					started[c.startPhase].Add(1)
					ctx := context.WithValue(context.Background(), redisErrKey{}, &c.redisErr)
					c.start = time.Now()
					c.res, c.err = l.Allow(ctx, id, limits[id])
					c.end = time.Now()
					c.endPhase = phase.Load()
					if c.startPhase == phaseRecovering {
						if c.failedFast() {
							clean.Store(0)
						} else {
							clean.Add(1)
						}
					}
					mine = append(mine, c)
					// At most one request a millisecond per goroutine, as
					// from traffic: a failure answered in microseconds
					// would otherwise spin, starve the decisions that probe
					// the recovered server, and pile up records.
					time.Sleep(time.Millisecond)
				}
			})
		}
	}
	// waitFor waits for the workers to get as far as cond says, or fails.
	waitFor := func(what string, cond func() bool) {
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("%s: not reached in 30s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor("decisions before the kill", func() bool { return started[phaseUp].Load() >= beforeKill })
	srv.Stop()
	phase.Store(phaseDown)
	waitFor("decisions during the outage", func() bool { return started[phaseDown].Load() >= duringDown })
	phase.Store(phaseRestarting)
	srv.Restart(t)
	restarted := time.Now()
	phase.Store(phaseRecovering)
	waitFor("a run of good decisions after the restart", func() bool { return clean.Load() >= cleanRun })
	close(stop)
	wg.Wait()

	// Sort the decisions out first and log the figures, then check them.
	var (
		outage         []time.Duration
		outageAllowed  int
		outageDenied   int
		outageWrong    []string // decisions in the outage that break the policy
		degraded       int64
		policyWrong    []string // degraded decisions that break the policy
		deniedWrong    []string
		recovered      = restarted            // when the last decision that failed fast ended
		firstServer    = map[string][]int64{} // by id: counts the first server handed out
		newServer      = map[string][]int64{} // by id: counts the new server handed out
		eitherServer   = map[string][]int64{} // by id: counts of calls that spanned the restart
		degradedOnNew  = map[string]int{}     // by id: degraded decisions that may have reached the new server
		errsInOutage   = map[string]int{}
		errsRecovering = map[string]int{}
	)
	for _, c := range calls {
		// A call begun before the kill that ended once the new server
		// started may have been answered by either: one whose client kept
		// dialing through the outage reaches the new server within its
		// timeout.
		spans := c.startPhase == phaseUp && c.endPhase >= phaseRestarting
		if c.res.Degraded {
			degraded++
			if err := p.degraded(limits[c.id], c.res, c.err); err != nil {
				policyWrong = append(policyWrong, err.Error())
			}
			if c.startPhase >= phaseDown || spans {
				degradedOnNew[c.id]++
			}
		}
		switch {
		case c.startPhase == phaseDown && c.endPhase == phaseDown:
			// No server ran for the whole call: the policy decides, in time.
			outage = append(outage, c.end.Sub(c.start))
			errsInOutage[errorKind(c.redisErr)]++
			if err := p.degraded(limits[c.id], c.res, c.err); err != nil {
				outageWrong = append(outageWrong, err.Error())
			}
			if c.res.Allowed {
				outageAllowed++
			} else {
				outageDenied++
			}
		case c.startPhase == phaseRecovering && c.res.Degraded:
			errsRecovering[errorKind(c.redisErr)]++
			if c.failedFast() && c.end.After(recovered) {
				recovered = c.end
			}
		}
		switch {
		case c.res.Degraded:
		case c.err != nil:
			policyWrong = append(policyWrong, "not degraded, yet "+c.err.Error())
		case !c.res.Allowed && c.res.Count != limits[c.id].Rate:
			deniedWrong = append(deniedWrong, fmt.Sprintf("%s denied at count %d", c.id, c.res.Count))
		case c.res.Allowed && spans:
			eitherServer[c.id] = append(eitherServer[c.id], c.res.Count)
		case c.res.Allowed && c.startPhase == phaseUp:
			// Begun before the kill and answered before the new server ran.
			firstServer[c.id] = append(firstServer[c.id], c.res.Count)
		case c.res.Allowed:
			newServer[c.id] = append(newServer[c.id], c.res.Count)
		}
	}
	var back, backSlow int // decisions begun after the last fast failure; those slower than the timeout
	for _, c := range calls {
		if c.start.After(recovered) {
			back++
			if c.res.Degraded {
				backSlow++
			}
		}
	}
	stored := map[string]int64{}
	for id := range limits {
		n, err := srv.Client(t).Get(context.Background(), fmt.Sprintf("killed:{%s}:%d:%d", id, time.Hour.Milliseconds(),
			clk.Now().UnixMilli()/time.Hour.Milliseconds())).Int64()
		if !errors.Is(err, redis.Nil) {
			require.NoError(t, err)
		}
		stored[id] = n
	}

	t.Logf("%s: %d decisions by %d goroutines on %d application servers: %d begun before the kill, %d while no server ran, %d during the restart, %d after",
		p.name, len(calls), appServers*workers, appServers, started[phaseUp].Load(), started[phaseDown].Load(),
		started[phaseRestarting].Load(), started[phaseRecovering].Load())
	t.Logf("%s: %d decisions wholly within the outage: %d allowed degraded, %d denied degraded; latency p50 %v, p99 %v, max %v (timeout %v); Redis errors %v",
		p.name, len(outage), outageAllowed, outageDenied, percentile(outage, 50), percentile(outage, 99), percentile(outage, 100),
		timeout, errsInOutage)
	t.Logf("%s: after the new server answered, decisions failed for %v more (Redis errors %v); then %d decisions, %d of them slower than the timeout",
		p.name, recovered.Sub(restarted).Round(time.Millisecond), errsRecovering, back, backSlow)
	t.Logf("%s: %d degraded in all, %d calls to the handler; hot admitted %d by the first server, %d (Rate %d, stored %d) by the new one, %d by either (begun before the kill, answered after the restart)",
		p.name, degraded, handled.Load(), len(firstServer["hot"]), len(newServer["hot"]), limits["hot"].Rate, stored["hot"], len(eitherServer["hot"]))

	require.GreaterOrEqual(t, len(outage), duringDown/2, "too few decisions fell wholly in the outage")
	require.Empty(t, outageWrong, "decisions during the outage that break the policy")
	requireLatencies(t, outage, timeout, p.name+": decisions during the outage")
	require.Empty(t, policyWrong)
	require.Empty(t, deniedWrong)
	require.Equal(t, degraded, handled.Load(), "every Redis error reached the handler once")
	require.Less(t, recovered.Sub(restarted), recoveryBound, "decisions kept failing after the server was back")
	require.GreaterOrEqual(t, back, cleanRun/2)
	require.LessOrEqual(t, backSlow, back/20, "once back, too many decisions were slower than the timeout")
	for id, limit := range limits {
		// Neither server handed out more than Rate, or a count twice.
		// Replies lost in the kill leave gaps in the first server's counts.
		requireDistinct(t, firstServer[id], limit.Rate, id+" on the first server")
		requireDistinct(t, newServer[id], limit.Rate, id+" on the new server")
		for _, n := range eitherServer[id] {
			// answered by one server or the other: not a count both handed out
			require.True(t, n >= 1 && n <= limit.Rate, "%s: count %d outside 1..%d", id, n, limit.Rate)
			require.False(t, slices.Contains(firstServer[id], n) && slices.Contains(newServer[id], n),
				"%s: count %d of a call that spanned the restart was handed out on both servers", id, n)
		}
		// The new server reached Rate, and each count it stored went to a
		// decision: an admission, or one the Limiter stopped waiting for
		// (degraded) after the script ran.
		require.Equal(t, limit.Rate, stored[id], "%s stored on the new server", id)
		require.LessOrEqual(t, stored[id], int64(len(newServer[id])+len(eitherServer[id])+degradedOnNew[id]),
			"%s: counts no decision accounts for", id)
	}
}

// failedFast reports whether a decision was degraded for another reason
// than Redis being slower than the timeout.
func (c faultCall) failedFast() bool {
	return c.res.Degraded && !errors.Is(c.redisErr, context.DeadlineExceeded)
}

// errorKind names an error for the log: its text, with the address of a
// failed dial left out.
func errorKind(err error) string {
	if err == nil {
		return "none"
	}
	s := err.Error()
	if i := strings.Index(s, "127.0.0.1:"); i >= 0 {
		if j := strings.IndexByte(s[i:], ' '); j >= 0 {
			s = s[:i] + "…" + s[i+j-1:]
		} else {
			s = s[:i] + "…"
		}
	}
	return s
}

// requireDistinct checks that no count was handed out twice and each lies
// in 1..rate.
func requireDistinct(t *testing.T, counts []int64, rate int64, msg string) {
	t.Helper()
	seen := map[int64]bool{}
	for _, n := range counts {
		require.True(t, n >= 1 && n <= rate, "%s: count %d outside 1..%d", msg, n, rate)
		require.False(t, seen[n], "%s: count %d handed out twice", msg, n)
		seen[n] = true
	}
}

// percentile returns the p-th percentile (nearest rank) of ds, 0 if empty.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i, 1)-1]
}

// SCRIPT FLUSH while decisions run: each EVALSHA that meets NOSCRIPT did not
// run, so the EVAL that follows counts once. No decision fails, none is
// degraded, and exactly Rate are admitted.
func TestScriptFlushUnderLoad(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		mk   newEnv
	}{
		{"RedisServer", serverEnv(t)},
		{"RedisCluster", clusterEnv(t)},
	} {
		t.Run(b.name, func(t *testing.T) {
			e := b.mk(t)
			ctx := context.Background()
			var evals atomic.Int64
			hook := onCommand("eval", func() { evals.Add(1) }, nil)
			l := ratelimit.New(hookedClient(t, e.client, hook),
				ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix(e.prefix), ratelimit.WithTimeout(time.Minute))
			limit := ratelimit.PerHour(150)

			stop := make(chan struct{})
			var flushes atomic.Int64
			var flusher sync.WaitGroup
			var failed firstError
			flusher.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := flushScripts(ctx, e.client); err != nil {
						failed.report(fmt.Errorf("SCRIPT FLUSH: %w", err))
						return
					}
					flushes.Add(1)
				}
			})
			var mu sync.Mutex
			var got []int64
			var wg sync.WaitGroup
			var decisions atomic.Int64
			for range 32 {
				wg.Go(func() {
					// Ten decisions each, and more while fewer than two
					// flushes have come between script calls: on a loaded
					// machine the flusher can wait long for a turn.
					for i := 0; i < 10 || evals.Load() < 2 && i < 1000; i++ {
						decisions.Add(1)
						res, err := l.Allow(ctx, "hot", limit)
						if err != nil || res.Degraded {
							failed.report(fmt.Errorf("Allow during SCRIPT FLUSH: %+v, %v", res, err))
							return
						}
						if res.Allowed {
							mu.Lock()
							got = append(got, res.Count)
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			close(stop)
			flusher.Wait()
			require.NoError(t, failed.get())
			require.Len(t, got, int(limit.Rate))
			requireDistinct(t, got, limit.Rate, "hot")
			require.Equal(t, limit.Rate, e.get(t, "hot", time.Hour, e.windowIndex(time.Hour)))
			require.GreaterOrEqual(t, evals.Load(), int64(2), "no flush came between two decisions")
			t.Logf("%s: %d decisions, %d SCRIPT FLUSH, %d NOSCRIPT fallbacks to EVAL", b.name, decisions.Load(), flushes.Load(), evals.Load())
		})
	}
}

// Many callers at once against a server that accepts connections and never
// answers, more than the client's pool holds, twice over: every call returns
// within the Limiter's timeout (requireLatencies), not the client's own
// (30s), under every policy, whether or not the client stops at ctx
// deadlines itself, and is decided by the policy, on its caller's
// goroutine: none is left waiting on the client.
func TestSilentServerManyCallers(t *testing.T) {
	const (
		callers = 64
		waves   = 2
		timeout = 50 * time.Millisecond
	)
	addr := redistest.Silent(t)
	limit := ratelimit.PerSecond(10)
	for _, ctxAware := range []bool{false, true} {
		for _, p := range policyCases {
			t.Run(fmt.Sprintf("%s/ContextTimeoutEnabled=%v", p.name, ctxAware), func(t *testing.T) {
				require.Eventually(t, func() bool { return watchGoroutines() == 0 }, 10*time.Second, 10*time.Millisecond,
					"goroutines left by earlier tests have ended")
				client := redis.NewClient(slowClient(addr, ctxAware))
				t.Cleanup(func() { _ = client.Close() }) // if the test fails before it closes it: the next waits for its goroutines
				var handled atomic.Int64
				l := ratelimit.New(client, p.with(ratelimit.WithTimeout(timeout),
					ratelimit.WithErrorHandler(func(context.Context, string, error) { handled.Add(1) }))...)
				var took [callers * waves]time.Duration
				var failed firstError
				for wave := range waves {
					var wg sync.WaitGroup
					for i := range callers {
						wg.Go(func() {
							begin := time.Now()
							res, err := l.Allow(context.Background(), "id", limit)
							took[wave*callers+i] = time.Since(begin)
							failed.report(p.degraded(limit, res, err))
						})
					}
					wg.Wait()
				}
				require.NoError(t, failed.get())
				requireLatencies(t, took[:], timeout, "callers of a silent server")
				require.Equal(t, int64(callers*waves), handled.Load())
				// Neither client's calls are watched: go-redis's default one's
				// go through sockets whose deadlines are the Limiter's.
				require.Zero(t, watchGoroutines(), "no goroutine waits on the client")
				require.NoError(t, client.Close())
			})
		}
	}
}

// watchGoroutines counts the goroutines the Limiter started to wait on a
// client that ignores ctx, still running: a decision's, or another
// command's.
func watchGoroutines() int {
	return goroutinesIn("github.com/slidingwindow/ratelimit/internal/transport.(*watchedCall).run") +
		goroutinesIn("github.com/slidingwindow/ratelimit/internal/transport.Watch[")
}

// goroutinesIn counts the goroutines running a function whose name starts
// with fn, at any depth of their stacks.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "\n"+fn) {
			n++
		}
	}
	return n
}

// Eight application servers × 64 goroutines on one id admit exactly Rate,
// each count 1..Rate once, on one server and on a cluster. The timeout is
// long: this is about atomicity, not speed.
func TestAtomicAcrossAppServers(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		// start starts the servers and returns how to make a client of them.
		start func(t *testing.T) func() redis.UniversalClient
	}{
		{"RedisServer", func(t *testing.T) func() redis.UniversalClient {
			addr := redistest.Start(t).Addr
			return func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addr}) }
		}},
		{"RedisCluster", func(t *testing.T) func() redis.UniversalClient {
			addrs := redistest.SharedCluster(t)
			return func() redis.UniversalClient { return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}) }
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			const appServers, workers, each = 8, 64, 2
			limit := ratelimit.PerHour(500)
			clk := clock.NewFake(epoch)
			var mu sync.Mutex
			var got []int64
			var denied atomic.Int64
			var wg sync.WaitGroup
			var failed firstError
			connect := b.start(t)
			for range appServers {
				client := connect()
				t.Cleanup(func() { _ = client.Close() })
				l := ratelimit.New(client, ratelimit.WithClock(clk.Now), ratelimit.WithTimeout(time.Minute),
					ratelimit.WithPrefix(t.Name()))
				for range workers {
					wg.Go(func() {
						for range each {
							res, err := l.Allow(context.Background(), "hot", limit)
							if err != nil || res.Degraded {
								failed.report(fmt.Errorf("Allow: %+v, %v", res, err))
								return
							}
							if !res.Allowed {
								denied.Add(1)
								continue
							}
							mu.Lock()
							got = append(got, res.Count)
							mu.Unlock()
						}
					})
				}
			}
			wg.Wait()
			require.NoError(t, failed.get())
			require.Len(t, got, int(limit.Rate))
			requireDistinct(t, got, limit.Rate, "hot")
			require.Equal(t, int64(appServers*workers*each)-limit.Rate, denied.Load())
		})
	}
}

// A request is sent only while its caller waits. Replies come 600 ms late
// and the timeout is 50 ms: 2,000 concurrent callers each return within the
// timeout (requireLatencies), decided by the policy; the requests queued
// behind the calls on the wire are sent only while their callers wait, and
// dropped once they have left. Before, a returning call sent the whole
// queue, a second after its callers had gone, and all 2,000 were counted.
// The proxy stamps each call when it forwards it, a moment after the client
// wrote it: a call that reaches it half the delay after the last caller
// returned can only have been made when a late reply came back.
func TestSlowRedisIsSentNothingLate(t *testing.T) {
	const (
		timeout = 50 * time.Millisecond
		delay   = 600 * time.Millisecond
		callers = 2000
	)
	srv := redistest.Start(t)
	for _, tc := range []struct {
		ctxAware, breaker bool
	}{{true, true}, {false, true}, {true, false}, {false, false}} {
		ctxAware := tc.ctxAware
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v/breaker=%v", tc.ctxAware, tc.breaker), func(t *testing.T) {
			proxy := redistest.StartProxy(t, srv.Addr)
			const poolSize = 64 // enough connections, warmed, that the proxy's late handshakes stop no call
			client := newClient(t, &redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: ctxAware, MaxRetries: -1, PoolSize: poolSize})
			e := env{client: srv.Client(t), clock: clock.NewFake(epoch), prefix: t.Name()}
			opts := []ratelimit.Option{ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix(e.prefix), ratelimit.WithTimeout(timeout),
				ratelimit.WithErrorHandler(func(context.Context, string, error) {})}
			if !tc.breaker { // what the breaker does not save
				opts = append(opts, ratelimit.WithCircuitBreaker(0, 0))
			}
			l := ratelimit.New(client, opts...)
			limit := ratelimit.PerMinute(10)
			// The server has the script, and the pool its connections, each
			// through its handshake: a client whose ContextTimeoutEnabled is
			// false makes a new connection's handshake in full whatever the
			// deadline (its replies are late too) and then writes the command
			// it was given, which no Limiter can take back
			// (docs/failure-modes.md). Both are ready before the Limiter's
			// first decision, which its 50 ms then bound on a loaded machine
			// by 10 times and more.
			warmPool(t, client, poolSize)
			loadScript(t, e.client)
			res, err := l.Allow(context.Background(), "warm-up", limit)
			require.NoError(t, err)
			require.False(t, res.Degraded)
			before := len(proxy.Sent("evalsha"))

			proxy.Delay(delay)
			start := make(chan struct{})
			var wg sync.WaitGroup
			var took [callers]time.Duration
			var failed firstError
			for i := range callers {
				wg.Go(func() {
					<-start
					begin := time.Now()
					res, err := l.Allow(context.Background(), fmt.Sprint("id-", i), limit)
					took[i] = time.Since(begin)
					if err != nil || !res.Degraded {
						failed.report(fmt.Errorf("%+v, %v: want a FailOpen decision", res, err))
					}
				})
			}
			close(start)
			wg.Wait()
			returned := time.Now()
			require.NoError(t, failed.get())
			requireLatencies(t, took[:], timeout, "callers of a slow Redis")

			// Nothing the Limiter started is left to send: the batch's
			// goroutine ends when its call does, and late replies come in.
			require.Eventually(t, func() bool {
				return goroutinesIn("github.com/slidingwindow/ratelimit/internal/transport.(*batcher).flush") == 0 && watchGoroutines() == 0
			}, 10*time.Second, time.Millisecond)
			proxy.Delay(0)
			sent := proxy.Sent("evalsha")[before:]
			late := 0
			for _, at := range sent {
				if at.After(returned.Add(delay / 2)) {
					late++
				}
			}
			counted := 0
			for _, key := range e.keys(t) {
				if !strings.Contains(key, "warm-up") {
					counted++
				}
			}
			t.Logf("%d callers: %d script calls, %d late, %d requests counted", callers, len(sent), late, counted)
			require.Zero(t, late, "script calls made after the callers had left")
			// Before, every request was counted: the queue was sent whole.
			require.Less(t, counted, callers, "requests counted: those of the calls made while their callers waited")
		})
	}
}
