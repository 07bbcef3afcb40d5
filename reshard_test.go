package ratelimit_test

import (
	"context"
	"fmt"
	"os/exec"
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

// A live resharding fails no decision. While redis-cli moves 1,500 slots
// from one master to another and back, 8 goroutines decide ids whose keys
// are all in those slots, under FailClosed: every decision is made by Redis
// (none Degraded, none an error), and each id's count is what it was
// admitted, at most its rate.
//
// Each decision reads two keys of one slot, the current window's and the
// previous one's, which exists (it holds 0) for every id: while its slot
// migrates, a decision whose current key does not exist yet, or whose keys
// MIGRATE has split between the two masters, is answered TRYAGAIN, by the
// source or, after ASK, by the target. The script did not run; the Limiter
// sends it again after a short pause, within its timeout.
//
// The cluster is the test's own: resharding the shared one would move the
// keys of the tests that run beside this one.
func TestClusterReshardingUnderLoad(t *testing.T) {
	long(t)
	t.Parallel()
	const (
		moving     = 1500 // slots, from the source's lowest
		ids        = 3000 // each with its keys in the moving slots
		fresh      = ids / 2
		goroutines = 8
		maxEach    = 200_000 // decisions a goroutine makes at most, should the CLI hang
		rate       = 20
	)
	cli := redistest.Require(t, redistest.CLIProgram())
	addrs := redistest.StartCluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	ctx := context.Background()
	e := env{client: cc, clock: clock.NewFake(epoch.Add(30 * time.Minute)), prefix: t.Name()}
	limit := ratelimit.PerHour(rate) // the clock stands still: one window, at most rate admitted per id
	tryAgains := &replyCounter{code: "TRYAGAIN"}
	cc.AddHook(tryAgains)
	l := ratelimit.New(cc, ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix(e.prefix),
		ratelimit.WithFailurePolicy(ratelimit.FailClosed),
		ratelimit.WithTimeout(time.Second), // the default 100ms, with room for a loaded machine
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))

	// The source serves slot 0; redis-cli takes the slots it moves from a
	// source's lowest.
	//lint:ignore SA1019 go-redis routes by CLUSTER SLOTS: the view the Limiter's client has
	ranges, err := cc.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	var src, dst string
	srcAddr := ""
	var srcSlots []int
	for _, r := range ranges {
		if r.Start == 0 {
			src, srcAddr = r.Nodes[0].ID, r.Nodes[0].Addr
		}
	}
	for _, r := range ranges {
		if r.Nodes[0].ID == src {
			for s := r.Start; s <= r.End; s++ {
				srcSlots = append(srcSlots, s)
			}
		} else if dst == "" {
			dst = r.Nodes[0].ID
		}
	}
	require.NotEmpty(t, src, "no master serves slot 0")
	require.NotEmpty(t, dst, "no second master")
	require.GreaterOrEqual(t, len(srcSlots), moving)
	movingSlot := map[int64]bool{}
	for _, s := range srcSlots[:moving] {
		movingSlot[int64(s)] = true
	}

	// ids whose keys are in the moving slots, each with its previous
	// window's key, and half of them with their current one.
	node := redis.NewClient(&redis.Options{Addr: srcAddr})
	t.Cleanup(func() { _ = node.Close() })
	cur := e.windowIndex(limit.Window)
	var chosen []string
	for batch := 0; len(chosen) < ids; batch++ {
		require.Less(t, batch, 100, "too few ids in the moving slots")
		pipe := node.Pipeline()
		cands := make([]string, 2000)
		slots := make([]*redis.IntCmd, len(cands))
		for i := range cands {
			cands[i] = fmt.Sprint("id-", batch*len(cands)+i)
			slots[i] = pipe.ClusterKeySlot(ctx, e.key(cands[i], limit.Window, cur))
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
		for i, s := range slots {
			if movingSlot[s.Val()] && len(chosen) < ids {
				chosen = append(chosen, cands[i])
			}
		}
	}
	pipe := cc.Pipeline()
	for _, id := range chosen {
		pipe.Set(ctx, e.key(id, limit.Window, cur-1), 0, time.Hour)
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	admitted := make([]int64, ids) // by index in chosen
	for i, id := range chosen[fresh:] {
		res, err := l.Allow(ctx, id, limit)
		require.NoError(t, err)
		require.True(t, res.Allowed, id)
		admitted[fresh+i]++
	}

	// The load runs until both reshardings are done.
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var made int
	var failed []string
	for g := range goroutines {
		wg.Go(func() {
			mine := make([]int64, ids)
			n := 0
			var errs []string
			defer func() {
				mu.Lock()
				defer mu.Unlock()
				made += n
				failed = append(failed, errs...)
				for i, a := range mine {
					admitted[i] += a
				}
			}()
			for i := g; n < maxEach; i += goroutines {
				select {
				case <-done:
					return
				default:
				}
				k := i % ids
				res, err := l.Allow(ctx, chosen[k], limit)
				n++
				switch {
				case err != nil || res.Degraded:
					errs = append(errs, fmt.Sprintf("%s: degraded %v: %v", chosen[k], res.Degraded, err))
				case res.Allowed:
					mine[k]++
				}
			}
		})
	}
	started := time.Now()
	reshard := func(from, to string) {
		out, err := exec.Command(cli, "--cluster", "reshard", srcAddr, "--cluster-from", from, "--cluster-to", to,
			"--cluster-slots", fmt.Sprint(moving), "--cluster-pipeline", "1", "--cluster-yes").CombinedOutput()
		if err != nil {
			close(done)
			wg.Wait()
			t.Fatalf("%s --cluster reshard: %v\n%s", cli, err, out)
		}
	}
	reshard(src, dst)
	there := time.Since(started)
	reshard(dst, src)
	back := time.Since(started) - there
	close(done)
	wg.Wait()
	t.Logf("%d decisions in %v; %d slots moved in %v and back in %v; %d script calls answered TRYAGAIN; %d decisions failed",
		made, time.Since(started).Round(time.Millisecond), moving, there.Round(time.Millisecond), back.Round(time.Millisecond),
		tryAgains.n.Load(), len(failed))

	kinds := map[string]int{}
	for _, f := range failed {
		kinds[replyCode(f)]++
	}
	for i, f := range failed {
		if i == 5 {
			break
		}
		t.Errorf("a decision failed: %s", f)
	}
	require.Zero(t, len(failed), "decisions failed, by kind: %v", kinds)
	require.NotZero(t, tryAgains.n.Load(), "no call met TRYAGAIN: the test did not test the retry")
	for i, id := range chosen {
		require.LessOrEqual(t, admitted[i], int64(rate), "%s admitted past its limit", id)
		got, err := cc.Get(ctx, e.key(id, limit.Window, cur)).Int64()
		require.NoError(t, err, id)
		require.Equal(t, admitted[i], got, "%s: its count is not what it was admitted", id)
	}
}

// replyCode returns the Redis error code a failed decision's message names
// (TRYAGAIN, CLUSTERDOWN, ...), or the message when it names none.
func replyCode(msg string) string {
	for _, code := range []string{"TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "LOADING", "NOSCRIPT", "non local key", "deadline"} {
		if strings.Contains(msg, code) {
			return code
		}
	}
	return msg
}

// A replyCounter counts the commands a Cluster client's callers saw fail
// with an error reply of code.
type replyCounter struct {
	code string
	n    atomic.Int64
}

func (h *replyCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *replyCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *replyCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if redis.HasErrorPrefix(err, h.code) {
			h.n.Add(1)
		}
		return err
	}
}

// A script call answered TRYAGAIN goes again after a pause, as long as the
// Limiter's timeout leaves time for it, and is counted once; the replies
// that say the script did not run but last longer than a timeout, and every
// other error, go to the policy at once. A reply that never changes fails
// the decision before its timeout ends, for the policy to decide.
func TestTryAgainIsSentAgain(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	for _, tc := range []struct {
		name    string
		reply   string
		fails   int // calls answered reply, then Redis's own answers
		timeout time.Duration
		allowed bool
		calls   int // script calls made: 0 for at least 2
	}{
		// the third EVALSHA meets NOSCRIPT (a new server), and EVAL follows
		{"TRYAGAIN twice", "TRYAGAIN Multiple keys request during rehashing of slot", 2, timeout, true, 4},
		{"TRYAGAIN throughout", "TRYAGAIN Multiple keys request during rehashing of slot", 1 << 30, timeout, false, 0},
		{"TRYAGAIN throughout, no timeout", "TRYAGAIN Multiple keys request during rehashing of slot", 1 << 30, 0, false, 0},
		{"CLUSTERDOWN", "CLUSTERDOWN The cluster is down", 1, timeout, false, 1},
		{"LOADING", "LOADING Redis is loading the dataset in memory", 1, timeout, false, 1},
		{"BUSY", "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", 1, timeout, false, 1},
		{"MASTERDOWN", "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", 1, timeout, false, 1},
		{"READONLY", "READONLY You can't write against a read only replica.", 1, timeout, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mr := miniredis.RunT(t)
			rc := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rc.Close() })
			h := &refusingHook{reply: serverReply(tc.reply), fails: tc.fails}
			rc.AddHook(h)
			l := ratelimit.New(rc, ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(tc.timeout),
				ratelimit.WithFailurePolicy(ratelimit.FailClosed), ratelimit.WithCircuitBreaker(0, 0),
				ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
			limit := ratelimit.PerMinute(10)

			start := time.Now()
			res, err := l.Allow(context.Background(), "id", limit)
			took := time.Since(start)
			require.Equal(t, tc.allowed, res.Allowed)
			require.Equal(t, !tc.allowed, res.Degraded)
			calls := h.made()
			if tc.calls > 0 {
				require.Equal(t, tc.calls, calls, "script calls")
			} else {
				require.GreaterOrEqual(t, calls, 2, "script calls")
			}
			if tc.allowed {
				require.NoError(t, err)
				peek, err := l.Peek(context.Background(), "id", limit)
				require.NoError(t, err)
				require.Equal(t, int64(1), peek.Count, "counted once")
				return
			}
			require.ErrorIs(t, err, ratelimit.ErrUnavailable)
			require.ErrorContains(t, err, strings.Fields(tc.reply)[0])
			if tc.timeout > 0 {
				// The last call is sent with half the time left, at
				// most; a loaded machine may answer it late.
				require.Less(t, took, tc.timeout+time.Second, "a retry outlived the timeout")
			}
		})
	}
}

// A refusingHook answers the first fails script calls with reply, without
// sending them, as a Redis that did not run the script does.
type refusingHook struct {
	reply serverReply
	mu    sync.Mutex
	fails int
	calls int
}

func (h *refusingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *refusingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *refusingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		h.calls++
		refuse := h.fails > 0
		h.fails--
		h.mu.Unlock()
		if refuse {
			cmd.SetErr(h.reply)
			return h.reply
		}
		return next(ctx, cmd)
	}
}

// made returns how many script calls the hook saw.
func (h *refusingHook) made() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

// serverReply is an error reply of a Redis server, as go-redis gives one.
type serverReply string

func (e serverReply) Error() string { return string(e) }

// RedisError marks serverReply as a reply of the server (redis.Error).
func (serverReply) RedisError() {}
