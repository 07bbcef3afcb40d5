package main

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
)

// The leased study replays one hot id's demand, spread at random over N
// servers (Limiters on one Redis, miniredis, with one clock moved to each
// request's time), through a Leased limit and through the same limit not
// leased, and compares what each admitted. It runs the library itself: a
// lease's size, its give-back and the script's cut are the library's, not a
// model's.

// leaseConfig is the hot id's limit and the traces' length.
type leaseConfig struct {
	Rate, Window, Windows int64 // R per W ms, over Windows windows
	Servers               []int
	Seed                  uint64
}

func defaultLeaseConfig() leaseConfig {
	return leaseConfig{Rate: 2000, Window: 1000, Windows: 20, Servers: []int{1, 4, 16}, Seed: 1}
}

// leaseDemand is one shape of the hot id's demand.
type leaseDemand struct {
	name, about string
	make        func(c config, rng *rand.Rand) []request
}

// leaseDemands draw on the per-client traces with one client, the hot id,
// at the hot id's limit.
var leaseDemands = []leaseDemand{
	{"steady 80%", "a Poisson process at 80% of the limit's rate", func(c config, rng *rand.Rand) []request { return steady(c, rng, 0.8) }},
	{"steady 120%", "a Poisson process at 120% of the limit's rate: always at the limit", func(c config, rng *rand.Rand) []request { return steady(c, rng, 1.2) }},
	{"bursty", "bursts of Pareto(α=1.5) sizes at Pareto gaps, as the heavy-tailed trace", heavyTailed},
	{"on/off", "on for W/3 on average at 3× the limit's rate, off for 5W/6 on average, as the on/off trace", onOff},
}

// leaseRow is one demand on N servers.
type leaseRow struct {
	demand           string
	servers          int
	offered          float64 // requests per window, as a fraction of R
	unleased, leased int64   // requests admitted
	calls            float64 // script calls per 1,000 decisions, leased
	fromLease        float64 // decisions served from a lease, as a fraction
	over             int64   // admitted requests at which the sliding rule was broken
}

// underUse is the leased limit's under-admission against the unleased one.
func (r leaseRow) underUse() float64 {
	if r.unleased == 0 {
		return 0
	}
	return 1 - float64(r.leased)/float64(r.unleased)
}

// runLeases replays every demand on every number of servers, leased and not.
func runLeases(c leaseConfig) ([]leaseRow, error) {
	mr, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("accuracy: miniredis: %w", err)
	}
	defer mr.Close()
	var calls atomic.Int64
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer func() { _ = client.Close() }()
	client.AddHook(countHook{&calls})
	tc := config{Rate: c.Rate, Window: c.Window, Windows: c.Windows, Clients: 1}
	var rows []leaseRow
	for i, d := range leaseDemands {
		reqs := d.make(tc, rand.New(rand.NewPCG(c.Seed, uint64(100+i))))
		slices.SortStableFunc(reqs, func(a, b request) int { return cmp.Compare(a.t, b.t) })
		// Unleased, the servers share the counts exactly: their number
		// changes nothing, and one replay serves every row.
		un, _, _, err := replayLeased(client, c, reqs, 1, false, fmt.Sprintf("%d-u", i), &calls)
		if err != nil {
			return nil, err
		}
		for _, n := range c.Servers {
			row := leaseRow{demand: d.name, servers: n, offered: float64(len(reqs)) / float64(c.Windows) / float64(c.Rate)}
			le, over, local, err := replayLeased(client, c, reqs, n, true, fmt.Sprintf("%d-%d", i, n), &calls)
			if err != nil {
				return nil, err
			}
			row.unleased, row.leased, row.over = un, le, over
			row.calls = 1000 * float64(calls.Swap(0)) / float64(len(reqs))
			row.fromLease = float64(local) / float64(len(reqs))
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// replayLeased decides reqs, each on a server drawn at random, and returns
// how many were admitted, at how many the sliding rule was broken for what
// was admitted, and how many came from leases. The script calls of a leased
// replay are left in calls; an unleased one's are dropped.
func replayLeased(client *redis.Client, c leaseConfig, reqs []request, servers int, leased bool, prefix string, calls *atomic.Int64) (admitted, over, local int64, err error) {
	var now atomic.Int64 // read by the Limiters' lease sweepers too
	var fromLease atomic.Int64
	obs := ratelimit.ObserverFunc(func(_ context.Context, e *ratelimit.Event) {
		if e.Source == ratelimit.SourceLease {
			fromLease.Add(1)
		}
	})
	limiters := make([]*ratelimit.Limiter, servers)
	for i := range limiters {
		limiters[i] = ratelimit.New(client, ratelimit.WithPrefix(prefix), ratelimit.WithTimeout(time.Minute),
			ratelimit.WithClock(func() time.Time { return time.UnixMilli(now.Load()) }), ratelimit.WithObserver(obs))
	}
	defer func() { // Close ends each Limiter's lease sweeper; its give-backs are no decisions: calls keeps the replay's
		n := calls.Load()
		for _, l := range limiters {
			_ = l.Close(context.Background())
		}
		calls.Store(n)
	}()
	lim := ratelimit.Limit{Rate: c.Rate, Window: time.Duration(c.Window) * time.Millisecond, Leased: leased}
	rng := rand.New(rand.NewPCG(c.Seed, uint64(servers)))
	judge := newSlidingJudge(c.Rate, c.Window)
	calls.Store(0)
	for _, r := range reqs {
		now.Store(r.t)
		res, err := limiters[rng.IntN(servers)].Allow(context.Background(), "hot", lim)
		if err != nil || res.Degraded {
			return 0, 0, 0, fmt.Errorf("accuracy: leased replay at %d ms: %+v, %v", r.t, res, err)
		}
		if res.Allowed {
			admitted++
			if !judge.admit(r.t, 1) {
				over++
			}
		}
	}
	if !leased {
		calls.Store(0)
	}
	return admitted, over, fromLease.Load(), nil
}

// slidingJudge checks the sliding rule on what was admitted: at each
// admission at t in window w, the cost admitted in w up to t plus
// floor(the cost admitted in w-1 × the ms left of w / W) is at most R.
type slidingJudge struct {
	rate, w   int64
	i         int64 // the window of the last admission
	cur, prev int64 // the cost admitted in it and in the one before
}

func newSlidingJudge(rate, w int64) *slidingJudge { return &slidingJudge{rate: rate, w: w} }

// admit records an admission of cost n at t (in time order) and reports
// whether the rule holds with it.
func (j *slidingJudge) admit(t, n int64) bool {
	switch i := t / j.w; {
	case i == j.i+1:
		j.i, j.prev, j.cur = i, j.cur, 0
	case i > j.i:
		j.i, j.prev, j.cur = i, 0, 0
	}
	j.cur += n
	left := j.w - (t - j.i*j.w)
	return j.cur+j.prev*left/j.w <= j.rate
}

// countHook counts the script's calls.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// leaseMarkdown writes the leased study's section of the report.
func leaseMarkdown(b *strings.Builder, c leaseConfig, rows []leaseRow) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## Leased limits: what they under-use\n\n")
	p("One hot id with the limit R = %s per W = %s, its demand spread at random over N servers (Limiters of the library ", num(c.Rate), seconds(c.Window))
	p("on one Redis, miniredis, with one clock set to each request's time), over %d windows; every request costs 1. ", c.Windows)
	p("Each demand is replayed through the limit with `Leased` set and through the same limit without it, on the same servers. ")
	p("The demands:\n\n")
	for _, d := range leaseDemands {
		p("- **%s**: %s.\n", d.name, d.about)
	}
	p("\n**under-use** is 1 − admitted leased / admitted unleased. **over the rule** counts the admitted requests at which the ")
	p("sliding rule was broken for what was admitted (the cost admitted in the window so far plus floor(the cost admitted in the one before × the ms left / W) above R): ")
	p("a leased limit must never break it. **Redis calls** are the leased replay's script calls per 1,000 decisions.\n\n")
	p("| demand | offered (× R per W) | servers | admitted, unleased | admitted, leased | under-use | from a lease | Redis calls / 1,000 | over the rule |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		p("| %s | %.2f | %d | %s | %s | %.2f%% | %.1f%% | %.1f | %d |\n", r.demand, r.offered, r.servers, num(r.unleased), num(r.leased),
			100*r.underUse(), 100*r.fromLease, r.calls, r.over)
	}
	p("\nThe bound the design gives: a server holds at most one lease of an id's limit at a time, of at most R/20 units, ")
	p("and the script leases at most half of what the limit has left beyond the request. What the servers hold unused at a moment, ")
	p("at most N × R/20 (and never more than what is left), is all that the shared count can be ahead of what was admitted; ")
	p("it goes back when the window ends. So a leased limit admits at most R/20 less than an unleased one per server at any moment, ")
	p("and the halving keeps what is held near the limit far below that, as the table shows.\n\n")
}
