package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
	"github.com/stretchr/testify/require"
)

func TestAccount(t *testing.T) {
	const w, rate = 1000, 10
	var calls []Call
	at := func(start, end int64, n int) {
		for range n {
			calls = append(calls, Call{Start: start, End: end, At: noPlace})
		}
	}
	// Window 5 (ms 5000-5999): 10 at its start. Window 6: 2 at its ms 900,
	// where the estimate is 2 + floor(10 × 100/1000) = 3; then 1 that started
	// in window 6 and returned in window 7. Window 7: 8 at its ms 0.
	at(5000, 5000, 10)
	at(6900, 6901, 2)
	at(6999, 7000, 1)
	at(7000, 7000, 8)
	a := Account(calls, w, rate)
	require.False(t, a.Placed)
	require.Equal(t, int64(21), a.Admitted)
	require.Equal(t, 3, a.Windows)
	require.Equal(t, []int64{10, 3, 8}, a.PerWindow) // where they started
	require.Equal(t, int64(1), a.Straddled)
	require.InDelta(t, 1.0, a.WorstWindow, 1e-9) // window 5
	// Window 7 could hold 9 (the straddler), window 6 3: window 5 is the worst.
	require.InDelta(t, 1.0, a.WorstWindowBound, 1e-9)
	// At ms 7000 the estimate is 8 + floor(3 × 1000/1000) = 11 with the
	// straddler in window 6, where it started; the bound counts it in both
	// windows: 9 + 3 = 12.
	require.InDelta(t, 1.1, a.WorstEstimate, 1e-9)
	require.InDelta(t, 1.2, a.WorstEstimateBound, 1e-9)
	// Intervals that begin a window after the first admission, ms 6000:
	// [6001, 7000] holds 2 + 1 + 8.
	require.InDelta(t, 1.1, a.WorstInterval, 1e-9)
	// Windows from ms 5000: [5000, 5999] 10, [6000, 6999] 3, [7000, ...] 8.
	require.InDelta(t, 1.0, a.WorstFromFirst, 1e-9)

	// Placed by the limiter, the straddler is in window 7: 1 + floor(2 ×
	// 1000/1000) = 3 at its ms 0, then 9 + 2 = 11.
	for i := range calls {
		calls[i].At = calls[i].End
	}
	a = Account(calls, w, rate)
	require.True(t, a.Placed)
	require.Equal(t, []int64{10, 2, 9}, a.PerWindow)
	require.InDelta(t, 1.1, a.WorstEstimate, 1e-9)
	require.InDelta(t, 1.2, a.WorstEstimateBound, 1e-9)

	require.Zero(t, Account(nil, w, rate).Admitted)
}

// The sliding estimate catches what a fixed window's count misses: a
// window's worth admitted at the end of one window and again at the start
// of the next is within each window, and twice the limit by the estimate.
func TestAccountSeesABurstAcrossTheEdge(t *testing.T) {
	var calls []Call
	for range 10 {
		calls = append(calls, Call{Start: 999, End: 999, At: 999}, Call{Start: 1000, End: 1000, At: 1000})
	}
	a := Account(calls, 1000, 10)
	require.Equal(t, []int64{10, 10}, a.PerWindow)
	require.InDelta(t, 1.0, a.WorstWindow, 1e-9)
	require.InDelta(t, 2.0, a.WorstEstimate, 1e-9)
}

func TestPlacerNotesTheCallersReading(t *testing.T) {
	var p Placer
	mine := p.slot()
	*mine = noPlace
	before := time.Now().UnixMilli()
	got := p.Now().UnixMilli()
	require.Equal(t, got, *mine)
	require.GreaterOrEqual(t, got, before)
	done := make(chan *int64)
	go func() {
		other := p.slot()
		*other = noPlace
		p.Now()
		done <- other
	}()
	other := <-done
	require.NotSame(t, mine, other)
	require.GreaterOrEqual(t, *other, got)
	require.Equal(t, got, *mine) // not the other goroutine's reading
	require.Same(t, mine, p.slot())
	go func() { p.Now(); close(done) }() // a goroutine without a slot: not noted
	<-done
}

// Both modes run on miniredis, where every decision is allowed: the leased
// one decides from leases, the unleased one in Redis.
func TestRunHotModes(t *testing.T) {
	mr := miniredis.RunT(t)
	for _, mode := range HotModes {
		t.Run(mode, func(t *testing.T) {
			mr.FlushAll()
			limit := ratelimit.Limit{Rate: 1 << 40, Window: time.Second, Leased: mode == "leased"}
			res, err := RunHot(context.Background(), HotConfig{
				Name: mode, Servers: NewHotOurs(mr.Addr(), 2, limit, nil), Concurrency: 2, ID: "hot",
				Duration: 200 * time.Millisecond, Warmup: 20 * time.Millisecond,
				Rate: limit.Rate, Window: limit.Window, MinAllowed: 0.999,
			})
			require.NoError(t, err)
			require.True(t, res.OK, res.Problem)
			require.Equal(t, res.Decisions, res.Allowed)
			require.Positive(t, res.P50)
			require.InDelta(t, 1, res.LeaseShare+res.RedisShare, 1e-9)
			if mode == "leased" {
				require.Greater(t, res.LeaseShare, 0.5)
				require.Positive(t, res.LeaseP50)
			} else {
				require.Zero(t, res.LeaseShare)
			}
			require.Nil(t, res.Admission)
		})
	}
}

// With a limit that is reached, every admitted decision is accounted for,
// placed where its Limiter read the clock, and no window admits more than
// the limit.
func TestRunHotAccountsForAReachedLimit(t *testing.T) {
	mr := miniredis.RunT(t)
	for _, mode := range HotModes {
		t.Run(mode, func(t *testing.T) {
			mr.FlushAll()
			limit := ratelimit.Limit{Rate: 40, Window: 100 * time.Millisecond, Leased: mode == "leased"}
			placer := new(Placer)
			res, err := RunHot(context.Background(), HotConfig{
				Name: mode, Servers: NewHotOurs(mr.Addr(), 2, limit, placer), Concurrency: 2, ID: "hot",
				Duration: 350 * time.Millisecond, Warmup: 10 * time.Millisecond,
				Rate: limit.Rate, Window: limit.Window, Windows: true, Placer: placer,
			})
			require.NoError(t, err)
			require.True(t, res.OK, res.Problem)
			require.Positive(t, res.Denied)
			a := res.Admission
			require.NotNil(t, a)
			require.GreaterOrEqual(t, a.Admitted, res.Allowed)
			require.GreaterOrEqual(t, a.Windows, 4)
			require.True(t, a.Placed)
			require.LessOrEqual(t, a.WorstWindow, 1.0, "%v", a.PerWindow)
		})
	}
}

// On a redis-server, 8 Limiters of 8 goroutines each: leased decisions take
// a few Redis calls per 1,000, unleased ones hundreds.
func TestRunHotOnRedis(t *testing.T) {
	addr := startRedis(t)
	stats := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { stats.Close() })
	for _, mode := range HotModes {
		t.Run(mode, func(t *testing.T) {
			require.NoError(t, stats.FlushAll(context.Background()).Err())
			limit := ratelimit.Limit{Rate: 1 << 40, Window: time.Second, Leased: mode == "leased"}
			res, err := RunHot(context.Background(), HotConfig{
				Name: mode, Servers: NewHotOurs(addr, 8, limit, nil), Concurrency: 8, ID: "hot",
				Duration: 500 * time.Millisecond, Warmup: 50 * time.Millisecond,
				Rate: limit.Rate, Window: limit.Window, MinAllowed: 0.999, Stats: stats,
			})
			require.NoError(t, err)
			require.True(t, res.OK, res.Problem)
			require.Positive(t, res.RedisCPUPerDecision)
			if mode == "leased" {
				require.Less(t, res.ScriptCallsPer1000, 10.0)
				require.Greater(t, res.LeaseShare, 0.99)
			} else {
				require.Greater(t, res.ScriptCallsPer1000, 10.0)
			}
		})
	}
}

func TestHotTable(t *testing.T) {
	lines := `{"kind":"hot","name":"unleased","servers":8,"concurrency":8,"rate":1099511627776,"window_ms":1000,"round":1,"decisions":100,"allowed":100,"decisions_per_s":20000,"p50_us":2000,"p99_us":9000,"redis_share":1,"redis_p50_us":2000,"redis_stats":true,"script_calls_per_1000":400,"ok":true}
{"kind":"hot","name":"leased","servers":8,"concurrency":8,"rate":1099511627776,"window_ms":1000,"round":1,"decisions":100,"allowed":100,"decisions_per_s":1000000,"p50_us":0.5,"p99_us":0.9,"lease_share":0.99,"lease_p50_us":0.5,"lease_p99_us":0.9,"redis_share":0.01,"redis_p50_us":7000,"redis_stats":true,"script_calls_per_1000":0.03,"ok":true}
{"kind":"hot","name":"leased","servers":8,"concurrency":8,"rate":1099511627776,"window_ms":1000,"round":2,"decisions":100,"allowed":100,"decisions_per_s":1200000,"p50_us":0.6,"p99_us":1.1,"lease_share":0.99,"lease_p50_us":0.6,"lease_p99_us":1.1,"redis_share":0.01,"redis_p50_us":8000,"redis_stats":true,"script_calls_per_1000":0.05,"ok":true}
{"kind":"hot","name":"unleased","servers":8,"concurrency":8,"rate":1099511627776,"window_ms":1000,"round":2,"decisions":100,"allowed":100,"decisions_per_s":30000,"p50_us":2000,"p99_us":9000,"redis_share":1,"redis_p50_us":2000,"redis_stats":true,"script_calls_per_1000":400,"ok":true}
{"kind":"hot","name":"leased","servers":8,"concurrency":8,"rate":10000,"window_ms":1000,"round":1,"decisions":100,"allowed":40,"denied":60,"decisions_per_s":25000,"redis_stats":true,"script_calls_per_1000":300,"admission":{"admitted":50000,"windows":6,"placed":true,"worst_window":1,"worst_window_bound":1.0004,"worst_estimate":1,"worst_estimate_bound":1.002,"worst_interval":1.01,"worst_from_first":1.3,"straddled":40,"per_window":[10000,9990,9000]},"ok":true}
{"kind":"hot","name":"unleased","servers":8,"concurrency":8,"rate":10000,"window_ms":1000,"round":1,"decisions":100,"denied":100,"errors":2,"decisions_per_s":25000,"ok":false,"problem":"2 calls failed"}
`
	res, err := ReadHotResults(strings.NewReader(lines))
	require.NoError(t, err)
	require.Len(t, res, 6)
	var b strings.Builder
	require.NoError(t, HotTable(&b, res))
	out := b.String()
	// A row whose every run failed has no figures, only its failure.
	require.NotContains(t, out, "| unleased | 8 × 8 | 10,000 per 1s |")
	for _, want := range []string{
		"| unleased | 8 × 8 | 2^40 per 1s | 25,000 (20,000–30,000) | 1.00× | 400.00 |",
		// 1,000,000 / 20,000 and 1,200,000 / 30,000, each within its round.
		"| leased | 8 × 8 | 2^40 per 1s | 1,100,000 (1,000,000–1,200,000) | 45.0× (40.0–50.0) | 0.04 (0.03–0.05) | 0.55 (0.50–0.60) |",
		"| 99.0% | 0.550 (0.500–0.600) | 1.00 (0.90–1.10) | 7,500.0 (7,000.0–8,000.0) |",
		"| leased | 8 × 8 | 10,000 per 1s | 25,000 | 40.0% | 300.0 | 6 | the limiter's clock | 1.0000 | 1.0004 | 1.0000 | 1.0020 | 1.3000 | 1.0100 | 40 | 1 |",
		"unleased, 8 × 8, 10,000 per 1s, round 1: 2 calls failed",
	} {
		require.Contains(t, out, want)
	}
	_, err = ReadHotResults(strings.NewReader(`{"kind":"run"}`))
	require.Error(t, err)
}
