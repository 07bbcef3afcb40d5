package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// backends are the servers a test of the script's replies runs on: the
// script on miniredis's Lua and on a real redis-server.
var backends = []struct {
	name string
	addr func(t *testing.T) string
}{
	{"miniredis", func(t *testing.T) string { return miniredis.RunT(t).Addr() }},
	{"RedisServer", func(t *testing.T) string { return redistest.Start(t).Addr }},
}

// heldCalls is a go-redis hook that holds the first hold script calls a
// client makes until release is closed, and records how many requests each
// script call carried. A held call whose ctx is done by then is not sent.
type heldCalls struct {
	hold    int
	held    chan struct{} // receives once for each call held
	release chan struct{}

	mu    sync.Mutex
	sizes []int // requests per script call, in the order they were made
}

func newHeldCalls(hold int) *heldCalls {
	return &heldCalls{hold: hold, held: make(chan struct{}, hold), release: make(chan struct{})}
}

func (h *heldCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		h.sizes = append(h.sizes, requestsOf(cmd.Args()))
		hold := len(h.sizes) <= h.hold
		h.mu.Unlock()
		if hold {
			h.held <- struct{}{}
			<-h.release
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h *heldCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// requestsOf returns how many requests a script call of args carries, when
// each is of one sliding limit, as every request these tests batch: two
// keys each, all declared, in either form.
func requestsOf(args []any) int {
	keys, _ := strconv.Atoi(fmt.Sprint(args[2]))
	return keys / 2
}

// calls returns the number of requests each script call carried.
func (h *heldCalls) calls() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.sizes)
}

// heldClient returns a client of the server at addr, with the script loaded
// so that each call is one EVALSHA, whose script calls a heldCalls holds
// (maxInFlight of them).
func heldClient(t *testing.T, addr string) (*redis.Client, *heldCalls) {
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	require.NoError(t, client.ScriptLoad(context.Background(), slidingWindow(t)).Err())
	hook := newHeldCalls(maxInFlight)
	client.AddHook(hook)
	return client, hook
}

// batchAlways has a Transport's batchers batch decisions however few are
// under way: from the few goroutines of a test, they would go alone.
func batchAlways(c *Config) { c.FewDeciding = 0 }

// outcome is what Do returned for one decision.
type outcome struct {
	replies []script.Reply
	err     error
}

// batchAfterHeld makes decisions, each of its requests, all in one script
// call: it fills the batcher's calls in flight with decisions whose script
// calls hook holds (their ctx is holdCtx), queues decisions behind them,
// then lets the held calls go, after cancelling holdCtx if cancel is not
// nil. The queued decisions then go together in the next call. It returns
// the outcomes of the queued decisions, in order, and of the held ones.
func batchAfterHeld(t *testing.T, tr *Transport, hook *heldCalls, decisions [][]*script.Request,
	holdCtx context.Context, cancel context.CancelFunc) (queued, held []outcome) {
	t.Helper()
	b := tr.one.batch
	require.NotNil(t, b, "batching is on for a *redis.Client")
	require.Zero(t, tr.few, "made with batchAlways")
	require.Equal(t, maxInFlight, hook.hold)
	type done struct {
		i int // the decision's index; -1 for a held one
		outcome
	}
	out := make(chan done, maxInFlight+len(decisions))
	start := func(ctx context.Context, i int, reqs []*script.Request) {
		go func() {
			replies := make([]script.Reply, len(reqs))
			err := tr.Do(ctx, reqs, replies)
			out <- done{i, outcome{replies, err}}
		}()
	}
	for i := range maxInFlight {
		start(holdCtx, -1, []*script.Request{oneRequest(fmt.Sprint("held-", i), 10)})
		<-hook.held // in flight, held: the next decision cannot join it
	}
	reqs := 0
	for i, d := range decisions {
		start(context.Background(), i, d)
		reqs += len(d)
	}
	require.Eventually(t, func() bool {
		waiting, _ := b.counts()
		return waiting == reqs
	}, 10*time.Second, time.Millisecond, "the decisions queue behind the held calls")
	if cancel != nil {
		cancel()
	}
	close(hook.release)
	queued = make([]outcome, len(decisions))
	for range maxInFlight + len(decisions) {
		d := <-out
		if d.i < 0 {
			held = append(held, d.outcome)
		} else {
			queued[d.i] = d.outcome
		}
	}
	// Wait for the batch's own call to be over and counted: it may outlast
	// the callers, who stop waiting at their own deadlines.
	require.Eventually(t, func() bool {
		_, sending := b.counts()
		return sending == 0
	}, 10*time.Second, time.Millisecond, "the batch's call ends")
	require.Equal(t, []int{1, 1, reqs}, hook.calls(), "requests per script call: the queued decisions went together")
	return queued, held
}

// counts returns how many requests wait in b, and how many of its calls are
// in flight.
func (b *batcher) counts() (waiting, sending int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting, b.sending
}

// decisionsOf returns a decision of one request of a limit of 10 a minute
// for each id.
func decisionsOf(ids ...string) [][]*script.Request {
	var ds [][]*script.Request
	for _, id := range ids {
		ds = append(ds, []*script.Request{oneRequest(id, 10)})
	}
	return ds
}

// While no more than FewDeciding decisions are under way, each goes alone at
// once, whatever is in flight: with FewDeciding calls held, all of them are
// in flight. One more decision then waits, and goes once they return; in a
// burst after that, decisions batch.
func TestFewDecisionsGoAlone(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	require.NoError(t, client.ScriptLoad(context.Background(), slidingWindow(t)).Err())
	hook := newHeldCalls(FewDeciding)
	client.AddHook(hook)
	tr := newTestTransport(t, client)
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hook.release) }) }) // if it fails first
	out := make(chan error, FewDeciding+1)
	decide := func(id string) {
		go func() {
			out <- tr.Do(context.Background(), []*script.Request{oneRequest(id, 10)}, make([]script.Reply, 1))
		}()
	}
	for i := range FewDeciding {
		decide(fmt.Sprint("alone-", i))
		select {
		case <-hook.held: // its call is in flight, although maxInFlight are
		case <-time.After(10 * time.Second):
			t.Fatalf("decision %d of %d was not sent at once", i+1, FewDeciding)
		}
	}
	decide("one-more")
	b := tr.one.batch
	require.Eventually(t, func() bool {
		waiting, sending := b.counts()
		return waiting == 1 && sending == FewDeciding
	}, 10*time.Second, time.Millisecond, "the decision past FewDeciding waits")
	release.Do(func() { close(hook.release) })
	for range FewDeciding + 1 {
		require.NoError(t, <-out)
	}
	want := slices.Repeat([]int{1}, FewDeciding+1)
	require.Equal(t, want, hook.calls())

	// A burst, all at once: past FewDeciding under way, decisions batch.
	const burst = 8 * FewDeciding
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			<-start
			out := make([]script.Reply, 1)
			assert.NoError(t, tr.Do(context.Background(), []*script.Request{oneRequest(fmt.Sprint("burst-", i), 10)}, out))
		})
	}
	close(start)
	wg.Wait()
	calls := hook.calls()[len(want):]
	require.Less(t, len(calls), burst, "no call carried two decisions")
	// The last call hands out its replies before it counts itself out.
	require.Eventually(t, func() bool {
		_, sending := b.counts()
		return sending == 0
	}, 10*time.Second, time.Millisecond, "the calls end")
}

// A batch that carries a request for an id whose key holds no count fails
// that request alone, with ErrBadReply: the other decisions of the call are
// made by Redis, and the breaker hears of one call that Redis answered.
func TestBatchWithBadKey(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			client, hook := heldClient(t, b.addr(t))
			tr := newTestTransport(t, client, batchAlways)
			ids := []string{"a", "b", "bad", "c", "d"}
			decisions := decisionsOf(ids...)
			require.NoError(t, client.Set(ctx, decisions[2][0].Keys[0], "not a number", 0).Err())

			queued, held := batchAfterHeld(t, tr, hook, decisions, ctx, nil)
			for _, o := range held {
				require.NoError(t, o.err)
				require.True(t, o.replies[0].Allowed, "%+v", o)
			}
			for i, id := range ids {
				o := queued[i]
				require.NoError(t, o.err, "%s: the call itself", id)
				if id == "bad" {
					require.ErrorIs(t, o.replies[0].Err, script.ErrBadReply)
					require.False(t, o.replies[0].Allowed)
					continue
				}
				require.NoError(t, o.replies[0].Err, "%s: another id's bad key failed it", id)
				require.True(t, o.replies[0].Allowed, id)
				require.Equal(t, []int64{0, 0}, o.replies[0].Counts, "%s: counted once, now", id)
			}
			require.Zero(t, tr.one.breaker.failures.Load(), "Redis answered")
		})
	}
}

// A batch that carries a charge that would take a count past 2^53 fails
// that charge alone, with ErrInvalidCost and nothing of it written: the
// other decisions and charges of the call are made by Redis, and the
// breaker hears that Redis answered.
func TestBatchWithChargePast2To53(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			client, hook := heldClient(t, b.addr(t))
			tr := newTestTransport(t, client, batchAlways)
			ids := []string{"a", "big", "charged", "c"}
			decisions := decisionsOf(ids...)
			key := func(i int) string { return decisions[i][0].Keys[0] }
			for i, n := range map[int]int64{1: 1 << 53, 2: 1<<53 - 1} {
				decisions[i][0].Cost, decisions[i][0].Mode = n, script.ModeCharge
				require.NoError(t, client.Set(ctx, key(i), 1, time.Hour).Err())
			}

			queued, held := batchAfterHeld(t, tr, hook, decisions, ctx, nil)
			for _, o := range held {
				require.NoError(t, o.err)
				require.True(t, o.replies[0].Allowed, "%+v", o)
			}
			for _, o := range queued {
				require.NoError(t, o.err, "the call itself")
			}
			big := queued[1].replies[0]
			require.ErrorIs(t, big.Err, script.ErrInvalidCost)
			require.ErrorContains(t, big.Err, "charge 9007199254740992 would take the count of limit 10/1m0s past 2^53 (it holds 1)")
			got, err := client.Get(ctx, key(1)).Result()
			require.NoError(t, err)
			require.Equal(t, "1", got, "nothing of the charge written")
			charged := queued[2].replies[0]
			require.NoError(t, charged.Err)
			require.Equal(t, int64(1), charged.Counts[0])
			n, err := client.Get(ctx, key(2)).Int64()
			require.NoError(t, err)
			require.Equal(t, int64(1<<53), n, "a charge to 2^53 exactly is counted")
			for _, i := range []int{0, 3} {
				r := queued[i].replies[0]
				require.NoError(t, r.Err, ids[i])
				require.True(t, r.Allowed, ids[i])
				require.Equal(t, []int64{0, 0}, r.Counts, "%s: counted once, now", ids[i])
			}
			out := make([]script.Reply, 1)
			require.NoError(t, tr.Do(ctx, []*script.Request{oneRequest("big", 10)}, out), "the key still holds a count")
			require.NoError(t, out[0].Err)
			require.Equal(t, int64(1), out[0].Counts[0])
			require.Zero(t, tr.one.breaker.failures.Load(), "Redis answered")
		})
	}
}

// A batched script call that fails counts once toward the breaker, however
// many decisions it carried: five decisions in one call to a server that
// never answers leave a breaker of threshold 5 closed, with one failure.
func TestBreakerCountsABatchOnce(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	addr := redistest.Silent(t)
	for _, ctxAware := range []bool{true, false} {
		t.Run(fmt.Sprint("ContextTimeoutEnabled=", ctxAware), func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: ctxAware,
				ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
			hook := newHeldCalls(maxInFlight)
			client.AddHook(hook)
			tr := newTestTransport(t, client, batchAlways, func(c *Config) {
				c.Timeout, c.BreakerFailures, c.BreakerCooldown = timeout, 5, time.Hour
			})

			// The held decisions' callers leave before their calls go on:
			// that tells nothing of Redis, and counts nothing.
			holdCtx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ids := []string{"a", "b", "c", "d", "e"}
			queued, held := batchAfterHeld(t, tr, hook, decisionsOf(ids...), holdCtx, cancel)
			for _, o := range held {
				require.ErrorIs(t, o.err, context.Canceled)
			}
			for i, o := range queued {
				// The caller's deadline, or the batch's a moment later.
				var netErr net.Error
				require.True(t, errors.Is(o.err, context.DeadlineExceeded) || errors.As(o.err, &netErr) && netErr.Timeout(), "%s: %v", ids[i], o.err)
			}
			require.False(t, tr.BreakerOpen(), "one failed call of five decisions opened the breaker")
			require.Equal(t, int32(1), tr.one.breaker.failures.Load(), "one failed call, one failure")
		})
	}
}
