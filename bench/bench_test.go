package bench

import (
	"context"
	"fmt"
	"math"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
	"github.com/stretchr/testify/require"
)

func TestHistogramQuantiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals []time.Duration
	}{
		{"small", []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{"spread", func() []time.Duration {
			var v []time.Duration
			for i := 1; i <= 10000; i++ {
				v = append(v, time.Duration(i)*time.Microsecond)
			}
			return v
		}()},
		{"huge", []time.Duration{time.Hour, 2 * time.Hour, math.MaxInt64}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h histogram
			for _, v := range tc.vals {
				h.record(v)
			}
			sorted := slices.Clone(tc.vals)
			slices.Sort(sorted)
			for _, q := range []float64{0.5, 0.99, 1} {
				want := float64(sorted[int(math.Ceil(q*float64(len(sorted))))-1])
				got := h.quantile(q)
				require.InDelta(t, want, got, want/64+1, "q=%v", q)
			}
		})
	}
}

func TestHistogramBucketsAreContiguous(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<20; v++ {
		b := bucketOf(v)
		require.True(t, b == prev || b == prev+1, "v=%d: bucket %d after %d", v, b, prev)
		prev = b
	}
	require.Less(t, bucketOf(math.MaxInt64), nBuckets)
	require.Less(t, bucketOf(math.MaxUint64), nBuckets)
}

// Every contender allows the first requests of a fresh id and denies once
// the limit is reached: the comparison compares rate limiters that work.
func TestContendersDecide(t *testing.T) {
	for _, c := range Contenders() {
		if c.Offline {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			mr := miniredis.RunT(t)
			env := newTestEnv(t, mr, ratelimit.PerMinute(3))
			d, err := c.New(context.Background(), env)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, closeDecider(d)) })
			var got []bool
			for range 5 {
				ok, err := d.Allow(context.Background(), "client-1")
				require.NoError(t, err)
				got = append(got, ok)
			}
			require.Equal(t, []bool{true, true, true, false, false}, got)
		})
	}
}

// bare/incr counts in the key the library writes for the current window,
// with the TTL the library gives it: its INCR and PEXPIRE are the bare
// form of the library's write.
func TestBareIncrWritesTheLibrarysKey(t *testing.T) {
	mr := miniredis.RunT(t)
	at := time.Now() // one window for both, whenever the test runs
	ttls := map[string]map[string]time.Duration{}
	for _, name := range []string{"ours", "bare/incr"} {
		mr.FlushAll()
		c, err := Lookup(name)
		require.NoError(t, err)
		env := newTestEnv(t, mr, ratelimit.PerMinute(10))
		env.Now = func() time.Time { return at }
		d, err := c.New(context.Background(), env)
		require.NoError(t, err)
		ok, err := d.Allow(context.Background(), "client-7")
		require.NoError(t, err)
		require.True(t, ok)
		ttls[name] = map[string]time.Duration{}
		for _, k := range mr.Keys() {
			ttls[name][k] = mr.TTL(k)
		}
	}
	require.Len(t, ttls["ours"], 1)
	require.Equal(t, ttls["ours"], ttls["bare/incr"])
}

func TestRunNoopAllocatesNothing(t *testing.T) {
	c, err := Lookup("noop")
	require.NoError(t, err)
	s, err := LookupScenario("allowed")
	require.NoError(t, err)
	res, err := Run(context.Background(), RunConfig{
		Contender: c, Scenario: s, Concurrency: 2,
		Duration: 200 * time.Millisecond, Warmup: 10 * time.Millisecond,
		Options: redis.Options{Addr: "127.0.0.1:1"},
	})
	require.NoError(t, err)
	require.True(t, res.OK, res.Problem)
	require.Positive(t, res.Decisions)
	require.Less(t, res.AllocsPerDecision, 0.001)
}

func TestRunCountsAndChecks(t *testing.T) {
	mr := miniredis.RunT(t)
	for _, tc := range []struct {
		scenario string
		wantOK   bool
	}{
		{"allowed", true},
		{"denied", true},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			c, err := Lookup("ours")
			require.NoError(t, err)
			s, err := LookupScenario(tc.scenario)
			require.NoError(t, err)
			res, err := Run(context.Background(), RunConfig{
				Contender: c, Scenario: s, Concurrency: 4,
				Duration: 200 * time.Millisecond, Warmup: 20 * time.Millisecond,
				Options: redis.Options{Addr: mr.Addr()}, IDPrefix: tc.scenario + "-",
			})
			require.NoError(t, err)
			require.Equal(t, tc.wantOK, res.OK, res.Problem)
			require.Equal(t, res.Decisions, res.Allowed+res.Denied)
			require.Positive(t, res.P99)
			require.GreaterOrEqual(t, res.P99, res.P50)
			if _, ok := processCPU(); ok {
				require.Positive(t, res.ClientCPUPerDecision)
			}
		})
	}
}

func TestCheckFailsALimiterThatDoesNotLimit(t *testing.T) {
	s, err := LookupScenario("denied")
	require.NoError(t, err)
	require.Contains(t, check(RunResult{Decisions: 100, Allowed: 100}, s, false), "denied")
	require.Contains(t, check(RunResult{Decisions: 100, Denied: 100, Degraded: 1, FirstDegraded: "late"}, s, false), "1 decisions degraded")
	require.Contains(t, check(RunResult{Decisions: 100, Denied: 100, Errors: 1, FirstError: "boom"}, s, false), "boom")
	require.Equal(t, "", check(RunResult{Decisions: 100, Allowed: 5, Denied: 95}, s, false))
}

func TestMeasureMemory(t *testing.T) {
	addr := startRedis(t)
	c, err := Lookup("ours")
	require.NoError(t, err)
	res, err := MeasureMemory(context.Background(), MemoryConfig{
		Contender: c, Options: redis.Options{Addr: addr},
		Clients: 1000, Windows: 2, Concurrency: 4, Flush: true,
	})
	require.NoError(t, err)
	require.True(t, res.OK, res.Problem)
	require.Equal(t, int64(2000), res.Keys)
	require.Equal(t, 2.0, res.KeysPerClient)
	// A key, its value and its TTL take tens of bytes at the very least.
	require.Greater(t, res.BytesPerClient, 2*50.0)
}

func TestTable(t *testing.T) {
	// bare/incr ran in rounds 1 and 2 only, listed round 2 first: ours's
	// ratios to it are those of rounds 1 and 2, each against its own
	// round's, not paired by position.
	lines := `{"kind":"run","contender":"ours","scenario":"allowed","concurrency":8,"round":1,"decisions":100,"allowed":100,"decisions_per_s":1000,"p50_us":10,"p99_us":20,"script_calls_per_decision":0.25,"script_us_per_decision":2,"ok":true}
{"kind":"run","contender":"ours","scenario":"allowed","concurrency":8,"round":2,"decisions":100,"allowed":100,"decisions_per_s":3000,"p50_us":12,"p99_us":30,"script_calls_per_decision":0.25,"script_us_per_decision":3,"ok":true}
{"kind":"run","contender":"ours","scenario":"allowed","concurrency":8,"round":3,"decisions":100,"allowed":100,"decisions_per_s":2000,"p50_us":11,"p99_us":25,"script_calls_per_decision":0.25,"script_us_per_decision":2.5,"ok":true}
{"kind":"run","contender":"bare/incr","scenario":"allowed","concurrency":8,"round":2,"decisions":100,"allowed":100,"decisions_per_s":5000,"script_calls_per_decision":1,"script_us_per_decision":8,"ok":true}
{"kind":"run","contender":"bare/incr","scenario":"allowed","concurrency":8,"round":1,"decisions":100,"allowed":100,"decisions_per_s":5000,"script_calls_per_decision":1,"script_us_per_decision":4,"ok":true}
{"kind":"run","contender":"ulule","scenario":"allowed","concurrency":8,"round":1,"decisions":100,"allowed":100,"decisions_per_s":4000,"p50_us":5,"p99_us":9,"slow":2,"client_cpu_us_per_decision":31.5,"redis_cpu_us_per_decision":7.25,"script_calls_per_decision":1,"script_us_per_decision":7,"ok":true}
{"kind":"run","contender":"ours+denycache","scenario":"denied","concurrency":64,"round":1,"decisions":100,"denied":100,"degraded":3,"decisions_per_s":9000,"ok":false,"problem":"3 decisions degraded"}

{"kind":"run","contender":"throttled","scenario":"allowed","concurrency":8,"round":1,"decisions":100,"allowed":100,"errors":3,"decisions_per_s":500,"ok":false,"problem":"3 calls failed"}
{"kind":"memory","contender":"ours","windows":1,"clients":100000,"bytes_per_client":132.8,"keys_per_client":1,"clocked":true,"ok":true}
{"kind":"memory","contender":"ours","windows":2,"clients":100000,"bytes_per_client":265.8,"keys_per_client":2,"clocked":true,"ok":true}
{"kind":"memory","contender":"ulule","windows":2,"clients":100000,"bytes_per_client":119.1,"keys_per_client":1,"ok":true}
`
	res, err := ReadResults(strings.NewReader(lines))
	require.NoError(t, err)
	require.Len(t, res.Runs, 8)
	require.Len(t, res.Memory, 3)
	require.True(t, res.Failed())
	var b strings.Builder
	require.NoError(t, Table(&b, res))
	out := b.String()
	for _, want := range []string{
		"| script calls/decision | script µs/call | call × bare/incr | script µs/decision | decision × bare/incr | allowed |",
		// Script µs per call 8, 12, 10; against bare/incr's 4 and 8: 2 and
		// 1.5 per call, 0.5 and 0.375 per decision.
		"| ours | 8 | 2,000 (1,000–3,000) | 1.00× | 11.0 (10.0–12.0) | 25.0 (20.0–30.0) | 0.0 | 0 | 0.0 | 0.0 | 0.250 | " +
			"10.0 (8.0–12.0) | 1.75× (1.50–2.00) | 2.5 (2.0–3.0) | 0.44× (0.38–0.50) |",
		"| bare/incr | 8 | 5,000 | 2.50× |",
		"| 1.000 | 6.0 (4.0–8.0) | 1.00× | 6.0 (4.0–8.0) | 1.00× |",
		"| ulule | 8 | 4,000 | 2.00× | 5.0 | 9.0 | 0.0 | 0 | 31.5 | 7.2 | 1.000 | 7.0 | 1.75× | 7.0 | 1.75× | 100.0% | 0.0% | 2 | 0 | 1 |",
		// No script call: no time per call; no bare/incr in the scenario: no multiple.
		"| throttled | 8 | 500 | 0.25× | 0.0 | 0.0 | 0.0 | 0 | 0.0 | 0.0 | 0.000 | – | – | 0.0 | 0.00× |",
		"| ours+denycache | 64 | 9,000 | – | 0.0 | 0.0 | 0.0 | 0 | 0.0 | 0.0 | 0.000 | – | – | 0.0 | – |",
		"| 0.0% | 100.0% | 0 | 3 | 1 (1 FAILED) |",
		"1 (1 FAILED)",
		"| ours | 132.8 | 1.00 | 265.8 | 2.00 |",
		"| ulule | – | – | 119.1 | 1.00† |",
		"throttled, allowed, 8 goroutines, round 1: 3 calls failed",
	} {
		require.Contains(t, out, want)
	}
}

func TestGroupThousands(t *testing.T) {
	for in, want := range map[string]string{
		"0": "0", "999": "999", "1000": "1,000", "1234567.89": "1,234,567.89", "-12345": "-12,345",
	} {
		require.Equal(t, want, groupThousands(in), in)
	}
}

// newTestEnv returns an Env on mr, whose client is closed with the test.
func newTestEnv(t *testing.T, mr *miniredis.Miniredis, limit ratelimit.Limit) Env {
	t.Helper()
	opts := redis.Options{Addr: mr.Addr()}
	client := redis.NewClient(&opts)
	t.Cleanup(func() { client.Close() })
	return Env{Client: client, Options: opts, Limit: limit, Now: time.Now}
}

// startRedis starts a redis-server of the test's own on a free loopback
// port, stopped with the test, and returns its address; it skips the test
// if there is no redis-server.
func startRedis(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Skip("no redis-server on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(tb, l.Close())
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--loglevel", "warning")
	require.NoError(tb, cmd.Start())
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	require.Eventually(tb, func() bool { return client.Ping(context.Background()).Err() == nil },
		5*time.Second, 20*time.Millisecond, "redis-server did not answer on %s", addr)
	return addr
}

// A degraded decision is counted apart from errors and decisions, and fails
// the run, whichever contender returns it.
func TestRunCountsDegradedDecisions(t *testing.T) {
	s, err := LookupScenario("allowed")
	require.NoError(t, err)
	var n atomic.Int64
	c := Contender{Name: "flaky", Offline: true, New: func(context.Context, Env) (Decider, error) {
		return DeciderFunc(func(context.Context, string) (bool, error) {
			if n.Add(1)%100 == 0 {
				return true, fmt.Errorf("%w: no reply within 100ms", ErrDegraded)
			}
			return true, nil
		}), nil
	}}
	res, err := Run(context.Background(), RunConfig{
		Contender: c, Scenario: s, Concurrency: 2,
		Duration: 50 * time.Millisecond, Warmup: 5 * time.Millisecond,
		Options: redis.Options{Addr: "127.0.0.1:1"},
	})
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Positive(t, res.Degraded)
	require.Zero(t, res.Errors)
	require.Contains(t, res.Problem, "decisions degraded")
	require.Contains(t, res.FirstDegraded, "no reply within 100ms")
}

// The bench's ours contenders really differ in what their names say.
func TestOursVariants(t *testing.T) {
	addr := startRedis(t)
	for _, tc := range []struct {
		name   string
		lo, hi float64 // script calls per decision at 64 goroutines
	}{
		{"ours", 0.001, 0.9}, // batched
		{"ours/nobatch", 0.95, 1.05},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Lookup(tc.name)
			require.NoError(t, err)
			s, err := LookupScenario("allowed")
			require.NoError(t, err)
			res, err := Run(context.Background(), RunConfig{
				Contender: c, Scenario: s, Concurrency: 64,
				Duration: 300 * time.Millisecond, Warmup: 50 * time.Millisecond,
				Options: redis.Options{Addr: addr}, IDPrefix: strings.ReplaceAll(tc.name, "/", "-") + "-",
			})
			require.NoError(t, err)
			require.True(t, res.OK, res.Problem)
			require.Positive(t, res.RedisCPUPerDecision)
			require.InDelta(t, (tc.lo+tc.hi)/2, res.ScriptCallsPerDecision, (tc.hi-tc.lo)/2)
		})
	}
}
