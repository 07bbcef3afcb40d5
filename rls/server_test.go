package rls

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit"
)

// epoch starts a second, a minute and an hour.
var epoch = time.UnixMilli(1_700_002_800_000)

const testConfig = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100, name: tenant}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 1000, replaces: [{name: tenant}]}
  - key: health
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// fixture is a Server on miniredis with a clock that stands still.
type fixture struct {
	s   *Server
	mr  *miniredis.Miniredis
	now time.Time
}

func newFixture(t *testing.T, opts ...Option) *fixture {
	f := &fixture{mr: miniredis.RunT(t), now: epoch.Add(30 * time.Second)}
	c := redis.NewClient(&redis.Options{Addr: f.mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	l := ratelimit.New(c, ratelimit.WithClock(func() time.Time { return f.now }), ratelimit.WithTimeout(time.Minute))
	f.s = NewServer(l, load(t, testConfig), opts...)
	return f
}

// ask sends one request of the descriptors, each given as key, value.
func (f *fixture) ask(t *testing.T, hits uint32, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	resp, err := f.s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "api", Descriptors: ds, HitsAddend: hits})
	require.NoError(t, err)
	require.Len(t, resp.Statuses, len(ds))
	return resp
}

func TestOverLimit(t *testing.T) {
	f := newFixture(t)
	for want := uint32(1); want <= 2; want++ {
		r := f.ask(t, 0, desc("user", "ann"))
		require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
		st := r.Statuses[0]
		require.Equal(t, pb.RateLimitResponse_OK, st.Code)
		require.Equal(t, &pb.RateLimitResponse_RateLimit{RequestsPerUnit: 2, Unit: pb.RateLimitResponse_RateLimit_MINUTE}, st.CurrentLimit)
		require.Equal(t, 2-want, st.LimitRemaining)
	}
	r := f.ask(t, 0, desc("user", "ann"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[0].Code)
	require.Zero(t, r.Statuses[0].LimitRemaining)
	// 2 in this minute, 30 s in: a request passes once the window's end
	// weighs them below 2, a ms after it.
	require.Equal(t, 30*time.Second+time.Millisecond, r.Statuses[0].DurationUntilReset.AsDuration())
	require.Equal(t, pb.RateLimitResponse_OK, f.ask(t, 0, desc("user", "bob")).OverallCode, "another user")
}

// One descriptor over its limit: the request is counted under none.
func TestAllOrNothing(t *testing.T) {
	f := newFixture(t)
	f.ask(t, 2, desc("user", "ann"))
	r := f.ask(t, 0, desc("tenant", "acme"), desc("user", "ann"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[0].Code, "the tenant's own limit admits it")
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[1].Code)
	require.Equal(t, uint32(100), r.Statuses[0].LimitRemaining, "and counted nothing")
}

func TestUnmatchedUnlimitedZero(t *testing.T) {
	f := newFixture(t)
	r := f.ask(t, 0, desc("nothing", "x"), desc("health", "ok"), desc("blocked", "x"))
	require.Equal(t, &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}, r.Statuses[0])
	require.Equal(t, &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}, r.Statuses[1])
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[2].Code, "0 requests per second")
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Empty(t, f.mr.Keys(), "none of these asks Redis")
}

func TestReplaces(t *testing.T) {
	f := newFixture(t)
	r := f.ask(t, 0, desc("tenant", "acme"), desc("vip", "yes"))
	require.Equal(t, &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}, r.Statuses[0], "replaced: no limit")
	require.Equal(t, uint32(999), r.Statuses[1].LimitRemaining)
}

func TestShadowRule(t *testing.T) {
	f := newFixture(t)
	f.ask(t, 0, desc("trial", "t"))
	r := f.ask(t, 0, desc("trial", "t"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[0].Code)
	require.Zero(t, r.Statuses[0].LimitRemaining)
}

func TestGlobalShadowMode(t *testing.T) {
	f := newFixture(t, WithShadowMode(true))
	f.ask(t, 2, desc("user", "ann"))
	r := f.ask(t, 0, desc("user", "ann"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode, "the overall code lets it through")
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[0].Code, "the status tells the truth")
}

func TestHitsAddend(t *testing.T) {
	f := newFixture(t)
	r := f.ask(t, 2, desc("tenant", "acme"))
	require.Equal(t, uint32(98), r.Statuses[0].LimitRemaining, "the request's hits")
	d := desc("tenant", "acme")
	d.HitsAddend = wrapperspb.UInt64(5)
	r = f.ask(t, 2, d)
	require.Equal(t, uint32(93), r.Statuses[0].LimitRemaining, "the descriptor's own")
	look := desc("user", "ann")
	look.HitsAddend = wrapperspb.UInt64(0)
	r = f.ask(t, 0, look, look)
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Equal(t, uint32(2), r.Statuses[0].LimitRemaining, "0 counts nothing")
	back := desc("tenant", "acme")
	back.HitsAddend, back.IsNegativeHits = wrapperspb.UInt64(4), true
	f.ask(t, 0, back)
	r = f.ask(t, 0, desc("tenant", "acme"))
	require.Equal(t, uint32(96), r.Statuses[0].LimitRemaining, "4 given back, 1 counted")
}

func TestResponseHeaders(t *testing.T) {
	f := newFixture(t, WithResponseHeaders("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"))
	r := f.ask(t, 0, desc("tenant", "acme"), desc("user", "ann"))
	got := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	require.Equal(t, map[string]string{"RateLimit-Limit": "2", "RateLimit-Remaining": "1", "RateLimit-Reset": "31"}, got,
		"the descriptor nearest its limit: its 1, 30 s into the minute, weighs below 1 a ms into the next")
}

func TestInvalidRequests(t *testing.T) {
	f := newFixture(t)
	many := make([]*rlv3.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("user", "ann")
	}
	long := desc()
	for range MaxEntries + 1 {
		long.Entries = append(long.Entries, &rlv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	huge := desc("tenant", "acme")
	huge.HitsAddend = wrapperspb.UInt64(1<<53 + 1)
	limited := make([]*rlv3.RateLimitDescriptor, MaxLimited+1)
	for i := range limited {
		limited[i] = desc("user", strings.Repeat("u", i+1))
	}
	for name, req := range map[string]*pb.RateLimitRequest{
		"no domain":                    {Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann")}},
		"no descriptors":               {Domain: "api"},
		"too many":                     {Domain: "api", Descriptors: many},
		"too many entries":             {Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{long}},
		"hits past 2^53":               {Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{huge}},
		"too many limited":             {Domain: "api", Descriptors: limited},
		"an id of any length":          nil,
		"no entries, a nil descriptor": nil,
	} {
		t.Run(name, func(t *testing.T) {
			if req == nil {
				r := f.ask(t, 0, desc("user", strings.Repeat("\x00é", 100_000)), &rlv3.RateLimitDescriptor{}, nil)
				require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode, "matching nothing, as in the reference")
				return
			}
			_, err := f.s.ShouldRateLimit(context.Background(), req)
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		})
	}
}

func TestRedisDown(t *testing.T) {
	for _, policy := range []bool{false, true} {
		f := newFixture(t, WithFailurePolicy(policy))
		f.mr.Close()
		resp, err := f.s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann")}})
		if !policy {
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, pb.RateLimitResponse_OK, resp.OverallCode, "FailOpen, the Limiter's default")
	}
}

func TestNoConfig(t *testing.T) {
	f := newFixture(t)
	f.s.SetConfig(nil)
	_, err := f.s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann")}})
	require.Equal(t, codes.Unavailable, status.Code(err))
}

func TestCallerGone(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := f.s.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann")}})
	require.Equal(t, codes.Canceled, status.Code(err))
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	f := newFixture(t, WithMetrics(m))
	for range 3 {
		f.ask(t, 0, desc("user", "ann"))
	}
	labels := []string{"api", "user", ""}
	require.Equal(t, 3.0, testutil.ToFloat64(m.totalHits.WithLabelValues(labels...)))
	require.Equal(t, 2.0, testutil.ToFloat64(m.withinLimit.WithLabelValues(labels...)))
	require.Equal(t, 1.0, testutil.ToFloat64(m.overLimit.WithLabelValues(labels...)))
	require.Equal(t, 1.0, testutil.ToFloat64(m.nearLimit.WithLabelValues(labels...)), "the second hit passed 80% of 2")
	_, _ = f.s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{})
	require.Equal(t, 1.0, testutil.ToFloat64(m.errors.WithLabelValues("InvalidArgument")))
	families, err := reg.Gather()
	require.NoError(t, err)
	calls := uint64(0)
	for _, mf := range families {
		if mf.GetName() == "ratelimit_service_response_time_seconds" {
			calls = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	require.Equal(t, uint64(4), calls, "every call is timed")
}

// FuzzShouldRateLimit: no request makes the server panic, and every answer
// is a status error or a response with a status per descriptor.
func FuzzShouldRateLimit(f *testing.F) {
	f.Add("api", "user", "ann", "tenant", "acme", uint32(1), uint64(0), false)
	f.Add("api", "vip", "", "blocked", "x", uint32(0), uint64(1<<60), true)
	f.Add("", "", "", "", "", uint32(math.MaxUint32), uint64(0), false)
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, hits uint32, own uint64, negative bool) {
		fx := newFixture(t)
		d2 := desc(k2, v2)
		d2.HitsAddend, d2.IsNegativeHits = wrapperspb.UInt64(own), negative
		req := &pb.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{desc(k1, v1), d2}}
		resp, err := fx.s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			require.Contains(t, []codes.Code{codes.InvalidArgument, codes.Unavailable}, status.Code(err), "%v", err)
			return
		}
		require.Len(t, resp.Statuses, 2)
	})
}

// A shadow rule counts on its own beside a descriptor that refuses the
// request, and its status says what remains after its hits.
func TestShadowRuleBesideRefusal(t *testing.T) {
	f := newFixture(t)
	f.ask(t, 2, desc("user", "ann"))
	r := f.ask(t, 0, desc("user", "ann"), desc("trial", "t"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[1].Code)
	require.Zero(t, r.Statuses[1].LimitRemaining, "1 of 1 counted")
	require.Positive(t, r.Statuses[1].DurationUntilReset.AsDuration(), "until that 1 is gone")
}

// A descriptor's own limit (Envoy's override) beside the configured rule
// of the same entries: one count, each status against its own rule, as the
// reference's two INCRBYs of one key.
func TestOverrideBesideRule(t *testing.T) {
	f := newFixture(t)
	over := desc("tenant", "acme")
	over.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 2} // a minute
	r := f.ask(t, 0, desc("tenant", "acme"), over)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode, "2 hits on one count, over the override's 1")
	require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[0].Code)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[1].Code)
	r = f.ask(t, 0, over)
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode, "the refused request counted nothing")
}

func TestReplacedUnlimited(t *testing.T) {
	f := newFixture(t)
	f.s.SetConfig(load(t, `
domain: api
descriptors:
  - key: open
    rate_limit: {unlimited: true, name: open}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 10, replaces: [{name: open}]}
`))
	r := f.ask(t, 0, desc("open", "x"), desc("vip", "y"))
	require.Equal(t, uint32(math.MaxUint32), r.Statuses[0].LimitRemaining, "an unlimited rule is not replaced, as in the reference")
}

// Under FailLocal, the statuses say what this process's share decided.
func TestFailLocalStatuses(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l := ratelimit.New(c, ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithReplicas(4),
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	s := NewServer(l, load(t, testConfig), WithFailurePolicy(true))
	mr.Close()
	codes := map[pb.RateLimitResponse_Code]int{}
	for range 40 {
		r, err := s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("tenant", "acme")}})
		require.NoError(t, err)
		codes[r.OverallCode]++
	}
	require.Equal(t, map[pb.RateLimitResponse_Code]int{pb.RateLimitResponse_OK: 25, pb.RateLimitResponse_OVER_LIMIT: 15}, codes, "a share of 100/4")
}

func TestMetricLabels(t *testing.T) {
	require.Equal(t, []string{"edge", "remote_address_10_0_0_1", "path_x"}, metricLabels("edge", "edge.remote_address_10.0.0.1.path_x.more"))
	require.Equal(t, []string{"d", "k_a_b_c", ""}, metricLabels("d", "d.k_a:b|c"))
}

// The same entries twice in a request, once matching a rule in shadow mode
// and once with their own limit (Envoy's override): the override limits
// the request, the shadow rule beside it decides nothing. (The two were
// once one quota at the shadow rule's rate, which 2 hits never fit:
// nothing was counted and every request passed.)
func TestShadowRuleBesideOverride(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	f := newFixture(t, WithMetrics(m))
	over := desc("trial", "t")
	over.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 2} // a minute
	var codes []pb.RateLimitResponse_Code
	for range 4 {
		r := f.ask(t, 0, desc("trial", "t"), over)
		codes = append(codes, r.OverallCode)
		require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[0].Code, "a shadow rule's status is OK")
		require.Equal(t, r.OverallCode, r.Statuses[1].Code)
	}
	require.Equal(t, []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK,
		pb.RateLimitResponse_OVER_LIMIT, pb.RateLimitResponse_OVER_LIMIT}, codes, "2 hits a request against 5")
	// the shadow rule of 1: within for the first request's hit (1 of 1),
	// over from the second (3 of 1), counted or not
	labels := []string{"api", "trial", ""}
	require.Equal(t, 1.0, testutil.ToFloat64(m.withinLimit.WithLabelValues(labels...)))
	require.Equal(t, 3.0, testutil.ToFloat64(m.shadowMode.WithLabelValues(labels...)))
}

// Two rules of one count, each checked with the hits up to its own, as
// the reference checks each INCRBY's result: the first descriptor's rule
// of 1 admits the request's first hit, not its second.
func TestRulesInOrder(t *testing.T) {
	f := newFixture(t)
	f.s.SetConfig(load(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`))
	over := desc("user", "ann")
	over.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 2}
	r := f.ask(t, 0, desc("user", "ann"), over)
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode, "1 of 1, then 2 of 5")
	r = f.ask(t, 0, desc("user", "ann"), over)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[0].Code, "3 of 1")
	require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[1].Code, "4 of 5")
}

// headers returns the response headers of r by name.
func headers(r *pb.RateLimitResponse) map[string]string {
	got := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	return got
}

// No wait that invites useless retries: a request that can never pass (a
// rule of 0 requests, or more hits than the rate) has no reset; a request
// over a per-second and an hourly limit reports the hourly one, the wait
// that binds (ratelimit.Binding).
func TestWaits(t *testing.T) {
	f := newFixture(t, WithResponseHeaders("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"))
	f.s.SetConfig(load(t, `
domain: api
descriptors:
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: sec
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 1}
`))
	r := f.ask(t, 0, desc("blocked", "x"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Nil(t, r.Statuses[0].DurationUntilReset, "a rule of 0: never")
	require.Equal(t, map[string]string{"RateLimit-Limit": "0", "RateLimit-Remaining": "0"}, headers(r))

	r = f.ask(t, 5, desc("sec", "x"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Nil(t, r.Statuses[0].DurationUntilReset, "5 hits against 1 a second: never")
	require.NotContains(t, headers(r), "RateLimit-Reset")

	f.ask(t, 0, desc("sec", "y"), desc("hour", "y"))
	r = f.ask(t, 0, desc("sec", "y"), desc("hour", "y"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[0].Code)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[1].Code)
	require.Equal(t, map[string]string{"RateLimit-Limit": "1", "RateLimit-Remaining": "0", "RateLimit-Reset": "3571"}, headers(r),
		"the hour's wait (to its end, 30 s in) binds, not the second's")
}

// Redis down, the failure policy decides: no made-up numbers. A status
// has its code only (no limit, remaining or reset, from which Envoy would
// make its headers), and the response headers say the limit alone, as the
// library's middlewares do.
func TestDegradedSaysNoCounts(t *testing.T) {
	f := newFixture(t, WithFailurePolicy(true), WithResponseHeaders("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"))
	f.mr.Close()
	r := f.ask(t, 0, desc("tenant", "acme"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode, "FailOpen, the Limiter's default")
	require.Equal(t, &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}, r.Statuses[0])
	require.Equal(t, map[string]string{"RateLimit-Limit": "100"}, headers(r))
}

// quotaConfig has two rules in quota mode and one that is not.
const quotaConfig = `
domain: api
descriptors:
  - key: tokens
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: backup
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`

// quota_mode as the reference has it since PR #1059 (March 2026; its
// January build answered OK to every quota over, and TestPeerMigration
// shows that build): a quota_mode descriptor keeps its status, and the
// request is over when every quota_mode descriptor of it is, or a
// descriptor that is not (src/service/ratelimit.go at f2fb157, lines
// 232-255).
func TestQuotaModeDecision(t *testing.T) {
	f := newFixture(t)
	f.s.SetConfig(load(t, quotaConfig))
	r := f.ask(t, 0, desc("tokens", "t"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Zero(t, r.Statuses[0].LimitRemaining, "counted: 1 of 1")
	r = f.ask(t, 0, desc("tokens", "t"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[0].Code, "its own status says over")
	require.NotNil(t, r.Statuses[0].CurrentLimit)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode, "its only quota is over")

	// one quota of two over: the other serves; it is counted
	r = f.ask(t, 0, desc("tokens", "t"), desc("backup", "b"))
	require.Equal(t, []pb.RateLimitResponse_Code{pb.RateLimitResponse_OVER_LIMIT, pb.RateLimitResponse_OK}, codesOf(r))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Equal(t, uint32(2), r.Statuses[1].LimitRemaining, "the backup quota counted it")

	// a rule not in quota mode over decides, whatever the quotas say
	f.ask(t, 2, desc("user", "ann"))
	r = f.ask(t, 0, desc("backup", "b"), desc("user", "ann"))
	require.Equal(t, []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT}, codesOf(r))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)

	// both quotas over (backup counted 2 of its 3: a quota descriptor
	// is counted when its own rule admits it, as the reference counts it)
	f.ask(t, 1, desc("backup", "b"))
	r = f.ask(t, 0, desc("tokens", "t"), desc("backup", "b"))
	require.Equal(t, []pb.RateLimitResponse_Code{pb.RateLimitResponse_OVER_LIMIT, pb.RateLimitResponse_OVER_LIMIT}, codesOf(r))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)

	// refused as its quotas are over, a request is counted under none of
	// its descriptors: the user's rule, which admitted it, gives it back
	r = f.ask(t, 0, desc("tokens", "t"), desc("user", "bob"))
	require.Equal(t, []pb.RateLimitResponse_Code{pb.RateLimitResponse_OVER_LIMIT, pb.RateLimitResponse_OK}, codesOf(r))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	r = f.ask(t, 0, desc("user", "bob"))
	require.Equal(t, uint32(1), r.Statuses[0].LimitRemaining, "1 of 2 counted: this one; the refused one given back")
}

// QUOTA_MODE puts every rule in quota mode: the request is over only when
// every descriptor not unlimited is, one that matches no rule passing.
func TestGlobalQuotaMode(t *testing.T) {
	f := newFixture(t, WithQuotaMode(true))
	f.ask(t, 2, desc("user", "ann"))
	r := f.ask(t, 0, desc("user", "ann"), desc("tenant", "acme"))
	require.Equal(t, []pb.RateLimitResponse_Code{pb.RateLimitResponse_OVER_LIMIT, pb.RateLimitResponse_OK}, codesOf(r))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Equal(t, uint32(99), r.Statuses[1].LimitRemaining, "the tenant counted it, the user over held nothing back")
	r = f.ask(t, 0, desc("user", "ann"), desc("nothing", "x"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode, "a descriptor of no rule passes")
	r = f.ask(t, 0, desc("user", "ann"), desc("health", "ok"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode, "an unlimited one is not a quota")
}

// codesOf returns the statuses' codes of r.
func codesOf(r *pb.RateLimitResponse) []pb.RateLimitResponse_Code {
	var out []pb.RateLimitResponse_Code
	for _, st := range r.Statuses {
		out = append(out, st.Code)
	}
	return out
}

// metadataConfig has rules with metadata, one nested map to merge.
const metadataConfig = `
domain: ai
descriptors:
  - key: model
    value: gpt-*
    quota_mode: true
    metadata: {backend: primary, route: {pool: a, weight: 1}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tier
    metadata: {backend: secondary, route: {zone: eu, pool: b}, tags: [x, 2]}
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// RESPONSE_DYNAMIC_METADATA, as the reference's ratelimitToMetadata
// (src/service/ratelimit.go at f2fb157, lines 277-360): the domain, the
// descriptors, hitsAddend when set, and the metadata of the descriptors
// that passed, merged, the first one's value winning.
func TestDynamicMetadata(t *testing.T) {
	f := newFixture(t, WithDynamicMetadata(true))
	f.s.SetConfig(load(t, metadataConfig))
	own := desc("tier", "gold")
	own.HitsAddend = wrapperspb.UInt64(2)
	call := func(hits uint32, want pb.RateLimitResponse_Code) map[string]any {
		resp, err := f.s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "ai", HitsAddend: hits,
			Descriptors: []*rlv3.RateLimitDescriptor{desc("model", "gpt-5"), own, desc("other", "x")}})
		require.NoError(t, err)
		require.Equal(t, want, resp.OverallCode)
		return resp.DynamicMetadata.AsMap()
	}
	descriptors := []any{
		map[string]any{"entries": []any{"model=gpt-5"}},
		map[string]any{"entries": []any{"tier=gold"}, "hitsAddend": 2.0},
		map[string]any{"entries": []any{"other=x"}},
	}
	require.Equal(t, map[string]any{
		"domain": "ai", "descriptors": descriptors, "hitsAddend": 1.0,
		"metadata": map[string]any{"backend": "primary", "route": map[string]any{"pool": "a", "weight": 1.0, "zone": "eu"}, "tags": []any{"x", 2.0}},
	}, call(1, pb.RateLimitResponse_OK))
	// the model's quota is over now (and so is the request, its only
	// quota over): its metadata is left out, the others' sent
	require.Equal(t, map[string]any{
		"domain": "ai", "descriptors": descriptors,
		"metadata": map[string]any{"backend": "secondary", "route": map[string]any{"pool": "b", "zone": "eu"}, "tags": []any{"x", 2.0}},
	}, call(0, pb.RateLimitResponse_OVER_LIMIT))
	require.Equal(t, "primary", f.s.Config().Match("ai", desc("model", "gpt-4")).Rule.Metadata.AsMap()["backend"], "the rules' metadata unchanged")

	f = newFixture(t)
	f.s.SetConfig(load(t, metadataConfig))
	require.Nil(t, f.ask(t, 0, desc("tier", "gold")).DynamicMetadata, "off by default, as in the reference")
}
