// The -quota mode: a fleet of emulated Envoys on ratelimit-rls's quota
// service (RLQS), beside the rate limit service at the same traffic.

package main

import (
	"context"
	"fmt"
	"log"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqs "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/rls"
)

// quotaRate is the quota domain's limit a minute: 100 a second.
const quotaRate = 6000

// quotaConfig is the domain both faces count under: a tenant's 6,000 a
// minute.
var quotaConfig = fmt.Sprintf("domain: quota\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", quotaRate)

// quotaPrefix is ratelimit-rls's CACHE_KEY_PREFIX in -quota: the bench
// reads the counts it keeps.
const quotaPrefix = "bench:"

// measureQuota runs the fleet against ours (a ratelimit-rls serving RLQS
// with Envoy's defaults) and prints (duration > 0) the cost rows, with
// reference and ours answering ShouldRateLimit at the same traffic, then
// (minutes > 0) the fleet's minutes over the limit.
func measureQuota(ours, reference *service, rdb *redis.Client, duration time.Duration, minutes int) {
	if duration > 0 {
		quotaCost(ours, reference, rdb, duration)
	}
	if minutes > 0 {
		fmt.Println()
		fleetOverLimit(ours, rdb, minutes)
	}
}

// quotaCost prints the cost rows: the fleet under the limit for d, and
// each service's ShouldRateLimit at the same traffic.
func quotaCost(ours, reference *service, rdb *redis.Client, duration time.Duration) {
	const envoys, each = 8, 10 // requests a second
	fmt.Printf("A fleet of %d emulated Envoys, %d requests a second each (%d/s, under the limit of %d a minute) for %v after 10 s of warm-up;\n"+
		"RLQS with Envoy's 5 s reports and the service's defaults (RLS_QUOTA_TTL 10s, fill 1s, message delay 1s);\n"+
		"the rate limit service at the same traffic, a ShouldRateLimit call per request of one descriptor.\n\n", envoys, each, envoys*each, quotaRate, duration)
	fmt.Println("| face | service | calls to the service /s | per 1,000 requests | Redis commands per admitted request | Redis round trips per admitted request | admitted/s |")
	fmt.Println("|---|---|--:|--:|--:|--:|--:|")
	fleet := newFleet(ours, envoys, 5*time.Second, "cost")
	for _, e := range fleet {
		e.setRate(each)
	}
	time.Sleep(10 * time.Second) // the fleet's first reports and assignments, in real time
	_, calls0 := redisStats(rdb)
	scripts0 := scriptCalls(rdb)
	msgs0, adm0 := fleetTotals(fleet)
	t0 := time.Now()
	time.Sleep(duration) // the measured run, in real time
	elapsed := time.Since(t0)
	_, calls1 := redisStats(rdb)
	scripts1 := scriptCalls(rdb)
	msgs1, adm1 := fleetTotals(fleet)
	for _, e := range fleet {
		e.stop()
	}
	traffic := float64(envoys*each) * elapsed.Seconds()
	admitted := float64(max(adm1-adm0, 1))
	fmt.Printf("| RLQS (rate_limit_quota) | ratelimit-rls | %.2f | %.2f | %.4f | %.4f | %.1f |\n", float64(msgs1-msgs0)/elapsed.Seconds(),
		1000*float64(msgs1-msgs0)/traffic, float64(calls1-calls0)/admitted, float64(scripts1-scripts0)/admitted, float64(adm1-adm0)/elapsed.Seconds())
	for _, s := range []*service{reference, ours} {
		calls, admitted, commands, trips, d := paced(rdb, s, envoys, each, duration)
		fmt.Printf("| RLS (ratelimit) | %s | %.1f | %.0f | %.4f | %.4f | %.1f |\n", s.name, float64(calls)/d.Seconds(),
			1000*float64(calls)/(float64(envoys*each)*d.Seconds()), float64(commands)/float64(max(admitted, 1)), float64(trips)/float64(max(admitted, 1)), float64(admitted)/d.Seconds())
	}
	fmt.Println()
	fmt.Println("Redis commands as INFO commandstats counts them (a script's own commands too); a round trip is a script call (EVAL/EVALSHA), or for the reference, whose pipeline of INCRBY and EXPIRE per descriptor is one round trip, a call.")
}

// fleetTotals is what the fleet sent the service (reports) and admitted.
func fleetTotals(fleet []*fleetEnvoy) (msgs, admitted int) {
	for _, e := range fleet {
		e.mu.Lock()
		msgs += e.sent
		for _, n := range e.admitted {
			admitted += n
		}
		e.mu.Unlock()
	}
	return msgs, admitted
}

// paced sends s clients × each ShouldRateLimit calls a second of one
// tenant for d, and returns the calls, those allowed, Redis's commands and
// round trips.
func paced(rdb *redis.Client, s *service, clients, each int, d time.Duration) (calls, admitted int, commands, trips int64, elapsed time.Duration) {
	tenant := fmt.Sprint("rls-", s.name, "-", time.Now().UnixNano())
	req := &pb.RateLimitRequest{Domain: "quota", Descriptors: []*rlv3.RateLimitDescriptor{descriptor("tenant", tenant)}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	_, c0 := redisStats(rdb)
	s0 := scriptCalls(rdb)
	t0 := time.Now()
	for range clients {
		wg.Go(func() {
			for i := 0; ; i++ {
				at := t0.Add(time.Duration(i) * time.Second / time.Duration(each))
				if !at.Before(t0.Add(d)) {
					return
				}
				time.Sleep(time.Until(at)) // paced load, in real time
				resp, err := s.client.ShouldRateLimit(context.Background(), req)
				if err != nil {
					log.Fatalf("envoy: %s: %v", s.name, err)
				}
				mu.Lock()
				calls++
				if resp.OverallCode == pb.RateLimitResponse_OK {
					admitted++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed = time.Since(t0)
	_, c1 := redisStats(rdb)
	trips = scriptCalls(rdb) - s0
	if trips == 0 {
		trips = int64(calls) // the reference: a pipeline per call
	}
	return calls, admitted, c1 - c0, trips, elapsed
}

// scriptCalls is how many scripts Redis has run (EVAL, EVALSHA and their
// read-only forms): a round trip each.
func scriptCalls(rdb *redis.Client) int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		log.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !slices.Contains([]string{"cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro"}, name) {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				k, _ := strconv.ParseInt(v, 10, 64)
				n += k
			}
		}
	}
	return n
}

// fleetOverLimit runs 8 Envoys asking 140 a second of one tenant's 100 for
// minutes whole minutes: Envoys 0-3 ask 30 a second and 4-7 ask 5, flipped
// 90 s in; 150 s in, Envoy 7's stream is killed (it reconnects at its next
// report). Then they stop asking, and report twice more. It prints, by
// minute, the limit, the most the Envoys could have admitted under their
// assignments, what they admitted, and what Redis counted, and how long
// the shares took to follow the demand.
func fleetOverLimit(ours *service, rdb *redis.Client, minutes int) {
	cfg, err := rls.LoadConfig([]rls.File{{Name: "quota.yaml", Data: []byte(quotaConfig)}})
	if err != nil {
		log.Fatal(err)
	}
	tenant := "fleet"
	m := cfg.Match("quota", descriptor("tenant", tenant))
	start := time.Now().Truncate(time.Minute).Add(time.Minute)
	end := start.Add(time.Duration(minutes) * time.Minute)
	fmt.Fprintf(os.Stderr, "fleet: waiting for %s, then %d minute(s)\n", start.Format("15:04:05"), minutes)
	time.Sleep(time.Until(start)) // the run starts with a window, in real time
	const period = 5 * time.Second
	fleet := newFleet(ours, 8, period, tenant)
	high, low := fleet[:4], fleet[4:]
	demand := func(hi, lo float64) {
		for _, e := range high {
			e.setRate(hi)
		}
		for _, e := range low {
			e.setRate(lo)
		}
	}
	demand(30, 5)
	counted := make([]int64, minutes)
	exposure := make([]float64, minutes) // by minute: the most admitted + could still admit
	var wg sync.WaitGroup
	for i := range minutes {
		wg.Go(func() {
			// the minute's count once the reports after it settled it
			end := start.Add(time.Duration(i+1) * time.Minute)
			time.Sleep(time.Until(end.Add(15 * time.Second))) // real time: the reports after the minute
			counted[i] = windowCount(rdb, m, end.Add(-time.Millisecond))
		})
	}
	sampling, stopSampling := context.WithCancel(context.Background())
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampling.Done():
				return
			case now := <-tick.C:
				i := int(now.Sub(start) / time.Minute)
				if i < 0 || i >= minutes {
					continue
				}
				from := start.Add(time.Duration(i) * time.Minute)
				v := 0.0
				for _, e := range fleet {
					v += e.exposure(from, now)
				}
				exposure[i] = max(exposure[i], v)
			}
		}
	})
	flip, kill := start.Add(90*time.Second), start.Add(150*time.Second)
	if minutes >= 3 {
		time.Sleep(time.Until(flip)) // real time
		demand(5, 30)
		time.Sleep(time.Until(kill)) // real time
		fleet[7].kill()
	}
	time.Sleep(time.Until(end)) // real time
	demand(0, 0)
	time.Sleep(2*period + time.Second) // the reports that settle the last minute, in real time
	stopSampling()
	for _, e := range fleet {
		e.stop()
	}
	wg.Wait()
	fmt.Printf("The fleet over the limit: 8 Envoys asking 140 a second of one tenant's %d a minute (sliding), %d minute(s) from a window's start,\n"+
		"then nothing for two report periods; Envoys 0-3 ask 30/s and 4-7 ask 5/s, flipped at 90 s; Envoy 7's stream killed at 150 s.\n"+
		"\"Could admit\": the most, over the minute's instants, of what the Envoys had admitted in it plus what the assignments in force\n"+
		"could still let them admit (each Envoy's tokens and the fills until its TTL ends). \"Counted\": the minute's window in Redis,\n"+
		"read 15 s after it ended.\n\n", quotaRate, minutes)
	fmt.Println("| minute | limit | could admit | admitted | counted in Redis | counted - admitted |")
	fmt.Println("|--:|--:|--:|--:|--:|--:|")
	for i := range minutes {
		from, to := start.Add(time.Duration(i)*time.Minute), start.Add(time.Duration(i+1)*time.Minute)
		admitted := 0
		for _, e := range fleet {
			admitted += e.admittedIn(from, to)
		}
		fmt.Printf("| %d | %d | %.0f | %d | %d | %d |\n", i+1, quotaRate, exposure[i], admitted, counted[i], counted[i]-int64(admitted))
	}
	fmt.Println()
	fmt.Printf("Shares following demand (a share: the fill rate of the assignment an Envoy last applied, DENY_ALL 0; re-balanced: every Envoy\n"+
		"asking more holds a larger one than every Envoy asking less, counted from when all hold one): from the start, %s", rebalanced(high, low, start, start.Add(90*time.Second), period))
	if minutes >= 3 {
		fmt.Printf("; after the flip at 90 s, %s", rebalanced(low, high, flip, kill, period))
	}
	fmt.Println(".")
}

// rebalanced is how long after from (or after every Envoy first held an
// assignment, if later), before to, each of high first held a larger share
// than each of low (DENY_ALL is a share of 0).
func rebalanced(high, low []*fleetEnvoy, from, to time.Time, period time.Duration) string {
	all := append(slices.Clone(high), low...)
	times := []time.Time{from}
	for _, e := range all {
		if len(e.shares) == 0 {
			return "never: an Envoy got no assignment"
		}
		from = later(from, e.shares[0].at)
		for _, g := range e.shares {
			if g.at.Before(to) {
				times = append(times, g.at)
			}
		}
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	ordered := func(t time.Time) bool {
		for _, h := range high {
			for _, l := range low {
				if h.shareAt(t) <= l.shareAt(t) {
					return false
				}
			}
		}
		return true
	}
	for _, t := range times {
		if !t.Before(from) && ordered(t) {
			d := t.Sub(from)
			return fmt.Sprintf("%v (%.2f report periods)", d.Round(time.Millisecond), d.Seconds()/period.Seconds())
		}
	}
	return "not by " + to.Sub(from).String()
}

// windowCount is what Redis counts in the window of m's limit that at
// falls in (at just before the window's end: the window before weighs
// nothing), read with a Limiter on a clock stopped at at.
func windowCount(rdb *redis.Client, m *rls.Match, at time.Time) int64 {
	l := ratelimit.New(rdb, ratelimit.WithPrefix(quotaPrefix), ratelimit.WithClock(func() time.Time { return at }))
	defer func() { _ = l.Close(context.Background()) }()
	res, err := l.Peek(context.Background(), m.ID, m.Rule.Limit)
	if err != nil {
		log.Fatal(err)
	}
	return res.Count
}

// fleetEnvoy is one Envoy's rate_limit_quota filter with one bucket
// ({tenant: T}): it asks rate requests a second, decides them from its
// assignment (none or expired: denied), reports every period on its
// stream (reopening it when it is down; a report that cannot go is
// dropped), and applies what the service sends as Envoy does (a token
// bucket equal to the one in force extends its TTL and keeps its tokens).
type fleetEnvoy struct {
	client rlqs.RateLimitQuotaServiceClient
	period time.Duration
	bucket *rlqs.BucketId

	mu              sync.Mutex
	ctx             context.Context
	cancel          context.CancelFunc
	stream          rlqs.RateLimitQuotaService_StreamRateLimitQuotasClient
	streamCancel    context.CancelFunc
	rate            float64
	rateFrom        time.Time
	tried           int
	allowed, denied uint64
	lastReport      time.Time
	tb              *typev3.TokenBucket // in force, nil for none
	allowAll        bool
	tokens          float64
	tokensAt        time.Time
	expires         time.Time
	sent            int
	admitted        map[int64]int // by second
	shares          []share       // the fill rates applied, in order
	wg              sync.WaitGroup
}

// share is a fill rate (tokens a second) an Envoy applied, and when.
type share struct {
	at   time.Time
	rate float64
}

// newFleet starts n Envoys on s, each with the bucket {tenant: tenant},
// asking nothing until setRate.
func newFleet(s *service, n int, period time.Duration, tenant string) []*fleetEnvoy {
	var fleet []*fleetEnvoy
	for range n {
		conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			log.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		e := &fleetEnvoy{client: rlqs.NewRateLimitQuotaServiceClient(conn), period: period, ctx: ctx, cancel: func() { cancel(); _ = conn.Close() },
			bucket: &rlqs.BucketId{Bucket: map[string]string{"tenant": tenant}}, admitted: map[int64]int{}}
		e.wg.Add(1)
		go e.run()
		fleet = append(fleet, e)
	}
	return fleet
}

func (e *fleetEnvoy) setRate(r float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rate, e.rateFrom, e.tried = r, time.Now(), 0
}

// run ticks every 10 ms: the requests due, and the report when due.
func (e *fleetEnvoy) run() {
	defer e.wg.Done()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var next time.Time
	for {
		select {
		case <-e.ctx.Done():
			return
		case now := <-tick.C:
			e.mu.Lock()
			due := int(e.rate*now.Sub(e.rateFrom).Seconds()) - e.tried
			first := false
			for range max(due, 0) {
				e.tried++
				if e.lastReport.IsZero() {
					// the bucket's first request: denied, reported at once
					e.lastReport, first = now, true
					e.denied++
					next = now.Add(e.period)
					continue
				}
				e.decide(now)
			}
			report := first || (!next.IsZero() && !now.Before(next))
			var m *rlqs.RateLimitQuotaUsageReports
			if report {
				if !first {
					next = now.Add(e.period)
				}
				m = e.report(now)
			}
			e.mu.Unlock()
			if m != nil {
				e.send(m)
			}
		}
	}
}

// decide admits or denies one request at now.
func (e *fleetEnvoy) decide(now time.Time) {
	if !now.Before(e.expires) {
		e.tb, e.allowAll = nil, false
	}
	ok := e.allowAll
	if e.tb != nil {
		e.refill(now)
		if e.tokens >= 1 {
			e.tokens--
			ok = true
		}
	}
	if ok {
		e.allowed++
		e.admitted[now.Unix()]++
	} else {
		e.denied++
	}
}

func (e *fleetEnvoy) refill(now time.Time) {
	if secs := e.tb.GetFillInterval().GetSeconds(); secs > 0 {
		e.tokens = math.Min(float64(e.tb.GetMaxTokens()), e.tokens+float64(e.tb.GetTokensPerFill().GetValue())/float64(secs)*now.Sub(e.tokensAt).Seconds())
	}
	e.tokensAt = now
}

// report builds the report of the bucket at now and resets its counters.
func (e *fleetEnvoy) report(now time.Time) *rlqs.RateLimitQuotaUsageReports {
	m := &rlqs.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqs.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: e.bucket, TimeElapsed: durationpb.New(now.Sub(e.lastReport).Truncate(time.Second)),
		NumRequestsAllowed: e.allowed, NumRequestsDenied: e.denied}}}
	e.allowed, e.denied, e.lastReport = 0, 0, now
	return m
}

// send sends m, opening the stream when it is down.
func (e *fleetEnvoy) send(m *rlqs.RateLimitQuotaUsageReports) {
	e.mu.Lock()
	st := e.stream
	e.mu.Unlock()
	if st == nil {
		ctx, cancel := context.WithCancel(e.ctx)
		var err error
		if st, err = e.client.StreamRateLimitQuotas(ctx); err != nil {
			cancel()
			return
		}
		e.mu.Lock()
		e.stream, e.streamCancel = st, cancel
		e.mu.Unlock()
		e.wg.Add(1)
		go e.receive(st)
	}
	if st.Send(m) == nil {
		e.mu.Lock()
		e.sent++
		e.mu.Unlock()
	}
}

// receive applies what the service sends on st until it ends.
func (e *fleetEnvoy) receive(st rlqs.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	defer e.wg.Done()
	for {
		r, err := st.Recv()
		e.mu.Lock()
		if err != nil {
			if e.stream == st {
				e.stream = nil
			}
			e.mu.Unlock()
			return
		}
		now := time.Now()
		for _, a := range r.GetBucketAction() {
			e.apply(a, now)
		}
		e.mu.Unlock()
	}
}

// apply applies a bucket action at now, as Envoy does.
func (e *fleetEnvoy) apply(a *rlqs.RateLimitQuotaResponse_BucketAction, now time.Time) {
	if a.GetAbandonAction() != nil {
		e.tb, e.allowAll, e.expires = nil, false, now
		e.shares = append(e.shares, share{now, 0})
		return
	}
	qa := a.GetQuotaAssignmentAction()
	ttl := time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second
	expires := now.Add(ttl)
	switch s := qa.GetRateLimitStrategy().GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		e.tb, e.allowAll, e.expires = nil, s.BlanketRule == typev3.RateLimitStrategy_ALLOW_ALL, expires
		rate := 0.0
		if e.allowAll {
			rate = math.Inf(1)
		}
		e.shares = append(e.shares, share{now, rate})
	case *typev3.RateLimitStrategy_TokenBucket:
		tb := s.TokenBucket
		per := float64(tb.GetTokensPerFill().GetValue()) / math.Max(1, float64(tb.GetFillInterval().GetSeconds()))
		if e.tb != nil && now.Before(e.expires) && tb.GetMaxTokens() == e.tb.GetMaxTokens() &&
			tb.GetTokensPerFill().GetValue() == e.tb.GetTokensPerFill().GetValue() && tb.GetFillInterval().GetNanos() == e.tb.GetFillInterval().GetNanos() {
			e.expires = later(e.expires, expires)
			return
		}
		e.tb, e.allowAll, e.tokens, e.tokensAt, e.expires = tb, false, float64(tb.GetMaxTokens()), now, expires
		e.shares = append(e.shares, share{now, per})
	}
	if ttl == 0 {
		e.tb, e.allowAll = nil, false
	}
}

// kill ends the stream as a lost connection would; the Envoy reopens it at
// its next report.
func (e *fleetEnvoy) kill() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stream != nil {
		e.streamCancel()
		e.stream = nil
	}
}

func (e *fleetEnvoy) stop() {
	e.cancel()
	e.wg.Wait()
}

func (e *fleetEnvoy) admittedIn(from, to time.Time) int {
	n := 0
	for s, k := range e.admitted {
		if t := time.Unix(s, 0); !t.Before(from) && t.Before(to) {
			n += k
		}
	}
	return n
}

// exposure is what e admitted from from to now, plus what its assignment
// in force could still let it admit: its tokens now and the fills until
// its TTL ends.
func (e *fleetEnvoy) exposure(from, now time.Time) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	v := float64(e.admittedIn(from, now.Add(time.Second)))
	switch {
	case !now.Before(e.expires):
	case e.allowAll:
		return math.Inf(1)
	case e.tb != nil:
		e.refill(now)
		per := float64(e.tb.GetTokensPerFill().GetValue()) / math.Max(1, float64(e.tb.GetFillInterval().GetSeconds()))
		v += math.Floor(e.tokens + per*e.expires.Sub(now).Seconds())
	}
	return v
}

// shareAt is the fill rate of the token bucket last applied by t (0: none).
func (e *fleetEnvoy) shareAt(t time.Time) float64 {
	i, _ := slices.BinarySearchFunc(e.shares, t, func(g share, t time.Time) int { return g.at.Compare(t) })
	if i == 0 {
		return 0
	}
	return e.shares[i-1].rate
}

// descriptor is the descriptor of one entry.
func descriptor(k, v string) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
