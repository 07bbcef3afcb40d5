package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
)

// The hot-id workload: one id that every request of a fleet of servers
// shares (a global limit, a large tenant), each server a Decider of its own
// with Concurrency goroutines, all at once. It measures leased limits
// (Limit.Leased) against unleased ones on the same fleet, and, with a limit
// that is reached, how much the fleet admitted per window.

// HotModes are the modes of this library that RunHot compares.
var HotModes = []string{"unleased", "leased"}

// HotConfig describes one measured run of the hot-id workload.
type HotConfig struct {
	// Name says what is measured ("leased", "unleased", "gubernator"...).
	Name string
	// Servers are the fleet: each its own Decider (for this library a
	// Limiter on a client of its own), made by the caller and closed by
	// RunHot.
	Servers []Decider
	// Concurrency is the number of goroutines per server.
	Concurrency int
	// ID is the one id every decision is for.
	ID string
	// Duration is the measured time, Warmup the time before it, same load,
	// not measured.
	Duration, Warmup time.Duration
	// Rate and Window are the limit the servers enforce, for the JSON and
	// for the per-window accounting.
	Rate   int64
	Window time.Duration
	// Windows records every admitted decision, warm-up included, and
	// accounts for them per window of Window: for a limit that is reached.
	Windows bool
	// Placer, if set, is the servers' clock (see NewHotOurs): each
	// admitted decision is then placed at the ms its Limiter read.
	Placer *Placer
	// MinAllowed is the least share (0 to 1) of measured decisions that
	// must be allowed for the run to be OK.
	MinAllowed float64
	// Stats, if set, is a client of the servers' Redis, read for INFO cpu
	// and commandstats deltas over the measured time; RunHot does not close
	// it.
	Stats *redis.Client
	Round int
}

// HotResult is the outcome of one hot-id run, as one JSON line.
type HotResult struct {
	Kind        string  `json:"kind"` // "hot"
	Name        string  `json:"name"`
	Servers     int     `json:"servers"`
	Concurrency int     `json:"concurrency"` // per server
	Rate        int64   `json:"rate"`
	WindowMs    int64   `json:"window_ms"`
	Round       int     `json:"round"`
	Seconds     float64 `json:"seconds"`
	Decisions   int64   `json:"decisions"`
	Allowed     int64   `json:"allowed"`
	Denied      int64   `json:"denied"`
	// Errors and Degraded are counted as in RunResult, warm-up included;
	// any fails the run.
	Errors        int64   `json:"errors"`
	FirstError    string  `json:"first_error,omitempty"`
	Degraded      int64   `json:"degraded"`
	FirstDegraded string  `json:"first_degraded,omitempty"`
	PerSecond     float64 `json:"decisions_per_s"`
	// P50 and P99 are latencies of one decision (any source), in µs.
	P50 float64 `json:"p50_us"`
	P99 float64 `json:"p99_us"`
	// LeaseShare is the share of measured decisions whose Event.Source was
	// ratelimit.SourceLease; LeaseP50 and LeaseP99 their latencies, and
	// RedisP50 and RedisP99 those of decisions made in Redis
	// (SourceRedis), in µs. 0 where there were none, or where the servers do
	// not say (not this library).
	LeaseShare float64 `json:"lease_share"`
	LeaseP50   float64 `json:"lease_p50_us"`
	LeaseP99   float64 `json:"lease_p99_us"`
	RedisShare float64 `json:"redis_share"`
	RedisP50   float64 `json:"redis_p50_us"`
	RedisP99   float64 `json:"redis_p99_us"`
	// ScriptCallsPer1000 is EVAL and EVALSHA calls (INFO commandstats) over
	// the measured time per 1,000 decisions: the decisions' calls, leases'
	// give-backs included; RedisCPUPerDecision the server's CPU time (INFO
	// cpu) per decision, in µs. RedisStats says they were read (with
	// Stats).
	RedisStats          bool    `json:"redis_stats"`
	ScriptCallsPer1000  float64 `json:"script_calls_per_1000"`
	RedisCPUPerDecision float64 `json:"redis_cpu_us_per_decision"`
	// ClientCPUPerDecision is this process's CPU time per decision, in µs.
	ClientCPUPerDecision float64 `json:"client_cpu_us_per_decision"`
	AllocsPerDecision    float64 `json:"allocs_per_decision"`
	// Admission is the per-window accounting of Windows; nil without it.
	Admission  *Admission `json:"admission,omitempty"`
	GOMAXPROCS int        `json:"gomaxprocs"`
	GoVersion  string     `json:"go"`
	OK         bool       `json:"ok"`
	Problem    string     `json:"problem,omitempty"`
}

// hotWorker is one goroutine's tally in the hot-id workload.
type hotWorker struct {
	worker
	// src is the Source of the last decision, set by the Limiter's
	// observer (hotObserver) on this goroutine; srcSet says it was.
	src    ratelimit.Source
	srcSet bool
	// bySource are the measured decisions' latencies per Source.
	bySource [ratelimit.SourceLease + 1]histogram
	// admitted are the admitted decisions' calls (with Windows).
	admitted []Call
	// placed is this goroutine's slot of the Placer, nil without one.
	placed *int64
}

// hotWorkerKey is the context key of the hotWorker making a decision.
type hotWorkerKey struct{}

// hotObserver tells the hotWorker that made a decision (from its context)
// where the decision came from. It is the Observer of every Limiter of the
// hot-id workload, in both modes.
var hotObserver = ratelimit.ObserverFunc(func(ctx context.Context, e *ratelimit.Event) {
	if w, ok := ctx.Value(hotWorkerKey{}).(*hotWorker); ok {
		w.src, w.srcSet = e.Source, true
	}
})

// NewHotOurs returns a fleet of n Limiters of this library, each
// ratelimit.New on a go-redis client of its own (ContextTimeoutEnabled, the
// client's defaults otherwise) to addr, deciding against limit: the
// bench's newOurs (WithTimeout(OursTimeout), a degraded decision an error)
// with hotObserver, and p.Now as their clock if p is not nil (time.Now
// if it is). Each Decider closes its client.
func NewHotOurs(addr string, n int, limit ratelimit.Limit, p *Placer) []Decider {
	now := time.Now
	if p != nil {
		now = p.Now
	}
	servers := make([]Decider, n)
	for i := range servers {
		opts := redis.Options{Addr: addr, ContextTimeoutEnabled: true}
		client := redis.NewClient(&opts)
		env := Env{Client: client, Options: opts, Limit: limit, Now: now}
		servers[i] = closers{newOurs(client, env, ratelimit.WithObserver(hotObserver)), []io.Closer{client}}
	}
	return servers
}

// RunHot runs the hot-id workload and returns its result; the error is for
// a run that could not start. Failed calls are counted in the result, which
// is then not OK. It closes cfg.Servers.
func RunHot(ctx context.Context, cfg HotConfig) (HotResult, error) {
	defer func() {
		for _, d := range cfg.Servers {
			_ = closeDecider(d)
		}
	}()
	res := HotResult{
		Kind: "hot", Name: cfg.Name, Servers: len(cfg.Servers), Concurrency: cfg.Concurrency,
		Rate: cfg.Rate, WindowMs: cfg.Window.Milliseconds(), Round: cfg.Round,
		GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
	}
	if len(cfg.Servers) == 0 || cfg.Concurrency < 1 || cfg.Duration <= 0 || cfg.ID == "" {
		return res, errors.New("bench: need servers, a concurrency of 1 or more, a positive duration and an id")
	}
	if cfg.Windows && cfg.Window.Milliseconds() < 1 {
		return res, errors.New("bench: the per-window accounting needs a Window of 1ms or more")
	}
	workers := make([]*hotWorker, len(cfg.Servers)*cfg.Concurrency)
	for i := range workers {
		workers[i] = new(hotWorker)
	}
	// Each server's first decision, before any goroutine starts: a
	// connection and the script, as in a server that has been running.
	var phase atomic.Int32
	for s, d := range cfg.Servers {
		w := workers[s*cfg.Concurrency]
		if cfg.Placer != nil {
			w.placed = cfg.Placer.slot() // this goroutine's, for now
		}
		w.once(ctx, d, cfg.ID, false, cfg.Windows)
	}
	var wg sync.WaitGroup
	for i, w := range workers {
		d := cfg.Servers[i/cfg.Concurrency]
		wg.Add(1)
		go func() {
			defer wg.Done()
			if cfg.Placer != nil {
				w.placed = cfg.Placer.slot()
			}
			w.hotLoop(ctx, d, cfg.ID, &phase, cfg.Windows)
		}()
	}

	m := measure(ctx, cfg.Stats, &phase, cfg.Warmup, cfg.Duration)
	wg.Wait()

	var sum worker
	var bySource [len(workers[0].bySource)]histogram
	var calls []Call
	for _, w := range workers {
		sum.add(&w.worker)
		for s := range bySource {
			bySource[s].merge(&w.bySource[s])
		}
		calls = append(calls, w.admitted...)
	}
	res.Allowed, res.Denied = sum.allowed, sum.denied
	res.Errors, res.FirstError = sum.errors, errString(sum.firstErr)
	res.Degraded, res.FirstDegraded = sum.degraded, errString(sum.firstDegraded)
	res.Decisions = res.Allowed + res.Denied
	res.Seconds = m.elapsed.Seconds()
	res.PerSecond = float64(res.Decisions) / m.elapsed.Seconds()
	res.P50, res.P99 = sum.hist.quantile(0.50)/1e3, sum.hist.quantile(0.99)/1e3
	lease, rds := &bySource[ratelimit.SourceLease], &bySource[ratelimit.SourceRedis]
	res.LeaseP50, res.LeaseP99 = lease.quantile(0.50)/1e3, lease.quantile(0.99)/1e3
	res.RedisP50, res.RedisP99 = rds.quantile(0.50)/1e3, rds.quantile(0.99)/1e3
	if n := float64(res.Decisions); n > 0 {
		res.LeaseShare = float64(lease.n) / n
		res.RedisShare = float64(rds.n) / n
		res.AllocsPerDecision = float64(m.mallocs) / n
		if m.cpuOK {
			res.ClientCPUPerDecision = m.cpu.Seconds() * 1e6 / n
		}
		if m.redisErr == nil {
			res.RedisStats = true
			res.ScriptCallsPer1000 = m.redis.scriptCalls / n * 1000
			res.RedisCPUPerDecision = m.redis.cpuUs / n
		}
	}
	if cfg.Windows {
		a := Account(calls, cfg.Window.Milliseconds(), cfg.Rate)
		res.Admission = &a
	}
	res.Problem = checkHot(res, cfg.MinAllowed)
	res.OK = res.Problem == ""
	return res, nil
}

// hotLoop decides until the phase is phaseStop, as worker.loop does (a
// yield only after a decision answered in under localDecision), for one id.
func (w *hotWorker) hotLoop(ctx context.Context, d Decider, id string, phase *atomic.Int32, track bool) {
	ctx = context.WithValue(ctx, hotWorkerKey{}, w)
	for {
		ph := phase.Load()
		if ph == phaseStop {
			return
		}
		if took := w.once(ctx, d, id, ph == phaseMeasure, track); took < localDecision {
			runtime.Gosched()
		}
	}
}

// once makes one decision and tallies it, as worker.decide does, with its
// latency by source and, if track, its call if admitted.
func (w *hotWorker) once(ctx context.Context, d Decider, id string, measured, track bool) time.Duration {
	w.srcSet = false
	if w.placed != nil {
		*w.placed = noPlace
	}
	t0 := time.Now()
	ok, err := d.Allow(ctx, id)
	took := time.Since(t0)
	switch {
	case w.failed(err):
	default:
		if track && ok {
			c := Call{Start: t0.UnixMilli(), End: t0.Add(took).UnixMilli(), At: noPlace}
			if w.placed != nil {
				c.At = *w.placed
			}
			w.admitted = append(w.admitted, c)
		}
		if !measured {
			break
		}
		if ok {
			w.allowed++
		} else {
			w.denied++
		}
		w.record(took)
		if w.srcSet && int(w.src) < len(w.bySource) {
			w.bySource[w.src].record(took)
		}
	}
	return took
}

// checkHot returns what is wrong with res, or "".
func checkHot(res HotResult, minAllowed float64) string {
	switch {
	case res.Degraded > 0:
		return fmt.Sprintf("%d decisions degraded (made by the failure policy: Redis did not decide); the first: %s",
			res.Degraded, res.FirstDegraded)
	case res.Errors > 0:
		return fmt.Sprintf("%d calls failed; the first: %s", res.Errors, res.FirstError)
	case res.Decisions == 0:
		return "no decision was made"
	case float64(res.Allowed) < minAllowed*float64(res.Decisions):
		return fmt.Sprintf("only %d of %d decisions allowed; the run needs %.1f%%",
			res.Allowed, res.Decisions, 100*minAllowed)
	}
	return ""
}
