package main

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// request is one request of a trace: its ms (from 0, where windows and
// sub-windows begin), its client and its cost.
type request struct {
	t      int64
	client int32
	n      int32
}

// trace is a seeded stream of requests from several clients, each client
// decided against its own counts.
type trace struct {
	name    string
	about   string
	honest  bool // clients that mean no harm, for strict mode's cost
	clients int
	reqs    []request
}

// traceSpec makes one trace from the configuration and its own source of
// randomness.
type traceSpec struct {
	name   string
	honest bool
	make   func(c config, rng *rand.Rand) trace
}

// traceSpecs are the traces of the study, in the order of the report.
var traceSpecs = []traceSpec{
	{"steady 95%", true, func(c config, rng *rand.Rand) trace {
		return trace{about: fmt.Sprintf("Each client a Poisson process at 95%% of the limit (%.2f requests/s): near it, and over it by chance", 1000*c.perMS(0.95)),
			clients: c.Clients, reqs: steady(c, rng, 0.95)}
	}},
	{"steady 50%", true, func(c config, rng *rand.Rand) trace {
		return trace{about: fmt.Sprintf("Each client a Poisson process at 50%% of the limit (%.2f requests/s): far from it", 1000*c.perMS(0.50)),
			clients: c.Clients, reqs: steady(c, rng, 0.50)}
	}},
	{"on/off", true, func(c config, rng *rand.Rand) trace {
		return trace{about: fmt.Sprintf("Bursty clients: on for %s on average (exponential), sending as a Poisson process at 3× the limit's rate (%.1f requests/s), then off for %s on average",
			seconds(c.Window/3), 1000*c.perMS(3), seconds(c.Window*5/6)),
			clients: c.Clients, reqs: onOff(c, rng)}
	}},
	{"heavy-tailed", true, func(c config, rng *rand.Rand) trace {
		return trace{about: fmt.Sprintf("Bursts of Pareto(α=1.5, minimum 4, at most 2R) requests, %.1f ms apart on average (exponential), separated by Pareto(α=1.5, minimum %s, at most %s) gaps",
			2*float64(c.Window)/(60*float64(c.Rate)), seconds(5*c.Window/c.Rate), seconds(2*c.Window)),
			clients: c.Clients, reqs: heavyTailed(c, rng)}
	}},
	{"boundary attacker", false, func(c config, rng *rand.Rand) trace {
		return trace{about: fmt.Sprintf("Sends its whole limit R evenly over the last %s of a window, keeps hammering at that pace for %s past the boundary, then at 2× the limit's rate until 1.5 windows past it; rests, and attacks again 3 or 4 windows after the boundary",
			seconds(c.Window/60), seconds(c.Window/30)),
			clients: c.Attackers, reqs: boundary(c, rng)}
	}},
	{"precise attacker", false, func(c config, rng *rand.Rand) trace {
		return trace{about: "Knows the estimate and is never denied by the library: sends nothing until the last ms of a window, then all the estimate allows there (R); through the next window, at every ms all the estimate allows; and again. It puts 2R in one span of W every two windows",
			clients: c.Attackers, reqs: precise(c, rng)}
	}},
}

// makeTrace returns trace i of traceSpecs for the configuration.
func makeTrace(c config, i int) trace {
	spec := traceSpecs[i]
	tr := spec.make(c, rand.New(rand.NewPCG(c.Seed, uint64(i))))
	tr.name, tr.honest = spec.name, spec.honest
	slices.SortStableFunc(tr.reqs, func(a, b request) int { return cmp.Compare(a.t, b.t) })
	return tr
}

// span returns the trace's length in ms.
func (c config) span() int64 { return c.Windows * c.Window }

// perMS returns the limit's rate in requests per ms, times load.
func (c config) perMS(load float64) float64 { return load * float64(c.Rate) / float64(c.Window) }

// poisson appends the arrivals of a Poisson process of rate per ms over
// [from, to) ms for client, and returns them.
func poisson(reqs []request, rng *rand.Rand, client int, from, to, rate float64) []request {
	for t := from + rng.ExpFloat64()/rate; t < to; t += rng.ExpFloat64() / rate {
		reqs = append(reqs, request{t: int64(t), client: int32(client), n: 1})
	}
	return reqs
}

func steady(c config, rng *rand.Rand, load float64) []request {
	var reqs []request
	for cl := range c.Clients {
		reqs = poisson(reqs, rng, cl, 0, float64(c.span()), c.perMS(load))
	}
	return reqs
}

func onOff(c config, rng *rand.Rand) []request {
	var reqs []request
	w := float64(c.Window)
	for cl := range c.Clients {
		on := rng.IntN(2) == 0
		for t := 0.0; t < float64(c.span()); on = !on {
			if !on {
				t += rng.ExpFloat64() * w * 5 / 6
				continue
			}
			d := rng.ExpFloat64() * w / 3
			reqs = poisson(reqs, rng, cl, t, min(t+d, float64(c.span())), c.perMS(3))
			t += d
		}
	}
	return reqs
}

// pareto returns a Pareto(alpha, xm) sample: xm / U^(1/alpha).
func pareto(rng *rand.Rand, alpha, xm float64) float64 {
	return xm / math.Pow(1-rng.Float64(), 1/alpha)
}

func heavyTailed(c config, rng *rand.Rand) []request {
	var reqs []request
	w, r := float64(c.Window), float64(c.Rate)
	// Bursts of about 12 requests on average; gaps of 3 × 5W/R = 15W/R on
	// average put the load near three quarters of the limit.
	for cl := range c.Clients {
		for t := pareto(rng, 1.5, 5*w/r); t < float64(c.span()); t += min(pareto(rng, 1.5, 5*w/r), 2*w) {
			size := int(min(pareto(rng, 1.5, 4), 2*r))
			for range size {
				if t >= float64(c.span()) {
					break
				}
				reqs = append(reqs, request{t: int64(t), client: int32(cl), n: 1})
				t += rng.ExpFloat64() * 2 * w / (60 * r)
			}
		}
	}
	return reqs
}

func boundary(c config, rng *rand.Rand) []request {
	var reqs []request
	w, r := c.Window, c.Rate
	burst := w / 60 // 1 s of a minute
	for cl := range c.Attackers {
		for b := (1 + rng.Int64N(3)) * w; b+3*w/2 <= c.span(); b += (3 + rng.Int64N(2)) * w {
			// R in the last burst ms of the window, then 2R at that pace.
			for i := range 3 * r {
				reqs = append(reqs, request{t: b - burst + i*burst/r, client: int32(cl), n: 1})
			}
			// Then 2× the limit's rate, evenly, to 1.5 W past the boundary.
			gap := float64(w) / float64(2*r)
			for t := float64(b + 2*burst); t < float64(b+3*w/2); t += gap {
				reqs = append(reqs, request{t: int64(t), client: int32(cl), n: 1})
			}
		}
	}
	return reqs
}

func precise(c config, rng *rand.Rand) []request {
	var reqs []request
	w, r := c.Window, c.Rate
	for cl := range c.Attackers {
		// The attacker keeps the library's counts for its id, as the
		// library would: every request it sends is allowed.
		var cur, prev int64
		send := func(t, e int64) {
			n := r - estimate(cur, prev, w, e)
			for range n {
				reqs = append(reqs, request{t: t, client: int32(cl), n: 1})
			}
			cur += max(n, 0)
		}
		greedy := rng.IntN(2) == 0
		for i := range c.Windows {
			prev, cur = cur, 0
			if greedy {
				for e := range w {
					send(i*w+e, e)
				}
			} else {
				send(i*w+w-1, w-1)
			}
			greedy = !greedy
		}
	}
	return reqs
}
