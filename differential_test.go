package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

// model is a reference of the documented semantics, written for plainness,
// not speed: it keeps every window's (or strict sub-window's) count in a map
// and finds RetryAfter and ResetAfter by trying one millisecond after
// another.
type model struct {
	counts map[windowKey]int64
	// The Limiter's modes: WithShadow and WithCountDenied.
	shadow, countDenied bool
	// What the model decided, for a trace to show it crossed every path.
	tally tally
	// last is, per id, what its last decision or charge that counted
	// anything counted, for a refund; seq numbers them.
	last map[string]counted
	seq  int
}

// counted is what one decision counted: cost n in each of keys.
type counted struct {
	keys []windowKey
	n    int64
	seq  int
}

// windowKey names one count: id's count in window index of a sliding limit
// of window ms, or with strict set, in sub-window index of a strict one.
//
// For a calendar limit, window and strict are zero, cal and zone name the
// period and its zone, and index is the period's first date, as yyyymmdd
// (see periodOf).
type windowKey struct {
	id     string
	window int64
	strict bool
	index  int64
	cal    ratelimit.Period
	zone   string
}

// tally counts the model's decisions by kind.
type tally struct {
	allowed, denied, never int
	// partial: a denial of several enforced limits, one of which admitted.
	partial int
	// strict: a denial in which a strict limit did not admit.
	strict int
	// shadowed: a Result of a Shadow limit that would have denied.
	shadowed int
	// multi: decisions of AllowAll and PeekAll with several limits.
	multi int
	// charges and refunds, and refunds that gave back in a window the
	// decision had left (the next one, or a later sub-window).
	charges, refunds, lateRefunds int
	// idleRefunds: refunds whose windows had all slid out of their span,
	// for which Refund sends nothing.
	idleRefunds int
	// Charges that would take a count past maxCount, refused: by Redis
	// (some current count at least 1), or before it is asked (a cost above
	// maxCount, which sends nothing).
	pastRedis, pastCost int
}

// maxCount is the most a count holds: a charge that would take one past it
// is refused whole, with ErrInvalidCost.
const maxCount = 1 << 53

func newModel() *model { return &model{counts: map[windowKey]int64{}, last: map[string]counted{}} }

// record keeps what a decision of id counted, if anything, for a refund.
func (m *model) record(id string, keys []windowKey, n int64) {
	if len(keys) > 0 {
		m.seq++
		m.last[id] = counted{keys: keys, n: n, seq: m.seq}
	}
}

// charge counts n for id under every limit, whatever the counts, and
// derives each Result from the counts after it: Allowed is whether a cost-1
// request would pass every enforced limit, RetryAfter each limit's wait
// until it admits a cost of 1. A charge that would take some limit's
// current count past maxCount counts nothing and is ErrInvalidCost, its
// Results zero but for their Limits.
func (m *model) charge(id string, limits []ratelimit.Limit, t, n int64) ([]ratelimit.Result, error) {
	if past := n > maxCount; past || slices.ContainsFunc(limits, func(l ratelimit.Limit) bool { return m.counts[current(id, l, t)] > maxCount-n }) {
		if past {
			m.tally.pastCost++
		} else {
			m.tally.pastRedis++
		}
		res := make([]ratelimit.Result, len(limits))
		for i, limit := range limits {
			res[i].Limit = limit
		}
		return res, ratelimit.ErrInvalidCost
	}
	var keys []windowKey
	for _, limit := range limits {
		k := current(id, limit, t)
		m.counts[k] += n
		keys = append(keys, k)
	}
	m.record(id, keys, n)
	m.tally.charges++
	res := make([]ratelimit.Result, len(limits))
	fits := make([]bool, len(limits))
	allowed := true
	for i, limit := range limits {
		est := m.estimate(id, limit, t)
		fits[i] = est+1 <= limit.Rate
		if !limit.Shadow && !fits[i] {
			allowed = false
		}
		res[i] = ratelimit.Result{Count: est, Limit: limit, Remaining: max(0, limit.Rate-est),
			RetryAfter: m.waitFor(id, limit, t, limit.Rate-1), ResetAfter: m.waitFor(id, limit, t, 0),
			Shadowed: limit.Shadow && !fits[i]}
	}
	for i := range res {
		res[i].Allowed = allowed
	}
	return m.finish(res, allowed, fits), nil
}

// pastCharge returns the cost of a charge of id's limits at t that the
// model refuses, whatever the counts: one more than the most a current
// count leaves room for, so that it is refused by Redis when some current
// count is at least 1, and before Redis is asked (a cost above maxCount)
// when none is.
func (m *model) pastCharge(id string, limits []ratelimit.Limit, t int64) int64 {
	most := int64(0)
	for _, limit := range limits {
		most = max(most, m.counts[current(id, limit, t)])
	}
	return maxCount + 1 - most
}

// refund gives back n of id's last counting decision, once: in each window
// (sub-window) it counted in, while the limit still reads it, never below 0.
func (m *model) refund(id string, t, n int64) {
	c := m.last[id]
	delete(m.last, id)
	m.tally.refunds++
	idle := true
	for _, k := range c.keys {
		if k.cal != 0 { // a period's count, until it ends
			if periodOf(k.cal, zoneOf(k.zone), t) != k.index {
				continue
			}
			idle = false
			m.counts[k] = max(0, m.counts[k]-n)
			continue
		}
		w := k.window
		span := int64(1)
		if k.strict {
			w /= ratelimit.StrictSubWindows
			span = ratelimit.StrictSubWindows
		}
		now := floorDiv(t, w)
		if now > k.index+span {
			continue
		}
		if now > k.index {
			m.tally.lateRefunds++
		}
		idle = false
		m.counts[k] = max(0, m.counts[k]-n)
	}
	if idle {
		m.tally.idleRefunds++
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// current returns the key of the count a request of id at Unix ms t adds
// to under limit.
func current(id string, limit ratelimit.Limit, t int64) windowKey {
	if limit.Calendar != 0 {
		return windowKey{id: id, cal: limit.Calendar, zone: limit.Location.String(), index: periodOf(limit.Calendar, limit.Location, t)}
	}
	w := limit.Window.Milliseconds()
	if limit.Strict {
		return windowKey{id: id, window: w, strict: true, index: floorDiv(t, w/ratelimit.StrictSubWindows)}
	}
	return windowKey{id: id, window: w, index: floorDiv(t, w)}
}

// estimate is what the limit decides on at Unix ms t: for a sliding limit
// c + floor(p × (W-e) / W), for a strict one the sum of the current
// sub-window and the StrictSubWindows before it.
func (m *model) estimate(id string, limit ratelimit.Limit, t int64) int64 {
	k := current(id, limit, t)
	if k.cal != 0 {
		return m.counts[k]
	}
	return estimateWith(limit, t, func(index int64) int64 {
		return m.counts[windowKey{id: id, window: k.window, strict: k.strict, index: index}]
	})
}

// estimateWith is the estimate of limit at Unix ms t from count, which
// returns the count of a window (strict: a sub-window) by its index.
func estimateWith(limit ratelimit.Limit, t int64, count func(index int64) int64) int64 {
	w := limit.Window.Milliseconds()
	if limit.Strict {
		j := floorDiv(t, w/ratelimit.StrictSubWindows)
		var sum int64
		for back := range ratelimit.StrictSubWindows + 1 {
			sum += count(j - int64(back))
		}
		return sum
	}
	i := floorDiv(t, w)
	e := t - i*w
	return count(i) + count(i-1)*(w-e)/w
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

// waitFor returns the first wait from t after which the limit's estimate
// would be at most target with no other request, trying ms after ms. The
// counts the estimate can read from t on are copied first: no later window
// has a count yet, and none is written while waiting.
func (m *model) waitFor(id string, limit ratelimit.Limit, t, target int64) time.Duration {
	k := current(id, limit, t)
	if k.cal != 0 { // the count falls only when the period ends
		if m.counts[k] <= target {
			return 0
		}
		return time.Duration(periodEnd(limit.Calendar, limit.Location, t)-t) * time.Millisecond
	}
	first := k.index - ratelimit.StrictSubWindows
	var snap [ratelimit.StrictSubWindows + 1]int64
	for i := range snap {
		snap[i] = m.counts[windowKey{id: id, window: k.window, strict: k.strict, index: first + int64(i)}]
	}
	count := func(index int64) int64 {
		if index < first || index > k.index {
			return 0
		}
		return snap[index-first]
	}
	return firstAt(t, limit.Window.Milliseconds(), func(u int64) bool { return estimateWith(limit, u, count) <= target })
}

// allowAll decides a request of cost n by id at Unix ms t against limits
// and counts it: the enforced limits decide together, all or nothing; a
// Shadow limit counts the request when it alone admits it and denies
// nothing. A denied request (of the enforced limits, or a Shadow limit's
// own) is counted under WithCountDenied up to each limit's Rate in its
// current count, unless one of the limits that decided it can never admit
// the cost: such a request is counted nowhere. Each Result is derived from
// the counts after the decision.
func (m *model) allowAll(id string, limits []ratelimit.Limit, t, n int64) []ratelimit.Result {
	fits := make([]bool, len(limits))
	allowed, never := true, false // never: an enforced limit's rate is below n
	for i, limit := range limits {
		fits[i] = m.estimate(id, limit, t)+n <= limit.Rate
		if !limit.Shadow && !fits[i] {
			allowed = false
		}
		never = never || !limit.Shadow && n > limit.Rate
	}
	counted := make([]bool, len(limits))
	var keys []windowKey
	for i, limit := range limits {
		k := current(id, limit, t)
		counted[i] = allowed && !limit.Shadow || limit.Shadow && fits[i]
		switch {
		case counted[i]:
			m.counts[k] += n
			keys = append(keys, k)
		case m.countDenied && n <= limit.Rate && (limit.Shadow || !never): // a cost that can never pass is not counted
			m.counts[k] += max(0, min(n, limit.Rate-m.counts[k]))
		}
	}
	res := make([]ratelimit.Result, len(limits))
	for i, limit := range limits {
		r := ratelimit.Result{Allowed: allowed, Limit: limit, Count: m.estimate(id, limit, t)}
		switch {
		case counted[i]:
		case n > limit.Rate:
			r.RetryAfter = ratelimit.InfDuration
		default:
			r.RetryAfter = m.waitFor(id, limit, t, limit.Rate-n)
		}
		r.Remaining = max(0, limit.Rate-r.Count)
		r.ResetAfter = m.waitFor(id, limit, t, 0)
		r.Shadowed = limit.Shadow && !fits[i]
		res[i] = r
	}
	m.count(res, allowed, n)
	if !(m.shadow || m.countDenied) { // refunds are traced in the default modes
		m.record(id, keys, n)
	}
	return m.finish(res, allowed, fits)
}

// peekAll is what a cost-1 allowAll would decide now, counting nothing,
// with each Count the estimate as it is and ResetAfter the wait until it
// is 0.
func (m *model) peekAll(id string, limits []ratelimit.Limit, t int64) []ratelimit.Result {
	allowed := true
	res := make([]ratelimit.Result, len(limits))
	fits := make([]bool, len(limits))
	for i, limit := range limits {
		est := m.estimate(id, limit, t)
		fits[i] = est+1 <= limit.Rate
		if !limit.Shadow && !fits[i] {
			allowed = false
		}
		res[i] = ratelimit.Result{
			Count: est, Limit: limit, Remaining: max(0, limit.Rate-est),
			RetryAfter: m.waitFor(id, limit, t, limit.Rate-1),
			ResetAfter: m.waitFor(id, limit, t, 0),
			Shadowed:   limit.Shadow && !fits[i],
		}
	}
	for i := range res {
		res[i].Allowed = allowed
	}
	m.count(res, allowed, 1)
	return m.finish(res, allowed, fits)
}

// finish applies WithShadow: a denied decision comes back allowed, Shadowed
// on the Results of the limits that did not admit the request.
func (m *model) finish(res []ratelimit.Result, allowed bool, fits []bool) []ratelimit.Result {
	if m.shadow && !allowed {
		for i := range res {
			res[i].Allowed = true
			res[i].Shadowed = res[i].Shadowed || !fits[i]
		}
	}
	return res
}

func (m *model) count(res []ratelimit.Result, allowed bool, n int64) {
	if len(res) > 1 {
		m.tally.multi++
	}
	never, partial, strict := false, false, false
	for _, r := range res {
		if r.Shadowed {
			m.tally.shadowed++
		}
		if r.Limit.Shadow || allowed {
			continue
		}
		never = never || n > r.Limit.Rate
		partial = partial || r.RetryAfter == 0
		strict = strict || r.Limit.Strict && r.RetryAfter != 0
	}
	switch {
	case allowed:
		m.tally.allowed++
	case never:
		m.tally.never++
	default:
		m.tally.denied++
	}
	if !allowed && partial {
		m.tally.partial++
	}
	if !allowed && strict {
		m.tally.strict++
	}
}

func (m *model) allowN(id string, limit ratelimit.Limit, t, n int64) ratelimit.Result {
	return m.allowAll(id, []ratelimit.Limit{limit}, t, n)[0]
}

// peek is what a cost-1 request would get, with Count the estimate as it is
// and ResetAfter the wait until that estimate is 0.
func (m *model) peek(id string, limit ratelimit.Limit, t int64) ratelimit.Result {
	return m.peekAll(id, []ratelimit.Limit{limit}, t)[0]
}

// reset forgets the counts a Reset deletes: the current and previous
// window's, or every sub-window a strict limit reads.
func (m *model) reset(id string, limit ratelimit.Limit, t int64) {
	k := current(id, limit, t)
	if k.cal != 0 {
		delete(m.counts, k)
		return
	}
	back := int64(1)
	if limit.Strict {
		back = ratelimit.StrictSubWindows
	}
	for i := k.index - back; i <= k.index; i++ {
		delete(m.counts, windowKey{id: id, window: k.window, strict: k.strict, index: i})
	}
}

// apply runs o on the model.
func (m *model) apply(o op) ([]ratelimit.Result, error) {
	switch o.kind {
	case opReset:
		m.reset(o.id, o.limit, o.at)
		return nil, nil
	case opPeek:
		return []ratelimit.Result{m.peek(o.id, o.limit, o.at)}, nil
	case opPeekAll:
		return m.peekAll(o.id, o.limits, o.at), nil
	case opAllowAll:
		return m.allowAll(o.id, o.limits, o.at, o.cost), nil
	case opCharge:
		return m.charge(o.id, o.limits, o.at, o.cost)
	case opRefund:
		m.refund(o.id, o.at, o.cost)
		return nil, nil
	}
	return []ratelimit.Result{m.allowN(o.id, o.limit, o.at, o.cost)}, nil
}

// do runs o on l; a refund gives back o.cost of o.refunds.
func do(ctx context.Context, l *ratelimit.Limiter, o op) ([]ratelimit.Result, error) {
	switch o.kind {
	case opCharge:
		return l.Charge(ctx, o.id, o.limits, o.cost)
	case opRefund:
		return nil, l.Refund(ctx, o.id, o.refunds, o.cost)
	case opReset:
		return nil, l.Reset(ctx, o.id, o.limit)
	case opPeek:
		r, err := l.Peek(ctx, o.id, o.limit)
		return []ratelimit.Result{r}, err
	case opPeekAll:
		return l.PeekAll(ctx, o.id, o.limits)
	case opAllowAll:
		return l.AllowAll(ctx, o.id, o.limits, o.cost)
	}
	r, err := l.AllowN(ctx, o.id, o.limit, o.cost)
	return []ratelimit.Result{r}, err
}

// The differential tests drive the Limiter and the model through random
// traces of thousands of decisions over many windows (AllowN, AllowAll,
// Peek, PeekAll and Reset, on sliding, strict and Shadow limits that share
// ids and windows), on every backend, with and without batching, and in
// each of the Limiter's modes, and require every Result field to agree.
func TestDifferentialMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: tinyPool})
}

func TestDifferentialRedisServer(t *testing.T) {
	t.Parallel()
	runDifferential(t, serverEnv(t)(t), diffConfig{pool: realPool, realTime: true})
}

func TestDifferentialRedisCluster(t *testing.T) {
	t.Parallel()
	runDifferential(t, clusterEnv(t)(t), diffConfig{pool: realPool, realTime: true})
}

// With lanes, several ids are decided at once, one goroutine each, so that
// batching (on by default; see diffConfig.batched) puts decisions of single
// and several limits and looks into one script call: on a Cluster, those of
// ids on one master.
func TestDifferentialBatchedMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: tinyPool, lanes: 2 * fewLanes, batched: true, steps: 2000})
}

func TestDifferentialBatchedRedisServer(t *testing.T) {
	t.Parallel()
	runDifferential(t, serverEnv(t)(t), diffConfig{pool: realPool, lanes: 8, batched: true, realTime: true})
}

func TestDifferentialBatchedRedisCluster(t *testing.T) {
	t.Parallel()
	runDifferential(t, clusterEnv(t)(t), diffConfig{pool: realPool, lanes: 8, batched: true, realTime: true})
}

func TestDifferentialUnbatchedRedisServer(t *testing.T) {
	t.Parallel()
	runDifferential(t, serverEnv(t)(t), diffConfig{pool: realPool, lanes: 8, realTime: true,
		opts: []ratelimit.Option{ratelimit.WithBatching(1)}})
}

func TestDifferentialShadowModeMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: tinyPool, shadow: true, steps: 2000,
		opts: []ratelimit.Option{ratelimit.WithShadow(true)}})
}

func TestDifferentialCountDeniedMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: tinyPool, lanes: 4, countDenied: true, steps: 2000,
		opts: []ratelimit.Option{ratelimit.WithCountDenied(true)}})
}

// In both modes a limit that admitted a denied request may not admit it
// again (its denial was counted), and still it did not deny it: Shadowed
// marks only the limits that did.
func TestDifferentialShadowCountDeniedMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: tinyPool, shadow: true, countDenied: true, steps: 2000,
		opts: []ratelimit.Option{ratelimit.WithShadow(true), ratelimit.WithCountDenied(true)}})
}

// The limits of a trace share ids, and some share a window length (and so
// their counts): two sliding limits of 40ms, say, and a Shadow one of 7ms
// beside an enforced one. A strict limit of a window shared with a sliding
// one keeps counts of its own. miniredis lets keys expire only when told
// to, so its trace can use windows of a few ms. A real server expires keys
// in real time, two windows (strict: 1.2 windows) after the write, while the
// trace's clock runs at its own pace, kept at least twice as fast as real
// time by a pacer: there windows are long enough (500 ms or more) that no
// key expires before the trace's clock has left the windows it counts in,
// even when a request waits a few hundred ms to reach Redis, as it may
// under the race detector on a busy machine.
var (
	tinyWindows = []ratelimit.Limit{
		{Rate: 5, Window: 40 * time.Millisecond},
		{Rate: 12, Window: 40 * time.Millisecond},
		{Rate: 3, Window: 7 * time.Millisecond},
		{Rate: 1, Window: time.Millisecond},
		{Rate: 50, Window: 1000 * time.Millisecond},
		{Rate: 30, Window: 300 * time.Millisecond},
	}
	tinyPool = append(slices.Clip(tinyWindows),
		ratelimit.Limit{Rate: 8, Window: 40 * time.Millisecond, Strict: true},
		ratelimit.Limit{Rate: 20, Window: 300 * time.Millisecond, Strict: true},
		ratelimit.Limit{Rate: 4, Window: 20 * time.Millisecond, Strict: true},
		ratelimit.Limit{Rate: 6, Window: 7 * time.Millisecond, Shadow: true},
		ratelimit.Limit{Rate: 2, Window: 300 * time.Millisecond, Shadow: true},
		ratelimit.Limit{Rate: 10, Window: 100 * time.Millisecond, Strict: true, Shadow: true},
	)
	realPool = []ratelimit.Limit{
		{Rate: 10, Window: time.Second},
		{Rate: 25, Window: time.Second},
		{Rate: 6, Window: 750 * time.Millisecond},
		{Rate: 2, Window: 500 * time.Millisecond},
		{Rate: 80, Window: 2 * time.Second},
		{Rate: 40, Window: 1500 * time.Millisecond},
		{Rate: 15, Window: time.Second, Strict: true},
		{Rate: 30, Window: 1500 * time.Millisecond, Strict: true},
		{Rate: 6, Window: 500 * time.Millisecond, Strict: true},
		{Rate: 12, Window: 750 * time.Millisecond, Shadow: true},
		{Rate: 4, Window: 1500 * time.Millisecond, Shadow: true},
		{Rate: 20, Window: 2 * time.Second, Strict: true, Shadow: true},
	}
)

// op is one step of a random trace.
type op struct {
	at     int64 // Unix ms
	id     string
	limit  ratelimit.Limit   // of AllowN, Peek and Reset
	limits []ratelimit.Limit // of AllowAll and PeekAll
	kind   opKind
	cost   int64
	// refunds are the Results a refund gives back part of: those of its
	// id's last decision that counted, set when the trace runs.
	refunds []ratelimit.Result
	// past: a Charge whose cost, set when the trace runs, takes a count
	// past maxCount (see model.pastCharge).
	past bool
}

type opKind int

const (
	opAllow opKind = iota
	opPeek
	opReset
	opAllowAll
	opPeekAll
	opCharge
	opRefund
)

func (k opKind) String() string {
	return [...]string{"AllowN", "Peek", "Reset", "AllowAll", "PeekAll", "Charge", "Refund"}[k]
}

func (o op) String() string {
	limits := fmt.Sprint(o.limit)
	if o.kind == opAllowAll || o.kind == opPeekAll || o.kind == opCharge {
		limits = fmt.Sprint(o.limits)
	}
	return fmt.Sprintf("at %d: %v id %q limits %s cost %d", o.at, o.kind, o.id, limits, o.cost)
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
		now = nextTime(rng, now)
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

// nextTime returns the time of the next step: mostly the same ms, often a
// few ms later, now and then after a long pause.
func nextTime(rng *rand.Rand, now int64) int64 {
	switch r := rng.IntN(100); {
	case r < 75:
		return now
	case r < 97:
		return now + rng.Int64N(12)
	default:
		return now + rng.Int64N(2500)
	}
}

// mixedTrace is randomTrace with decisions of several limits: AllowAll and
// PeekAll of 2 or 3 limits of the pool with distinct windows (or kinds), on
// the same ids and windows as the single-limit operations. Ids end in
// suffix, so that traces with different suffixes never share a count.
func mixedTrace(seed uint64, steps int, pool []ratelimit.Limit, suffix string) []op {
	rng := rand.New(rand.NewPCG(seed, 3))
	ids := []string{"a", "a", "a", "a", "b", "{c}", "d}"} // "a" is hot
	now := epoch.UnixMilli() - 17
	ops := make([]op, steps)
	for step := range ops {
		switch r := rng.IntN(100); {
		case r < 80:
		case r < 98:
			now += rng.Int64N(8)
		default:
			now += rng.Int64N(2500)
		}
		o := op{at: now, id: ids[rng.IntN(len(ids))] + suffix, cost: 1}
		switch k := rng.IntN(100); {
		case k < 3:
			o.kind = opReset
		case k < 10:
			o.kind = opPeek
		case k < 20:
			o.kind = opPeekAll
		case k < 60:
			o.kind = opAllowAll
		default:
			o.kind = opAllow
		}
		o.limit = pool[rng.IntN(len(pool))]
		least := o.limit.Rate
		if o.kind == opAllowAll || o.kind == opPeekAll {
			o.limits = pickLimits(rng, pool, 2+rng.IntN(2))
			least = o.limits[0].Rate
			for _, l := range o.limits {
				least = min(least, l.Rate)
			}
		}
		if o.kind == opAllow || o.kind == opAllowAll {
			switch k := rng.IntN(20); {
			case k == 19:
				o.cost = least + 1 + rng.Int64N(2) // beyond one limit at least
			case k >= 12:
				o.cost = 1 + rng.Int64N(least)
			}
		}
		ops[step] = o
	}
	return ops
}

// withChargesAndRefunds turns about one op in ten of ops into a Charge of
// the op's limits (a cost up to twice the least rate, or for one in ten of
// them a cost that takes a count past maxCount) and one in seven into a
// Refund of up to 3 of the id's last decision that counted.
func withChargesAndRefunds(ops []op, seed uint64, pool []ratelimit.Limit) []op {
	rng := rand.New(rand.NewPCG(seed, 4))
	for i := range ops {
		o := &ops[i]
		switch k := rng.IntN(100); {
		case k < 10:
			o.kind = opCharge
			if o.limits == nil {
				o.limits = pickLimits(rng, pool, 1+rng.IntN(3))
			}
			least := o.limits[0].Rate
			for _, l := range o.limits {
				least = min(least, l.Rate)
			}
			o.cost = 1 + rng.Int64N(2*least)
			o.past = k == 0
		case k < 24:
			o.kind, o.cost = opRefund, 1+rng.Int64N(3)
		}
	}
	return ops
}

// pickLimits returns k limits of the pool, no two of the same Window and
// Strict, in random order.
func pickLimits(rng *rand.Rand, pool []ratelimit.Limit, k int) []ratelimit.Limit {
	var out []ratelimit.Limit
	for len(out) < k {
		l := pool[rng.IntN(len(pool))]
		if !slices.ContainsFunc(out, func(o ratelimit.Limit) bool {
			return o.Window == l.Window && o.Strict == l.Strict && o.Calendar == l.Calendar && o.Location.String() == l.Location.String()
		}) {
			out = append(out, l)
		}
	}
	return out
}

// diffConfig is one differential run.
type diffConfig struct {
	pool  []ratelimit.Limit
	steps int // decisions in all; 0 means 4000
	// lanes is how many ids are decided at once, each by its own goroutine
	// and trace, in lock step on the shared clock; 0 means 1.
	lanes int
	// batched: check that some script calls carried several decisions.
	// With no more lanes than fewLanes, the batcher is made to batch them
	// (it would send each alone); with more, it sends the first fewLanes
	// decisions under way alone, and batches those past them as it does
	// in use.
	batched bool
	opts    []ratelimit.Option
	// What opts set, for the model.
	shadow, countDenied bool
	// realTime: the server expires keys in real time (see pacer).
	realTime bool
	// charges: the trace has Charges and Refunds too (the default modes
	// only).
	charges bool
	// calendar: the pool is calendarPool, and the trace calendarTrace.
	calendar bool
}

// fewLanes is how many decisions under way a batched run's Limiter sends
// each alone (see diffConfig.batched).
const fewLanes = 8

// pacer keeps a trace's clock running at least twice as fast as real time.
// A real server expires a key in real time, two windows (strict: 1.2)
// after it was written, and the key is read only until the trace's clock
// has left the windows it counts in: if the clock ran slower than real
// time, as it may in a long run of requests a ms apart, a key could expire
// while still read. At twice real time, a key expires before it is last
// read only if a request waits longer than a window between reading the
// clock and reaching Redis. A step planned too soon is moved later, and
// every step after it with it, so that gaps only grow; the model is given
// the moved times.
type pacer struct {
	on     bool
	start  time.Time
	lead   time.Duration // the clock's lead over twice the real time since start, which only grows
	offset int64         // ms added to the trace's times so far
}

// at returns the time to decide a step of the trace planned at t.
func (p *pacer) at(t int64) int64 {
	if !p.on {
		return t
	}
	if p.start.IsZero() {
		p.start, p.lead = time.Now(), time.Duration(t)*time.Millisecond
	}
	real := 2 * time.Since(p.start)
	at := t + p.offset
	if lead := time.Duration(at)*time.Millisecond - real; lead < p.lead {
		at = int64((real + p.lead + time.Millisecond - 1) / time.Millisecond) // rounded up
		p.offset = at - t
	}
	p.lead = time.Duration(at)*time.Millisecond - real
	return at
}

func runDifferential(t *testing.T, e env, c diffConfig) {
	steps := c.steps
	if steps == 0 {
		steps = 4000
	}
	lanes := max(c.lanes, 1)
	ctx := context.Background()
	var calls scriptCalls
	if e.limited != nil { // the client the Limiter uses (see env.limiter)
		e.limited = hookedClient(t, e.limited, &calls)
	} else {
		e.client = hookedClient(t, e.client, &calls)
	}
	opts := c.opts
	if c.batched && lanes <= fewLanes {
		opts = append(slices.Clip(opts), ratelimit.BatchAlways())
	} else if c.batched {
		opts = append(slices.Clip(opts), ratelimit.WithFewDeciding(fewLanes))
	}
	l := e.limiter(opts...)
	m := newModel()
	m.shadow, m.countDenied = c.shadow, c.countDenied
	traces := make([][]op, lanes)
	for lane := range traces {
		suffix := ""
		if lanes > 1 {
			suffix = fmt.Sprintf("#%d", lane)
		}
		if c.calendar {
			traces[lane] = calendarTrace(1+uint64(lane), steps/lanes, c.pool, suffix)
		} else {
			traces[lane] = mixedTrace(1+uint64(lane), steps/lanes, c.pool, suffix)
		}
		if c.charges {
			traces[lane] = withChargesAndRefunds(traces[lane], 1+uint64(lane), c.pool)
		}
		for step := range traces[lane] { // one clock for all lanes
			traces[lane][step].at = traces[0][step].at
		}
	}
	got := make([][]ratelimit.Result, lanes)
	errs := make([]error, lanes)
	decisions := 0
	// booked are, per id, the Results of the decision m.last holds.
	booked := map[string][]ratelimit.Result{}
	pace := &pacer{on: c.realTime}
	for step := range traces[0] {
		at := pace.at(traces[0][step].at)
		for lane := range traces {
			traces[lane][step].at = at
		}
		e.clock.Set(time.UnixMilli(at))
		skip := make([]bool, lanes)
		for lane := range traces {
			o := &traces[lane][step]
			if o.past {
				o.cost = m.pastCharge(o.id, o.limits, o.at)
			}
			if o.kind != opRefund {
				continue
			}
			last, ok := m.last[o.id]
			skip[lane] = !ok // nothing to refund: the step does nothing
			o.refunds, o.cost = booked[o.id], min(o.cost, last.n)
		}
		seq := m.seq
		if lanes == 1 && skip[0] {
			continue
		} else if lanes == 1 {
			got[0], errs[0] = do(ctx, l, traces[0][step])
		} else {
			var wg sync.WaitGroup
			for lane := range lanes {
				if !skip[lane] {
					wg.Go(func() { got[lane], errs[lane] = do(ctx, l, traces[lane][step]) })
				}
			}
			wg.Wait()
		}
		for lane := range lanes {
			o := traces[lane][step]
			if skip[lane] {
				continue
			}
			where := fmt.Sprintf("step %d lane %d %v", step, lane, o)
			want, err := m.apply(o)
			if err != nil {
				require.ErrorIs(t, errs[lane], err, where)
			} else {
				require.NoError(t, errs[lane], where)
			}
			require.Equal(t, want, ratelimit.PublicAll(got[lane]), where)
			if m.seq > seq && m.last[o.id].seq > seq { // it counted: a later refund gives it back
				booked[o.id] = got[lane]
			}
			if o.kind != opReset && o.kind != opRefund {
				decisions++
			}
		}
	}
	// The traces must have crossed the interesting paths many times.
	s := m.tally
	// Each decision, and each refund with a window left to give back to,
	// sends one script call unless batched with others.
	sent := int64(decisions + s.refunds - s.idleRefunds - s.pastCost)
	t.Logf("%+v; %d decisions and refunds sent in %d script calls; the clock moved %d ms to keep up with real time", s, sent, calls.n.Load(), pace.offset)
	require.Greater(t, s.allowed, steps/10)
	require.Greater(t, s.never, steps/200)
	require.Greater(t, s.multi, steps/4)
	// A loaded machine makes a real-time trace's clock jump ahead (see
	// pacer), which thins these out: the bounds leave room for it (a
	// Cluster run under -race on a loaded machine has seen 98 denials of
	// 4000, with the clock 89 s ahead).
	require.Greater(t, s.denied, steps/100)
	require.Greater(t, s.partial, steps/200)
	require.Greater(t, s.shadowed, steps/200)
	require.Positive(t, calls.n.Load(), "the hook saw no script call")
	if c.calendar {
		periods, odd, lengths := calendarCoverage(m)
		t.Logf("%d periods counted in, %d of them days not 24 hours long: %v", periods, odd, lengths)
		require.Greater(t, periods, 100)
		for _, d := range []time.Duration{23 * time.Hour, 25 * time.Hour, 23*time.Hour + 30*time.Minute, 24*time.Hour + 30*time.Minute} {
			require.Positive(t, lengths[d], "no day of %v", d)
		}
	} else {
		require.Greater(t, s.strict, steps/200)
	}
	if c.charges && !c.calendar {
		require.Greater(t, s.charges, steps/20)
		require.Greater(t, s.refunds, steps/20)
		require.Positive(t, s.lateRefunds, "no refund in the window after the decision's")
		require.Positive(t, s.pastRedis, "no charge past maxCount refused by Redis")
		require.Positive(t, s.pastCost, "no charge past maxCount refused before Redis is asked")
	}
	if c.charges && c.calendar {
		require.Greater(t, s.charges, steps/20)
		require.Greater(t, s.refunds, steps/20)
		require.Positive(t, s.idleRefunds, "no refund after its period ended")
		require.Positive(t, s.pastRedis, "no charge past maxCount refused by Redis")
	}
	if c.batched {
		require.Less(t, calls.n.Load(), sent, "no script call carried two requests")
	} else {
		require.Equal(t, sent, calls.n.Load(), "unbatched, each decision and refund sent is one script call")
	}
}

// Charges and refunds among the decisions, held to the model: refunds in
// the window counted, in the next one, and after the span (nothing).
func TestDifferentialChargeRefundMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: tinyPool, charges: true})
}

func TestDifferentialChargeRefundBatchedMiniredis(t *testing.T) {
	t.Parallel()
	runDifferential(t, miniredisEnv(t), diffConfig{pool: tinyPool, lanes: 8, batched: true, charges: true})
}

func TestDifferentialChargeRefundRedisServer(t *testing.T) {
	t.Parallel()
	runDifferential(t, serverEnv(t)(t), diffConfig{pool: realPool, lanes: 8, batched: true, realTime: true, charges: true})
}

func TestDifferentialChargeRefundRedisCluster(t *testing.T) {
	t.Parallel()
	runDifferential(t, clusterEnv(t)(t), diffConfig{pool: realPool, realTime: true, charges: true})
}
