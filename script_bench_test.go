package ratelimit

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// decider is the script every decision sends.
var decider = script.NewScript(script.Source, false)

// bareIncr is the cheapest script a counter can be: INCR, then PEXPIRE.
// The script's cost is weighed against it.
var bareIncr = script.NewScript("redis.call('INCR', KEYS[1])\nredis.call('PEXPIRE', KEYS[1], ARGV[1])\nreturn 1", false)

// scriptCase is one kind of script call whose cost in Redis
// BenchmarkScriptCost measures.
type scriptCase struct {
	name   string
	limits []Limit
	batch  int  // requests per call, on successive ids
	denied bool // every request is denied: the script reads and writes nothing
	prev   bool // the previous window's keys exist too, as for a client active in the last window
	bare   bool // bareIncr instead of the script
	// charge: each request is a Charge of 1; refund: a Refund of 1 from
	// the current key, whose count the priming put far above 0.
	charge, refund bool
}

// BenchmarkScriptCost measures what each kind of script call costs Redis
// itself, from INFO commandstats: the script's µs per call and per
// decision, and how many times bareIncr's per call that is. The calls are
// the library's own (build and callArgs), over 10,000 ids, with the
// workload of bench/run.sh's "allowed" scenario: every id has decided once
// in the current window (its current key exists, and its previous key does
// not) unless the case says otherwise. They are sent pipelined, 16 to a
// round trip from 4 goroutines, so that Redis, not the client, is the
// bottleneck. bench/scriptcost.sh runs it and prints the table.
//
//	go test -run '^$' -bench ScriptCost -benchtime 200000x .
func BenchmarkScriptCost(b *testing.B) {
	srv := redistest.Start(b)
	// The script's time is wall time: on a machine whose cores the client
	// shares, the server's highest priority keeps the client from
	// preempting it inside a call (as root; best effort otherwise).
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, srv.PID(), -20); err != nil {
		b.Logf("the server keeps its priority: %v", err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 8, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = client.Close() })
	many := PerMinute(1_000_000)
	plan := func(k int) []Limit {
		windows := []time.Duration{time.Minute, time.Second, time.Hour, 24 * time.Hour}
		limits := make([]Limit, k)
		for i := range limits {
			limits[i] = Limit{Rate: 1_000_000, Window: windows[i]}
		}
		return limits
	}
	cases := []scriptCase{
		{name: "bare-incr-pexpire", limits: []Limit{many}, batch: 1, bare: true},
		{name: "one", limits: []Limit{many}, batch: 1},
		{name: "one/both-keys", limits: []Limit{many}, batch: 1, prev: true},
		{name: "one/denied", limits: []Limit{PerMinute(1)}, batch: 1, denied: true},
		{name: "batch3", limits: []Limit{many}, batch: 3}, // what batches hold at 8 goroutines
		{name: "batch16", limits: []Limit{many}, batch: 16},
		{name: "batch16/both-keys", limits: []Limit{many}, batch: 16, prev: true},
		{name: "all2", limits: plan(2), batch: 1},
		{name: "all4", limits: plan(4), batch: 1},
		{name: "strict", limits: []Limit{{Rate: 1_000_000, Window: time.Minute, Strict: true}}, batch: 1},
		{name: "calendar", limits: []Limit{PerPeriod(1_000_000, Monthly, nil)}, batch: 1},
		{name: "calendar/denied", limits: []Limit{PerPeriod(1, Monthly, nil)}, batch: 1, denied: true},
		{name: "calendar/batch16", limits: []Limit{PerPeriod(1_000_000, Monthly, nil)}, batch: 16},
		{name: "charge", limits: []Limit{many}, batch: 1, charge: true},
		{name: "refund", limits: []Limit{many}, batch: 1, refund: true},
	}
	var bare float64 // bareIncr's µs per call, once measured
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			perCall := benchScriptCase(b, client, tc)
			if tc.bare {
				bare = perCall
			} else if bare > 0 {
				b.ReportMetric(perCall/bare, "x-bare/call")
				b.ReportMetric(perCall/float64(tc.batch)/bare, "x-bare/decision")
			}
		})
	}
}

// benchScriptCase makes b.N script calls of tc and reports Redis's µs per
// call and per decision; it returns the µs per call.
func benchScriptCase(b *testing.B, client *redis.Client, tc scriptCase) float64 {
	ctx := context.Background()
	l := New(client, WithPrefix("cost-"+tc.name), WithTimeout(time.Minute))
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = "client-" + strconv.Itoa(i)
	}
	if err := client.FlushAll(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	// The ids' keys as the bench leaves them: one decision each now, and
	// one a window ago for the cases whose previous keys exist.
	for _, id := range ids {
		if tc.prev {
			back := New(client, WithPrefix("cost-"+tc.name), WithClock(func() time.Time { return time.Now().Add(-tc.limits[0].Window) }))
			if _, err := back.AllowAll(ctx, id, tc.limits, 1); err != nil {
				b.Fatal(err)
			}
		}
		// The bare case too: its key is the current window's, which this
		// writes, so that it increments keys that exist as the cases do.
		// Refunds find counts they can lower all along.
		prime := int64(1)
		if tc.refund {
			prime = tc.limits[0].Rate / 2
		}
		if _, err := l.AllowAll(ctx, id, tc.limits, prime); err != nil {
			b.Fatal(err)
		}
	}
	// RATELIMIT_SCRIPT_VARIANT names a Lua file sent in place of the
	// script in the measured calls (the priming above is the library's):
	// a copy of sliding_window.lua that returns early at some point
	// measures what the script costs up to there.
	measured := decider
	if f := os.Getenv("RATELIMIT_SCRIPT_VARIANT"); f != "" {
		src, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		measured = script.NewScript(string(src), false)
	}
	for _, sc := range []*script.Script{decider, bareIncr, measured} {
		if err := client.ScriptLoad(ctx, sc.Src.(string)).Err(); err != nil {
			b.Fatal(err)
		}
	}
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	const goroutines, pipelined = 4, 16
	var next atomic.Int64
	var failed sync.Once
	var wg sync.WaitGroup
	b.ResetTimer()
	for range goroutines {
		wg.Go(func() {
			for {
				first := next.Add(pipelined) - pipelined
				if first >= int64(b.N) {
					return
				}
				pipe := client.Pipeline()
				var cmds []redis.Cmder
				for c := first; c < min(first+pipelined, int64(b.N)); c++ {
					cmds = append(cmds, scriptCall(ctx, pipe, l, measured, tc, ids, c))
				}
				_, err := pipe.Exec(ctx)
				for _, cmd := range cmds {
					if err == nil {
						err = cmd.Err()
					}
				}
				if err != nil {
					failed.Do(func() { b.Error(err) })
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	calls, usec, err := evalshaStats(ctx, client)
	if err != nil {
		b.Fatal(err)
	}
	perCall := usec / calls
	b.ReportMetric(perCall, "redis-µs/call")
	b.ReportMetric(perCall/float64(tc.batch), "redis-µs/decision")
	return perCall
}

// scriptCall queues call c of tc on pipe, of sc: the library's own arguments for
// tc.batch requests on successive ids.
func scriptCall(ctx context.Context, pipe redis.Pipeliner, l *Limiter, sc *script.Script, tc scriptCase, ids []string, c int64) redis.Cmder {
	now := time.Now().UnixMilli()
	var reqs []*script.Request
	for i := range int64(tc.batch) {
		id := ids[(c*int64(tc.batch)+i)%int64(len(ids))]
		p := newPlan(len(tc.limits))
		place(p, id, tc.limits, 1, now)
		if tc.charge {
			p.BuildCharge(l.keys, id)
		} else {
			p.Build(l.keys, id, script.ModeCount, false)
		}
		if tc.refund {
			p.Reqs = []*script.Request{script.GiveBack(1, p.Reqs[0].Keys[0])}
		}
		reqs = append(reqs, p.Reqs...)
	}
	var cmd redis.Cmder
	if tc.bare {
		cmd = redis.NewCmd(ctx, "evalsha", bareIncr.SHA, 1, reqs[0].Keys[0], reqs[0].Limits[0].TTL)
	} else {
		cmd = redis.NewCmd(ctx, script.AppendCall(nil, sc, reqs, false, script.ShortCall(reqs, false))...)
	}
	_ = pipe.Process(ctx, cmd)
	return cmd
}

// evalshaStats returns the EVALSHA calls the server has run since its stats
// were reset, and the microseconds they took.
func evalshaStats(ctx context.Context, client *redis.Client) (calls, usec float64, err error) {
	info, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
			_, err := fmt.Sscanf(rest, "calls=%g,usec=%g,", &calls, &usec)
			return calls, usec, err
		}
	}
	return 0, 0, fmt.Errorf("no cmdstat_evalsha in %q", info)
}

// BenchmarkOneDecision is one goroutine deciding over 10,000 ids on a
// real server, every request allowed: the Go side of a decision at low
// concurrency, where no batch hides it. bare-evalsha is go-redis's own
// EvalSha of the script with the keys and arguments the library builds, and
// nothing around it: what a decision costs the client at the least.
//
//	go test -run '^$' -bench OneDecision -benchmem .
func BenchmarkOneDecision(b *testing.B) {
	srv := redistest.Start(b)
	limit := PerMinute(1 << 30)
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = "client-" + strconv.Itoa(i)
	}
	for _, ctxAware := range []bool{true, false} {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxAware})
		b.Cleanup(func() { _ = client.Close() })
		name := map[bool]string{true: "ctxclient", false: "default-client"}[ctxAware]
		b.Run("limiter/"+name, func(b *testing.B) {
			l := New(client, WithTimeout(time.Minute))
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				res, err := l.Allow(ctx, ids[i%len(ids)], limit)
				if err != nil || !res.Allowed {
					b.Fatal(res, err)
				}
			}
		})
		b.Run("bare-evalsha/"+name, func(b *testing.B) {
			l := New(client)
			ctx := context.Background()
			sha := decider.SHA.(string)
			if err := client.ScriptLoad(ctx, decider.Src.(string)).Err(); err != nil {
				b.Fatal(err)
			}
			values := func(a script.LimitArgs) []any { return []any{a.Rate, a.Window, a.TTL, int64(1), a.Weight} }
			a := script.Args(limit.Rate, locate(time.Now().UnixMilli(), &limit))
			r := &script.Request{Cost: 1, NLimits: 1, Limits: []script.LimitArgs{a}, Keys: []string{"a", "b"}}
			var sent []any
			for _, v := range script.AppendCall(nil, decider, []*script.Request{r}, false, true)[5:] {
				sent = append(sent, *v.(*int64))
			}
			if !slices.Equal(sent, values(a)) {
				b.Fatalf("the library sends %v after the keys, the benchmark %v", sent, values(a))
			}
			b.ReportAllocs()
			var keys [2]string
			for i := 0; b.Loop(); i++ {
				pos := locate(time.Now().UnixMilli(), &limit)
				a := script.Args(limit.Rate, pos)
				// values(a), written out so that go-redis boxes them as a
				// caller's literal arguments
				v, err := client.EvalSha(ctx, sha, l.keys.Append(keys[:0], ids[i%len(ids)], pos), a.Rate, a.Window, a.TTL, 1, a.Weight).Int64()
				if err != nil || v&1 != 1 {
					b.Fatal("not allowed:", v, err)
				}
			}
		})
	}
}
