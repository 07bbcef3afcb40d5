// Package rls is a rate limit service for Envoy: it answers
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit from
// envoyproxy/ratelimit's configuration files, deciding with a
// ratelimit.Limiter: sliding (or strict) windows, and the descriptors of a
// request all or nothing, in one script call.
//
//	cfg, err := rls.LoadDir("/srv/runtime_data/current/config", false)
//	...
//	srv := rls.NewServer(limiter, cfg)
//	g := grpc.NewServer()
//	srv.Register(g)
//
// The command ratelimit-rls (cmd/ratelimit-rls) is the service as the
// reference runs: its settings from the environment, under the same names.
// docs/envoy.md says where this service answers as the reference does and
// where it is better on purpose.
package rls

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidingwindow/ratelimit"
)

// Bounds of a request. Gateways send a handful of descriptors of a few
// entries each; a request past these is INVALID_ARGUMENT.
const (
	MaxDescriptors = 64 // descriptors of one request
	MaxEntries     = 64 // entries of one descriptor
	// MaxLimited is how many of a request's descriptors may match a rule
	// that is decided in Redis: what ratelimit.Limiter.AllowMany takes.
	MaxLimited = 16
	// MaxHits is the most hits a descriptor may add: what a count holds.
	MaxHits = 1 << 53
)

// Server answers ShouldRateLimit. It is safe for simultaneous use; its
// configuration may be replaced while it serves (SetConfig).
type Server struct {
	pb.UnimplementedRateLimitServiceServer
	limiter *ratelimit.Limiter
	config  atomic.Pointer[Config]
	opts    options
}

// An Option configures a Server.
type Option func(*options)

type options struct {
	shadow, quotaMode          bool
	dynamicMetadata            bool
	policy                     bool
	limitH, remainingH, resetH string
	metrics                    *Metrics
	nearRatio                  float64
	cutover                    *cutover // WithReferenceCutover
}

// WithShadowMode answers OK to every request, whatever its descriptors'
// statuses say (the reference's SHADOW_MODE): to try a configuration.
func WithShadowMode(on bool) Option { return func(o *options) { o.shadow = on } }

// WithQuotaMode puts every rule in quota mode (the reference's
// QUOTA_MODE): each descriptor keeps its status, and a request is
// OVER_LIMIT only when every descriptor of it that is not unlimited is.
func WithQuotaMode(on bool) Option { return func(o *options) { o.quotaMode = on } }

// WithDynamicMetadata sends, with every answer, dynamic metadata as the
// reference's RESPONSE_DYNAMIC_METADATA does: the domain, the request's
// descriptors (entries as key=value, their own limit and hits_addend),
// its hits_addend when set, and the metadata of the rules of the
// descriptors that passed, merged (the first one's value of a key wins,
// maps merged key by key).
func WithDynamicMetadata(on bool) Option { return func(o *options) { o.dynamicMetadata = on } }

// WithFailurePolicy has the Limiter's failure policy answer when Redis
// cannot (FailOpen: OK, Degraded; FailClosed: UNAVAILABLE; FailLocal: this
// process's share). Without it, a request Redis could not decide is an
// UNAVAILABLE status, as the reference's Redis errors are, and Envoy's
// failure_mode_deny decides.
func WithFailurePolicy(on bool) Option { return func(o *options) { o.policy = on } }

// WithResponseHeaders adds the limit, remaining and reset headers of the
// binding descriptor to every response, under these names (the reference's
// LIMIT_RESPONSE_HEADERS_ENABLED; its names are RateLimit-Limit,
// RateLimit-Remaining and RateLimit-Reset). The binding descriptor is the
// one ratelimit.Binding would pick: of those over their limits the longest
// wait, else the fewest remaining. There is no reset header for a request
// that can never pass, and only the limit header when the failure policy
// decided (Redis could not: the counts are unknown).
func WithResponseHeaders(limit, remaining, reset string) Option {
	return func(o *options) { o.limitH, o.remainingH, o.resetH = limit, remaining, reset }
}

// WithMetrics counts each rule's hits in m, and times each call.
func WithMetrics(m *Metrics) Option { return func(o *options) { o.metrics = m } }

// WithNearLimitRatio sets the share of a limit past which hits count as
// near_limit (the reference's NEAR_LIMIT_RATIO; 0.8 by default).
func WithNearLimitRatio(r float64) Option { return func(o *options) { o.nearRatio = r } }

// NewServer returns a Server deciding with l against cfg (nil: no
// configuration yet; every call is UNAVAILABLE until SetConfig).
func NewServer(l *ratelimit.Limiter, cfg *Config, opts ...Option) *Server {
	s := &Server{limiter: l, opts: options{nearRatio: 0.8}}
	for _, o := range opts {
		o(&s.opts)
	}
	s.config.Store(cfg)
	return s
}

// Register registers s on g as envoy.service.ratelimit.v3.RateLimitService.
func (s *Server) Register(g *grpc.Server) { pb.RegisterRateLimitServiceServer(g, s) }

// SetConfig replaces s's configuration; calls under way finish with the
// one they began with.
func (s *Server) SetConfig(cfg *Config) { s.config.Store(cfg) }

// Config returns s's configuration.
func (s *Server) Config() *Config { return s.config.Load() }

// ShouldRateLimit decides req: see the package doc and docs/envoy.md.
func (s *Server) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.decide(ctx, req)
	if m := s.opts.metrics; m != nil {
		m.call(time.Since(start), err)
	}
	return resp, err
}

// descriptor is one descriptor of a request on its way through decide.
type descriptor struct {
	match    *Match
	hits     int64 // what it adds; 0 looks
	negative bool  // is_negative_hits: gives hits back
	quota    int   // its quota in the AllowMany call, or -1
	// upTo is the hits of its quota up to and including its own: a quota
	// of two descriptors of one id counts them in order, as the
	// reference's two INCRBYs do.
	upTo int64
}

// decide answers req, or returns its status error.
func (s *Server) decide(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if err := check(req); err != nil {
		return nil, err
	}
	cfg := s.config.Load()
	if cfg == nil {
		return nil, status.Error(codes.Unavailable, "rls: no rate limit configuration loaded")
	}
	ds := make([]descriptor, len(req.GetDescriptors()))
	replaced := map[string]bool{}
	for i, d := range req.GetDescriptors() {
		ds[i] = descriptor{match: cfg.Match(req.GetDomain(), d), hits: hits(req, d), negative: d.GetIsNegativeHits(), quota: -1}
		if m := ds[i].match; m != nil {
			for _, name := range m.Rule.Replaces {
				replaced[name] = true
			}
		}
	}
	for i := range ds {
		// an unlimited rule is not replaced: the reference sets it apart first
		if m := ds[i].match; m != nil && !m.Rule.Unlimited && m.Rule.Name != "" && replaced[m.Rule.Name] {
			ds[i].match = nil
		}
	}
	quotas, err := quotasOf(ds, s.opts.quotaMode)
	if err != nil {
		return nil, err
	}
	if err := s.giveBack(ctx, ds); err != nil {
		return nil, err
	}
	// cutover from the reference (cutover.go): its counters too decide
	refOver, err := s.count(ctx, req, ds, quotas)
	if err != nil {
		return nil, err
	}
	results, err := s.allow(ctx, quotas)
	if err != nil {
		return nil, err
	}
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(ds))}
	var binding *pb.RateLimitResponse_DescriptorStatus
	var degraded *Rule // the first descriptor the failure policy decided
	var passed []int   // the descriptors not unlimited and not over, for the metadata
	overRules, quotaRules, overQuotaRules := 0, 0, 0
	for i, d := range ds {
		st := s.status(d, quotas, results)
		refOver.apply(i, d, st) // cutover.go
		resp.Statuses[i] = st
		if d.match == nil || !d.match.Rule.Unlimited {
			// the reference's rule (src/service/ratelimit.go, near line 252):
			// over when a rule not in quota mode is, or every one in it is
			quota := s.opts.quotaMode || d.match != nil && d.match.Rule.QuotaMode
			over := st.Code == pb.RateLimitResponse_OVER_LIMIT
			switch {
			case over && quota:
				overQuotaRules++
			case over:
				overRules++
			case s.opts.dynamicMetadata:
				passed = append(passed, i)
			}
			if quota {
				quotaRules++
			}
		}
		if st.CurrentLimit != nil && !d.negative && (binding == nil || binds(st, binding)) {
			binding = st
		}
		if degraded == nil && d.decidedInRedis() && results[d.quota].Degraded {
			degraded = d.match.Rule
		}
		if m := s.opts.metrics; m != nil && d.match != nil && !d.negative {
			m.hits(req.GetDomain(), d, quotas, results, s.opts.nearRatio)
		}
	}
	if overRules > 0 || quotaRules > 0 && overQuotaRules == quotaRules {
		resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		if overRules == 0 {
			s.unCount(ctx, quotas, results)
		}
	}
	if s.opts.dynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, ds, passed)
	}
	switch {
	case s.opts.limitH == "":
	case binding != nil:
		resp.ResponseHeadersToAdd = []*core.HeaderValue{
			{Key: s.opts.limitH, Value: strconv.FormatUint(uint64(binding.CurrentLimit.GetRequestsPerUnit()), 10)},
			{Key: s.opts.remainingH, Value: strconv.FormatUint(uint64(binding.LimitRemaining), 10)},
		}
		if binding.DurationUntilReset != nil { // none for a request that can never pass
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
				&core.HeaderValue{Key: s.opts.resetH, Value: strconv.FormatInt(ceilSeconds(binding.DurationUntilReset.AsDuration()), 10)})
		}
	case degraded != nil:
		// Redis did not decide: the limit is known, the counts are not
		resp.ResponseHeadersToAdd = []*core.HeaderValue{
			{Key: s.opts.limitH, Value: strconv.FormatUint(uint64(degraded.RequestsPerUnit), 10)},
		}
	}
	if s.opts.shadow && resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		resp.OverallCode = pb.RateLimitResponse_OK
		if m := s.opts.metrics; m != nil {
			m.globalShadow.Inc()
		}
	}
	return resp, nil
}

// unCount gives back what a request refused because every quota_mode
// descriptor of it was over had counted under the limits that are not
// Shadow (quota_mode and shadow_mode ones are, and count as if alone): a
// request over is counted under none of its descriptors. A give-back that
// fails leaves the count higher, the safe side; the Limiter reported it.
func (s *Server) unCount(ctx context.Context, quotas []ratelimit.Quota, results []ratelimit.Result) {
	for i, q := range quotas {
		if r := results[i]; !q.Limit.Shadow && r.Allowed && !r.Degraded {
			_ = s.limiter.Refund(ctx, q.ID, []ratelimit.Result{r}, q.Cost)
		}
	}
}

// binds reports whether status a, rather than b, is the one the headers
// describe, as ratelimit.Binding picks a Result: one over its limit
// before one within it; of two over, the longer wait (none, a request
// that can never pass, is the longest); of two within, the fewer
// remaining; ties go to the first.
func binds(a, b *pb.RateLimitResponse_DescriptorStatus) bool {
	aOver, bOver := a.Code == pb.RateLimitResponse_OVER_LIMIT, b.Code == pb.RateLimitResponse_OVER_LIMIT
	switch {
	case aOver != bOver:
		return aOver
	case aOver:
		return b.DurationUntilReset != nil && (a.DurationUntilReset == nil || a.DurationUntilReset.AsDuration() > b.DurationUntilReset.AsDuration())
	}
	return a.LimitRemaining < b.LimitRemaining
}

// check refuses a request the service cannot decide: INVALID_ARGUMENT,
// saying why.
func check(req *pb.RateLimitRequest) error {
	invalid := func(format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, "rls: "+format, args...)
	}
	if req.GetDomain() == "" {
		return invalid("rate limit domain must not be empty")
	}
	n := len(req.GetDescriptors())
	if n == 0 {
		return invalid("rate limit descriptor list must not be empty")
	}
	if n > MaxDescriptors {
		return invalid("%d descriptors, more than %d", n, MaxDescriptors)
	}
	for i, d := range req.GetDescriptors() {
		if len(d.GetEntries()) > MaxEntries {
			return invalid("descriptor %d has %d entries, more than %d", i, len(d.GetEntries()), MaxEntries)
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > MaxHits {
			return invalid("descriptor %d adds %d hits, more than 2^53", i, h.GetValue())
		}
	}
	return nil
}

// hits returns what d adds, as the reference reads it: its own hits_addend
// when set (0 looks), else the request's, 1 when that is 0.
func hits(req *pb.RateLimitRequest, d *rlv3.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(h.GetValue())
	}
	return int64(max(1, req.GetHitsAddend()))
}

// decidedInRedis reports whether d is decided by the Limiter.
func (d *descriptor) decidedInRedis() bool {
	return d.match != nil && !d.negative && !d.match.Rule.Unlimited && d.match.Rule.Limit.Rate > 0
}

// quotasOf returns the quotas of ds's descriptors decided in Redis, and
// sets each one's quota: two descriptors of one id and window are one
// quota of their hits together, as the reference's two INCRBYs of one key.
// Each descriptor is checked, as the reference checks each INCRBY's
// result, against its own rule with the hits up to its own: the quota's
// rate is the tightest of rate + cost − upTo over its descriptors, a rule
// in shadow mode left out beside one that is not (it decides nothing).
// With soft, every limit is a Shadow one (quota mode everywhere: one
// descriptor over holds back no other).
func quotasOf(ds []descriptor, soft bool) ([]ratelimit.Quota, error) {
	var quotas []ratelimit.Quota
	for i := range ds {
		d := &ds[i]
		if !d.decidedInRedis() {
			continue
		}
		limit := d.match.Rule.Limit
		limit.Shadow = limit.Shadow || soft
		for q := range quotas {
			if o := &quotas[q]; o.ID == d.match.ID && o.Limit.Window == limit.Window && o.Limit.Strict == limit.Strict &&
				o.Limit.Calendar == limit.Calendar && o.Limit.Location.String() == limit.Location.String() {
				d.quota = q
				o.Cost = min(o.Cost+d.hits, MaxHits)
				d.upTo = o.Cost
				o.Limit.Shadow = o.Limit.Shadow && limit.Shadow
				o.Limit.Leased = o.Limit.Leased && limit.Leased
				break
			}
		}
		if d.quota < 0 {
			d.quota, d.upTo = len(quotas), d.hits
			quotas = append(quotas, ratelimit.Quota{ID: d.match.ID, Limit: limit, Cost: d.hits})
		}
	}
	if len(quotas) > MaxLimited {
		return nil, status.Errorf(codes.InvalidArgument, "rls: %d descriptors match rate limits, more than %d", len(quotas), MaxLimited)
	}
	rates := make([]int64, len(quotas)) // 0 until a descriptor sets it
	for i := range ds {
		d := &ds[i]
		if d.quota < 0 {
			continue
		}
		q := &quotas[d.quota]
		if (d.match.Rule.Limit.Shadow || soft) && !q.Limit.Shadow {
			continue
		}
		r := min(d.match.Rule.Limit.Rate+q.Cost-d.upTo, maxRate(q.Limit))
		if rates[d.quota] == 0 || r < rates[d.quota] {
			rates[d.quota] = r
		}
	}
	for q := range quotas {
		quotas[q].Limit.Rate = rates[q]
	}
	return quotas, nil
}

// allow decides quotas: a single one of a cost of 1 or more by AllowN
// (the script's short form, and leases when Leased), any others by
// AllowMany (which does not lease: their Leased is dropped). It returns a status error when the Limiter fails or
// Redis could not decide without WithFailurePolicy.
func (s *Server) allow(ctx context.Context, quotas []ratelimit.Quota) ([]ratelimit.Result, error) {
	if len(quotas) == 0 {
		return nil, nil
	}
	var results []ratelimit.Result
	var err error
	if q := quotas[0]; len(quotas) == 1 && q.Cost > 0 { // AllowN's call is the script's cheapest, and leases
		var r ratelimit.Result
		r, err = s.limiter.AllowN(ctx, q.ID, q.Limit, q.Cost)
		results = []ratelimit.Result{r}
	} else {
		for i := range quotas {
			quotas[i].Limit.Leased = false
		}
		results, err = s.limiter.AllowMany(ctx, quotas)
	}
	if err != nil {
		return nil, statusOf(ctx, err)
	}
	if !s.opts.policy {
		for _, r := range results {
			if r.Degraded {
				return nil, status.Error(codes.Unavailable, "rls: Redis could not decide")
			}
		}
	}
	return results, nil
}

// giveBack gives back the hits of ds's negative descriptors, each under
// its rule, in its current window (ratelimit.Limiter.GiveBack).
func (s *Server) giveBack(ctx context.Context, ds []descriptor) error {
	for _, d := range ds {
		if !d.negative || d.match == nil || d.match.Rule.Unlimited || d.match.Rule.Limit.Rate == 0 || d.hits == 0 {
			continue
		}
		limit := d.match.Rule.Limit
		limit.Leased = false
		if err := s.limiter.GiveBack(ctx, d.match.ID, []ratelimit.Limit{limit}, d.hits); err != nil {
			if s.opts.policy && !errors.Is(err, ctx.Err()) {
				continue // a give-back lost in an outage leaves the count higher: the safe side; the Limiter reported it
			}
			return statusOf(ctx, err)
		}
	}
	return nil
}

// statusOf returns the gRPC status of a Limiter's error: the caller's own
// for its ctx, INVALID_ARGUMENT for its input, UNAVAILABLE for Redis.
func statusOf(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, ratelimit.ErrInvalidCost), errors.Is(err, ratelimit.ErrInvalidLimit), errors.Is(err, ratelimit.ErrInvalidID):
		return status.Error(codes.InvalidArgument, "rls: "+err.Error())
	}
	return status.Error(codes.Unavailable, "rls: "+err.Error())
}

// status returns the status of descriptor d, given the results of the
// quotas decided in Redis: OK with no limit for a descriptor that matched
// nothing; OK with the most remaining for an unlimited one; otherwise
// whether its own limit admits the request, its limit, what remains (0
// when over) and the wait: until the request would pass when over, until
// the count is 0 when not. A request that can never pass (a rule of 0, or
// more hits than the rate) has no wait: no time a client would retry at.
// A descriptor the failure policy decided (Redis could not) has its code
// only: no limit, remaining or wait, which would be made up.
func (s *Server) status(d descriptor, quotas []ratelimit.Quota, results []ratelimit.Result) *pb.RateLimitResponse_DescriptorStatus {
	if d.match == nil {
		return &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	}
	r := d.match.Rule
	if r.Unlimited {
		return &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
	}
	st := &pb.RateLimitResponse_DescriptorStatus{
		Code:         pb.RateLimitResponse_OK,
		CurrentLimit: &pb.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: r.Unit},
	}
	switch {
	case d.negative:
		st.DurationUntilReset = durationpb.New(0)
	case r.Limit.Rate == 0: // a rule of 0 requests: never
		if d.hits > 0 && !r.Shadow {
			st.Code = pb.RateLimitResponse_OVER_LIMIT
		}
	case results[d.quota].Degraded:
		if _, isOver, _ := d.view(quotas, results); isOver && !r.Shadow {
			st.Code = pb.RateLimitResponse_OVER_LIMIT
		}
		st.CurrentLimit = nil
	default:
		res := results[d.quota]
		counted, isOver, remaining := d.view(quotas, results)
		st.LimitRemaining = uint32(min(remaining, math.MaxUint32))
		// within its limit: until its remaining grows, as httplimit's t
		// says (Result.RefillAfter; ResetAfter for a Result that counted
		// nothing); never a wait longer than a client must
		wait := res.ResetAfter
		if refill := res.RefillAfter(); refill > 0 && !isOver {
			wait = refill
		}
		if isOver {
			// 0 remaining, as the reference says of a descriptor over its
			// limit, even where a request of fewer hits would fit; a shadow
			// rule over beside an allowed one waits for its count to go
			st.Code, st.LimitRemaining = pb.RateLimitResponse_OVER_LIMIT, 0
			if !counted {
				wait = res.RetryAfter
			}
			if r.Shadow {
				st.Code = pb.RateLimitResponse_OK
			}
			if d.upTo > r.Limit.Rate { // more hits than the rule ever admits
				wait = ratelimit.InfDuration
			}
		}
		if wait != ratelimit.InfDuration {
			st.DurationUntilReset = durationpb.New(wait)
		}
	}
	return st
}

// view returns what the Result of d's quota says of d: whether its hits
// were counted, whether its own rule did not admit them (its quota's count
// before the request, with the hits of its quota up to its own, over its
// rule's rate), and what remains of its rule after its hits, or before
// them when they were not counted (0 when over). A Result the failure
// policy made is taken as it is: its counts are this process's.
func (d *descriptor) view(quotas []ratelimit.Quota, results []ratelimit.Result) (counted, over bool, remaining int64) {
	res := results[d.quota]
	if res.Degraded {
		counted = res.Allowed && !res.Shadowed
		over = res.Shadowed || !res.Allowed && res.RetryAfter > 0
		if over {
			return counted, true, 0
		}
		return counted, false, res.Remaining
	}
	rate := d.match.Rule.Limit.Rate
	// a Shadow quota is counted when it alone admits its cost, whatever the
	// decision
	if !res.Shadowed && (res.Allowed || res.Limit.Shadow) {
		// over only for a shadow rule beside one that is not, which the
		// quota's rate leaves out (quotasOf)
		after := res.Count - quotas[d.quota].Cost + d.upTo
		return true, after > rate, max(0, rate-after)
	}
	if res.Count+d.upTo > rate {
		return false, true, 0
	}
	return false, false, max(0, rate-res.Count)
}

// ceilSeconds returns d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
