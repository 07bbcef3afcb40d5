package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
)

// The deny cache changes no decision: on random traces, a Limiter with it
// and one without, each on its own miniredis and reading the same clock,
// return equal Results for every request, while the cached one sends Redis
// far fewer commands.
func TestDenyCacheChangesNothing(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			trace := randomTrace(seed, depth(t, 2000), tinyWindows)
			if seed == 3 { // calendar periods across clock changes, as the calendar model's trace
				z := calendarZones()
				trace = calendarTrace(seed, depth(t, 2000), []ratelimit.Limit{
					ratelimit.PerPeriod(4, ratelimit.Daily, z["America/Havana"]), ratelimit.PerPeriod(6, ratelimit.Monthly, z["Australia/Lord_Howe"]),
					ratelimit.PerPeriod(8, ratelimit.Weekly, nil), // three at least: the trace's AllowAll picks up to three
				}, "")
			}
			ctx := context.Background()
			clk := clock.NewFake(epoch)
			newLimiter := func(opts ...ratelimit.Option) (*ratelimit.Limiter, *miniredis.Miniredis) {
				mr := miniredis.RunT(t)
				c := newClient(t, &redis.Options{Addr: mr.Addr()})
				return ratelimit.New(c, append(opts, ratelimit.WithClock(clk.Now), ratelimit.WithTimeout(time.Minute))...), mr
			}
			plain, plainRedis := newLimiter()
			cached, cachedRedis := newLimiter(ratelimit.WithDenyCache(1000))
			var denied int
			for step, o := range trace {
				clk.Set(time.UnixMilli(o.at))
				where := fmt.Sprintf("step %d %v", step, o)
				switch o.kind {
				case opReset:
					require.NoError(t, plain.Reset(ctx, o.id, o.limit), where)
					require.NoError(t, cached.Reset(ctx, o.id, o.limit), where)
				case opPeek:
					want, err := plain.Peek(ctx, o.id, o.limit)
					require.NoError(t, err, where)
					got, err := cached.Peek(ctx, o.id, o.limit)
					require.NoError(t, err, where)
					require.Equal(t, ratelimit.Public(want), ratelimit.Public(got), where)
				case opAllow:
					want, err := plain.AllowN(ctx, o.id, o.limit, o.cost)
					require.NoError(t, err, where)
					got, err := cached.AllowN(ctx, o.id, o.limit, o.cost)
					require.NoError(t, err, where)
					require.Equal(t, ratelimit.Public(want), ratelimit.Public(got), where)
					if !want.Allowed {
						denied++
					}
				}
			}
			saved := plainRedis.CommandCount() - cachedRedis.CommandCount()
			t.Logf("denied %d; commands without the cache %d, with it %d",
				denied, plainRedis.CommandCount(), cachedRedis.CommandCount())
			require.Greater(t, saved, denied/2, "the cache answered too few denials locally")
		})
	}
}

// A client hammering past its limit is denied locally until the exact
// millisecond its next request could pass; that request goes to Redis.
func TestDenyCacheUntilRetry(t *testing.T) {
	t.Parallel()
	e := miniredisEnv(t)
	ctx := context.Background()
	l := e.limiter(ratelimit.WithDenyCache(10))
	limit := ratelimit.PerSecond(3)
	e.clock.Set(epoch.Add(250 * time.Millisecond))
	for range 3 {
		res, err := l.Allow(ctx, "id", limit)
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	first, err := l.Allow(ctx, "id", limit) // Redis denies; the cache learns
	require.NoError(t, err)
	require.False(t, first.Allowed)

	// Deleting the keys behind the Limiter's back is what the cache cannot
	// see: it goes on denying, which shows these denials are local.
	require.NoError(t, e.client.Del(ctx,
		e.key("id", time.Second, e.windowIndex(time.Second)),
		e.key("id", time.Second, e.windowIndex(time.Second)-1)).Err())
	for range 100 {
		res, err := l.Allow(ctx, "id", limit)
		require.NoError(t, err)
		require.Equal(t, first, res)
	}
	e.clock.Set(epoch.Add(250*time.Millisecond + first.RetryAfter - time.Millisecond))
	res, err := l.Allow(ctx, "id", limit)
	require.NoError(t, err)
	require.False(t, res.Allowed, "one ms before RetryAfter the cache still denies")
	e.clock.Set(epoch.Add(250*time.Millisecond + first.RetryAfter))
	res, err = l.Allow(ctx, "id", limit)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.Equal(t, int64(1), res.Count, "the request went to Redis, which had no count left")
}

// With other servers writing to the same Redis, the cache's counts fall
// behind Redis's; still every request it denies, Redis would deny too. Two
// servers share a Redis, one of them caching; after each denial by the
// caching one, a third Limiter without a cache asks Redis the same question.
func TestDenyCacheSharedRedis(t *testing.T) {
	t.Parallel()
	e := miniredisEnv(t)
	ctx := context.Background()
	cached := e.limiter(ratelimit.WithDenyCache(1000))
	other := e.limiter()
	check := e.limiter()
	var local int
	for step, o := range randomTrace(7, 2000, tinyWindows) {
		e.clock.Set(time.UnixMilli(o.at))
		where := fmt.Sprintf("step %d %v", step, o)
		l := cached
		if step%3 == 0 {
			l = other
		}
		switch o.kind {
		case opReset: // a Reset through the caching server only
			require.NoError(t, cached.Reset(ctx, o.id, o.limit), where)
		case opPeek, opAllow:
			res, err := l.AllowN(ctx, o.id, o.limit, o.cost)
			require.NoError(t, err, where)
			if l == cached && !res.Allowed {
				again, err := check.AllowN(ctx, o.id, o.limit, o.cost)
				require.NoError(t, err, where)
				require.False(t, again.Allowed, "the cache denied what Redis allows: "+where)
				local++
			}
		}
	}
	require.Greater(t, local, 100)
}

// Reset through the same Limiter clears its cache entry.
func TestDenyCacheReset(t *testing.T) {
	t.Parallel()
	e := miniredisEnv(t)
	ctx := context.Background()
	l := e.limiter(ratelimit.WithDenyCache(10))
	limit := ratelimit.PerMinute(1)
	_, err := l.Allow(ctx, "id", limit)
	require.NoError(t, err)
	res, err := l.Allow(ctx, "id", limit)
	require.NoError(t, err)
	require.False(t, res.Allowed)
	require.NoError(t, l.Reset(ctx, "id", limit))
	res, err = l.Allow(ctx, "id", limit)
	require.NoError(t, err)
	require.True(t, res.Allowed)
}

// AllowMany asks and teaches the deny cache as AllowAll does, per quota's
// ID: a client hammering past one of its ids' limits is denied locally,
// with the Results Redis would give, until a request could pass.
func TestDenyCacheAllowMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := clock.NewFake(epoch.Add(250 * time.Millisecond))
	newLimiter := func(opts ...ratelimit.Option) (*ratelimit.Limiter, *miniredis.Miniredis) {
		mr := miniredis.RunT(t)
		c := newClient(t, &redis.Options{Addr: mr.Addr()})
		return ratelimit.New(c, append(opts, ratelimit.WithClock(clk.Now), ratelimit.WithTimeout(time.Minute))...), mr
	}
	plain, plainRedis := newLimiter()
	cached, cachedRedis := newLimiter(ratelimit.WithDenyCache(100))
	var sources []ratelimit.Source
	var mu sync.Mutex
	watched, _ := newLimiter(ratelimit.WithDenyCache(100), ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, ev *ratelimit.Event) {
		mu.Lock()
		sources = append(sources, ev.Source)
		mu.Unlock()
	})))
	quotas := []ratelimit.Quota{
		{ID: "per-key|alpha", Limit: ratelimit.PerSecond(10), Cost: 1},
		{ID: "per-ip|192.0.2.1", Limit: ratelimit.PerSecond(3), Cost: 1},
	}
	for step := range 40 {
		if step == 20 {
			clk.Add(time.Second) // the next window: the cache lets it through to Redis
		}
		want, err := plain.AllowMany(ctx, quotas)
		require.NoError(t, err)
		got, err := cached.AllowMany(ctx, quotas)
		require.NoError(t, err)
		require.Equal(t, ratelimit.PublicAll(want), ratelimit.PublicAll(got), "step %d", step)
		_, err = watched.AllowMany(ctx, quotas)
		require.NoError(t, err)
	}
	t.Logf("commands without the cache %d, with it %d", plainRedis.CommandCount(), cachedRedis.CommandCount())
	require.Less(t, cachedRedis.CommandCount(), plainRedis.CommandCount()/2, "the cache answered too few denials")
	require.Contains(t, sources, ratelimit.SourceCache)
}
