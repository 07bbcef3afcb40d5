package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

func TestShadowMiniredis(t *testing.T) {
	t.Parallel()
	runShadow(t, miniredisEnv, false)
}

func TestShadowRedisServer(t *testing.T) {
	t.Parallel()
	runShadow(t, serverEnv(t), true)
}

func TestShadowRedisCluster(t *testing.T) {
	t.Parallel()
	runShadow(t, clusterEnv(t), true)
}

// runShadow runs the shadow tests against one kind of Redis; realTime says
// that it expires keys in real time (see pacer).
func runShadow(t *testing.T, mk newEnv, realTime bool) {
	t.Run("ShadowLimitCountsAsItsTwin", func(t *testing.T) { testShadowLimitTwin(t, mk(t), realTime) })
	t.Run("WithShadowCountsAsItsTwin", func(t *testing.T) { testWithShadowTwin(t, mk(t), realTime) })
}

// twin returns e with a prefix of its own, so that its Limiters keep counts
// apart from e's on the same Redis and clock.
func (e env) twin(name string) env {
	e.prefix += "-" + name
	return e
}

// liveCounts returns the values of the keys limits read for id now, under
// e's prefix, by key without it ("" for none): keys that a real server,
// expiring in real time, cannot have expired yet (see pacer).
func (e env) liveCounts(t *testing.T, id string, limits []ratelimit.Limit) map[string]string {
	t.Helper()
	var keys []string
	for _, limit := range limits {
		if limit.Strict {
			j := e.subWindow(limit.Window)
			for back := range int64(ratelimit.StrictSubWindows + 1) {
				keys = append(keys, e.strictKey(id, limit.Window, j-back))
			}
			continue
		}
		i := e.windowIndex(limit.Window)
		keys = append(keys, e.key(id, limit.Window, i), e.key(id, limit.Window, i-1))
	}
	out := map[string]string{}
	for _, k := range keys {
		v, err := e.client.Get(context.Background(), k).Result()
		if !errors.Is(err, redis.Nil) {
			require.NoError(t, err, k)
		}
		out[strings.TrimPrefix(k, e.prefix)] = v
	}
	return out
}

// countsBySuffix returns the keys under e's prefix without it, with their
// values.
func (e env) countsBySuffix(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range e.dump(t) {
		out[strings.TrimPrefix(k, e.prefix)] = v
	}
	return out
}

// observed keeps the Events an Observer saw, with copies of their Results.
type observed struct {
	mu     sync.Mutex
	events []ratelimit.Event
}

func (o *observed) Observe(_ context.Context, e *ratelimit.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ev := *e
	ev.Results = slices.Clone(e.Results)
	o.events = append(o.events, ev)
}

// last returns the last Event seen.
func (o *observed) last() ratelimit.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.events[len(o.events)-1]
}

// enforced returns limit with Shadow off.
func enforced(limit ratelimit.Limit) ratelimit.Limit {
	limit.Shadow = false
	return limit
}

// Two enforced limits and two Shadow ones (one strict) are decided together
// by one Limiter, and the same traffic goes to twins, each with a prefix of
// its own: one Limiter deciding the enforced limits alone, another deciding
// each Shadow limit alone, enforced. At every step the Results agree: the
// enforced limits' exactly (so the Shadow limits never deny), each Shadow
// limit's as its twin's but for Allowed (the enforced decision) and
// Shadowed (exactly when its twin denied); PeekAll's counts agree, every
// 20 steps the values of the keys read, and at the end (on miniredis,
// where no key expires) every key. An Observer sees each decision with Shadow
// set, and Results that say what the Shadow limit would have done.
func testShadowLimitTwin(t *testing.T, e env, realTime bool) {
	ctx := context.Background()
	var seen observed
	l := e.limiter(ratelimit.WithObserver(&seen))
	twinE, twinS := e.twin("enforced"), e.twin("shadow")
	le, ls := twinE.limiter(), twinS.limiter()
	a := ratelimit.Limit{Rate: 10, Window: time.Second, Name: "a"}
	b := ratelimit.Limit{Rate: 120, Window: 10 * time.Second, Strict: true, Name: "b"}
	s1 := ratelimit.Limit{Rate: 6, Window: 2 * time.Second, Shadow: true, Name: "s1"}
	s2 := ratelimit.Limit{Rate: 4, Window: 500 * time.Millisecond, Strict: true, Shadow: true, Name: "s2"}
	all := []ratelimit.Limit{a, s1, b, s2}
	// asTwin is what a Shadow limit's Result must be, given its twin's and
	// the decision's.
	asTwin := func(twin ratelimit.Result, shadow ratelimit.Limit, allowed bool) ratelimit.Result {
		twin.Limit, twin.Allowed, twin.Shadowed = shadow, allowed, !twin.Allowed
		return twin
	}
	rng := rand.New(rand.NewPCG(21, 22))
	pace := &pacer{on: realTime}
	now := epoch.UnixMilli()
	var shadowed, deniedByEnforced, alone int
	for step := range 600 {
		if rng.IntN(3) > 0 {
			now += rng.Int64N(250)
		}
		e.clock.Set(time.UnixMilli(pace.at(now)))
		cost := 1 + rng.Int64N(2)
		where := fmt.Sprintf("step %d at %v cost %d", step, e.clock.Now().UnixMilli(), cost)
		if rng.IntN(5) == 0 { // a Shadow limit on its own: never denied
			shadow := []ratelimit.Limit{s1, s2}[rng.IntN(2)]
			got, err := l.AllowN(ctx, "id", shadow, cost)
			require.NoError(t, err, where)
			want, err := ls.AllowN(ctx, "id", enforced(shadow), cost)
			require.NoError(t, err, where)
			require.Equal(t, ratelimit.Public(asTwin(want, shadow, true)), ratelimit.Public(got), where)
			alone++
		} else {
			got, err := l.AllowAll(ctx, "id", all, cost)
			require.NoError(t, err, where)
			wantE, err := le.AllowAll(ctx, "id", []ratelimit.Limit{a, b}, cost)
			require.NoError(t, err, where)
			want1, err := ls.AllowN(ctx, "id", enforced(s1), cost)
			require.NoError(t, err, where)
			want2, err := ls.AllowN(ctx, "id", enforced(s2), cost)
			require.NoError(t, err, where)
			allowed := wantE[0].Allowed
			require.Equal(t, ratelimit.PublicAll([]ratelimit.Result{wantE[0], asTwin(want1, s1, allowed), wantE[1], asTwin(want2, s2, allowed)}), ratelimit.PublicAll(got), where)
			if got[1].Shadowed || got[3].Shadowed {
				shadowed++
			}
			if !allowed {
				deniedByEnforced++
			}
			ev := seen.last()
			require.True(t, ev.Shadow, where)
			require.Equal(t, allowed, ev.Allowed, where)
			require.Equal(t, got, ev.Results, where)
			require.Equal(t, ratelimit.SourceRedis, ev.Source, where)
			require.Equal(t, cost, ev.Cost, where)
		}

		peek, err := l.PeekAll(ctx, "id", all)
		require.NoError(t, err, where)
		peekE, err := le.PeekAll(ctx, "id", []ratelimit.Limit{a, b})
		require.NoError(t, err, where)
		peekS, err := ls.PeekAll(ctx, "id", []ratelimit.Limit{enforced(s1), enforced(s2)})
		require.NoError(t, err, where)
		require.Equal(t, []int64{peekE[0].Count, peekS[0].Count, peekE[1].Count, peekS[1].Count}, counts(peek), where)
		if step%20 == 19 {
			theirs := twinE.liveCounts(t, "id", []ratelimit.Limit{a, b})
			maps.Copy(theirs, twinS.liveCounts(t, "id", []ratelimit.Limit{s1, s2}))
			require.Equal(t, theirs, e.liveCounts(t, "id", all), where)
		}
	}
	if !realTime { // every key, none expired
		theirs := twinE.countsBySuffix(t)
		maps.Copy(theirs, twinS.countsBySuffix(t))
		require.Equal(t, theirs, e.countsBySuffix(t))
	}
	t.Logf("%d AllowAll shadowed, %d denied by the enforced limits, %d Shadow limits alone", shadowed, deniedByEnforced, alone)
	require.Greater(t, shadowed, 100)
	require.Greater(t, deniedByEnforced, 100)
	require.Less(t, deniedByEnforced, 600-alone-100)
}

// A Limiter WithShadow and a twin without it, with a prefix of its own,
// take the same traffic: AllowN, AllowAll of a sliding and a strict limit,
// and PeekAll. Every Result agrees with the twin's but for Allowed (always
// true) and Shadowed, set exactly on the Results of the limits that denied
// the twin; so the counts agree at every step, and every key at the end.
// The shadow Limiter's Observer sees every decision with Shadow set and
// Allowed true, with Results that say what would have happened; the twin's
// sees none with Shadow.
func testWithShadowTwin(t *testing.T, e env, realTime bool) {
	ctx := context.Background()
	var seen, seenTwin observed
	l := e.limiter(ratelimit.WithShadow(true), ratelimit.WithObserver(&seen))
	twin := e.twin("twin")
	lt := twin.limiter(ratelimit.WithObserver(&seenTwin))
	a := ratelimit.Limit{Rate: 8, Window: time.Second}
	b := ratelimit.Limit{Rate: 30, Window: 5 * time.Second, Strict: true}
	rng := rand.New(rand.NewPCG(23, 24))
	pace := &pacer{on: realTime}
	now := epoch.UnixMilli()
	var denied, deniedByOne int
	for step := range 600 {
		if rng.IntN(3) > 0 {
			now += rng.Int64N(250)
		}
		e.clock.Set(time.UnixMilli(pace.at(now)))
		cost := 1 + rng.Int64N(2)
		o := op{at: e.clock.Now().UnixMilli(), id: "id", kind: opAllowAll, limits: []ratelimit.Limit{a, b}, limit: a, cost: cost}
		switch k := rng.IntN(10); {
		case k < 2:
			o.kind = opAllow
		case k < 3:
			o.kind = opPeekAll
		}
		where := fmt.Sprintf("step %d %v", step, o)
		want, err := do(ctx, lt, o)
		require.NoError(t, err, where)
		got, err := do(ctx, l, o)
		require.NoError(t, err, where)
		if !want[0].Allowed {
			denied++
			refused := 0
			for i := range want {
				want[i].Allowed = true
				want[i].Shadowed = want[i].RetryAfter != 0 // the limits that denied it
				if want[i].Shadowed {
					refused++
				}
			}
			if refused < len(want) {
				deniedByOne++
			}
		}
		require.Equal(t, ratelimit.PublicAll(want), ratelimit.PublicAll(got), where)
		ev, evTwin := seen.last(), seenTwin.last()
		require.True(t, ev.Shadow && ev.Allowed, where)
		require.False(t, evTwin.Shadow, where)
		require.Equal(t, got, ev.Results, where)
		require.Equal(t, evTwin.Allowed, !slices.ContainsFunc(ev.Results, func(r ratelimit.Result) bool { return r.Shadowed }), where)

		peek, err := l.PeekAll(ctx, "id", []ratelimit.Limit{a, b})
		require.NoError(t, err, where)
		peekTwin, err := lt.PeekAll(ctx, "id", []ratelimit.Limit{a, b})
		require.NoError(t, err, where)
		require.Equal(t, counts(peekTwin), counts(peek), where)
	}
	require.Equal(t, twin.liveCounts(t, "id", []ratelimit.Limit{a, b}), e.liveCounts(t, "id", []ratelimit.Limit{a, b}))
	if !realTime { // every key, none expired
		require.Equal(t, twin.countsBySuffix(t), e.countsBySuffix(t))
	}
	t.Logf("%d of 600 decisions shadowed, %d of them by one limit of two", denied, deniedByOne)
	require.Greater(t, denied, 100)
	require.Less(t, denied, 500)
	require.Greater(t, deniedByOne, 50)
}

// An Observer sees Event.Shadow on the decisions that involve shadow mode,
// and from Event.Results what they would have been: Shadowed where a
// limit would have denied; Allowed is the answer given.
func TestObserverSeesShadow(t *testing.T) {
	t.Parallel()
	e := miniredisEnv(t)
	ctx := context.Background()
	var seen observed
	l := e.limiter(ratelimit.WithObserver(&seen))
	enforcedLimit := ratelimit.PerSecond(2)
	shadow := ratelimit.Limit{Rate: 1, Window: time.Minute, Shadow: true}
	for _, tc := range []struct {
		name          string
		limits        []ratelimit.Limit
		shadow        bool // Event.Shadow
		allowed       bool
		shadowedLimit []bool
	}{
		{"no shadow limit", []ratelimit.Limit{enforcedLimit}, false, true, []bool{false}},
		{"shadow admits", []ratelimit.Limit{enforcedLimit, shadow}, true, true, []bool{false, false}},
		{"shadow would deny", []ratelimit.Limit{enforcedLimit, shadow}, true, false, []bool{false, true}},
		{"shadow alone would deny", []ratelimit.Limit{shadow}, true, true, []bool{true}},
	} {
		res, err := l.AllowAll(ctx, "id", tc.limits, 1)
		require.NoError(t, err, tc.name)
		ev := seen.last()
		require.Equal(t, tc.shadow, ev.Shadow, tc.name)
		require.Equal(t, tc.allowed, ev.Allowed, tc.name)
		require.Equal(t, res, ev.Results, tc.name)
		for i, want := range tc.shadowedLimit {
			require.Equal(t, want, ev.Results[i].Shadowed, "%s: limit %d", tc.name, i)
		}
	}
	require.Len(t, seen.events, 4)

	// WithShadow: a denial is let through, and the Observer is told.
	ls := e.limiter(ratelimit.WithShadow(true), ratelimit.WithObserver(&seen))
	res, err := ls.Allow(ctx, "id", enforcedLimit)
	require.NoError(t, err)
	require.Equal(t, ratelimit.Result{
		Allowed: true, Count: 2, Limit: enforcedLimit, Remaining: 0,
		RetryAfter: 1001 * time.Millisecond, ResetAfter: 1501 * time.Millisecond, Shadowed: true,
	}, res)
	ev := seen.last()
	require.True(t, ev.Shadow && ev.Allowed)
	require.Equal(t, []ratelimit.Result{res}, ev.Results)
}

// Under WithCountDenied a denial counts: its cost goes to each limit's
// current count, up to the Rate, and the Result says so: Count includes it
// and RetryAfter is the wait from there, exact to the ms.
func TestCountDeniedResults(t *testing.T) {
	t.Parallel()
	e := miniredisEnv(t)
	ctx := context.Background()
	l := e.limiter(ratelimit.WithCountDenied(true))
	ms := time.Millisecond
	limit := ratelimit.PerSecond(5)

	// 5 in the previous second, none in this one, at its first ms: the
	// estimate is 5, and the denial makes the current count 1. The same
	// request then passes when 1 + floor(5 × (1000-e)/1000) <= 4: e >= 201.
	e.set(t, "prev", time.Second, 0, 5)
	res, err := l.Allow(ctx, "prev", limit)
	require.NoError(t, err)
	require.Equal(t, ratelimit.Result{Count: 6, Limit: limit, Remaining: 0, RetryAfter: 201 * ms, ResetAfter: 1001 * ms}, res)
	require.Equal(t, int64(1), e.get(t, "prev", time.Second, e.windowIndex(time.Second)))
	e.clock.Set(epoch.Add(200 * ms))
	peek, err := l.Peek(ctx, "prev", limit)
	require.NoError(t, err)
	require.False(t, peek.Allowed, "1 ms before RetryAfter")
	e.clock.Set(epoch.Add(201 * ms))
	res, err = l.Allow(ctx, "prev", limit)
	require.NoError(t, err)
	require.True(t, res.Allowed, "at RetryAfter")
	require.Equal(t, int64(5), res.Count)

	// A cost above the Rate is never allowed, and not counted: it is a
	// mistake, not a client to slow down.
	res, err = l.AllowN(ctx, "big", limit, 7)
	require.NoError(t, err)
	require.Equal(t, ratelimit.Result{Count: 0, Limit: limit, Remaining: 5, RetryAfter: ratelimit.InfDuration}, res)
	require.Equal(t, int64(0), e.get(t, "big", time.Second, e.windowIndex(time.Second)))

	// AllowAll: a denial by the second limit counts under both, each up to
	// its own Rate: the first's count grows, the second's stays at its 3.
	a, b := ratelimit.PerMinute(100), ratelimit.PerSecond(3)
	for range 3 {
		res, err := l.AllowAll(ctx, "all", []ratelimit.Limit{a, b}, 1)
		require.NoError(t, err)
		require.True(t, res[0].Allowed)
	}
	for n := int64(4); n <= 6; n++ {
		all, err := l.AllowAll(ctx, "all", []ratelimit.Limit{a, b}, 1)
		require.NoError(t, err)
		require.False(t, all[0].Allowed)
		require.Equal(t, []int64{n, 3}, counts(all), "denial %d", n-3)
		require.Zero(t, all[0].RetryAfter, "a admits it still")
		require.Positive(t, all[1].RetryAfter)
	}
	require.Equal(t, int64(6), e.get(t, "all", time.Minute, e.windowIndex(time.Minute)))
	require.Equal(t, int64(3), e.get(t, "all", time.Second, e.windowIndex(time.Second)))
}

// Under WithCountDenied, a request that one limit can never admit (its cost
// is above that limit's Rate) is counted under none: not under the limit
// that can never pass it, and not under the others either. A client that
// retries such a 429 must not burn its hourly quota for nothing.
func TestCountDeniedNeverCountsAnImpossibleRequest(t *testing.T) {
	t.Parallel()
	for _, b := range singleServers(t) {
		t.Run(b.name, func(t *testing.T) {
			e := b.mk(t)
			ctx := context.Background()
			l := e.limiter(ratelimit.WithCountDenied(true))
			burst, hourly := ratelimit.Limit{Rate: 3, Window: 10 * time.Minute}, ratelimit.PerHour(100)
			plan := []ratelimit.Limit{burst, hourly}
			res, err := l.AllowAll(ctx, "id", plan, 1)
			require.NoError(t, err)
			require.True(t, res[0].Allowed)
			for range 3 {
				res, err = l.AllowAll(ctx, "id", plan, 5)
				require.NoError(t, err)
				require.False(t, res[0].Allowed)
				require.Equal(t, ratelimit.InfDuration, res[0].RetryAfter)
				require.Equal(t, []int64{1, 1}, counts(res), "the Results describe what was counted: nothing")
			}
			require.Equal(t, int64(1), e.get(t, "id", time.Hour, e.windowIndex(time.Hour)), "the hourly count")
			require.Equal(t, int64(1), e.get(t, "id", 10*time.Minute, e.windowIndex(10*time.Minute)))

			// A cost the limits can pass but not now is counted, each up to
			// its Rate, as before.
			res, err = l.AllowAll(ctx, "id", plan, 3)
			require.NoError(t, err)
			require.False(t, res[0].Allowed)
			require.Equal(t, []int64{3, 4}, counts(res))
		})
	}
}

// A client sending 20 a second against 10 a second: without
// WithCountDenied it gets about 10 a second through, each time the estimate
// dips; with it, after its first 10 it stays blocked while it keeps up the
// pace (its denials fill each new window to the Rate), and it is let
// through again once it slows to 5 a second. Its current count never
// exceeds the Rate.
func TestCountDeniedBlocksUntilSlower(t *testing.T) {
	t.Parallel()
	limit := ratelimit.PerSecond(10)
	run := func(t *testing.T, countDenied bool) (fast, slow int, firstSlow time.Duration) {
		e := miniredisEnv(t)
		ctx := context.Background()
		l := e.limiter(ratelimit.WithCountDenied(countDenied))
		firstSlow = -1
		for at := time.Duration(0); at < 10*time.Second; {
			e.clock.Set(epoch.Add(at))
			res, err := l.Allow(ctx, "client", limit)
			require.NoError(t, err)
			require.LessOrEqual(t, e.get(t, "client", time.Second, e.windowIndex(time.Second)), limit.Rate)
			switch {
			case at < 5*time.Second:
				if res.Allowed {
					fast++
				}
				at += 50 * time.Millisecond
			default:
				if res.Allowed {
					slow++
					if firstSlow < 0 {
						firstSlow = at - 5*time.Second
					}
				}
				at += 200 * time.Millisecond
			}
		}
		return fast, slow, firstSlow
	}
	fast, slow, _ := run(t, false)
	t.Logf("without: %d of 100 through at 20/s, %d of 25 at 5/s", fast, slow)
	require.GreaterOrEqual(t, fast, 45)
	require.GreaterOrEqual(t, slow, 24)

	fast, slow, first := run(t, true)
	t.Logf("with: %d of 100 through at 20/s, %d of 25 at 5/s, the first %v after slowing", fast, slow, first)
	require.Equal(t, 10, fast, "the first 10, then none")
	// At 5 s the previous second holds 10 (its denials, up to the Rate):
	// denied, counted 1; at 5.2 s 1 + floor(10 × 0.8) + 1 = 10 fits.
	require.Equal(t, 200*time.Millisecond, first)
	require.Equal(t, 24, slow)
}
