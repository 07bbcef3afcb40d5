// The RLQS conformance harness: envoy.service.rate_limit_quota.v3 as
// ratelimit-rls serves it, checked from the protocol alone with emulated
// Envoys (rlqs_envoy_test.go). The claim under test: every token an
// assignment lets an Envoy spend before its TTL ends is counted in Redis
// first, unused shares come back, so that what all Envoys admit never
// exceeds the rule's limit, across streams and replicas.
//
// The TestRLQS* tests run the service and skip while it answers
// StreamRateLimitQuotas with Unimplemented; TestHarness* check the
// harness itself, against fake servers written here, one of them right
// and the others each wrong in one way the checks must catch.

package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/rls"
	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

const (
	rlqsDomain = "rlqs"
	rlqsPrefix = "rlqsh" // CACHE_KEY_PREFIX, and the prefix the harness looks under
	rlqsRate   = 600     // the rule's requests_per_unit, a minute
	// The service's RLQS settings in these tests: short, so that each test
	// runs in about 20 s.
	rlqsTTL     = 3 * time.Second
	rlqsPeriod  = time.Second // RLS_QUOTA_REPORT_INTERVAL, and the Envoys' reporting interval
	rlqsAbandon = 3 * time.Second
	// RLS_QUOTA_MESSAGE_DELAY: the longest a message takes on loopback,
	// with room for a busy machine
	rlqsDelay = 50 * time.Millisecond
)

var rlqsEnv = []string{"RLS_QUOTA_TTL=" + rlqsTTL.String(), "RLS_QUOTA_FILL_INTERVAL=1s", "RLS_QUOTA_REPORT_INTERVAL=" + rlqsPeriod.String(),
	"RLS_QUOTA_ABANDON_AFTER=" + rlqsAbandon.String(), "RLS_QUOTA_MESSAGE_DELAY=" + rlqsDelay.String()}

// acme is the bucket every scenario's Envoys share.
var acme = map[string]string{"tenant": "acme"}

// rlqsConfig is the rlqs domain's file: tenant at rate a minute. The
// service's tests make it strict: the claim is a hard bound, and only a
// strict limit is one (a sliding one lets a window that straddles two of
// its fixed windows hold more, by design: docs/accuracy.md).
func rlqsConfig(rate int, strict bool) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: %d, strict: %t}\n", rlqsDomain, rate, strict)
}

// rlqsMatch loads the configuration text as the service does and returns
// it with acme's match: the id it counts under and its Limit.
func rlqsMatch(t *testing.T, text string) (*rls.Config, *rls.Match) {
	t.Helper()
	cfg, err := rls.LoadConfig([]rls.File{{Name: "rlqs.yaml", Data: []byte(text)}})
	require.NoError(t, err)
	m := cfg.Match(rlqsDomain, descriptorOf(acme))
	require.NotNil(t, m)
	return cfg, m
}

// descriptorOf is bucket id's RLS descriptor: its entries by key.
func descriptorOf(id map[string]string) *rlv3.RateLimitDescriptor {
	var kv []string
	for _, e := range strings.Split(bucketKey(id), ",") {
		k, v, _ := strings.Cut(e, "=")
		kv = append(kv, k, v)
	}
	return desc(kv...)
}

// redisSample is the rule's count in Redis, looked at (at is when the look
// began).
type redisSample struct {
	at    time.Time
	count int64
}

// harnessRun is one scenario's Envoys, bucket and Redis samples, and the
// checks on them.
type harnessRun struct {
	limit  ratelimit.Limit
	bucket string
	period time.Duration // the Envoys' reporting interval: the slack where timing matters
	delay  time.Duration // the message delay δ the server is told to assume (RLS_QUOTA_MESSAGE_DELAY)
	envoys []*emulatedEnvoy
	peek   func(context.Context) (int64, error)

	mu      sync.Mutex
	samples []redisSample
	errs    []error
}

func newHarnessRun(limit ratelimit.Limit, period, delay time.Duration, peek func(context.Context) (int64, error), envoys ...*emulatedEnvoy) *harnessRun {
	return &harnessRun{limit: limit, bucket: bucketKey(acme), period: period, delay: delay, envoys: envoys, peek: peek}
}

// sample looks at the count (cost 0: Peek counts nothing).
func (r *harnessRun) sample(ctx context.Context, at time.Time) {
	n, err := r.peek(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs = append(r.errs, err)
		return
	}
	r.samples = append(r.samples, redisSample{at: at, count: n})
}

// verdict is one check's outcome, a row of the table the tests log.
type verdict struct {
	name, condition, measured string
	ok                        bool
}

// admitted is what all Envoys admitted of the bucket in (from, to].
func (r *harnessRun) admitted(from, to time.Time) int {
	n := 0
	for _, e := range r.envoys {
		n += e.admittedIn(r.bucket, from, to)
	}
	return n
}

// potential is what all Envoys could still admit at t under the
// assignments in force.
func (r *harnessRun) potential(t time.Time) float64 {
	p := 0.0
	for _, e := range r.envoys {
		p += e.stateAt(r.bucket, t).potential(t)
	}
	return p
}

// checkAdmitted: in every window of the rule's length, what all Envoys
// admitted is at most the limit. The count in a window is largest when it
// starts at an admission, so the windows starting at each admission are
// every window there is to check.
func (r *harnessRun) checkAdmitted() verdict {
	var all []time.Time
	for _, e := range r.envoys {
		all = append(all, e.admissions[r.bucket]...)
	}
	slices.SortFunc(all, func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i := range all {
		for j < len(all) && all[j].Before(all[i].Add(r.limit.Window)) {
			j++
		}
		most = max(most, j-i)
	}
	return verdict{name: "admitted", condition: fmt.Sprintf("max over windows of %v of requests admitted <= %d", r.limit.Window, r.limit.Rate),
		measured: fmt.Sprintf("%d (of %d in all)", most, len(all)), ok: int64(most) <= r.limit.Rate}
}

// checkExposure: at every instant t, what all Envoys admitted in the
// window ending at t plus what the assignments in force at t could still
// let them admit (each Envoy's tokens then, the fills until its TTL ends:
// a greedy Envoy's most) is at most the limit. Between two changes of one
// Envoy's assignment its sum only falls (a request admitted moves a token
// from could to did; a full bucket wastes its fill), so the instants to
// check are those of the Envoys' recorded states.
//
// This is "could admit under their assignments" as a run can measure it:
// the sum over assignments of max_tokens plus fills over the TTL, each as
// granted, is no bound a right server keeps, since a share that went
// unused comes back and is granted again (it is in the table, as
// "granted").
func (r *harnessRun) checkExposure() verdict {
	var ts []time.Time
	for _, e := range r.envoys {
		ts = append(ts, e.times(r.bucket)...)
	}
	most, at := 0.0, time.Time{}
	for _, t := range ts {
		if v := float64(r.admitted(t.Add(-r.limit.Window), t)) + r.potential(t); v > most {
			most, at = v, t
		}
	}
	return verdict{name: "could admit", condition: fmt.Sprintf("max over t of admitted in the %v to t + what the assignments in force could still admit <= %d", r.limit.Window, r.limit.Rate),
		measured: fmt.Sprintf("%v at %s", most, r.clock(at)), ok: most <= float64(r.limit.Rate)}
}

// checkRedisLimit: the rule's count, sampled during the run, is never
// above the limit.
func (r *harnessRun) checkRedisLimit() verdict {
	most := int64(0)
	for _, s := range r.samples {
		most = max(most, s.count)
	}
	return verdict{name: "redis <= limit", condition: fmt.Sprintf("every sampled count <= %d", r.limit.Rate),
		measured: fmt.Sprintf("max %d over %d samples (%d failed looks)", most, len(r.samples), len(r.errs)),
		ok:       most <= r.limit.Rate && len(r.samples) > 0}
}

// checkCountedFirst: every sampled count is at least what the Envoys had
// admitted in the window before the look began, plus what the assignments
// then in force could still let them admit, counting only assignments
// still in force (not replaced, not expired) a report period later. That
// period is slack for the server's TTL clock, which starts when it sends
// and so ends before the Envoy's: a server may give back what an
// assignment left unused once it expires, or when it replaces it, and the
// Envoy may not have seen either yet.
func (r *harnessRun) checkCountedFirst() verdict {
	worst, worstAt, failed := math.Inf(1), time.Time{}, 0
	for _, s := range r.samples {
		lower := float64(r.admitted(s.at.Add(-r.limit.Window), s.at))
		later := s.at.Add(r.period)
		for _, e := range r.envoys {
			now, then := e.stateAt(r.bucket, s.at), e.stateAt(r.bucket, later)
			if now.seg != 0 && then.seg == now.seg && later.Before(then.expires) {
				lower += now.potential(s.at)
			}
		}
		if d := float64(s.count) - lower; d < worst {
			worst, worstAt = d, s.at
		}
		if float64(s.count) < lower {
			failed++
		}
	}
	return verdict{name: "counted first", condition: "every sampled count >= admitted in the window + what assignments still in force a period later could still admit",
		measured: fmt.Sprintf("min count - that = %v at %s; %d of %d samples below", worst, r.clock(worstAt), failed, len(r.samples)), ok: failed == 0}
}

// checkGiveBack: once demand has stopped (from is when, plus the bound the
// server documents), the count holds no more than what a server that
// gives back all it can must keep: at least one sample at or after from
// must show that (the least of them, because a grant the server has
// counted is in the count a moment before the Envoy applies it, and a
// report is in the Envoy's record a moment before the server reads it).
//
// What it must keep, of each Envoy, is reckoned from the last report the
// Envoy made by the sample, because the server knows nothing newer: what
// the Envoy admitted by then, and the most a greedy Envoy could admit
// after it under the assignments it held then and applied since (reach).
// Each bound of that stretch may move by the message delay δ the server
// is told to assume: a report received at R may have been made at R−δ,
// and an assignment sent at S may reach the Envoy at S+δ and run its TTL
// from then. The tokens the Envoy held at its report are a full bucket,
// less what its admissions since the bucket started show it cannot hold,
// since a report says what was admitted, not what is left. A stream that
// ended (killed, or its Envoy gone) adds what its Envoy could admit after
// its last report on it under the assignments it got on it: no report
// will say what it spent, and a reconnecting Envoy is a new stream to the
// server (nothing in the protocol names it).
func (r *harnessRun) checkGiveBack(from time.Time) verdict {
	least, n, ended := math.Inf(1), 0, 0.0
	var counts []int64
	for _, s := range r.samples {
		if s.at.Before(from) {
			continue
		}
		n++
		counts = append(counts, s.count)
		keep := 0.0
		ended = 0
		for _, e := range r.envoys {
			keep += r.mustKeep(e, s.at)
			for _, k := range e.kills {
				if !k.at.After(s.at) {
					last := k.lastSend
					if last.IsZero() {
						last = k.at
					}
					ended += e.reach(r.bucket, last, k.at, r.delay)
				}
			}
		}
		least = min(least, float64(s.count)-keep-ended)
	}
	return verdict{name: "given back",
		condition: fmt.Sprintf("from %s: min over samples of count - (per Envoy: admitted by its last report + the most it could admit after it, δ %v each side + %v for streams ended, after their last report) <= 0",
			r.clock(from), r.delay, ended),
		measured: fmt.Sprintf("%v over %d samples (counts %v)", least, n, counts), ok: n > 0 && least <= 0}
}

// mustKeep is what of e a server that gives back all it can keeps counted
// at t, but for the streams that ended (checkGiveBack): what e admitted in
// the window by its last report, and the most it could admit after it on
// a stream still open at t.
func (r *harnessRun) mustKeep(e *emulatedEnvoy, t time.Time) float64 {
	last := e.lastReport(t)
	if last.IsZero() {
		return float64(e.admittedIn(r.bucket, t.Add(-r.limit.Window), t)) + e.stateAt(r.bucket, t).potential(t)
	}
	keep := float64(e.admittedIn(r.bucket, t.Add(-r.limit.Window), last))
	if slices.ContainsFunc(e.kills, func(k killRecord) bool { return !k.at.After(t) && !k.at.Before(last) }) {
		return keep // the stream it went on has ended: its rest is the ended streams' part
	}
	return keep + e.reach(r.bucket, last, t, r.delay)
}

// verdicts are the bound's checks, and with quiet non-zero the give-back
// check from then on.
func (r *harnessRun) verdicts(quiet time.Time) []verdict {
	vs := []verdict{r.checkAdmitted(), r.checkExposure(), r.checkRedisLimit(), r.checkCountedFirst()}
	if !quiet.IsZero() {
		vs = append(vs, r.checkGiveBack(quiet))
	}
	return vs
}

// start is the run's first recorded instant.
func (r *harnessRun) start() time.Time {
	var first time.Time
	for _, e := range r.envoys {
		if h := e.history[r.bucket]; len(h) > 0 && (first.IsZero() || h[0].at.Before(first)) {
			first = h[0].at
		}
	}
	return first
}

// clock names t as an offset from the run's start.
func (r *harnessRun) clock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return "+" + t.Sub(r.start()).Round(time.Millisecond).String()
}

// logTable logs vs and what each Envoy did, as the closing note needs
// them.
func (r *harnessRun) logTable(t *testing.T, vs []verdict) {
	t.Helper()
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "check\tok\tmeasured\tcondition")
	for _, v := range vs {
		fmt.Fprintf(w, "%s\t%t\t%s\t%s\n", v.name, v.ok, v.measured, v.condition)
	}
	fmt.Fprintln(w, "\nenvoy\tadmitted\tassignments\tgranted\treports sent/answered/dropped\tstreams ended (the run's end too)\tlast share (rate/s, max)")
	for _, e := range r.envoys {
		granted, n := 0.0, 0
		for _, a := range e.assignments {
			if a.bucket == r.bucket && !strings.HasPrefix(a.what, "skipped") {
				granted += a.granted
				n++
			}
		}
		var last string
		for i := len(e.assignments) - 1; i >= 0; i-- {
			if a := e.assignments[i]; a.bucket == r.bucket && a.what == "token_bucket" {
				last = fmt.Sprintf("%d per %v, max %d, ttl %v", a.tpf, a.fill, a.max, a.ttl)
				break
			}
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%v\t%d/%d/%d\t%d\t%s\n", e.name, len(e.admissions[r.bucket]), n, granted,
			e.sent, e.received, e.dropped, len(e.kills), last)
	}
	w.Flush()
	t.Log("\n" + b.String())
}

// report logs the table and fails t for each check that failed.
func (r *harnessRun) report(t *testing.T, vs []verdict) {
	t.Helper()
	r.logTable(t, vs)
	for _, v := range vs {
		if !v.ok {
			t.Errorf("%s: %s; measured %s", v.name, v.condition, v.measured)
		}
	}
}

// checkSkew: from within two report periods after from until end, the
// Envoy with the larger demand has the larger share: its fill rate is
// higher, or equal with more max_tokens (no assignment and DENY_ALL are a
// share of 0). It measures when that began.
func checkSkew(big, small *emulatedEnvoy, bucket string, period time.Duration, from, end time.Time) verdict {
	larger := func(t time.Time) bool {
		br, bm := big.share(bucket, t)
		sr, sm := small.share(bucket, t)
		return br > sr || (br == sr && bm > sm)
	}
	ts := append(big.times(bucket), small.times(bucket)...)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	var since time.Time
	for _, t := range ts {
		switch {
		case t.Before(from) || t.After(end):
		case !larger(t):
			since = time.Time{}
		case since.IsZero():
			since = t
		}
	}
	measured := "never held to the end"
	if !since.IsZero() {
		measured = fmt.Sprintf("held from %v on (%.2f periods)", since.Sub(from).Round(time.Millisecond), since.Sub(from).Seconds()/period.Seconds())
	}
	return verdict{name: "skew", condition: fmt.Sprintf("from within 2 report periods after %s to %s, %s's (rate, max_tokens) > %s's, compared rate first",
		from.Format("15:04:05.000"), end.Format("15:04:05.000"), big.name, small.name),
		measured: measured, ok: !since.IsZero() && !since.After(from.Add(2*period))}
}

// firstReports is when both Envoys had first reported: nil when one had not.
func firstReports(a, b *emulatedEnvoy) (time.Time, bool) {
	if len(a.sends) == 0 || len(b.sends) == 0 {
		return time.Time{}, false
	}
	return later(a.sends[0], b.sends[0]), true
}

// --- the harness checked against fakes ---

// manualClock is a clock the self-check moves.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// fakeFault is what a fake RLQS server gets wrong.
type fakeFault int

const (
	fakeRight         fakeFault = iota
	fakeForgetsFills            // counts max_tokens in Redis, not the fills it grants with them
	fakeEarlyGiveBack           // gives back what is unused at every report, while the assignment still runs
	fakeKeepsShares             // never gives back what went unused
)

func (f fakeFault) String() string {
	return [...]string{"right", "forgets fills", "gives back early", "keeps shares"}[f]
}

// The fake's one assignment: 5 tokens, 5 more a second, for 2 s: a
// greedy Envoy admits 15 under it.
const (
	fakeMax    = 5
	fakeFill   = 5
	fakeTTL    = 2 * time.Second
	fakeCounts = fakeMax + fakeFill*int64(fakeTTL/time.Second)
)

// fakeRLQS is a FAKE RLQS server for the harness's self-check only: it
// answers every report once; a bucket with no assignment in force gets
// one if the rule's count takes all it lets an Envoy admit (else
// DENY_ALL), and what an expired one left unused (granted minus reported)
// is given back. A stream that ends keeps what it was granted: the fake
// cannot know what was spent after the last report.
type fakeRLQS struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	now     func() time.Time
	limiter *ratelimit.Limiter
	cfg     *rls.Config
	fault   fakeFault
}

// fakeGrant is a stream's assignment of a bucket.
type fakeGrant struct {
	expires                 time.Time
	counted, used, returned int64
	match                   *rls.Match
}

func (f *fakeRLQS) StreamRateLimitQuotas(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	ctx := st.Context()
	grants := map[string]*fakeGrant{}
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		now := f.now()
		resp := &rlqspb.RateLimitQuotaResponse{}
		for _, u := range m.GetBucketQuotaUsages() {
			id := u.GetBucketId().GetBucket()
			match := f.cfg.Match(m.GetDomain(), descriptorOf(id))
			if match == nil {
				continue
			}
			k := bucketKey(id)
			if g := grants[k]; g != nil {
				g.used += int64(u.GetNumRequestsAllowed())
				if now.Before(g.expires) {
					if f.fault == fakeEarlyGiveBack {
						f.giveBack(ctx, g)
					}
					continue
				}
				if f.fault != fakeKeepsShares {
					f.giveBack(ctx, g)
				}
			}
			cost := fakeCounts
			if f.fault == fakeForgetsFills {
				cost = fakeMax
			}
			strategy := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
				MaxTokens: fakeMax, TokensPerFill: wrapperspb.UInt32(fakeFill), FillInterval: durationpb.New(time.Second)}}}
			if res, err := f.limiter.AllowN(ctx, match.ID, match.Rule.Limit, cost); err != nil || !res.Allowed {
				cost = 0
				strategy = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
			}
			grants[k] = &fakeGrant{expires: now.Add(fakeTTL), counted: cost, match: match}
			resp.BucketAction = append(resp.BucketAction, &rlqspb.RateLimitQuotaResponse_BucketAction{
				BucketId: u.GetBucketId(),
				BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
					AssignmentTimeToLive: durationpb.New(fakeTTL), RateLimitStrategy: strategy}}})
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

// giveBack gives back what g has counted and no report has used.
func (f *fakeRLQS) giveBack(ctx context.Context, g *fakeGrant) {
	if n := g.counted - g.used - g.returned; n > 0 {
		if err := f.limiter.GiveBack(ctx, g.match.ID, []ratelimit.Limit{g.match.Rule.Limit}, n); err == nil {
			g.returned += n
		}
	}
}

// selfCheckRate is the fakes' rule: 60 a minute, which three Envoys of 23
// requests a second in all would pass in 3 s if nothing held them.
const selfCheckRate = 60

// runAgainstFake runs the self-check's scenario on a fake with fault, on
// a clock the test moves in steps of 50 ms, and returns the run and its
// verdicts: three Envoys on acme (10, 10 and 3 requests a second); at
// 8 s the second goes idle (its stream stays) and the third is gone; the
// give-back check starts 5 s later (the fake's TTL, two report periods,
// one of slack).
func runAgainstFake(t *testing.T, fault fakeFault) (*harnessRun, []verdict) {
	// a minute's start: the run stays in one of the limit's fixed windows,
	// where a sliding limit is exact and a give-back lands where its grant
	// was counted
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &manualClock{t: base}
	mr := miniredis.RunT(t)
	rc := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	limiter := ratelimit.New(rc, ratelimit.WithClock(clock.now), ratelimit.WithPrefix(rlqsPrefix), ratelimit.WithTimeout(time.Minute))
	t.Cleanup(func() { _ = limiter.Close(context.Background()) })
	cfg, match := rlqsMatch(t, rlqsConfig(selfCheckRate, false))

	client := fakeClient(t, &fakeRLQS{now: clock.now, limiter: limiter, cfg: cfg, fault: fault})

	var envoys []*emulatedEnvoy
	for i, rate := range []float64{10, 10, 3} {
		e := newEnvoy(t, fmt.Sprintf("envoy-%d", i), client, rlqsDomain, time.Second, clock.now)
		e.setDemand(acme, rate)
		envoys = append(envoys, e)
	}
	// the fake's messages take no time on this clock; the live runs' δ is
	// allowed all the same, to show that its term hides no share kept
	run := newHarnessRun(match.Rule.Limit, time.Second, rlqsDelay, func(ctx context.Context) (int64, error) {
		res, err := limiter.Peek(ctx, match.ID, match.Rule.Limit)
		return res.Count, err
	}, envoys...)
	quiet := base.Add(8 * time.Second)
	for now := base; now.Before(base.Add(16 * time.Second)); now = now.Add(50 * time.Millisecond) {
		clock.set(now)
		if now.Equal(quiet) {
			envoys[1].setDemand(acme, 0)
			envoys[2].stop()
		}
		for _, e := range envoys {
			e.tick(now)
		}
		for _, e := range envoys {
			e.settle(t)
		}
		if now.Sub(base)%(250*time.Millisecond) == 0 {
			run.sample(context.Background(), now)
		}
	}
	for _, e := range envoys {
		e.stop()
	}
	return run, run.verdicts(quiet.Add(fakeTTL + 3*time.Second))
}

// The harness catches a server that breaks the bound: against the right
// fake every check passes; against each wrong one, the checks named fail.
func TestHarnessSelfCheck(t *testing.T) {
	for _, tc := range []struct {
		fault fakeFault
		fails []string // the checks that must report it; the others must pass
	}{
		{fakeRight, nil},
		// 5 counted, 15 granted: the Envoys admit three times the limit
		{fakeForgetsFills, []string{"admitted", "could admit", "counted first"}},
		// the count falls below what the Envoys hold and have spent
		{fakeEarlyGiveBack, []string{"counted first"}},
		// the bound holds, but the unused shares stay counted
		{fakeKeepsShares, []string{"given back"}},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			run, vs := runAgainstFake(t, tc.fault)
			run.logTable(t, vs)
			var failed []string
			for _, v := range vs {
				if !v.ok {
					failed = append(failed, v.name)
				}
			}
			if tc.fault == fakeEarlyGiveBack {
				// its other effect, admitting over the limit, depends on
				// who asks when; what it must break is the counted-first check
				require.Contains(t, failed, "counted first")
				return
			}
			require.Equal(t, tc.fails, failed)
			if tc.fault == fakeRight {
				require.Greater(t, run.admitted(time.Time{}, run.start().Add(time.Hour)), selfCheckRate*3/4, "the right fake lets the Envoys use the limit")
			}
		})
	}
}

// The harness's real-clock plumbing (runLive, as the TestRLQS tests run
// it) against the right fake, in-process on the real clock for 5 s: the
// Envoys admit, the count is sampled, and the bound holds. The other
// checks are logged: on the real clock the fake's TTL ends a transit time
// before an Envoy's, which its give-back at that moment does not allow
// for.
func TestHarnessLive(t *testing.T) {
	mr := miniredis.RunT(t)
	rc := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	limiter := ratelimit.New(rc, ratelimit.WithPrefix(rlqsPrefix), ratelimit.WithTimeout(time.Minute))
	t.Cleanup(func() { _ = limiter.Close(context.Background()) })
	cfg, match := rlqsMatch(t, rlqsConfig(selfCheckRate, true))
	client := fakeClient(t, &fakeRLQS{now: time.Now, limiter: limiter, cfg: cfg})
	var envoys []*emulatedEnvoy
	for i, rate := range []float64{10, 10, 3} {
		e := newEnvoy(t, fmt.Sprintf("envoy-%d", i), client, rlqsDomain, time.Second, time.Now)
		e.setDemand(acme, rate)
		envoys = append(envoys, e)
	}
	run := newHarnessRun(match.Rule.Limit, time.Second, rlqsDelay, func(ctx context.Context) (int64, error) {
		res, err := limiter.Peek(ctx, match.ID, match.Rule.Limit)
		return res.Count, err
	}, envoys...)
	_, until := runLive(t, run)
	until(5 * time.Second)
	vs := append(finish(t, run, time.Time{}), enough(run, selfCheckRate/2))
	run.logTable(t, vs)
	for _, v := range vs {
		if v.name != "counted first" {
			require.True(t, v.ok, "%s: %s; measured %s", v.name, v.condition, v.measured)
		}
	}
}

// fakeClient serves fake on a loopback port until t ends and returns a
// client of it.
func fakeClient(t *testing.T, fake *fakeRLQS) rlqspb.RateLimitQuotaServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(g, fake)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return rlqspb.NewRateLimitQuotaServiceClient(conn)
}

// The emulated Envoy applies assignments as Envoy does, quirks included.
func TestHarnessEnvoyQuirks(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return base.Add(d) }
	k := bucketKey(acme)
	tb := func(maxTokens, perFill uint32, fill, ttl time.Duration) *rlqspb.RateLimitQuotaResponse {
		return &rlqspb.RateLimitQuotaResponse{BucketAction: []*rlqspb.RateLimitQuotaResponse_BucketAction{{
			BucketId: &rlqspb.BucketId{Bucket: acme},
			BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
					MaxTokens: maxTokens, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(fill)}}}}}}}}
	}
	newBucket := func() *emulatedEnvoy {
		e := newEnvoy(t, "quirks", nil, rlqsDomain, time.Second, func() time.Time { return base })
		first := e.request(acme, at(0))
		require.Equal(t, uint64(1), first.BucketQuotaUsages[0].NumRequestsDenied, "the first request: no assignment, denied, reported at once")
		require.Equal(t, rlqsDomain, first.Domain)
		return e
	}
	admits := func(e *emulatedEnvoy, now time.Time, n int) int {
		before := len(e.admissions[k])
		for range n {
			e.request(acme, now)
		}
		return len(e.admissions[k]) - before
	}

	t.Run("time_elapsed in whole seconds", func(t *testing.T) {
		e := newBucket()
		require.Zero(t, e.report(at(900 * time.Millisecond)).BucketQuotaUsages[0].TimeElapsed.AsDuration())
		require.Equal(t, time.Second, e.report(at(2500 * time.Millisecond)).BucketQuotaUsages[0].TimeElapsed.AsDuration())
	})
	t.Run("a TTL unset or under 1 s has expired at once", func(t *testing.T) {
		for _, ttl := range []time.Duration{0, 900 * time.Millisecond} {
			e := newBucket()
			e.apply(tb(10, 1, time.Second, ttl), at(0))
			require.Zero(t, admits(e, at(0), 1))
		}
		e := newBucket()
		m := tb(10, 1, time.Second, time.Second)
		m.BucketAction[0].GetQuotaAssignmentAction().AssignmentTimeToLive = nil
		e.apply(m, at(0))
		require.Zero(t, admits(e, at(0), 1))
	})
	t.Run("a token bucket, then expired: denied", func(t *testing.T) {
		e := newBucket()
		e.apply(tb(2, 3, time.Second, 3*time.Second), at(0))
		require.Equal(t, 2, admits(e, at(0), 5), "starts full")
		require.Equal(t, 2, admits(e, at(time.Second), 5), "3 a second, capped at 2")
		require.Equal(t, 1, admits(e, at(1400*time.Millisecond), 5), "3 a second for 0.4 s")
		require.Zero(t, admits(e, at(3*time.Second), 5), "expired: expired_assignment_behavior deny")
	})
	t.Run("identical: the TTL extended, the tokens kept; changed: replaced", func(t *testing.T) {
		e := newBucket()
		e.apply(tb(4, 1, time.Second, 2*time.Second), at(0))
		require.Equal(t, 4, admits(e, at(0), 4))
		e.apply(tb(4, 1, time.Second, 2*time.Second), at(time.Second))
		require.Equal(t, 1, admits(e, at(time.Second), 4), "the tokens kept: one fill since")
		require.Equal(t, 1, admits(e, at(2500*time.Millisecond), 4), "extended: live past 2 s")
		e.apply(tb(3, 1, time.Second, 2*time.Second), at(2500*time.Millisecond))
		require.Equal(t, 3, admits(e, at(2500*time.Millisecond), 4), "changed: a new bucket, full")
	})
	t.Run("fill_interval's seconds are not compared", func(t *testing.T) {
		e := newBucket()
		e.apply(tb(1, 1, time.Second, 10*time.Second), at(0))
		require.Equal(t, 1, admits(e, at(0), 1))
		e.apply(tb(1, 1, 5*time.Second, 10*time.Second), at(0))
		require.Equal(t, 1, admits(e, at(time.Second), 1), "the old rate, 1 a second, kept")
	})
	t.Run("a fill_interval under 1 s divides by 0: unlimited", func(t *testing.T) {
		e := newBucket()
		e.apply(tb(1, 1, 500*time.Millisecond, 5*time.Second), at(0))
		require.Equal(t, 100, admits(e, at(0), 100))
		require.True(t, math.IsInf(e.stateAt(k, at(0)).potential(at(0)), 1))
	})
	t.Run("tokens_per_fill unset is 0", func(t *testing.T) {
		e := newBucket()
		m := tb(2, 0, time.Second, 5*time.Second)
		m.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().TokensPerFill = nil
		e.apply(m, at(0))
		require.Equal(t, 2, admits(e, at(0), 5))
		require.Zero(t, admits(e, at(4*time.Second), 5))
	})
	t.Run("requests_per_time_unit skipped; abandon forgets the bucket", func(t *testing.T) {
		e := newBucket()
		e.apply(&rlqspb.RateLimitQuotaResponse{BucketAction: []*rlqspb.RateLimitQuotaResponse_BucketAction{{
			BucketId: &rlqspb.BucketId{Bucket: acme},
			BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(time.Minute), RateLimitStrategy: &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
					RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 100, TimeUnit: typev3.RateLimitUnit_SECOND}}}}}}}}, at(0))
		require.Zero(t, admits(e, at(0), 1), "still no assignment")
		e.apply(&rlqspb.RateLimitQuotaResponse{BucketAction: []*rlqspb.RateLimitQuotaResponse_BucketAction{{
			BucketId:     &rlqspb.BucketId{Bucket: acme},
			BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}}}, at(0))
		require.NotNil(t, e.request(acme, at(0)), "a new bucket: its first report again")
	})
	t.Run("reach: what a server that last heard at a report must keep", func(t *testing.T) {
		const d = 100 * time.Millisecond
		e := newBucket()
		e.apply(tb(5, 2, time.Second, 3*time.Second), at(0))
		admits(e, at(500*time.Millisecond), 5)
		// made at 1 s: 5 spent of 5 + 2 a second, so at most 2 held from
		// 0.9 s (not a full bucket), and 2 a second to 3.1 s
		require.Equal(t, math.Floor(5+2*0.9-5+2*2.2), e.reach(k, at(time.Second), at(time.Second), d))
		// an extension applied well before the expiry keeps the bucket
		e.apply(tb(5, 2, time.Second, 3*time.Second), at(2*time.Second))
		require.Equal(t, math.Floor(5+2*0.9-5+2*4.2), e.reach(k, at(time.Second), at(2*time.Second), d), "to 5.1 s")
		// one within δ of the expiry may find it expired: a full bucket
		e.apply(tb(5, 2, time.Second, 3*time.Second), at(4950*time.Millisecond))
		require.Equal(t, math.Floor(5+2*0.9-5+2*(4.95+0.1-0.9))+math.Floor(5+2*3.1), e.reach(k, at(time.Second), at(5*time.Second), d))
		// an Envoy gone is no end the server can know of
		e.history[k] = append(e.history[k], bucketState{at: at(6 * time.Second), gone: true})
		require.Equal(t, e.reach(k, at(time.Second), at(5*time.Second), d), e.reach(k, at(time.Second), at(7*time.Second), d))
	})
	t.Run("potential", func(t *testing.T) {
		e := newBucket()
		e.apply(tb(5, 2, time.Second, 3*time.Second), at(0))
		require.Equal(t, 11.0, e.stateAt(k, at(0)).potential(at(0)), "5 + 2 a second for 3 s")
		admits(e, at(time.Second), 5)
		e.record(k, e.buckets[k], at(time.Second))
		require.Equal(t, 4.0, e.stateAt(k, at(time.Second)).potential(at(time.Second)), "5 spent of 5+2, 2 a second for 2 s")
		require.Zero(t, e.stateAt(k, at(3*time.Second)).potential(at(3*time.Second)))
	})
}

// --- the service ---

// rlqsRig is a redis-server, replicas of the service on it serving the
// rlqs domain's rule, and a look at the rule's count.
type rlqsRig struct {
	svcs  []*service
	match *rls.Match
	peek  func(context.Context) (int64, error)
}

// newRLQSRig starts replicas of the service with the RLQS settings and
// env, and skips t while the service does not serve RLQS.
func newRLQSRig(t *testing.T, replicas int, env ...string) *rlqsRig {
	t.Helper()
	redisSrv := testredis.Start(t)
	text := rlqsConfig(rlqsRate, true)
	_, match := rlqsMatch(t, text)
	rig := &rlqsRig{match: match}
	all := append(append([]string{"REDIS_URL=" + redisSrv.Addr, "CACHE_KEY_PREFIX=" + rlqsPrefix}, rlqsEnv...), env...)
	for i := range replicas {
		s := start(t, all...)
		require.NoError(t, os.WriteFile(filepath.Join(s.configDir, "rlqs.yaml"), []byte(text), 0o644))
		c := s.client(t)
		waitFor(t, "the rlqs domain loaded", func() bool {
			r, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: rlqsDomain, Descriptors: []*rlv3.RateLimitDescriptor{desc("tenant", "probe")}})
			return err == nil && r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == rlqsRate
		})
		if i == 0 {
			requireRLQS(t, s)
		}
		rig.svcs = append(rig.svcs, s)
	}
	rc := redis.NewClient(&redis.Options{Addr: redisSrv.Addr})
	t.Cleanup(func() { _ = rc.Close() })
	limiter := ratelimit.New(rc, ratelimit.WithPrefix(rlqsPrefix))
	t.Cleanup(func() { _ = limiter.Close(context.Background()) })
	rig.peek = func(ctx context.Context) (int64, error) {
		res, err := limiter.Peek(ctx, match.ID, match.Rule.Limit)
		return res.Count, err
	}
	return rig
}

// rlqsClient is a client of s's RLQS on a connection of its own, as each
// Envoy has.
func rlqsClient(t *testing.T, s *service) rlqspb.RateLimitQuotaServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return rlqspb.NewRateLimitQuotaServiceClient(conn)
}

// requireRLQS skips t, saying why, when s answers StreamRateLimitQuotas
// with Unimplemented; a server that takes a report and has not answered
// within three report periods serves it.
func requireRLQS(t *testing.T, s *service) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*rlqsPeriod)
	defer cancel()
	st, err := rlqsClient(t, s).StreamRateLimitQuotas(ctx)
	if err == nil {
		_ = st.Send(firstReport(rlqsDomain, map[string]string{"tenant": "probe-rlqs"}))
		_, err = st.Recv() // after a failed Send too: Recv has the status
	}
	switch status.Code(err) {
	case codes.OK, codes.DeadlineExceeded:
	case codes.Unimplemented:
		t.Skipf("ratelimit-rls does not serve RLQS: StreamRateLimitQuotas answered %v", err)
	default:
		t.Fatalf("StreamRateLimitQuotas: %v", err)
	}
}

// firstReport is a report of domain for buckets, each with one request denied
// and 0 s elapsed, as an Envoy's first report of a bucket.
func firstReport(domain string, buckets ...map[string]string) *rlqspb.RateLimitQuotaUsageReports {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: domain}
	for _, b := range buckets {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: b}, TimeElapsed: durationpb.New(0), NumRequestsDenied: 1})
	}
	return m
}

// live runs envoys (each one's service given by svc) on the real clock
// against the rig, and returns the run, its start, and a function that
// waits until d after the start.
func (rig *rlqsRig) live(t *testing.T, envoys []*emulatedEnvoy) (*harnessRun, time.Time, func(time.Duration)) {
	t.Helper()
	run := newHarnessRun(rig.match.Rule.Limit, rlqsPeriod, rlqsDelay, rig.peek, envoys...)
	start, until := runLive(t, run)
	return run, start, until
}

// runLive ticks run's Envoys every 20 ms of the real clock and samples the
// count every 100 ms until t ends; it returns the start, and a function
// that waits until d after it.
func runLive(t *testing.T, run *harnessRun) (time.Time, func(time.Duration)) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	start := time.Now()
	for _, e := range run.envoys {
		e.run(ctx, 20*time.Millisecond)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				look, done := context.WithTimeout(ctx, time.Second)
				run.sample(look, time.Now())
				done()
			}
		}
	}()
	// The server's TTLs and report periods are its own process's wall
	// clock: waiting for them is waiting for time to pass, which no fake
	// clock can shorten here.
	until := func(d time.Duration) { time.Sleep(time.Until(start.Add(d))) }
	return start, until
}

// finish stops the Envoys and the sampling, and returns the verdicts.
func finish(t *testing.T, run *harnessRun, quiet time.Time) []verdict {
	for _, e := range run.envoys {
		e.stop()
	}
	run.mu.Lock() // the sampler may still append once; stop reading under its lock
	defer run.mu.Unlock()
	return run.verdicts(quiet)
}

// enough checks the run let the Envoys use the limit at all: a server
// that grants nothing keeps every bound.
func enough(run *harnessRun, least int) verdict {
	n := run.admitted(time.Time{}, time.Now().Add(time.Hour))
	return verdict{name: "liveness", condition: fmt.Sprintf("admitted in all >= %d", least), measured: fmt.Sprint(n), ok: n >= least}
}

// Three Envoys asking 15 a second each (900 in the 20 s run) of a rule of
// 600 a minute: the bound holds, and the limit is used.
func TestRLQSBound(t *testing.T) {
	rig := newRLQSRig(t, 1)
	var envoys []*emulatedEnvoy
	for i := range 3 {
		e := newEnvoy(t, fmt.Sprintf("envoy-%d", i), rlqsClient(t, rig.svcs[0]), rlqsDomain, rlqsPeriod, time.Now)
		e.setDemand(acme, 15)
		envoys = append(envoys, e)
	}
	run, _, until := rig.live(t, envoys)
	until(20 * time.Second)
	vs := finish(t, run, time.Time{})
	run.report(t, append(vs, enough(run, rlqsRate/4)))
}

// Two Envoys asking 5 a second; at 4 s one of them stops asking (its
// stream stays): within two report periods (sampled for one more) what
// it was granted and can no longer use is back.
func TestRLQSGiveBack(t *testing.T) {
	rig := newRLQSRig(t, 1)
	a := newEnvoy(t, "idle", rlqsClient(t, rig.svcs[0]), rlqsDomain, rlqsPeriod, time.Now)
	b := newEnvoy(t, "busy", rlqsClient(t, rig.svcs[0]), rlqsDomain, rlqsPeriod, time.Now)
	a.setDemand(acme, 5)
	b.setDemand(acme, 5)
	run, start, until := rig.live(t, []*emulatedEnvoy{a, b})
	until(4 * time.Second)
	a.setDemand(acme, 0)
	quiet := start.Add(4*time.Second + 2*rlqsPeriod)
	until(quiet.Sub(start) + rlqsPeriod)
	run.report(t, finish(t, run, quiet))
}

// Envoys asking 18 and 2 a second of one bucket, swapped 7.5 s in: from
// within two report periods after both first reported until the swap,
// and after the swap until the end, the one asking more has the larger
// share. The run starts 0.5 s into one of the strict rule's sub-windows,
// so the swap comes 2 s into the next and the two periods after it end
// before the sub-window does: a unit's end holds every share back until
// the next unit's first assignments (docs/envoy.md, "The bound"), a
// report period or so.
func TestRLQSSkew(t *testing.T) {
	rig := newRLQSRig(t, 1)
	big := newEnvoy(t, "90%", rlqsClient(t, rig.svcs[0]), rlqsDomain, rlqsPeriod, time.Now)
	small := newEnvoy(t, "10%", rlqsClient(t, rig.svcs[0]), rlqsDomain, rlqsPeriod, time.Now)
	sub := (rig.match.Rule.Limit.Window / ratelimit.StrictSubWindows).Milliseconds()
	next := time.UnixMilli((time.Now().UnixMilli()/sub + 1) * sub)
	time.Sleep(time.Until(next.Add(500 * time.Millisecond))) // real time: the service's sub-windows are its clock's
	big.setDemand(acme, 18)
	small.setDemand(acme, 2)
	run, start, until := rig.live(t, []*emulatedEnvoy{big, small})
	until(7500 * time.Millisecond)
	swap := time.Now()
	big.setDemand(acme, 2)
	small.setDemand(acme, 18)
	until(10400 * time.Millisecond)
	vs := finish(t, run, time.Time{})
	k := bucketKey(acme)
	first, ok := firstReports(big, small)
	vs = append(vs, verdict{name: "first reports", condition: "both Envoys reported", measured: fmt.Sprint(ok), ok: ok},
		checkSkew(big, small, k, rlqsPeriod, first, swap),
		checkSkew(small, big, k, rlqsPeriod, swap, start.Add(10400*time.Millisecond-50*time.Millisecond)))
	run.report(t, vs)
}

// Three Envoys asking 4 a second: at 4 s one's stream is killed (it
// lives on, keeps its assignment, and reopens the stream at its next
// report); at 5 s another is gone with its stream. The bound holds
// throughout; within two report periods (sampled for one more) the gone
// one's unused share is back, and the reopened stream is not counted
// twice: the count is no more than what was admitted, what is held, and
// what the ended streams' last reports could not tell.
func TestRLQSStreamKilled(t *testing.T) {
	rig := newRLQSRig(t, 1)
	var envoys []*emulatedEnvoy
	for _, name := range []string{"stays", "killed", "gone"} {
		e := newEnvoy(t, name, rlqsClient(t, rig.svcs[0]), rlqsDomain, rlqsPeriod, time.Now)
		e.setDemand(acme, 4)
		envoys = append(envoys, e)
	}
	run, start, until := rig.live(t, envoys)
	until(4 * time.Second)
	envoys[1].killStream()
	until(5 * time.Second)
	envoys[2].stop()
	quiet := start.Add(5*time.Second + 2*rlqsPeriod)
	until(quiet.Sub(start) + rlqsPeriod)
	vs := finish(t, run, quiet)
	killed := slices.IndexFunc(envoys[1].kills, func(k killRecord) bool { return !k.at.Before(start.Add(4 * time.Second)) })
	reopened := verdict{name: "reopened", condition: "the killed Envoy's stream reopened: an assignment applied after the kill",
		measured: fmt.Sprintf("%d answers in all", envoys[1].received),
		ok:       killed >= 0 && slices.ContainsFunc(envoys[1].assignments, func(a assignmentRecord) bool { return a.at.After(envoys[1].kills[killed].at) })}
	run.report(t, append(vs, reopened))
}

// Two replicas on one redis-server, two Envoys on each, asking 10 a
// second each (800 in the 20 s run) of 600 a minute: the bound holds
// across them.
func TestRLQSReplicas(t *testing.T) {
	rig := newRLQSRig(t, 2)
	var envoys []*emulatedEnvoy
	for i := range 4 {
		e := newEnvoy(t, fmt.Sprintf("envoy-%d@replica-%d", i, i%2), rlqsClient(t, rig.svcs[i%2]), rlqsDomain, rlqsPeriod, time.Now)
		e.setDemand(acme, 10)
		envoys = append(envoys, e)
	}
	run, _, until := rig.live(t, envoys)
	until(20 * time.Second)
	vs := finish(t, run, time.Time{})
	run.report(t, append(vs, enough(run, rlqsRate/4)))
}

// Input no Envoy sends, and input Envoy does send: the codes the contract
// names are asserted, the rest logged; after each the service still
// answers a good stream.
func TestRLQSBadInput(t *testing.T) {
	const maxBuckets = 4
	rig := newRLQSRig(t, 1, fmt.Sprint("RLS_QUOTA_MAX_BUCKETS=", maxBuckets))
	s := rig.svcs[0]
	client := rlqsClient(t, s)
	// exchange sends msgs on a stream and returns what came back within
	// three report periods, and how the stream ended (DeadlineExceeded:
	// it had not).
	exchange := func(msgs ...*rlqspb.RateLimitQuotaUsageReports) ([]*rlqspb.RateLimitQuotaResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*rlqsPeriod)
		defer cancel()
		st, err := client.StreamRateLimitQuotas(ctx)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if st.Send(m) != nil {
				break // the status is Recv's
			}
		}
		var got []*rlqspb.RateLimitQuotaResponse
		for {
			r, err := st.Recv()
			if err != nil {
				return got, err
			}
			got = append(got, r)
		}
	}
	// survives: a new stream's report of a bucket is answered for it
	survives := func(t *testing.T) {
		t.Helper()
		fresh := map[string]string{"tenant": fmt.Sprintf("fresh-%d", time.Now().UnixNano())}
		got, err := exchange(firstReport(rlqsDomain, fresh))
		answered := slices.ContainsFunc(got, func(r *rlqspb.RateLimitQuotaResponse) bool {
			return slices.ContainsFunc(r.GetBucketAction(), func(a *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
				return bucketKey(a.GetBucketId().GetBucket()) == bucketKey(fresh)
			})
		})
		require.True(t, answered, "a good stream after it: %v, %v", got, err)
		require.Nil(t, s.cmd.ProcessState, "the service exited:\n%s", s.log)
	}
	many := make([]map[string]string, maxBuckets+1)
	for i := range many {
		many[i] = map[string]string{"tenant": fmt.Sprint("many-", i)}
	}
	dup := firstReport(rlqsDomain, map[string]string{"tenant": "dup"}, map[string]string{"tenant": "dup"})
	noElapsed := firstReport(rlqsDomain, map[string]string{"tenant": "no-elapsed"})
	noElapsed.BucketQuotaUsages[0].TimeElapsed = nil
	for _, tc := range []struct {
		name string
		msgs []*rlqspb.RateLimitQuotaUsageReports
		want codes.Code // OK: no code asserted, the answer logged
		open bool       // the stream must still be open when the harness leaves it
	}{
		{"first message without a domain", []*rlqspb.RateLimitQuotaUsageReports{firstReport("", acme)}, codes.InvalidArgument, false},
		{"a later message of another domain", []*rlqspb.RateLimitQuotaUsageReports{firstReport(rlqsDomain, acme), firstReport("other", acme)}, codes.InvalidArgument, false},
		{"a bucket of an empty map (INVALID_ARGUMENT or as documented)", []*rlqspb.RateLimitQuotaUsageReports{firstReport(rlqsDomain, map[string]string{})}, codes.OK, false},
		{"more buckets than RLS_QUOTA_MAX_BUCKETS (RESOURCE_EXHAUSTED or as documented)", []*rlqspb.RateLimitQuotaUsageReports{firstReport(rlqsDomain, many...)}, codes.OK, false},
		{"one bucket twice in a message", []*rlqspb.RateLimitQuotaUsageReports{dup}, codes.OK, false},
		{"time_elapsed unset", []*rlqspb.RateLimitQuotaUsageReports{noElapsed}, codes.OK, false},
		// Envoy sends 0 in every bucket's first report and whenever less
		// than a second has passed: it must not end the stream
		{"time_elapsed 0, as Envoy sends it", []*rlqspb.RateLimitQuotaUsageReports{firstReport(rlqsDomain, acme), firstReport(rlqsDomain, acme)}, codes.OK, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := exchange(tc.msgs...)
			t.Logf("answers %v; stream ended with %v", got, err)
			if tc.want != codes.OK {
				require.Equal(t, tc.want, status.Code(err), "%v", err)
			}
			if tc.open {
				require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
			}
			survives(t)
		})
	}
}
