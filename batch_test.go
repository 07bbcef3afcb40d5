package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// Many goroutines deciding for a few ids at once, with batching: each id
// gets exactly its rate, every count from 1 to the rate is handed out once
// (so the requests of one call saw each other's writes, in order), and
// Redis ran far fewer script calls than there were decisions.
func TestBatchingUnderLoad(t *testing.T) {
	// Not parallel: how many decisions share a call depends on how many
	// arrive together, which other tests' load would change.
	mk := serverEnv(t)
	for _, ctxAware := range []bool{true, false} {
		t.Run(fmt.Sprint("ContextTimeoutEnabled=", ctxAware), func(t *testing.T) {
			e := mk(t)
			e.client = newClient(t, &redis.Options{Addr: e.client.(*redis.Client).Options().Addr, ContextTimeoutEnabled: ctxAware})
			testBatchingUnderLoad(t, e)
		})
	}
}

func testBatchingUnderLoad(t *testing.T, e env) {
	ctx := context.Background()
	before := evalshaCalls(t, e)
	l := e.limiter(ratelimit.WithBatching(64))
	ids := []string{"a", "b", "{c}", "d"}
	rates := map[string]int64{"a": 100, "b": 37, "{c}": 250, "d": 1}
	var mu sync.Mutex
	seen := map[string]map[int64]int{}
	var wg sync.WaitGroup
	var failed firstError
	const goroutines, each = 64, 20
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				id := ids[(g+i)%len(ids)]
				res, err := l.Allow(ctx, id, ratelimit.PerMinute(rates[id]))
				if err != nil || res.Degraded {
					failed.report(fmt.Errorf("Allow: %v, degraded %v", err, res.Degraded))
					return
				}
				if res.Allowed {
					mu.Lock()
					if seen[id] == nil {
						seen[id] = map[int64]int{}
					}
					seen[id][res.Count]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, failed.get())
	for _, id := range ids {
		require.Len(t, seen[id], int(rates[id]), id)
		for n := int64(1); n <= rates[id]; n++ {
			require.Equal(t, 1, seen[id][n], "%s count %d", id, n)
		}
	}
	calls := evalshaCalls(t, e) - before
	t.Logf("%d decisions in %d script calls", goroutines*each, calls)
	require.Less(t, calls, int64(goroutines*each/2), "requests were not batched")
}

// evalshaCalls returns how many EVALSHA and EVAL calls the server has run.
func evalshaCalls(t *testing.T, e env) int64 {
	t.Helper()
	calls, _, err := scriptStats(e.client)
	require.NoError(t, err)
	return int64(calls)
}

// A caller whose ctx is done gets its ctx's error, and its request is not
// sent.
func TestBatchingCallerGivesUp(t *testing.T) {
	t.Parallel()
	e := serverEnv(t)(t)
	l := e.limiter(ratelimit.WithBatching(64))
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.Allow(done, "id", ratelimit.PerSecond(5))
	require.ErrorIs(t, err, context.Canceled)
	res, err := l.Allow(context.Background(), "id", ratelimit.PerSecond(5))
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Count, "the canceled request was not sent")
}

// The goroutine that sends batches ends when no request waits: after a
// burst of concurrent decisions and the client's Close, nothing the Limiter
// started is left running.
func TestBatchingLeavesNoGoroutine(t *testing.T) {
	addr := redistest.Start(t).Addr
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer client.Close()
	l := ratelimit.New(client, ratelimit.WithBatching(64), ratelimit.WithTimeout(time.Minute))
	var wg sync.WaitGroup
	var failed firstError
	for range 64 {
		wg.Go(func() {
			for range 10 {
				if _, err := l.Allow(context.Background(), "id", ratelimit.PerMinute(1000)); err != nil {
					failed.report(err)
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, failed.get())
}
