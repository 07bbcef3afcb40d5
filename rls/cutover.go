// The cutover from envoyproxy/ratelimit: while reference pods and ours
// share a Redis, ours decide by the reference's fixed-window counters too,
// so that a client gets its limit once, not once from each.

package rls

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidingwindow/ratelimit"
)

// A CutoverOption configures WithReferenceCutover.
type CutoverOption func(*cutover)

// CutoverJitter sets the most that is added at random to the expiry of a
// reference counter, as the reference's EXPIRATION_JITTER_MAX_SECONDS
// (300 s by default; 0 or less: none). It is rounded down to whole
// seconds, and held to a year.
func CutoverJitter(d time.Duration) CutoverOption {
	return func(c *cutover) { c.jitter = int64(min(max(d, 0), 365*24*time.Hour) / time.Second) }
}

// CutoverTimeout bounds the call to Redis that counts in the reference's
// counters (100 ms by default, as ratelimit.WithTimeout's default).
func CutoverTimeout(d time.Duration) CutoverOption {
	return func(c *cutover) { c.timeout = d }
}

// cutoverClock sets the clock that places a request in the reference's
// windows (default time.Now): tests move it by hand.
func cutoverClock(now func() time.Time) CutoverOption {
	return func(c *cutover) {
		if now != nil {
			c.now = now
		}
	}
}

// WithReferenceCutover has the Server count every request, beside its own
// windows, in the counters envoyproxy/ratelimit's Redis cache keeps, in
// client, under the reference's CACHE_KEY_PREFIX prefix: one pipeline of
// an INCRBY and an EXPIRE per descriptor, one more round trip per request.
// A descriptor is OVER_LIMIT when the reference's counter after the
// increment is over its requests_per_unit, or when this service's own
// window says so. A request over a reference's counter is counted in none
// of this service's windows (the Limiter only looks), as a request over
// any of their own limits is not. A descriptor's limit_remaining is this
// service's, 0 when the reference's counter is over, and its
// duration_until_reset this service's, at least to the end of the
// reference's window when that counter is over. Descriptors of no limit,
// unlimited, of a rule of 0, or of is_negative_hits (which the reference
// does not read, and counts as hits) are not counted there, nor are rules
// the reference cannot express (a window or a calendar). When Redis
// fails, the request is UNAVAILABLE as when the Limiter fails; under
// WithFailurePolicy the reference's counters are left out and the
// Limiter's failure policy decides. docs/envoy.md, "Cutover from the
// reference", says how to use it and end it.
func WithReferenceCutover(client redis.UniversalClient, prefix string, opts ...CutoverOption) Option {
	c := &cutover{client: client, prefix: prefix, jitter: 300, timeout: 100 * time.Millisecond, now: time.Now}
	for _, o := range opts {
		o(c)
	}
	return func(o *options) { o.cutover = c }
}

// cutover counts in the reference's counters.
type cutover struct {
	client  redis.UniversalClient
	prefix  string
	jitter  int64 // seconds
	timeout time.Duration
	now     func() time.Time
}

// refOver says, per descriptor of a request, whether the reference's
// counter is over its limit, and when that counter's window ends. A nil
// refOver (no cutover) says nothing.
type refOver []time.Duration // 0: not over; else the wait to the window's end

// counted reports whether d is counted in the reference's counters: the
// descriptors the reference's fixed-window cache counts, less is_negative_hits
// and the rules of 0, which this service decides without Redis.
func (c *cutover) counted(d *descriptor) bool {
	if !d.decidedInRedis() || d.match.Rule.Limit.Calendar != 0 {
		return false
	}
	_, ok := divider(d.match.Rule.Unit)
	return ok
}

// divider returns the length of a reference unit in seconds, as the
// reference's utils.UnitToDivider, or false for UNKNOWN (a window of ours).
func divider(u pb.RateLimitResponse_RateLimit_Unit) (int64, bool) {
	switch u {
	case pb.RateLimitResponse_RateLimit_SECOND:
		return 1, true
	case pb.RateLimitResponse_RateLimit_MINUTE:
		return 60, true
	case pb.RateLimitResponse_RateLimit_HOUR:
		return 60 * 60, true
	case pb.RateLimitResponse_RateLimit_DAY:
		return 60 * 60 * 24, true
	case pb.RateLimitResponse_RateLimit_WEEK:
		return 60 * 60 * 24 * 7, true
	case pb.RateLimitResponse_RateLimit_MONTH:
		return 60 * 60 * 24 * 30, true
	case pb.RateLimitResponse_RateLimit_YEAR:
		return 60 * 60 * 24 * 365, true
	}
	return 0, false
}

// referenceKey returns the reference's key of descriptor d of domain at
// unix second now, as its CacheKeyGenerator.GenerateCacheKey
// (src/limiter/cache_key.go, lines 62-82 at 3fb702589d36): prefix, domain,
// '_', each entry's key, '_', value (its share_threshold wildcard where it
// has one), '_', then the window's first second.
func (c *cutover) referenceKey(domain string, m *Match, entries []*rlv3.RateLimitDescriptor_Entry, div, now int64) string {
	var b strings.Builder
	b.WriteString(c.prefix)
	b.WriteString(domain)
	b.WriteByte('_')
	for i, e := range entries {
		b.WriteString(e.GetKey())
		b.WriteByte('_')
		if i < len(m.share) && m.share[i] != "" {
			b.WriteString(m.share[i])
		} else {
			b.WriteString(e.GetValue())
		}
		b.WriteByte('_')
	}
	b.WriteString(strconv.FormatInt(now/div*div, 10))
	return b.String()
}

// count adds the hits of req's counted descriptors to the reference's
// counters, in one pipeline, and returns which are over; when one of a
// rule not in shadow mode is, it sets the cost of quotas, what the
// Limiter is to decide, to 0. It returns nil when s has no cutover, or
// when Redis failed and the failure policy decides; else a status error
// when Redis failed.
func (s *Server) count(ctx context.Context, req *pb.RateLimitRequest, ds []descriptor, quotas []ratelimit.Quota) (refOver, error) {
	c := s.opts.cutover
	if c == nil {
		return nil, nil
	}
	now := c.now()
	sec := now.Unix()
	type counter struct {
		i     int
		incr  *redis.IntCmd
		limit int64
		ends  time.Duration // from now to the window's end
	}
	var counters []counter
	var pipe redis.Pipeliner
	for i := range ds {
		d := &ds[i]
		if !c.counted(d) {
			continue
		}
		div, _ := divider(d.match.Rule.Unit)
		key := c.referenceKey(req.GetDomain(), d.match, req.GetDescriptors()[i].GetEntries(), div, sec)
		expiry := div
		if c.jitter > 0 {
			expiry += rand.Int64N(c.jitter)
		}
		if pipe == nil {
			pipe = c.client.Pipeline()
		}
		ends := time.Unix(sec/div*div+div, 0).Sub(now)
		counters = append(counters, counter{i: i, incr: pipe.IncrBy(ctx, key, d.hits), limit: int64(d.match.Rule.RequestsPerUnit), ends: ends})
		pipe.Expire(ctx, key, time.Duration(expiry)*time.Second)
	}
	if pipe == nil {
		return nil, nil
	}
	call := ctx
	if c.timeout > 0 {
		var cancel context.CancelFunc
		call, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	if _, err := pipe.Exec(call); err != nil {
		if s.opts.policy && ctx.Err() == nil {
			return nil, nil // the Limiter meets the same Redis, and its policy decides
		}
		return nil, statusOf(ctx, err)
	}
	over := make(refOver, len(ds))
	refused := false
	for _, k := range counters {
		if k.incr.Val() > k.limit {
			over[k.i] = max(k.ends, time.Nanosecond)
			refused = refused || !ds[k.i].match.Rule.Shadow
		}
	}
	if refused {
		// the request is over: the Limiter looks and counts nothing, as
		// for a request over any of its own limits, or its windows would
		// count what the reference's counters refused and, read as the
		// previous window, refuse what they would admit
		for q := range quotas {
			quotas[q].Cost = 0
		}
	}
	return over, nil
}

// apply makes st, the status of descriptor i of a request, say what the
// reference's counter says: over it, OVER_LIMIT (OK for a shadow rule,
// as the reference answers) with 0 remaining, and a wait at least to the
// end of the reference's window. A status the failure policy made (no
// limit: the Limiter could not decide) takes the code alone.
func (o refOver) apply(i int, d descriptor, st *pb.RateLimitResponse_DescriptorStatus) {
	if i >= len(o) || o[i] == 0 {
		return
	}
	if !d.match.Rule.Shadow {
		st.Code = pb.RateLimitResponse_OVER_LIMIT
	}
	st.LimitRemaining = 0
	if st.DurationUntilReset != nil && st.DurationUntilReset.AsDuration() < o[i] {
		st.DurationUntilReset = durationpb.New(o[i])
	}
}
