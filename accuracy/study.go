package main

import (
	"sync"
)

// config is what a study replays: the limit every client has, the traces'
// length and clients, and the seed they are drawn from.
type config struct {
	Rate      int64  // R, in cost per window
	Window    int64  // W, in ms: a multiple of subWindows ms and of 60
	Windows   int64  // each trace's length, in windows
	Clients   int    // clients of the honest traces
	Attackers int    // clients of the attackers' traces
	Seed      uint64 // the traces' seed
}

// defaultConfig is the configuration of docs/accuracy.md: 1000 per minute,
// traces of 100 minutes.
func defaultConfig() config {
	return config{Rate: 1000, Window: 60_000, Windows: 100, Clients: 8, Attackers: 4, Seed: 1}
}

func (c config) limit() limit { return limit{rate: c.Rate, w: c.Window} }

// outcome is how one algorithm did on one trace.
type outcome struct {
	algo     string
	requests int64 // requests in the trace
	admitted int64 // requests the algorithm allowed
	// wrongAllow and wrongDeny count requests whose decision differs from
	// the exact rule applied to what this algorithm itself admitted.
	wrongAllow, wrongDeny int64
	// rateError is sum |a - a*| / sum a* over clients and seconds, with a
	// the requests admitted in that second and a* the exact log's.
	rateError float64
	// worst is the most cost admitted to one client in any span of W ms.
	worst int64
}

// traceResult is one trace and how every algorithm did on it.
type traceResult struct {
	trace
	offered  float64 // cost sent per client per window, as a fraction of R
	outcomes []outcome
}

// replay runs a trace through one algorithm, judging every decision with
// the exact rule on the algorithm's own admitted requests. It returns the
// outcome and the requests admitted per client per second.
func replay(tr trace, c config, alg algorithm) (outcome, [][]int32) {
	lim := c.limit()
	secs := c.span()/1000 + 1
	deciders := make([]decider, tr.clients)
	judges := make([]spanLog, tr.clients)
	perSec := make([][]int32, tr.clients)
	for i := range deciders {
		deciders[i] = alg.new(lim)
		perSec[i] = make([]int32, secs)
	}
	out := outcome{algo: alg.name, requests: int64(len(tr.reqs))}
	for _, r := range tr.reqs {
		t, n := r.t, int64(r.n)
		j := &judges[r.client]
		j.expire(t, lim.w)
		fits := j.sum+n <= lim.rate
		if !deciders[r.client].allow(t, n) {
			if fits {
				out.wrongDeny++
			}
			continue
		}
		out.admitted++
		if !fits {
			out.wrongAllow++
		}
		j.add(t, n)
		out.worst = max(out.worst, j.sum)
		perSec[r.client][t/1000]++
	}
	return out, perSec
}

// rateError returns sum |a - a*| / sum a* over the cells of got and exact.
func rateError(got, exact [][]int32) float64 {
	var diff, total int64
	for c := range exact {
		for s, want := range exact[c] {
			d := int64(got[c][s]) - int64(want)
			diff += max(d, -d)
			total += int64(want)
		}
	}
	if total == 0 {
		return 0
	}
	return float64(diff) / float64(total)
}

// runTrace makes trace i and replays it through every algorithm.
func runTrace(c config, i int) traceResult {
	tr := makeTrace(c, i)
	res := traceResult{trace: tr}
	var cost int64
	for _, r := range tr.reqs {
		cost += int64(r.n)
	}
	res.offered = float64(cost) / float64(int64(tr.clients)*c.Windows*c.Rate)
	var exact [][]int32
	for k, alg := range algorithms {
		out, perSec := replay(tr, c, alg)
		if k == 0 {
			exact = perSec
		}
		out.rateError = rateError(perSec, exact)
		res.outcomes = append(res.outcomes, out)
	}
	return res
}

// study is the outcome of every trace, in traceSpecs' order, and the
// figure's series.
type study struct {
	config config
	traces []traceResult
	chart  []series
	// The leased study's, when it ran: it runs the library on miniredis,
	// and its lease sweeper in real time, so that its rows may differ a
	// little from run to run.
	leaseConfig leaseConfig
	leases      []leaseRow
}

// runStudy replays every trace through every algorithm, the traces in parallel.
// The result depends on the configuration only.
func runStudy(c config) *study {
	s := &study{config: c, traces: make([]traceResult, len(traceSpecs))}
	var wg sync.WaitGroup
	for i := range traceSpecs {
		wg.Go(func() { s.traces[i] = runTrace(c, i) })
	}
	wg.Wait()
	s.chart = boundaryChart(c, s.trace("boundary attacker"))
	return s
}

// trace returns the result of the trace of that name.
func (s *study) trace(name string) *traceResult {
	for i := range s.traces {
		if s.traces[i].name == name {
			return &s.traces[i]
		}
	}
	panic("accuracy: no trace " + name)
}
