package ratelimit_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// Three application servers whose local clocks disagree: the second is 30s
// ahead of the first, the third 45s behind it.
var skews = []time.Duration{0, 30 * time.Second, -45 * time.Second}

// skewLimit spans a few windows over a run of skewSteps, with denials in each.
var skewLimit = ratelimit.Limit{Rate: 50, Window: time.Minute}

// skewT is what the shared Redis (and the reference clock) says the time is
// when a run starts; the servers' local clocks are hours off it as well as
// off each other.
var skewT = time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)

// step is one request in a run: real time moves by after, then server sends
// a request of cost cost.
type step struct {
	after  time.Duration
	server int
	cost   int64
}

// decision is the part of a Result that depends on the shared count.
type decision struct {
	Allowed bool
	Count   int64
}

// skewSteps returns the same few hundred requests every time: bursts (no
// time between requests) and pauses of up to 2s, from each server in turn
// at random.
func skewSteps() []step {
	rng := rand.New(rand.NewPCG(1, 2))
	gaps := []time.Duration{0, 0, 10 * time.Millisecond, 100 * time.Millisecond, time.Second, 2 * time.Second}
	steps := make([]step, 300)
	for i := range steps {
		steps[i] = step{after: gaps[rng.IntN(len(gaps))], server: rng.IntN(len(skews)), cost: 1 + rng.Int64N(2)}
	}
	return steps
}

// run sends steps to limiters, advancing real time with advance, and
// returns the decisions. every, if not nil, is called every 50 steps with
// the real time elapsed since the start.
func run(t *testing.T, steps []step, limiters []*ratelimit.Limiter, advance func(time.Duration), every func(elapsed time.Duration)) []decision {
	t.Helper()
	var elapsed time.Duration
	got := make([]decision, len(steps))
	for i, s := range steps {
		advance(s.after)
		elapsed += s.after
		if every != nil && i%50 == 49 {
			every(elapsed)
		}
		res, err := limiters[s.server].AllowN(t.Context(), "id", skewLimit, s.cost)
		require.NoError(t, err)
		require.False(t, res.Degraded)
		got[i] = decision{res.Allowed, res.Count}
	}
	return got
}

// reference returns what a single limiter on a single clock decides for steps.
func reference(t *testing.T, steps []step) []decision {
	t.Helper()
	mr := miniredis.RunT(t)
	client := newClient(t, &redis.Options{Addr: mr.Addr()})
	ref := clock.NewFake(skewT)
	l := ratelimit.New(client, ratelimit.WithTimeout(time.Minute), ratelimit.WithClock(ref.Now))
	return run(t, steps, []*ratelimit.Limiter{l, l, l}, func(d time.Duration) { ref.Add(d) }, nil)
}

// servers returns one local clock per skew, all hours off skewT, and a
// function that moves them all by the same real time.
func servers() ([]*clock.Fake, func(time.Duration)) {
	base := skewT.Add(-3*time.Hour + 123*time.Millisecond)
	locals := make([]*clock.Fake, len(skews))
	for i, skew := range skews {
		locals[i] = clock.NewFake(base.Add(skew))
	}
	return locals, func(d time.Duration) {
		for _, l := range locals {
			l.Add(d)
		}
	}
}

// summary counts the cost a run admitted and the requests it denied.
func summary(steps []step, ds []decision) (admitted int64, denied int) {
	for i, d := range ds {
		if d.Allowed {
			admitted += steps[i].cost
		} else {
			denied++
		}
	}
	return admitted, denied
}

// With a RedisClock each, three servers whose clocks are up to 75s apart
// decide exactly what one limiter on one clock decides, request by request,
// across resyncs.
func TestSkewRedisClockAgrees(t *testing.T) {
	t.Parallel()
	steps := skewSteps()
	want := reference(t, steps)
	admitted, denied := summary(steps, want)
	require.Greater(t, admitted, 2*skewLimit.Rate, "the run spans several windows")
	require.Greater(t, denied, 50, "the run is denied often")

	mr := miniredis.RunT(t)
	mr.SetTime(skewT)
	locals, advance := servers()
	clocks := make([]*ratelimit.RedisClock, len(skews))
	limiters := make([]*ratelimit.Limiter, len(skews))
	for i, local := range locals {
		// Each server its own connection, its own clock, its own limiter.
		client := newClient(t, &redis.Options{Addr: mr.Addr()})
		clocks[i] = ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0), ratelimit.WithLocalClock(local.Now))
		defer clocks[i].Close()
		require.NoError(t, clocks[i].Sync(t.Context()))
		limiters[i] = ratelimit.New(client, ratelimit.WithTimeout(time.Minute), ratelimit.WithClock(clocks[i].Now))
	}
	got := run(t, steps, limiters, advance, func(elapsed time.Duration) {
		// Redis's clock has moved with real time; every server resyncs.
		mr.SetTime(skewT.Add(elapsed))
		for _, c := range clocks {
			require.NoError(t, c.Sync(t.Context()))
		}
	})
	require.Equal(t, want, got)
}

// With their own clocks (WithClock(local.Now)), the same three servers
// decide differently from one limiter on one clock, and admit more. Each
// places the request in the window its own clock is in: the server 30s ahead
// counts in windows the others reach only 30s later, and the one 45s behind
// in windows the others have left. Each sees the others' counts only as the
// faded "previous window", or not at all.
func TestSkewLocalClocksDisagree(t *testing.T) {
	t.Parallel()
	steps := skewSteps()
	want := reference(t, steps)

	mr := miniredis.RunT(t)
	locals, advance := servers()
	limiters := make([]*ratelimit.Limiter, len(skews))
	for i, local := range locals {
		client := newClient(t, &redis.Options{Addr: mr.Addr()})
		limiters[i] = ratelimit.New(client, ratelimit.WithTimeout(time.Minute), ratelimit.WithClock(local.Now))
	}
	got := run(t, steps, limiters, advance, nil)
	require.NotEqual(t, want, got)
	// The run lasts 2m49s of real time, in three one-minute windows of the
	// reference clock: one clock admits 149 cost units of the 150 that three
	// windows allow. The three skewed clocks admit 189 between them, 40 over.
	wantAdmitted, _ := summary(steps, want)
	gotAdmitted, _ := summary(steps, got)
	require.Equal(t, int64(149), wantAdmitted)
	require.Equal(t, int64(189), gotAdmitted)
}

// burst has each server, at one real instant, send requests until it is
// denied, and returns how many the three admitted between them.
func burst(t *testing.T, limiters []*ratelimit.Limiter, limit ratelimit.Limit) int64 {
	t.Helper()
	var admitted int64
	for _, l := range limiters {
		for range 2 * limit.Rate {
			res, err := l.Allow(t.Context(), "id", limit)
			require.NoError(t, err)
			if !res.Allowed {
				break
			}
			admitted++
		}
	}
	return admitted
}

// The overshoot, concretely. Limit 10 per minute; the first server's clock
// is 40s into window i, so the second's (+30s) is 10s into window i+1 and
// the third's (-45s) 55s into window i-1. All at one real instant:
//   - the first admits 10 into window i;
//   - the second sees them as its previous window weighted by the 50s left
//     of its own: floor(10 × 50/60) = 8, and admits 2 more into window i+1;
//   - the third counts in window i-1, and sees window i-2 as its previous:
//     nothing at all. It admits 10.
//
// 22 requests pass a limit of 10 in one instant. With RedisClocks the three
// agree and admit 10.
func TestSkewBurstOvershoot(t *testing.T) {
	t.Parallel()
	limit := ratelimit.Limit{Rate: 10, Window: time.Minute}
	first := time.Date(2031, 5, 6, 7, 8, 40, 0, time.UTC) // 40s into a minute

	t.Run("local clocks", func(t *testing.T) {
		mr := miniredis.RunT(t)
		client := newClient(t, &redis.Options{Addr: mr.Addr()})
		var limiters []*ratelimit.Limiter
		for _, skew := range skews {
			limiters = append(limiters, ratelimit.New(client, ratelimit.WithTimeout(time.Minute), ratelimit.WithClock(clock.NewFake(first.Add(skew)).Now)))
		}
		require.Equal(t, int64(22), burst(t, limiters, limit))
	})

	t.Run("RedisClock", func(t *testing.T) {
		mr := miniredis.RunT(t)
		mr.SetTime(first)
		client := newClient(t, &redis.Options{Addr: mr.Addr()})
		var limiters []*ratelimit.Limiter
		for _, skew := range skews {
			rc := ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0),
				ratelimit.WithLocalClock(clock.NewFake(first.Add(skew)).Now))
			defer rc.Close()
			require.NoError(t, rc.Sync(t.Context()))
			limiters = append(limiters, ratelimit.New(client, ratelimit.WithTimeout(time.Minute), ratelimit.WithClock(rc.Now)))
		}
		require.Equal(t, int64(10), burst(t, limiters, limit))
	})
}

// Against a real redis-server, with real local clocks skewed by the same
// amounts: once synced, the three clocks agree to within half their
// samples' round trips (a few ms on an idle machine), not 75s.
func TestSkewRealServer(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	clocks := make([]*ratelimit.RedisClock, len(skews))
	rtts := make([]time.Duration, len(skews))
	for i, skew := range skews {
		// Synced by hand only, so that the round trip of each sample is
		// known.
		clocks[i] = ratelimit.NewRedisClock(client, ratelimit.WithSyncInterval(0),
			ratelimit.WithLocalClock(func() time.Time { return time.Now().Add(skew) }))
		defer clocks[i].Close()
		rtts[i] = timedSync(t, clocks[i])
	}
	for range 10 {
		for i, c := range clocks[1:] {
			begin := time.Now()
			first, other := clocks[0].Now(), c.Now()
			// Read after the first: later by the time between the reads,
			// plus or minus the two samples' half round trips.
			bound := rtts[0]/2 + rtts[i+1]/2 + time.Since(begin) + time.Millisecond
			require.WithinDuration(t, first, other, bound)
		}
	}
}
