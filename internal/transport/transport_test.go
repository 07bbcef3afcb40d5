package transport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/group"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// newTestTransport returns a Transport of client, batching, with a breaker
// and a minute's timeout, as set changes them; when the test ends it closes
// client, which ends the calls still on the wire, and waits for the
// Transport's goroutines.
func newTestTransport(t *testing.T, client redis.UniversalClient, set ...func(*Config)) *Transport {
	t.Helper()
	cfg := Config{Timeout: time.Minute, MaxBatch: 128, FewDeciding: FewDeciding, BreakerFailures: 5, BreakerCooldown: time.Second,
		Warn: func(error) {}, Work: new(group.Group)}
	for _, f := range set {
		f(&cfg)
	}
	tr := New(client, cfg)
	t.Cleanup(func() {
		_ = client.Close()
		_ = tr.work.Wait(context.Background())
	})
	return tr
}

// slidingWindow returns the source of sliding_window.lua.
func slidingWindow(*testing.T) string { return script.Source }

// oneRequest returns the request of one decision of id against a limit of
// rate a minute, at the start of a window: the current window's key, then
// the previous one's.
func oneRequest(id string, rate int64) *script.Request {
	const w = 60_000
	return &script.Request{
		Cost: 1, Mode: script.ModeCount, NLimits: 1,
		Keys:   []string{"{" + id + "}:0", "{" + id + "}:-1"},
		Limits: []script.LimitArgs{{Rate: rate, Weight: w, Window: w, TTL: 2*w + script.Margin(w)}},
	}
}

// strictRequest returns the request of one decision of id against a strict
// limit of rate per window ms, at the start of a sub-window: the
// window.SubWindows+1 sub-windows' keys, the current one first.
func strictRequest(id string, rate, w int64) *script.Request {
	const subs = window.SubWindows
	sub := w / subs
	keys := make([]string, subs+1)
	for k := range keys {
		keys[k] = fmt.Sprintf("{%s}:%d/%d:%d", id, w, subs, -k)
	}
	return &script.Request{
		Cost: 1, Mode: script.ModeCount, NLimits: 1, Keys: keys,
		Limits: []script.LimitArgs{{Rate: rate, Weight: subs + 1, TTL: (subs+2)*sub + script.Margin(subs*sub)}},
	}
}

// joined returns one request of the limits and keys of reqs, in order, at
// the first one's cost and mode.
func joined(reqs ...*script.Request) *script.Request {
	r := *reqs[0]
	r.Keys, r.Limits = nil, nil
	for _, o := range reqs {
		r.Keys = append(r.Keys, o.Keys...)
		r.Limits = append(r.Limits, o.Limits...)
	}
	r.NLimits = uint16(len(r.Limits))
	return &r
}

// A half-open breaker lets one probe out at a time: a second waits, and a
// probe whose caller left hands its turn back.
func TestBreakerOneProbe(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	b := newBreaker(1, time.Second, clk.Now)
	ok, probe := b.allow()
	require.True(t, ok && !probe, "closed")
	b.done(false, errors.New("BUSY Redis is busy running a script"))
	ok, _ = b.allow()
	require.False(t, ok, "open after one failure")
	clk.Add(time.Second)
	ok, probe = b.allow()
	require.True(t, ok)
	require.True(t, probe)
	for range 10 {
		ok, _ := b.allow()
		require.False(t, ok, "a second probe while the first is out")
	}
	b.abandon(true) // its caller left: the turn goes back
	ok, probe = b.allow()
	require.True(t, ok && probe)
	b.done(true, nil)
	require.Equal(t, closed, b.state.Load())
}

// While the breaker is open, concurrent decisions send one probe at a time.
// A call that ends while more than maxInFlight are in flight leaves the
// waiting decisions to the others, whether it went alone (next) or was a
// batch (flush); one that ends with maxInFlight or fewer in flight sends
// them.
func TestCallsPastMaxInFlightRetire(t *testing.T) {
	t.Parallel()
	tr := newTestTransport(t, redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), ContextTimeoutEnabled: true}))
	b := tr.one.batch
	p := newPending(context.Background(), context.Background(), []*script.Request{oneRequest("waiting", 10)})
	b.mu.Lock()
	b.queue, b.waiting, b.keys = []*pending{p}, len(p.reqs), p.keys
	b.sending = maxInFlight + 2 // this call, and maxInFlight+1 others
	b.mu.Unlock()

	b.next()
	b.flush()
	b.mu.Lock()
	require.Equal(t, maxInFlight, b.sending, "both calls retired")
	require.Len(t, b.queue, 1, "and left the decision waiting")
	b.mu.Unlock()

	b.next() // maxInFlight in flight, this one among them: it sends
	select {
	case r := <-p.done:
		require.NoError(t, r.err)
		require.True(t, r.replies[0].Allowed)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting decision was not sent")
	}
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.sending == maxInFlight-1 && len(b.queue) == 0
	}, 10*time.Second, time.Millisecond, "the call that sent it ends")
}

// An open breaker met after the Limiter's deadline passed is named once, as
// the open breaker of its server: no reply was due from a server not asked
// (the failover run had logged "no reply within 100ms from …: … circuit open").
func TestCircuitOpenNamedOnce(t *testing.T) {
	tr := &Transport{timeout: 100 * time.Millisecond}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	err := tr.explain(ctx, &server{name: "127.0.0.1:7921"}, ErrCircuitOpen)
	require.ErrorIs(t, err, ErrCircuitOpen)
	require.Equal(t, "ratelimit: 127.0.0.1:7921: circuit open after repeated Redis failures", err.Error())
}

// A decision whose ctx is never canceled gets a tickCtx: its deadline is the
// timeout rounded up to a tick, its values are the caller's, decisions of
// one tick share its Done (those of context.Background its tickCtx), and
// Done closes at the deadline, Err then saying so.
func TestTickDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 20 * time.Millisecond
	tr := &Transport{timeout: timeout, epoch: time.Now()}
	type key struct{}
	caller := context.WithValue(context.Background(), key{}, "v")
	before := time.Now()
	ctx, cancel, ours := tr.deadline(caller)
	defer cancel()
	require.True(t, ours)
	require.IsType(t, &tickCtx{}, ctx)
	d, ok := ctx.Deadline()
	require.True(t, ok)
	require.False(t, d.Before(before.Add(timeout)), "the deadline is at least the timeout away")
	require.Less(t, time.Until(d), timeout+tickLen(timeout), "and at most a tick more")
	require.Equal(t, "v", ctx.Value(key{}))
	long, cancelLong, _ := (&Transport{timeout: time.Hour, epoch: time.Now()}).deadline(caller)
	defer cancelLong()
	require.NoError(t, long.Err(), "before its deadline")

	// Within a few decisions, two fall in one tick and share it.
	shared := false
	for range 1000 {
		a, _, _ := tr.deadline(caller)
		b, _, _ := tr.deadline(caller)
		da, _ := a.Deadline()
		db, _ := b.Deadline()
		if da.Equal(db) {
			require.Equal(t, a.Done(), b.Done())
			shared = true
			break
		}
	}
	require.True(t, shared, "no two decisions fell in one tick")
	// Those of context.Background share the tick's own tickCtx.
	shared = false
	for range 1000 {
		a, _, _ := tr.deadline(context.Background())
		b, _, _ := tr.deadline(context.Background())
		if da, _ := a.Deadline(); da.Equal(ctxDeadline(b)) {
			require.Same(t, a, b)
			require.Nil(t, a.Value(key{}))
			shared = true
			break
		}
	}
	require.True(t, shared, "no two decisions of context.Background fell in one tick")

	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not close")
	}
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
	require.False(t, time.Now().Before(d), "Done closed before the deadline")
	require.True(t, expired(ctx))

	// A timeout too long for ticks, up to the longest there is, gets a
	// deadline of its own, not one in the past.
	for _, d := range []time.Duration{maxTickTimeout + time.Nanosecond, math.MaxInt64} {
		huge, cancelHuge, _ := (&Transport{timeout: d, epoch: time.Now()}).deadline(caller)
		defer cancelHuge()
		require.NoError(t, huge.Err(), "timeout %v", d)
		until, ok := huge.Deadline()
		require.True(t, ok)
		require.True(t, until.After(time.Now().Add(time.Minute)), "timeout %v: deadline %v", d, until)
	}

	// A ctx that can be canceled keeps its own Done.
	parent, stop := context.WithCancel(context.Background())
	ctx, cancel, ours = tr.deadline(parent)
	defer cancel()
	require.True(t, ours)
	_, isTick := ctx.(*tickCtx)
	require.False(t, isTick)
	stop()
	require.ErrorIs(t, ctx.Err(), context.Canceled)
}

// ctxDeadline returns ctx's deadline.
func ctxDeadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// Slot agrees with the slots Redis's own documentation gives, and with its
// hash tag rule: the first {…} that is not empty.
func TestHashSlot(t *testing.T) {
	for _, tc := range []struct {
		key  string
		slot int
	}{
		{"123456789", 12739}, // CRC16 XMODEM's check value 0x31C3, mod 16384
		{"foo", 12182},
		{"bar", 5061},
		{"{user1000}.following", HashSlot("user1000")},
		{"foo{}{bar}", HashSlot("foo{}{bar}")}, // empty first tag: the whole key
		{"foo{{bar}}zap", HashSlot("{bar")},
		{"foo{bar}{zap}", HashSlot("bar")},
	} {
		require.Equal(t, tc.slot, HashSlot(tc.key), tc.key)
	}
}
