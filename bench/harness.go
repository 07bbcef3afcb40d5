package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
)

// Scenario is a pattern of traffic and the outcome every contender must
// produce under it, or the run fails.
type Scenario struct {
	// Name is how the command line, the JSON and the table call it.
	Name string
	// About says what the scenario is, for the table.
	About string
	// Limit is the limit every decision is made against.
	Limit ratelimit.Limit
	// IDs is how many distinct client ids the goroutines cycle through.
	IDs int
	// MinAllowed and MinDenied are the least shares (0 to 1) of decisions
	// that must be allowed and denied: a check that the calls did real work.
	MinAllowed, MinDenied float64
	// Prime is how many decisions one goroutine makes, over the ids in
	// order, before the run's goroutines start; they are not measured.
	Prime int
}

// Scenarios returns the scenarios of a run, in the table's order.
func Scenarios() []Scenario {
	return []Scenario{
		{
			Name:       "allowed",
			About:      "10,000 client ids, limit 1,000,000 per minute: every request is allowed and counted",
			Limit:      ratelimit.PerMinute(1_000_000),
			IDs:        10_000,
			MinAllowed: 0.999,
			Prime:      1,
		},
		{
			Name:      "denied",
			About:     "one abusive client hammering one id, limit 10 per minute: nearly every request is denied",
			Limit:     ratelimit.PerMinute(10),
			IDs:       1,
			MinDenied: 0.9,
			Prime:     11, // past the limit: the 11th is denied
		},
	}
}

// LookupScenario returns the scenario called name.
func LookupScenario(name string) (Scenario, error) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, nil
		}
	}
	return Scenario{}, fmt.Errorf("bench: no scenario %q", name)
}

// IDs returns n distinct client ids: prefix + "client-000000", and so on.
func IDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%sclient-%06d", prefix, i)
	}
	return ids
}

// RunConfig describes one measured run of one contender.
type RunConfig struct {
	Contender   Contender
	Scenario    Scenario
	Concurrency int           // goroutines deciding at once; at least 1
	Duration    time.Duration // measured time
	Warmup      time.Duration // time before, same load, not measured
	Options     redis.Options // the Redis client's options (Addr at least)
	Round       int           // copied into the result, for the table
	IDPrefix    string        // starts every client id, to keep runs apart
	// Flush runs FLUSHALL before the run. Only for a server the bench owns.
	Flush bool
}

// RunResult is the outcome of one run, as one JSON line.
type RunResult struct {
	Kind        string  `json:"kind"` // "run"
	Contender   string  `json:"contender"`
	Scenario    string  `json:"scenario"`
	Concurrency int     `json:"concurrency"`
	Round       int     `json:"round"`
	Seconds     float64 `json:"seconds"`
	Decisions   int64   `json:"decisions"`
	Allowed     int64   `json:"allowed"`
	Denied      int64   `json:"denied"`
	// Errors counts failed calls, warm-up included, but for degraded
	// decisions; any fails the run.
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Degraded counts decisions the contender's failure policy made because
	// Redis could not (errors wrapping ErrDegraded), warm-up included; any
	// fails the run. They are not in Decisions.
	Degraded      int64  `json:"degraded"`
	FirstDegraded string `json:"first_degraded,omitempty"`
	// PerSecond is decisions per second of measured time.
	PerSecond float64 `json:"decisions_per_s"`
	// P50 and P99 are latencies of one decision, in microseconds.
	P50 float64 `json:"p50_us"`
	P99 float64 `json:"p99_us"`
	// Slow counts measured decisions that took longer than SlowDecision:
	// those this library would have left to its failure policy with its
	// default timeout.
	Slow int64 `json:"slow"`
	// AllocsPerDecision and BytesPerDecision are the deltas of
	// runtime.MemStats Mallocs and TotalAlloc over the measured time, divided
	// by Decisions: the whole process, go-redis's goroutines included.
	AllocsPerDecision float64 `json:"allocs_per_decision"`
	BytesPerDecision  float64 `json:"bytes_per_decision"`
	// ClientCPUPerDecision is the bench process's CPU time (user and
	// system, every thread: the contender, go-redis and the harness) over
	// the measured time, in microseconds per decision; 0 where the system
	// does not tell.
	ClientCPUPerDecision float64 `json:"client_cpu_us_per_decision"`
	// RedisCPUPerDecision is the server's CPU time (INFO cpu, user and
	// system, every thread) over the measured time, in microseconds per
	// decision: scripts, network and parsing. ScriptCallsPerDecision and
	// ScriptUsPerDecision are the EVAL and EVALSHA calls and their time
	// (INFO commandstats) per decision. All three are 0 for an offline
	// contender, and assume no one else uses the server.
	RedisCPUPerDecision    float64 `json:"redis_cpu_us_per_decision"`
	ScriptCallsPerDecision float64 `json:"script_calls_per_decision"`
	ScriptUsPerDecision    float64 `json:"script_us_per_decision"`
	GOMAXPROCS             int     `json:"gomaxprocs"`
	GoVersion              string  `json:"go"`
	// OK is false when calls failed or the outcome missed the scenario's
	// check; Problem then says why.
	OK      bool   `json:"ok"`
	Problem string `json:"problem,omitempty"`
}

// worker is one goroutine's tally. Each is its own allocation, so that the
// goroutines do not share cache lines.
type worker struct {
	allowed, denied, errors, degraded, slow int64
	firstErr, firstDegraded                 error
	hist                                    histogram
}

// SlowDecision is the latency past which a decision counts as slow: the
// Limiter's default timeout (WithTimeout).
const SlowDecision = 100 * time.Millisecond

// Phases of a run, read by every worker before each call.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// Run measures one contender under one scenario and returns the result;
// the error is for a run that could not start (no Redis, a constructor
// failing). Failed calls are counted in the result, which is then not OK.
func Run(ctx context.Context, cfg RunConfig) (RunResult, error) {
	res := RunResult{
		Kind: "run", Contender: cfg.Contender.Name, Scenario: cfg.Scenario.Name,
		Concurrency: cfg.Concurrency, Round: cfg.Round,
		GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
	}
	if cfg.Concurrency < 1 || cfg.Duration <= 0 || cfg.Scenario.IDs < 1 {
		return res, errors.New("bench: need a concurrency of 1 or more, a positive duration and ids")
	}
	opts := cfg.Options
	client := redis.NewClient(&opts)
	defer client.Close()
	if !cfg.Contender.Offline {
		if err := client.Ping(ctx).Err(); err != nil {
			return res, fmt.Errorf("bench: Redis at %s: %w", opts.Addr, err)
		}
		if cfg.Flush {
			if err := client.FlushAll(ctx).Err(); err != nil {
				return res, fmt.Errorf("bench: FLUSHALL: %w", err)
			}
		}
	}
	d, err := cfg.Contender.New(ctx, Env{Client: client, Options: cfg.Options, Limit: cfg.Scenario.Limit, Now: time.Now})
	if err != nil {
		return res, fmt.Errorf("bench: starting %s: %w", cfg.Contender.Name, err)
	}
	defer closeDecider(d)

	ids := IDs(cfg.IDPrefix, cfg.Scenario.IDs)
	workers := make([]*worker, cfg.Concurrency)
	for g := range workers {
		workers[g] = new(worker)
	}
	// The scenario's first decisions, from one goroutine, before the
	// others start: a connection is dialled, scripts are loaded, and the
	// abuser is past its limit, as in a server that has been running. Cold,
	// every goroutine would wait on those at once.
	for i := range cfg.Scenario.Prime {
		workers[0].decide(ctx, d, ids[i%len(ids)], false)
	}
	var phase atomic.Int32
	var wg sync.WaitGroup
	for g, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(ctx, d, ids, g*len(ids)/len(workers), &phase)
		}()
	}

	// A server without INFO cpu and commandstats (miniredis) leaves the
	// Redis figures at 0.
	stats := client
	if cfg.Contender.Offline {
		stats = nil
	}
	m := measure(ctx, stats, &phase, cfg.Warmup, cfg.Duration)
	wg.Wait()

	var sum worker
	for _, w := range workers {
		sum.add(w)
	}
	res.Allowed, res.Denied, res.Slow = sum.allowed, sum.denied, sum.slow
	res.Errors, res.FirstError = sum.errors, errString(sum.firstErr)
	res.Degraded, res.FirstDegraded = sum.degraded, errString(sum.firstDegraded)
	res.Decisions = res.Allowed + res.Denied
	res.Seconds = m.elapsed.Seconds()
	res.PerSecond = float64(res.Decisions) / m.elapsed.Seconds()
	res.P50 = sum.hist.quantile(0.50) / 1e3
	res.P99 = sum.hist.quantile(0.99) / 1e3
	if n := float64(res.Decisions); n > 0 {
		res.AllocsPerDecision = float64(m.mallocs) / n
		res.BytesPerDecision = float64(m.bytes) / n
		if m.cpuOK {
			res.ClientCPUPerDecision = m.cpu.Seconds() * 1e6 / n
		}
		if m.redisErr == nil {
			res.RedisCPUPerDecision = m.redis.cpuUs / n
			res.ScriptCallsPerDecision = m.redis.scriptCalls / n
			res.ScriptUsPerDecision = m.redis.scriptUs / n
		}
	}
	res.Problem = check(res, cfg.Scenario, cfg.Contender.Offline)
	res.OK = res.Problem == ""
	return res, nil
}

// loop decides until the phase is phaseStop, starting at ids[i] and going
// round; it counts only calls that start in phaseMeasure, but errors and
// degraded decisions always. Nothing in it allocates but the Decider.
//
// It models a server's goroutine, which gives up its processor between
// requests because it blocks reading the next one. A decision that waited
// (on Redis, or on the reply of a batch it joined) has given it up already,
// and the goroutine goes on at once, as a server's whose next request has
// come. A decision answered in the process without waiting (a local deny
// cache, the no-op), shorter than localDecision, has not: the goroutine
// then yields (runtime.Gosched) in place of the read it would have blocked
// on. Without that, goroutines answered in a fraction of a microsecond run
// back to back for whole time slices of the scheduler (10ms), and one whose
// Redis reply has come waits behind dozens of them, hundreds of
// milliseconds (ours+denycache, denied, 64 goroutines).
//
// The bench used to yield after every decision. That is not what a server
// does, and it costs what a server does not pay: runtime.Gosched puts the
// goroutine on the global run queue and, when a processor is idle (a
// goroutine waiting on Redis leaves one idle), wakes a parked thread to
// look for work, which finds none and parks again. At one goroutine that was
// two futex calls, one more context switch and about 30µs more of the
// bench's CPU per decision, taken from Redis on two shared cores (see
// bench/README.md).
func (w *worker) loop(ctx context.Context, d Decider, ids []string, i int, phase *atomic.Int32) {
	for {
		ph := phase.Load()
		if ph == phaseStop {
			return
		}
		took := w.decide(ctx, d, ids[i], ph == phaseMeasure)
		if i++; i == len(ids) {
			i = 0
		}
		if took < localDecision {
			runtime.Gosched()
		}
	}
}

// localDecision is the latency under which a decision was answered without
// waiting: well under any round trip to Redis (tens of microseconds on the
// loopback), well over a decision made in the process (under a microsecond).
const localDecision = 5 * time.Microsecond

// decide makes one decision for id and tallies it: errors and degraded
// decisions always, outcomes and latency only if measured. It returns the
// decision's latency.
func (w *worker) decide(ctx context.Context, d Decider, id string, measured bool) time.Duration {
	t0 := time.Now()
	ok, err := d.Allow(ctx, id)
	took := time.Since(t0)
	switch {
	case w.failed(err):
	case !measured:
	case ok:
		w.allowed++
		w.record(took)
	default:
		w.denied++
		w.record(took)
	}
	return took
}

// failed tallies err, a degraded decision or a failed call, and reports
// whether there was one.
func (w *worker) failed(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrDegraded):
		w.degraded++
		if w.firstDegraded == nil {
			w.firstDegraded = err
		}
	default:
		w.errors++
		if w.firstErr == nil {
			w.firstErr = err
		}
	}
	return true
}

// add adds o's tallies and latencies to w's; w keeps its first errors, if
// any, over o's.
func (w *worker) add(o *worker) {
	w.allowed += o.allowed
	w.denied += o.denied
	w.errors += o.errors
	w.degraded += o.degraded
	w.slow += o.slow
	w.firstErr = cmp.Or(w.firstErr, o.firstErr)
	w.firstDegraded = cmp.Or(w.firstDegraded, o.firstDegraded)
	w.hist.merge(&o.hist)
}

// errString returns err's message, or "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// measurement is what a run's measured time cost this process and, if it
// was read (redisErr nil), the server: deltas over it.
type measurement struct {
	elapsed        time.Duration
	mallocs, bytes uint64        // runtime.MemStats Mallocs and TotalAlloc
	cpu            time.Duration // the process's CPU time, if cpuOK
	cpuOK          bool
	redis          redisStats
	redisErr       error
}

// measure lets the workers run for warmup, then for d in phaseMeasure, then
// stops them, reading the counters of this process and of stats (nil: none)
// around the measured time.
func measure(ctx context.Context, stats *redis.Client, phase *atomic.Int32, warmup, d time.Duration) measurement {
	time.Sleep(warmup)
	var m measurement
	var redisBefore, redisAfter redisStats
	m.redisErr = errors.New("no stats client")
	if stats != nil {
		redisBefore, m.redisErr = readRedisStats(ctx, stats)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpuBefore, cpuOK := processCPU()
	phase.Store(phaseMeasure)
	start := time.Now()
	time.Sleep(d)
	phase.Store(phaseStop)
	m.elapsed = time.Since(start)
	cpuAfter, _ := processCPU()
	runtime.ReadMemStats(&after)
	if m.redisErr == nil {
		redisAfter, m.redisErr = readRedisStats(ctx, stats)
	}
	m.mallocs, m.bytes = after.Mallocs-before.Mallocs, after.TotalAlloc-before.TotalAlloc
	m.cpu, m.cpuOK = cpuAfter-cpuBefore, cpuOK
	m.redis = redisStats{
		cpuUs:       redisAfter.cpuUs - redisBefore.cpuUs,
		scriptCalls: redisAfter.scriptCalls - redisBefore.scriptCalls,
		scriptUs:    redisAfter.scriptUs - redisBefore.scriptUs,
	}
	return m
}

func (w *worker) record(took time.Duration) {
	w.hist.record(took)
	if took > SlowDecision {
		w.slow++
	}
}

// check returns what is wrong with res under s, or "".
func check(res RunResult, s Scenario, offline bool) string {
	switch {
	case res.Degraded > 0:
		return fmt.Sprintf("%d decisions degraded (made by the failure policy: Redis did not decide); the first: %s",
			res.Degraded, res.FirstDegraded)
	case res.Errors > 0:
		return fmt.Sprintf("%d calls failed; the first: %s", res.Errors, res.FirstError)
	case res.Decisions == 0:
		return "no decision was made"
	case offline:
		return ""
	case float64(res.Allowed) < s.MinAllowed*float64(res.Decisions):
		return fmt.Sprintf("only %d of %d decisions allowed; the scenario needs %.1f%%",
			res.Allowed, res.Decisions, 100*s.MinAllowed)
	case float64(res.Denied) < s.MinDenied*float64(res.Decisions):
		return fmt.Sprintf("only %d of %d decisions denied; the scenario needs %.1f%%",
			res.Denied, res.Decisions, 100*s.MinDenied)
	}
	return ""
}

// redisStats are the server's counters the harness reads before and after
// the measured time.
type redisStats struct {
	cpuUs       float64 // used_cpu_user + used_cpu_sys, in µs
	scriptCalls float64 // EVAL, EVALSHA and their _ro forms: calls
	scriptUs    float64 // and their time, in µs
}

// readRedisStats reads INFO cpu and commandstats.
func readRedisStats(ctx context.Context, client *redis.Client) (redisStats, error) {
	var st redisStats
	cpu, err := client.Info(ctx, "cpu").Result()
	if err != nil {
		return st, fmt.Errorf("bench: INFO cpu: %w", err)
	}
	cmds, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		return st, fmt.Errorf("bench: INFO commandstats: %w", err)
	}
	found := false
	for line := range strings.Lines(cpu + cmds) {
		line = strings.TrimSpace(line)
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_user", "used_cpu_sys":
			secs, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return st, fmt.Errorf("bench: INFO cpu: %q: %w", line, err)
			}
			st.cpuUs += secs * 1e6
			found = true
		case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro":
			var calls, usec float64
			if _, err := fmt.Sscanf(val, "calls=%g,usec=%g,", &calls, &usec); err != nil {
				return st, fmt.Errorf("bench: INFO commandstats: %q: %w", line, err)
			}
			st.scriptCalls += calls
			st.scriptUs += usec
		}
	}
	if !found {
		return st, errors.New("bench: INFO cpu has no used_cpu_user")
	}
	return st, nil
}
