// The quota service: envoy.service.rate_limit_quota.v3, Envoy's
// rate_limit_quota filter deciding locally from token buckets this service
// assigns, every token of which is counted in Redis before Envoy may spend
// it (docs/envoy.md, "Quota service (RLQS)").

package rls

import (
	"cmp"
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqs "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit"
)

// MaxBucketIDBytes bounds a bucket id: its keys and values together. A
// report of a bucket past it, or of more than MaxEntries entries, or of
// none, is INVALID_ARGUMENT.
const MaxBucketIDBytes = 1024

// QuotaServer answers StreamRateLimitQuotas: each bucket an Envoy reports
// gets a token bucket, whose every token is counted in Redis under the
// bucket's rule before Envoy may spend it; what the next reports show
// unused is given back. It is safe for simultaneous use; it reads its
// configuration from the function it was given at every report.
type QuotaServer struct {
	rlqs.UnimplementedRateLimitQuotaServiceServer
	limiter *ratelimit.Limiter
	config  func() *Config
	opts    quotaOptions

	mu      sync.Mutex
	closing bool
	quit    chan struct{}
	streams sync.WaitGroup
	groups  map[string]*shareGroup
}

// quotaTick is how often a stream looks for buckets to abandon or renew.
const quotaTick = 250 * time.Millisecond

// A QuotaOption configures a QuotaServer.
type QuotaOption func(*quotaOptions)

type quotaOptions struct {
	ttl, fill, report, abandon time.Duration
	// delay bounds how long a message takes between Envoy and the service,
	// either way: an assignment sent at t reaches Envoy by t+delay, and a
	// report received at t was made after t-delay. The bound assumes it.
	delay      time.Duration
	maxBuckets int
	metrics    *QuotaMetrics
	// ticker makes the stream's ticks: tests drive them by hand
	ticker func() (<-chan time.Time, func())
}

// WithQuotaTTL sets how long an assignment lasts, in whole seconds (10 s
// by default): no assignment lasts past the end of the window its tokens
// were counted in.
func WithQuotaTTL(d time.Duration) QuotaOption { return func(o *quotaOptions) { o.ttl = d } }

// WithQuotaFillInterval sets a token bucket's fill interval, in whole
// seconds (1 s by default).
func WithQuotaFillInterval(d time.Duration) QuotaOption {
	return func(o *quotaOptions) { o.fill = d }
}

// WithQuotaReportInterval sets the report period the service plans for
// (5 s by default, what Envoy's filter sends whatever its configuration
// says): a bucket is renewed without a report only while one came within
// two periods.
func WithQuotaReportInterval(d time.Duration) QuotaOption {
	return func(o *quotaOptions) { o.report = d }
}

// WithQuotaAbandonAfter sets how long a bucket may go unreported before it
// is abandoned (30 s by default): Envoy gets its abandon_action, and the
// tokens it cannot have spent are given back.
func WithQuotaAbandonAfter(d time.Duration) QuotaOption {
	return func(o *quotaOptions) { o.abandon = d }
}

// WithQuotaMessageDelay sets the longest a message takes between Envoy and
// the service, either way (1 s by default): the bound assumes no
// assignment reaches Envoy later, and no report was made earlier, than
// that. A shorter one gives back sooner what Envoy left unused; one Envoy
// may exceed lets it spend tokens not counted. It is at least 1 ms and at
// most 1 s.
func WithQuotaMessageDelay(d time.Duration) QuotaOption {
	return func(o *quotaOptions) { o.delay = d }
}

// WithQuotaMaxBuckets bounds the buckets of one stream (1000 by default): a
// report of one more ends the stream with RESOURCE_EXHAUSTED.
func WithQuotaMaxBuckets(n int) QuotaOption { return func(o *quotaOptions) { o.maxBuckets = n } }

// WithQuotaMetrics counts streams, buckets, reports, assignments and tokens
// in m.
func WithQuotaMetrics(m *QuotaMetrics) QuotaOption { return func(o *quotaOptions) { o.metrics = m } }

// NewQuotaServer returns a QuotaServer counting with l against the
// configuration config returns (nil: none yet; a report is then
// UNAVAILABLE). A duration option that is not a whole number of seconds of
// at least 1 s is an error, as is a bucket bound below 1.
func NewQuotaServer(l *ratelimit.Limiter, config func() *Config, opts ...QuotaOption) (*QuotaServer, error) {
	o := quotaOptions{ttl: 10 * time.Second, fill: time.Second, report: 5 * time.Second,
		abandon: 30 * time.Second, delay: time.Second, maxBuckets: 1000}
	for _, opt := range opts {
		opt(&o)
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"TTL", o.ttl}, {"fill interval", o.fill}, {"report interval", o.report}, {"abandon time", o.abandon}} {
		if d.d < time.Second || d.d%time.Second != 0 {
			return nil, errors.New("rls: the quota " + d.name + " " + d.d.String() + " is not a whole number of seconds of at least 1s")
		}
	}
	if o.delay < time.Millisecond || o.delay > time.Second {
		return nil, errors.New("rls: the quota's message delay " + o.delay.String() + " is not between 1ms and 1s")
	}
	if o.maxBuckets < 1 {
		return nil, errors.New("rls: the quota's bucket bound " + strconv.Itoa(o.maxBuckets) + " is below 1")
	}
	if o.ticker == nil {
		o.ticker = func() (<-chan time.Time, func()) {
			t := time.NewTicker(quotaTick)
			return t.C, t.Stop
		}
	}
	return &QuotaServer{limiter: l, config: config, opts: o, quit: make(chan struct{}), groups: map[string]*shareGroup{}}, nil
}

// Register registers q on g as
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService.
func (q *QuotaServer) Register(g *grpc.Server) { rlqs.RegisterRateLimitQuotaServiceServer(g, q) }

// Shutdown sends every stream an assignment of each of its buckets with a
// TTL of 0, which Envoy expires at once (its buckets go to their
// expired_assignment_behavior), gives back what Envoy cannot have spent,
// and ends the streams; it returns when they have ended, or with ctx's
// error. A stream opened after it is UNAVAILABLE. It may be called more
// than once.
func (q *QuotaServer) Shutdown(ctx context.Context) error {
	q.mu.Lock()
	if !q.closing {
		q.closing = true
		close(q.quit)
	}
	q.mu.Unlock()
	done := make(chan struct{})
	go func() { q.streams.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// enter counts a stream in, unless q is shutting down.
func (q *QuotaServer) enter() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closing {
		return false
	}
	q.streams.Add(1)
	return true
}

// StreamRateLimitQuotas serves one Envoy's stream: see QuotaServer.
func (q *QuotaServer) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqs.RateLimitQuotaUsageReports, rlqs.RateLimitQuotaResponse]) error {
	if !q.enter() {
		return status.Error(codes.Unavailable, "rls: shutting down")
	}
	defer q.streams.Done()
	ctx := st.Context()
	s := q.newStream()
	defer func() {
		// after the client left, or was sent away: give back what its
		// Envoy cannot have spent
		settle, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		s.end(settle)
	}()

	msgs, errc, stop := make(chan *rlqs.RateLimitQuotaUsageReports), make(chan error, 1), make(chan struct{})
	defer close(stop)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-stop:
				return
			}
		}
	}()
	tick, stopTick := q.opts.ticker()
	defer stopTick()
	send := func(r *rlqs.RateLimitQuotaResponse) error {
		if r == nil || len(r.BucketAction) == 0 {
			return nil
		}
		s.sent(r)
		return st.Send(r)
	}
	for {
		select {
		case m := <-msgs:
			r, err := s.report(ctx, m)
			if err != nil {
				return err
			}
			if err := send(r); err != nil {
				return err
			}
		case <-tick:
			if err := send(s.tick(ctx)); err != nil {
				return err
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-q.quit:
			_ = send(s.shutdown())
			return status.Error(codes.Unavailable, "rls: shutting down")
		}
	}
}

// quotaStream is one stream's state, owned by the goroutine serving it.
type quotaStream struct {
	q       *QuotaServer
	domain  string
	buckets map[string]*quotaBucket
	order   []*quotaBucket // creation order: ticks answer in it
}

// quotaBucket is a bucket of a stream.
type quotaBucket struct {
	key  string // its entries, sorted and joined: one per bucket map
	id   *rlqs.BucketId
	desc *rlv3.RateLimitDescriptor
	// what it counts under: empty for a bucket no limit in Redis applies to
	countID string
	limit   ratelimit.Limit
	group   *shareGroup

	lastReport time.Time
	demand     float64                                   // requests a second, allowed and denied, at the last report
	led        ledger                                    // the unit its assignments are counted in now
	past       []ledger                                  // units that ended with tokens Envoy may have spent: the next reports settle them
	last       *rlqs.RateLimitQuotaResponse_BucketAction // the last action sent
	lastShape  shape
	sentAt     time.Time
	ttl        time.Duration
	due        time.Time // when a tick assigns it again without a report; zero: never
}

func (q *QuotaServer) newStream() *quotaStream {
	if m := q.opts.metrics; m != nil {
		m.streams.Inc()
	}
	return &quotaStream{q: q, buckets: map[string]*quotaBucket{}}
}

// usage is a bucket's report, duplicates of one message merged.
type usage struct {
	b               *quotaBucket
	allowed, denied uint64
	elapsed         time.Duration
}

// report answers one message of reports, or returns the status that ends
// the stream.
func (s *quotaStream) report(ctx context.Context, m *rlqs.RateLimitQuotaUsageReports) (*rlqs.RateLimitQuotaResponse, error) {
	switch d := m.GetDomain(); {
	case s.domain == "" && d == "":
		return nil, status.Error(codes.InvalidArgument, "rls: the first report of a stream must name its domain")
	case s.domain == "":
		s.domain = d
	case d != "" && d != s.domain:
		return nil, status.Errorf(codes.InvalidArgument, "rls: the stream's domain is %q, not %q: open another stream", s.domain, d)
	}
	cfg := s.q.config()
	if cfg == nil {
		return nil, status.Error(codes.Unavailable, "rls: no rate limit configuration loaded")
	}
	reports := m.GetBucketQuotaUsages()
	var usages []*usage
	seen := map[string]*usage{}
	for i, r := range reports {
		key, err := bucketKey(r.GetBucketId())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "rls: bucket %d: %v", i, err)
		}
		if u := seen[key]; u != nil { // twice in one message: one report of both
			u.allowed, u.denied = satAddU(u.allowed, r.GetNumRequestsAllowed()), satAddU(u.denied, r.GetNumRequestsDenied())
			u.elapsed = max(u.elapsed, r.GetTimeElapsed().AsDuration())
			continue
		}
		b := s.buckets[key]
		if b == nil {
			if len(s.buckets) >= s.q.opts.maxBuckets {
				return nil, status.Errorf(codes.ResourceExhausted, "rls: a stream holds at most %d buckets (RLS_QUOTA_MAX_BUCKETS)", s.q.opts.maxBuckets)
			}
			b = newQuotaBucket(key, r.GetBucketId())
			s.buckets[key] = b
			s.order = append(s.order, b)
			if mt := s.q.opts.metrics; mt != nil {
				mt.buckets.Inc()
			}
		}
		u := &usage{b: b, allowed: r.GetNumRequestsAllowed(), denied: r.GetNumRequestsDenied(), elapsed: r.GetTimeElapsed().AsDuration()}
		seen[key] = u
		usages = append(usages, u)
	}
	now := s.q.limiter.Now()
	resp := &rlqs.RateLimitQuotaResponse{}
	for _, u := range usages {
		if mt := s.q.opts.metrics; mt != nil {
			mt.reports.Inc()
		}
		s.reported(ctx, u, now)
		if a := s.assign(ctx, cfg, u.b, now); a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
	}
	return resp, nil
}

// newQuotaBucket returns the bucket of id, whose key is key.
func newQuotaBucket(key string, id *rlqs.BucketId) *quotaBucket {
	b := &quotaBucket{key: key, id: &rlqs.BucketId{Bucket: make(map[string]string, len(id.GetBucket()))}}
	d := &rlv3.RateLimitDescriptor{}
	for k, v := range id.GetBucket() {
		b.id.Bucket[k] = v
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	slices.SortFunc(d.Entries, func(a, b *rlv3.RateLimitDescriptor_Entry) int { return cmp.Compare(a.Key, b.Key) })
	b.desc = d
	return b
}

// bucketKey checks id and returns its entries sorted by key and joined,
// each part prefixed by its length: one key per map.
func bucketKey(id *rlqs.BucketId) (string, error) {
	m := id.GetBucket()
	if len(m) == 0 {
		return "", errors.New("its bucket_id has no entries")
	}
	if len(m) > MaxEntries {
		return "", errors.New("its bucket_id has " + strconv.Itoa(len(m)) + " entries, more than " + strconv.Itoa(MaxEntries))
	}
	keys, size := make([]string, 0, len(m)), 0
	for k, v := range m {
		keys = append(keys, k)
		size += len(k) + len(v)
	}
	if size > MaxBucketIDBytes {
		return "", errors.New("its bucket_id has " + strconv.Itoa(size) + " bytes, more than " + strconv.Itoa(MaxBucketIDBytes))
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		for _, s := range []string{k, m[k]} {
			sb.WriteString(strconv.Itoa(len(s)))
			sb.WriteByte(':')
			sb.WriteString(s)
		}
	}
	return sb.String(), nil
}

// reported takes in a bucket's report received at now: its demand, what it
// spent, and what that shows unused, given back.
func (s *quotaStream) reported(ctx context.Context, u *usage, now time.Time) {
	b := u.b
	elapsed := u.elapsed
	if elapsed < time.Second && !b.lastReport.IsZero() {
		elapsed = now.Sub(b.lastReport) // Envoy sends whole seconds: 0 happens
	}
	b.demand = float64(satAddU(u.allowed, u.denied)) / max(elapsed, time.Second).Seconds()
	if b.group != nil {
		b.group.set(b, b.demand)
	}
	b.lastReport = now
	n := int64(min(u.allowed, math.MaxInt64))
	for i := range b.past {
		b.past[i].spent(n)
	}
	b.led.spent(n)
	s.settle(ctx, b, now.Add(-s.q.opts.delay), now)
}

// settle gives back what b's ledgers hold that neither reports showed
// spent nor Envoy may spend after from, the earliest a report it has was
// made, and forgets the ended units that hold nothing more.
func (s *quotaStream) settle(ctx context.Context, b *quotaBucket, from, now time.Time) {
	s.settleLedger(ctx, &b.led, from)
	kept := b.past[:0]
	for _, l := range b.past {
		s.settleLedger(ctx, &l, from)
		if !l.settled(now) {
			kept = append(kept, l)
		}
	}
	clear(b.past[len(kept):])
	b.past = kept
}

func (s *quotaStream) settleLedger(ctx context.Context, l *ledger, from time.Time) {
	if l.id == "" {
		return
	}
	if n := l.unused(from, s.q.opts.fill); n > 0 {
		given, _ := l.giveBack(ctx, s.q.limiter, n)
		if m := s.q.opts.metrics; m != nil {
			m.givenBack.Add(float64(given))
		}
	}
	l.forget(from)
}

// retire moves b's current unit to those the next reports settle, when
// Envoy may have spent of it after its last report.
func (b *quotaBucket) retire() {
	if b.led.id != "" && len(b.led.terms) > 0 {
		b.past = append(b.past, b.led)
	}
	b.led = ledger{}
}

// spending reports whether Envoy may have spent tokens of an ended unit of
// b after its last report was made.
func (b *quotaBucket) spending() bool {
	for i := range b.past {
		if len(b.past[i].terms) > 0 {
			return true
		}
	}
	return false
}

// assign returns b's action as of now, counting in Redis what it lets
// Envoy spend; nil when there is none to send now.
func (s *quotaStream) assign(ctx context.Context, cfg *Config, b *quotaBucket, now time.Time) *rlqs.RateLimitQuotaResponse_BucketAction {
	q := s.q
	b.due = time.Time{}
	m := cfg.Match(s.domain, b.desc)
	var countID string
	var limit ratelimit.Limit
	blanket := typev3.RateLimitStrategy_ALLOW_ALL
	switch {
	case m == nil || m.Rule.Unlimited || m.Rule.Shadow:
	case m.Rule.Limit.Rate == 0:
		blanket = typev3.RateLimitStrategy_DENY_ALL
	default:
		countID, limit = m.ID, m.Rule.Limit
		limit.Shadow, limit.Leased = false, false // a quota_mode rule binds its bucket; counted in Redis, not leased again
	}
	if countID != b.countID || limit != b.limit {
		s.rebind(ctx, b, countID, limit, now)
	}
	if countID == "" {
		return s.blanket(b, blanket, q.opts.ttl, now)
	}
	unitEnd, span := quotaUnit(limit, now)
	if !unitEnd.Equal(b.led.unitEnd) {
		// what Envoy spent of the last unit after its last report comes in
		// the next ones, which settle it
		b.retire()
		b.led = newLedger(countID, limit, now)
	}
	if b.spending() {
		// Envoy may spend an ended unit's tokens after its last report was
		// made: a token bucket of this unit now would make the next report
		// one sum of both, which no unit could be sure was its own. The
		// first report made after the last of them ended assigns it.
		b.due = time.Time{}
		return nil
	}
	ttl := min(q.opts.ttl, unitEnd.Sub(now.Add(q.opts.delay)).Truncate(time.Second))
	if ttl < time.Second {
		b.due = unitEnd // too little of the unit left: the next one's first assignment
		return nil
	}
	want := b.group.share(b, float64(limit.Rate)/span.Seconds())
	f := min(max(1, int64(math.Ceil(want*q.opts.fill.Seconds()))), limit.Rate, math.MaxUint32)
	n := fills(ttl, q.opts.fill)
	// near the limit (Redis lately had less left than a share of the group
	// needed), no bucket takes more than its demand's part of what is
	// left, so that the buckets reporting after it get theirs: a small
	// share that fits would otherwise keep its all, and a large one get
	// the rest
	var left int64
	known := b.group.short(now)
	if known {
		l, ok := s.remaining(ctx, b)
		if !ok {
			return nil // Redis could not count: Envoy's assignment runs out, its expired_assignment_behavior decides
		}
		left = int64(float64(l) * b.group.part(b))
		f = min(f, left/(n+1))
	}
	if f >= 1 {
		sh := shape{max: f, fill: f}
		live := b.led.live()
		if old := b.lastShape.fill; live != nil && 4*abs(f-old) <= old {
			sh = b.lastShape // a share that barely moved keeps Envoy's bucket
		}
		// a renewal of the token bucket Envoy holds keeps its tokens: only
		// the fills of the time it adds are new
		if live != nil && b.last != nil && b.lastShape == sh && tokenBucket(b.last) && now.Add(q.opts.delay).Before(live.expires) {
			end := now.Add(ttl + q.opts.delay)
			if n := satMul(sh.fill, fills(end.Sub(live.end), q.opts.fill)); !end.After(live.end) || s.count(ctx, b, n) {
				live.end, live.expires = later(end, live.end), later(now.Add(ttl), live.expires)
				// the fills were counted whole, and Envoy refills
				// continuously: what the term as a whole cannot supply
				// comes back now, not at the next report
				s.settleLedger(ctx, &b.led, b.lastReport.Add(-q.opts.delay))
				return s.tokenBucket(b, sh, ttl, now)
			}
		}
		if s.count(ctx, b, satAdd(sh.max, satMul(sh.fill, n))) {
			return s.fresh(b, sh, ttl, now)
		}
	}
	// less is left than its share: its demand's part of what is left, if
	// Redis says
	b.group.shortUntil(now.Add(2 * q.opts.report))
	if !known {
		l, ok := s.remaining(ctx, b)
		if !ok {
			return nil // Redis could not count: Envoy's assignment runs out, its expired_assignment_behavior decides
		}
		left = int64(float64(l) * b.group.part(b))
	}
	if f := min(left/(n+1), math.MaxUint32); f >= 1 {
		if sh := (shape{max: f, fill: f}); s.count(ctx, b, f*(n+1)) {
			return s.fresh(b, sh, ttl, now)
		}
	} else if short := time.Duration(left-1) * q.opts.fill; short >= time.Second {
		short = min(ttl, short.Truncate(time.Second))
		if s.count(ctx, b, 1+fills(short, q.opts.fill)) {
			return s.fresh(b, shape{max: 1, fill: 1}, short, now)
		}
	}
	return s.blanket(b, typev3.RateLimitStrategy_DENY_ALL, q.opts.ttl, now)
}

// rebind settles b under what it counted in, and moves it to countID's
// limit (empty: none).
func (s *quotaStream) rebind(ctx context.Context, b *quotaBucket, countID string, limit ratelimit.Limit, now time.Time) {
	if b.countID != "" {
		s.endTerm(b, now)
		s.settle(ctx, b, b.lastReport.Add(-s.q.opts.delay), now)
		b.retire()
		b.group.leave(b)
		b.group = nil
	}
	b.countID, b.limit = countID, limit
	if countID != "" {
		b.group = s.q.join(countID+"\x00"+limit.String(), b, b.demand)
	}
}

// endTerm ends the token bucket Envoy holds of b, replaced or expired by
// an action sent now.
func (s *quotaStream) endTerm(b *quotaBucket, now time.Time) {
	if live := b.led.live(); live != nil {
		if end := now.Add(s.q.opts.delay); end.Before(live.end) {
			live.end = end
		}
	}
}

// count counts n for b in Redis, as tokens Envoy may spend; false when
// Redis did not count them.
func (s *quotaStream) count(ctx context.Context, b *quotaBucket, n int64) bool {
	if n <= 0 {
		return true
	}
	res, err := s.q.limiter.AllowN(ctx, b.countID, b.limit, n)
	if err != nil || !res.Allowed || res.Degraded {
		return false
	}
	b.led.grants = append(b.led.grants, grant{res: res, left: n})
	b.led.counted += n
	if m := s.q.opts.metrics; m != nil {
		m.leased.Add(float64(n))
	}
	return true
}

// remaining returns what b's limit has left, as Redis counts it.
func (s *quotaStream) remaining(ctx context.Context, b *quotaBucket) (int64, bool) {
	res, err := s.q.limiter.Peek(ctx, b.countID, b.limit)
	if err != nil || res.Degraded {
		return 0, false
	}
	return res.Remaining, true
}

// fresh starts a new token bucket of b in Envoy, whose tokens were counted.
func (s *quotaStream) fresh(b *quotaBucket, sh shape, ttl time.Duration, now time.Time) *rlqs.RateLimitQuotaResponse_BucketAction {
	s.endTerm(b, now)
	b.led.terms = append(b.led.terms, term{shape: sh, start: now, expires: now.Add(ttl), end: now.Add(ttl + s.q.opts.delay)})
	return s.tokenBucket(b, sh, ttl, now)
}

// tokenBucket returns b's assignment of sh for ttl.
func (s *quotaStream) tokenBucket(b *quotaBucket, sh shape, ttl time.Duration, now time.Time) *rlqs.RateLimitQuotaResponse_BucketAction {
	b.lastShape = sh
	return s.action(b, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: uint32(sh.max), TokensPerFill: wrapperspb.UInt32(uint32(sh.fill)), FillInterval: durationpb.New(s.q.opts.fill),
	}}}, ttl, now)
}

// blanket returns b's assignment of rule for ttl, which spends nothing
// counted: ALLOW_ALL is for buckets no limit in Redis applies to.
func (s *quotaStream) blanket(b *quotaBucket, rule typev3.RateLimitStrategy_BlanketRule, ttl time.Duration, now time.Time) *rlqs.RateLimitQuotaResponse_BucketAction {
	s.endTerm(b, now)
	return s.action(b, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}, ttl, now)
}

// action returns b's quota assignment of strategy for ttl, and remembers
// it; a tick renews it before Envoy's timer ends it.
func (s *quotaStream) action(b *quotaBucket, strategy *typev3.RateLimitStrategy, ttl time.Duration, now time.Time) *rlqs.RateLimitQuotaResponse_BucketAction {
	a := &rlqs.RateLimitQuotaResponse_BucketAction{BucketId: b.id, BucketAction: &rlqs.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqs.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: strategy,
		}}}
	b.last, b.sentAt, b.ttl = a, now, ttl
	// renewed while it surely reaches Envoy before its timer ends it: else
	// Envoy may start a full bucket where it would have kept its tokens,
	// and the renewal must count one
	b.due = now.Add(max(ttl-2*s.q.opts.delay-quotaTick, ttl/2))
	return a
}

// tokenBucket reports whether a assigns a token bucket.
func tokenBucket(a *rlqs.RateLimitQuotaResponse_BucketAction) bool {
	return a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil
}

// sent counts the actions of r.
func (s *quotaStream) sent(r *rlqs.RateLimitQuotaResponse) {
	m := s.q.opts.metrics
	if m == nil {
		return
	}
	for _, a := range r.BucketAction {
		kind := "abandon"
		if qa := a.GetQuotaAssignmentAction(); qa != nil {
			kind = strings.ToLower(qa.GetRateLimitStrategy().GetBlanketRule().String())
			if qa.GetRateLimitStrategy().GetTokenBucket() != nil {
				kind = "token_bucket"
			}
		}
		m.assignments.WithLabelValues(kind).Inc()
	}
}

// tick abandons the buckets not reported for the abandon time, and renews
// the others' assignments that are due: before Envoy's timer ends them,
// and when a window starts after one that had too little left.
func (s *quotaStream) tick(ctx context.Context) *rlqs.RateLimitQuotaResponse {
	now := s.q.limiter.Now()
	cfg := s.q.config()
	resp := &rlqs.RateLimitQuotaResponse{}
	kept := s.order[:0]
	for _, b := range s.order {
		if !now.Before(b.lastReport.Add(s.q.opts.abandon)) {
			s.endTerm(b, now)
			s.drop(ctx, b)
			delete(s.buckets, b.key)
			resp.BucketAction = append(resp.BucketAction, &rlqs.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
				BucketAction: &rlqs.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqs.RateLimitQuotaResponse_BucketAction_AbandonAction{}}})
			if m := s.q.opts.metrics; m != nil {
				m.abandoned.Inc()
			}
			continue
		}
		kept = append(kept, b)
		recent := now.Before(b.lastReport.Add(2 * s.q.opts.report))
		if cfg != nil && recent && !b.due.IsZero() && !now.Before(b.due) {
			if a := s.assign(ctx, cfg, b, now); a != nil {
				resp.BucketAction = append(resp.BucketAction, a)
			}
		}
	}
	clear(s.order[len(kept):])
	s.order = kept
	return resp
}

// drop settles b, whose Envoy spends nothing more after its last term,
// and forgets it.
func (s *quotaStream) drop(ctx context.Context, b *quotaBucket) {
	s.settle(ctx, b, b.lastReport.Add(-s.q.opts.delay), s.q.limiter.Now())
	if b.group != nil {
		b.group.leave(b)
	}
	if m := s.q.opts.metrics; m != nil {
		m.buckets.Dec()
	}
}

// end settles every bucket of a stream that ended: Envoy may spend its
// assignments until they expire, and what it cannot have spent is given
// back now.
func (s *quotaStream) end(ctx context.Context) {
	for _, b := range s.order {
		s.drop(ctx, b)
	}
	s.order, s.buckets = nil, nil
	if m := s.q.opts.metrics; m != nil {
		m.streams.Dec()
	}
}

// shutdown returns an assignment of every bucket with a TTL of 0, which
// Envoy expires at once: it spends no token after it arrives. The tokens
// it cannot have spent are given back as the stream ends.
func (s *quotaStream) shutdown() *rlqs.RateLimitQuotaResponse {
	now := s.q.limiter.Now()
	resp := &rlqs.RateLimitQuotaResponse{}
	for _, b := range s.order {
		strategy := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
		if b.last != nil && b.last.GetQuotaAssignmentAction() != nil {
			strategy = b.last.GetQuotaAssignmentAction().GetRateLimitStrategy()
		}
		s.endTerm(b, now)
		resp.BucketAction = append(resp.BucketAction, &rlqs.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
			BucketAction: &rlqs.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
				QuotaAssignmentAction: &rlqs.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
					AssignmentTimeToLive: durationpb.New(0), RateLimitStrategy: strategy,
				}}})
	}
	return resp
}

// shareGroup is the buckets of this process's streams that count under
// one id and window, and their demands: a bucket's share of the limit's
// rate follows its demand.
type shareGroup struct {
	q      *QuotaServer
	key    string
	mu     sync.Mutex
	demand map[*quotaBucket]float64
	// until when its buckets take no more than their part of what is left
	shortEnd time.Time
}

// join adds b, of demand d, to the group of key.
func (q *QuotaServer) join(key string, b *quotaBucket, d float64) *shareGroup {
	q.mu.Lock()
	defer q.mu.Unlock()
	g := q.groups[key]
	if g == nil {
		g = &shareGroup{q: q, key: key, demand: map[*quotaBucket]float64{}}
		q.groups[key] = g
	}
	g.mu.Lock()
	g.demand[b] = d
	g.mu.Unlock()
	return g
}

// leave removes b from g, and g from its server when it is empty.
func (g *shareGroup) leave(b *quotaBucket) {
	g.q.mu.Lock()
	defer g.q.mu.Unlock()
	g.mu.Lock()
	delete(g.demand, b)
	empty := len(g.demand) == 0
	g.mu.Unlock()
	if empty && g.q.groups[g.key] == g {
		delete(g.q.groups, g.key)
	}
}

// set records b's demand.
func (g *shareGroup) set(b *quotaBucket, d float64) {
	g.mu.Lock()
	g.demand[b] = d
	g.mu.Unlock()
}

// shortUntil has g's buckets take no more than their part of what is left
// until t.
func (g *shareGroup) shortUntil(t time.Time) {
	g.mu.Lock()
	g.shortEnd = later(g.shortEnd, t)
	g.mu.Unlock()
}

// short reports whether g's buckets take no more than their part of what
// is left at now.
func (g *shareGroup) short(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return now.Before(g.shortEnd)
}

// part returns b's part of the group's demand (all of it when there is
// none).
func (g *shareGroup) part(b *quotaBucket) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var total float64
	for _, d := range g.demand {
		total += d
	}
	if total <= 0 {
		return 1
	}
	return g.demand[b] / total
}

// share returns the rate, a second, that b may be assigned of rate: its
// demand and half again when the group's demands fit in rate, else its
// share of rate in proportion to its demand.
func (g *shareGroup) share(b *quotaBucket, rate float64) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var total float64
	for _, d := range g.demand {
		total += d
	}
	d := g.demand[b]
	if total <= rate {
		return min(rate, 1.5*d)
	}
	return rate * d / total
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

func satAddU(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
