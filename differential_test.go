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

// model is a reference of the documented semantics, written for plainness,
// not speed: it keeps every window's count in a map and finds RetryAfter and
// ResetAfter by trying one millisecond after another.
type model struct {
	counts map[windowKey]int64
}

type windowKey struct {
	id        string
	w, window int64
}

func newModel() *model { return &model{counts: map[windowKey]int64{}} }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// estimate is c + floor(p × (W-e) / W) at Unix ms t.
func (m *model) estimate(id string, w, t int64) int64 {
	i := floorDiv(t, w)
	e := t - i*w
	c := m.counts[windowKey{id, w, i}]
	p := m.counts[windowKey{id, w, i - 1}]
	return c + p*(w-e)/w
}

// firstAt returns the first ms d >= 0 at which ok(t+d) holds, trying up to
// three windows ahead, or -1 if none does.
func firstAt(t, w int64, ok func(int64) bool) time.Duration {
	for d := int64(0); d <= 3*w; d++ {
		if ok(t + d) {
			return time.Duration(d) * time.Millisecond
		}
	}
	return -1
}

func (m *model) allowN(id string, limit ratelimit.Limit, t, n int64) ratelimit.Result {
	w := limit.Window.Milliseconds()
	est := m.estimate(id, w, t)
	r := ratelimit.Result{Limit: limit, Count: est}
	if est+n <= limit.Rate {
		r.Allowed = true
		r.Count = est + n
		m.counts[windowKey{id, w, floorDiv(t, w)}] += n
	} else if n <= limit.Rate {
		r.RetryAfter = firstAt(t, w, func(t int64) bool { return m.estimate(id, w, t)+n <= limit.Rate })
	} else {
		r.RetryAfter = -1
	}
	r.Remaining = max(0, limit.Rate-r.Count)
	r.ResetAfter = firstAt(t, w, func(t int64) bool { return m.estimate(id, w, t) == 0 })
	return r
}

// peek is what a cost-1 request would get, with Count the estimate as it is
// and ResetAfter the wait until that estimate is 0.
func (m *model) peek(id string, limit ratelimit.Limit, t int64) ratelimit.Result {
	w := limit.Window.Milliseconds()
	k := windowKey{id, w, floorDiv(t, w)}
	saved, had := m.counts[k]
	r := m.allowN(id, limit, t, 1)
	if had {
		m.counts[k] = saved
	} else {
		delete(m.counts, k)
	}
	r.Count = m.estimate(id, w, t)
	r.Remaining = max(0, limit.Rate-r.Count)
	r.ResetAfter = firstAt(t, w, func(t int64) bool { return m.estimate(id, w, t) == 0 })
	return r
}

func (m *model) reset(id string, limit ratelimit.Limit, t int64) {
	w := limit.Window.Milliseconds()
	i := floorDiv(t, w)
	delete(m.counts, windowKey{id, w, i})
	delete(m.counts, windowKey{id, w, i - 1})
}

// The differential tests drive the Limiter and the model through one random
// trace of thousands of requests over many windows, on every backend, and
// requires every Result field to agree.
func TestDifferentialMiniredis(t *testing.T) { runDifferential(t, miniredisEnv(t), tinyWindows) }

func TestDifferentialRedisServer(t *testing.T) { runDifferential(t, serverEnv(t)(t), realWindows) }

func TestDifferentialRedisCluster(t *testing.T) { runDifferential(t, clusterEnv(t)(t), realWindows) }

func TestDifferentialBatchedRedisServer(t *testing.T) {
	runDifferential(t, withOpts(serverEnv(t), ratelimit.WithBatching(64))(t), realWindows)
}

// The limits of a trace share ids, and two share a window length (and so
// their counts). miniredis lets keys expire only when told to, so its trace
// can use windows of a few ms. A real server expires keys in real time, two
// windows after the write, while the trace's clock runs at its own pace:
// there windows are long enough that no key expires before the trace's
// clock has left the two windows it counts in.
var (
	tinyWindows = []ratelimit.Limit{
		{Rate: 5, Window: 40 * time.Millisecond},
		{Rate: 12, Window: 40 * time.Millisecond},
		{Rate: 3, Window: 7 * time.Millisecond},
		{Rate: 1, Window: time.Millisecond},
		{Rate: 50, Window: 1000 * time.Millisecond},
		{Rate: 30, Window: 300 * time.Millisecond},
	}
	realWindows = []ratelimit.Limit{
		{Rate: 5, Window: 200 * time.Millisecond},
		{Rate: 12, Window: 200 * time.Millisecond},
		{Rate: 3, Window: 150 * time.Millisecond},
		{Rate: 1, Window: 100 * time.Millisecond},
		{Rate: 50, Window: 1000 * time.Millisecond},
		{Rate: 30, Window: 300 * time.Millisecond},
	}
)

// op is one step of a random trace.
type op struct {
	at    int64 // Unix ms
	id    string
	limit ratelimit.Limit
	kind  opKind
	cost  int64
}

type opKind int

const (
	opAllow opKind = iota
	opPeek
	opReset
)

func (o op) String() string {
	return fmt.Sprintf("at %d: id %q limit %v kind %d cost %d", o.at, o.id, o.limit, o.kind, o.cost)
}

// randomTrace returns steps operations at non-decreasing times, mostly
// requests from one hot id bunched within a window, now and then a Peek, a
// Reset, a cost above the rate, or a long pause.
func randomTrace(seed uint64, steps int, limits []ratelimit.Limit) []op {
	rng := rand.New(rand.NewPCG(seed, 2))
	ids := []string{"a", "a", "a", "a", "b", "{c}", "d}"} // "a" is hot
	now := epoch.UnixMilli() - 17
	ops := make([]op, steps)
	for step := range ops {
		switch r := rng.IntN(100); {
		case r < 75:
		case r < 97:
			now += rng.Int64N(12)
		default:
			now += rng.Int64N(2500)
		}
		o := op{at: now, id: ids[rng.IntN(len(ids))], limit: limits[rng.IntN(len(limits))], cost: 1}
		switch k := rng.IntN(20); {
		case k == 0:
			o.kind = opReset
		case k < 4:
			o.kind = opPeek
		case k == 19:
			o.cost = o.limit.Rate + 1 + rng.Int64N(2) // can never pass
		case k >= 12:
			o.cost = 1 + rng.Int64N(o.limit.Rate)
		}
		ops[step] = o
	}
	return ops
}

func runDifferential(t *testing.T, e env, limits []ratelimit.Limit) {
	const steps = 4000
	ctx := context.Background()
	l := e.limiter()
	m := newModel()
	var allowed, denied, never int
	for step, o := range randomTrace(1, steps, limits) {
		e.clock.Set(time.UnixMilli(o.at))
		where := fmt.Sprintf("step %d %v", step, o)
		switch o.kind {
		case opReset:
			require.NoError(t, l.Reset(ctx, o.id, o.limit), where)
			m.reset(o.id, o.limit, o.at)
		case opPeek:
			got, err := l.Peek(ctx, o.id, o.limit)
			require.NoError(t, err, where)
			require.Equal(t, m.peek(o.id, o.limit, o.at), got, where)
		case opAllow:
			got, err := l.AllowN(ctx, o.id, o.limit, o.cost)
			require.NoError(t, err, where)
			require.Equal(t, m.allowN(o.id, o.limit, o.at, o.cost), got, where)
			switch {
			case got.Allowed:
				allowed++
			case got.RetryAfter < 0:
				never++
			default:
				denied++
			}
		}
	}
	// The trace must have crossed the interesting paths many times.
	t.Logf("allowed %d, denied %d, never %d", allowed, denied, never)
	require.Greater(t, allowed, steps/10)
	require.Greater(t, denied, steps/10)
	require.Greater(t, never, steps/100)
}
