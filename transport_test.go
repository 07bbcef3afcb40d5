package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// callSizes is a go-redis hook that records, for each script call, how
// many keys it carried, its length, and how many requests, for the calls
// that succeeded (one refused with NOSCRIPT goes again as EVAL).
type callSizes struct {
	mu                 sync.Mutex
	keys, values, reqs []int
}

func (h *callSizes) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *callSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && err == nil {
			args := cmd.Args()
			nreqs, nkeys := callShape(args)
			h.mu.Lock()
			h.keys = append(h.keys, nkeys)
			h.values = append(h.values, len(args)-3)
			h.reqs = append(h.reqs, nreqs)
			h.mu.Unlock()
		}
		return err
	}
}

func (h *callSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// No call exceeds what Redis's Lua can take: 3,000 concurrent AllowAll
// calls of MaxLimits strict limits (176 keys each) on distinct ids are all
// decided by Redis, in batched calls that each hold at most maxCallKeys keys
// and maxCallValues values, the transport's bounds. Before calls were
// bounded by keys, 64 such requests made a call of 11,264 keys, and Redis
// failed it with "too many results to unpack".
func TestLargeBatchesFitOneCall(t *testing.T) {
	const maxCallKeys, maxCallValues = 1024, 4096 // internal/transport's
	t.Parallel()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 8})
	t.Cleanup(func() { _ = client.Close() })
	hook := &callSizes{}
	client.AddHook(hook)
	l := New(client, WithTimeout(time.Minute), WithFailurePolicy(FailClosed), WithPrefix(t.Name()))
	plan := make([]Limit, MaxLimits)
	for i := range plan {
		plan[i] = Limit{Rate: 10, Window: time.Duration(i+1) * time.Second, Strict: true}
	}
	const callers = 3000
	var wg sync.WaitGroup
	var failed sync.Map
	start := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			res, err := l.AllowAll(context.Background(), fmt.Sprint("id-", i), plan, 1)
			if err != nil || res[0].Degraded || !res[0].Allowed {
				failed.Store(i, fmt.Sprintf("%+v, %v", res[0], err))
			}
		})
	}
	close(start)
	wg.Wait()
	failed.Range(func(k, v any) bool {
		t.Errorf("caller %v: %v", k, v)
		return false
	})
	hook.mu.Lock()
	defer hook.mu.Unlock()
	most, total := 0, 0
	for i, keys := range hook.keys {
		require.LessOrEqual(t, keys, maxCallKeys, "call %d", i)
		require.LessOrEqual(t, hook.values[i], maxCallValues, "call %d", i)
		most, total = max(most, hook.reqs[i]), total+hook.reqs[i]
	}
	require.Equal(t, callers, total, "every request went to Redis once")
	require.Greater(t, most, 1, "requests were batched")
	t.Logf("%d callers in %d calls, at most %d requests a call", callers, len(hook.keys), most)
}

// A server that does not run Lua scripts gives an error that says so, and
// not the policy's: under FailClosed too, ErrMisconfigured.
func TestServerWithoutScripting(t *testing.T) {
	t.Parallel()
	addr := redistest.Fake(t, map[string]string{"ping": "+PONG\r\n"}) // every other command is unknown
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, Protocol: 2})
	t.Cleanup(func() { _ = client.Close() })
	l := New(client, WithFailurePolicy(FailClosed), WithTimeout(time.Minute), WithErrorHandler(func(context.Context, string, error) {}))
	_, err := l.Allow(context.Background(), "id", PerSecond(1))
	require.ErrorIs(t, err, ErrMisconfigured)
	require.ErrorContains(t, err, "does not run Lua scripts")
	require.ErrorContains(t, err, "unknown command")
	require.False(t, IsOutage(err), "a server without scripting is up: it opens no breaker")
}

// callShape returns the number of requests and keys of a script call from
// its arguments (see callArgs): in the short form, whose ARGV[3] is a TTL
// and not the long form's 0 or 1, a request of two keys per pair of keys.
func callShape(args []any) (reqs, keys int) {
	nkeys, _ := strconv.Atoi(argString(args[2]))
	if third := argString(args[5+nkeys]); third != "0" && third != "1" {
		return nkeys / 2, nkeys
	}
	reqs, _ = strconv.Atoi(argString(args[3+nkeys]))
	extra, _ := strconv.Atoi(argString(args[4+nkeys]))
	return reqs, nkeys + extra
}

// argString returns a script call's argument as go-redis writes it: callArgs
// passes numbers and keys by pointer.
func argString(a any) string {
	switch a := a.(type) {
	case *int64:
		return strconv.FormatInt(*a, 10)
	case *string:
		return *a
	}
	return fmt.Sprint(a)
}

// gatedCalls is a go-redis hook that, while armed, holds each script call
// until released, and says when a held call has ended.
type gatedCalls struct {
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
	ended   chan struct{}
}

func (g *gatedCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gatedCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); (name != "evalsha" && name != "eval") || !g.armed.Load() {
			return next(ctx, cmd)
		}
		defer func() { g.ended <- struct{}{} }()
		g.held <- struct{}{}
		<-g.release
		// as if written before its caller left: Redis answers it
		return next(context.WithoutCancel(ctx), cmd)
	}
}

func (g *gatedCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// On go-redis's default client the call of a decision whose caller's
// deadline comes before the Limiter's goes on after its caller has left, on
// a goroutine of its own (sendWatched): its late reply must reach no other
// decision. Here the call left behind reads "a" at 5; if its watchedCall
// were pooled when its caller left, a later decision would take that reply
// for its own and report a count of 6 for a new id.
func TestLeftCallReplyReachesNoOne(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	gate := &gatedCalls{held: make(chan struct{}, 1), release: make(chan struct{}), ended: make(chan struct{}, 1)}
	client.AddHook(gate)
	at := time.Unix(1_700_000_000, 0) // one window for every decision here
	l := New(client, WithTimeout(time.Minute), WithClock(func() time.Time { return at }))
	limit := PerMinute(100)
	bg := context.Background()
	for range 5 {
		res, err := l.Allow(bg, "a", limit)
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}

	gate.armed.Store(true)
	ctx, leave := context.WithTimeout(bg, 30*time.Second) // before the Limiter's minute: watched
	left := make(chan error, 1)
	go func() {
		_, err := l.Allow(ctx, "a", limit)
		left <- err
	}()
	<-gate.held
	gate.armed.Store(false)
	leave()
	require.ErrorIs(t, <-left, context.Canceled)

	res, err := l.Allow(bg, "b", limit)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Count)
	close(gate.release)
	<-gate.ended
	for i := range 200 {
		id := "c" + strconv.Itoa(i)
		res, err := l.Allow(bg, id, limit)
		require.NoError(t, err, id)
		require.Equal(t, int64(1), res.Count, "%s: another call's reply", id)
	}
	res, err = l.Peek(bg, "a", limit)
	require.NoError(t, err)
	require.Equal(t, int64(6), res.Count, "the call left behind was counted")
}
