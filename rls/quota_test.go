package rls

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqs "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

const rlqsConfig = `
domain: rlqs
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: open
    rate_limit: {unlimited: true}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: strict
    rate_limit: {unit: minute, requests_per_unit: 600, strict: true}
  - key: env
    descriptors:
      - key: tenant
        rate_limit: {unit: minute, requests_per_unit: 50}
`

// quotaFixture is a QuotaServer on miniredis, on a clock the test moves.
type quotaFixture struct {
	q   *QuotaServer
	l   *ratelimit.Limiter
	cfg *Config
	now atomic.Int64 // Unix ms
}

func newQuotaFixture(t *testing.T, opts ...QuotaOption) *quotaFixture {
	t.Helper()
	return newQuotaFixtureOn(t, miniredis.RunT(t).Addr(), opts...)
}

// newQuotaFixtureOn is newQuotaFixture on the Redis at addr.
func newQuotaFixtureOn(t *testing.T, addr string, opts ...QuotaOption) *quotaFixture {
	t.Helper()
	f := &quotaFixture{cfg: load(t, rlqsConfig)}
	f.now.Store(epoch.UnixMilli())
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	f.l = ratelimit.New(c, ratelimit.WithClock(func() time.Time { return time.UnixMilli(f.now.Load()) }), ratelimit.WithTimeout(time.Minute))
	t.Cleanup(func() { _ = f.l.Close(context.Background()) })
	q, err := NewQuotaServer(f.l, func() *Config { return f.cfg }, opts...)
	require.NoError(t, err)
	f.q = q
	return f
}

func (f *quotaFixture) at(d time.Duration) { f.now.Store(epoch.Add(d).UnixMilli()) }

// count returns what Redis counts for the bucket {key: value} now, as the
// harness reads it: the id and limit of the descriptor's match.
func (f *quotaFixture) count(t *testing.T, entries ...string) int64 {
	t.Helper()
	m := f.cfg.Match("rlqs", descriptorOf(entries...))
	require.NotNil(t, m)
	res, err := f.l.Peek(context.Background(), m.ID, m.Rule.Limit)
	require.NoError(t, err)
	return res.Count
}

func descriptorOf(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// usageOf is a bucket's report.
func usageOf(allowed, denied uint64, elapsed time.Duration, kv ...string) *rlqs.RateLimitQuotaUsageReports_BucketQuotaUsage {
	id := &rlqs.BucketId{Bucket: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		id.Bucket[kv[i]] = kv[i+1]
	}
	return &rlqs.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: id, TimeElapsed: durationpb.New(elapsed),
		NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

func reports(domain string, us ...*rlqs.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqs.RateLimitQuotaUsageReports {
	return &rlqs.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}
}

// bucketOf returns the token bucket of a, and its TTL; fails when a is not
// one.
func bucketOf(t *testing.T, a *rlqs.RateLimitQuotaResponse_BucketAction) (*typev3.TokenBucket, time.Duration) {
	t.Helper()
	qa := a.GetQuotaAssignmentAction()
	require.NotNil(t, qa, "not an assignment: %v", a)
	tb := qa.GetRateLimitStrategy().GetTokenBucket()
	require.NotNil(t, tb, "not a token bucket: %v", qa.GetRateLimitStrategy())
	return tb, qa.GetAssignmentTimeToLive().AsDuration()
}

// checkAccepted fails unless a is an assignment Envoy's filter takes as
// meant: whole-second TTL and fill interval of 1s or more, tokens to give.
func checkAccepted(t *testing.T, a *rlqs.RateLimitQuotaResponse_BucketAction) {
	t.Helper()
	qa := a.GetQuotaAssignmentAction()
	require.NotNil(t, qa)
	ttl := qa.GetAssignmentTimeToLive().AsDuration()
	require.GreaterOrEqual(t, ttl, time.Second)
	require.Zero(t, ttl%time.Second, "ttl %v", ttl)
	require.Nil(t, qa.GetRateLimitStrategy().GetRequestsPerTimeUnit())
	if tb := qa.GetRateLimitStrategy().GetTokenBucket(); tb != nil {
		fill := tb.GetFillInterval().AsDuration()
		require.GreaterOrEqual(t, fill, time.Second)
		require.Zero(t, fill%time.Second)
		require.Positive(t, tb.GetMaxTokens())
		require.Positive(t, tb.GetTokensPerFill().GetValue())
	}
}

func TestQuotaAssignment(t *testing.T) {
	f := newQuotaFixture(t)
	f.at(10 * time.Second)
	s := f.q.newStream()
	ctx := context.Background()
	resp, err := s.report(ctx, reports("rlqs", usageOf(2, 0, 0, "tenant", "acme")))
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 1)
	a := resp.BucketAction[0]
	checkAccepted(t, a)
	require.Equal(t, map[string]string{"tenant": "acme"}, a.GetBucketId().GetBucket())
	tb, ttl := bucketOf(t, a)
	require.Equal(t, 10*time.Second, ttl)
	// demand 2/s, and half again: 3 a fill of 1s; a full bucket and 10 fills counted
	require.Equal(t, uint32(3), tb.GetTokensPerFill().GetValue())
	require.Equal(t, uint32(3), tb.GetMaxTokens())
	require.Equal(t, int64(3+3*10), f.count(t, "tenant", "acme"))

	// 5 s on, 8 spent: renewed as it was (Envoy keeps its tokens), and what
	// it can no longer spend given back
	f.at(15 * time.Second)
	resp, err = s.report(ctx, reports("", usageOf(8, 0, 5*time.Second, "tenant", "acme")))
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 1)
	tb2, ttl := bucketOf(t, resp.BucketAction[0])
	require.Equal(t, 10*time.Second, ttl)
	require.Equal(t, tb.GetTokensPerFill().GetValue(), tb2.GetTokensPerFill().GetValue())
	// 8 spent; after the report (made from 14s) Envoy may spend a full
	// bucket and the fills to the old end (21s: +1s delivery), 3 + 3×7;
	// 1 given back; the renewal adds 5 fills
	require.Equal(t, int64(8+3+3*7+3*5), f.count(t, "tenant", "acme"))

	// the limit's other face counts the same: an RLS request of the bucket's descriptor
	srv := NewServer(f.l, f.cfg)
	rr, err := srv.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "rlqs", Descriptors: []*rlv3.RateLimitDescriptor{descriptorOf("tenant", "acme")}})
	require.NoError(t, err)
	require.Equal(t, uint32(600-47-1), rr.GetStatuses()[0].GetLimitRemaining())
}

func TestQuotaWindowEnd(t *testing.T) {
	f := newQuotaFixture(t)
	s := f.q.newStream()
	ctx := context.Background()
	f.at(55*time.Second + 500*time.Millisecond)
	resp, err := s.report(ctx, reports("rlqs", usageOf(1, 0, 0, "tenant", "acme")))
	require.NoError(t, err)
	_, ttl := bucketOf(t, resp.BucketAction[0])
	require.Equal(t, 3*time.Second, ttl, "4.5s of the window left, 1s of it for delivery")

	f.at(59 * time.Second)
	resp, err = s.report(ctx, reports("rlqs", usageOf(1, 0, 0, "tenant", "acme")))
	require.NoError(t, err)
	require.Empty(t, resp.BucketAction, "no whole second is left of the window")
	require.Empty(t, s.tick(ctx).BucketAction)

	// Envoy may spend the last window's bucket to 59.5s, after the last
	// report was made (from 58s): the next window's waits for a report
	// made after it, lest one report be a sum of both
	f.at(60*time.Second + 100*time.Millisecond)
	require.Empty(t, s.tick(ctx).BucketAction)
	f.at(61 * time.Second)
	resp, err = s.report(ctx, reports("rlqs", usageOf(1, 0, 0, "tenant", "acme")))
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 1, "the next window's assignment at the first report made after the last one's bucket ended")
	_, ttl = bucketOf(t, resp.BucketAction[0])
	require.Equal(t, 10*time.Second, ttl)
}

// A tick renews an assignment while the renewal surely reaches Envoy
// before its timer ends the bucket, so Envoy keeps its tokens and only the
// fills of the added time are counted; a renewal that may come after
// would have to count a full bucket more.
func TestQuotaTickRenewsInTime(t *testing.T) {
	opts := []QuotaOption{WithQuotaTTL(time.Second), WithQuotaMessageDelay(50 * time.Millisecond)}
	t.Run("miniredis", func(t *testing.T) { tickRenewsInTime(t, newQuotaFixture(t, opts...)) })
	t.Run("redis-server", func(t *testing.T) { tickRenewsInTime(t, newQuotaFixtureOn(t, testredis.Start(t).Addr, opts...)) })
}

func tickRenewsInTime(t *testing.T, f *quotaFixture) {
	s := f.q.newStream()
	ctx := context.Background()
	f.at(10 * time.Second)
	resp, err := s.report(ctx, reports("rlqs", usageOf(2, 0, 0, "tenant", "acme")))
	require.NoError(t, err)
	tb, ttl := bucketOf(t, resp.BucketAction[0])
	require.Equal(t, time.Second, ttl)
	per := int64(tb.GetTokensPerFill().GetValue())
	require.Equal(t, 2*per, f.count(t, "tenant", "acme"), "a full bucket and a fill")
	// ticks every quotaTick: the first that renews does it before 10.95s,
	// when a renewal sent could reach Envoy after its bucket expired
	for at := 10*time.Second + quotaTick; ; at += quotaTick {
		f.at(at)
		resp := s.tick(ctx)
		if len(resp.BucketAction) == 0 {
			require.Less(t, at, time.Second*11, "no renewal before the bucket expired")
			continue
		}
		require.Less(t, at+50*time.Millisecond, 11*time.Second, "renewed at %v: it may reach Envoy after 11s", at)
		tb2, _ := bucketOf(t, resp.BucketAction[0])
		require.Equal(t, tb.GetTokensPerFill().GetValue(), tb2.GetTokensPerFill().GetValue(), "the same bucket: Envoy keeps its tokens")
		// one full bucket, and the fills from the report (made from 9.95s)
		// to the renewal's end (its TTL and δ)
		fills := float64(per) * (at + time.Second + 50*time.Millisecond - 9950*time.Millisecond).Seconds()
		require.Equal(t, per+int64(fills), f.count(t, "tenant", "acme"), "the renewal counts the fills of the time it adds, no second full bucket")
		break
	}
}

func TestQuotaBinding(t *testing.T) {
	ctx := context.Background()
	t.Run("domain", func(t *testing.T) {
		f := newQuotaFixture(t)
		_, err := f.q.newStream().report(ctx, reports("", usageOf(1, 0, 0, "tenant", "a")))
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)

		s := f.q.newStream()
		_, err = s.report(ctx, reports("rlqs", usageOf(1, 0, 0, "tenant", "a")))
		require.NoError(t, err)
		_, err = s.report(ctx, reports("rlqs", usageOf(1, 0, time.Second, "tenant", "a")))
		require.NoError(t, err, "Envoy repeats the domain")
		_, err = s.report(ctx, reports("", usageOf(1, 0, time.Second, "tenant", "a")))
		require.NoError(t, err)
		_, err = s.report(ctx, reports("other", usageOf(1, 0, time.Second, "tenant", "a")))
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	})
	blanket := func(t *testing.T, a *rlqs.RateLimitQuotaResponse_BucketAction) typev3.RateLimitStrategy_BlanketRule {
		t.Helper()
		checkAccepted(t, a)
		st := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
		_, ok := st.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
		require.True(t, ok, "not a blanket rule: %v", st)
		return st.GetBlanketRule()
	}
	for _, c := range []struct {
		name string
		kv   []string
		want typev3.RateLimitStrategy_BlanketRule
	}{
		{"no rule", []string{"nobody", "x"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{"unlimited", []string{"open", "x"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{"shadow", []string{"trial", "x"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{"zero", []string{"closed", "x"}, typev3.RateLimitStrategy_DENY_ALL},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newQuotaFixture(t)
			resp, err := f.q.newStream().report(ctx, reports("rlqs", usageOf(1, 0, 0, c.kv...)))
			require.NoError(t, err)
			require.Len(t, resp.BucketAction, 1)
			require.Equal(t, c.want, blanket(t, resp.BucketAction[0]))
		})
	}
	t.Run("unknown domain", func(t *testing.T) {
		f := newQuotaFixture(t)
		resp, err := f.q.newStream().report(ctx, reports("elsewhere", usageOf(1, 0, 0, "tenant", "a")))
		require.NoError(t, err)
		require.Equal(t, typev3.RateLimitStrategy_ALLOW_ALL, blanket(t, resp.BucketAction[0]))
	})
	t.Run("entries sorted by key", func(t *testing.T) {
		f := newQuotaFixture(t)
		resp, err := f.q.newStream().report(ctx, reports("rlqs", usageOf(1, 0, 0, "tenant", "acme", "env", "prod")))
		require.NoError(t, err)
		bucketOf(t, resp.BucketAction[0])
		require.Positive(t, f.count(t, "env", "prod", "tenant", "acme"), "counted as the descriptor [env prod, tenant acme]")
	})
	t.Run("no configuration", func(t *testing.T) {
		f := newQuotaFixture(t)
		f.cfg = nil
		_, err := f.q.newStream().report(ctx, reports("rlqs", usageOf(1, 0, 0, "tenant", "a")))
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	})
}

func TestQuotaBadInput(t *testing.T) {
	ctx := context.Background()
	many := func(n, size int) []string {
		var kv []string
		for i := range n {
			kv = append(kv, fmt.Sprintf("k%03d", i), strings.Repeat("v", size))
		}
		return kv
	}
	for _, c := range []struct {
		name string
		u    *rlqs.RateLimitQuotaUsageReports_BucketQuotaUsage
	}{
		{"no bucket id", &rlqs.RateLimitQuotaUsageReports_BucketQuotaUsage{}},
		{"empty bucket", usageOf(1, 0, 0)},
		{"too many entries", usageOf(1, 0, 0, many(MaxEntries+1, 1)...)},
		{"too many bytes", usageOf(1, 0, 0, many(2, MaxBucketIDBytes/2)...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newQuotaFixture(t)
			_, err := f.q.newStream().report(ctx, reports("rlqs", c.u))
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		})
	}
	t.Run("duplicates", func(t *testing.T) {
		f := newQuotaFixture(t)
		resp, err := f.q.newStream().report(ctx, reports("rlqs", usageOf(1, 0, 0, "tenant", "a"), usageOf(1, 0, 0, "tenant", "a")))
		require.NoError(t, err)
		require.Len(t, resp.BucketAction, 1, "one report of both")
		tb, _ := bucketOf(t, resp.BucketAction[0])
		require.Equal(t, uint32(3), tb.GetTokensPerFill().GetValue(), "2/s of demand, and half again")
	})
	t.Run("bucket bound", func(t *testing.T) {
		f := newQuotaFixture(t, WithQuotaMaxBuckets(3))
		s := f.q.newStream()
		var us []*rlqs.RateLimitQuotaUsageReports_BucketQuotaUsage
		for i := range 3 {
			us = append(us, usageOf(0, 0, 0, "tenant", fmt.Sprint(i)))
		}
		_, err := s.report(ctx, reports("rlqs", us...))
		require.NoError(t, err)
		_, err = s.report(ctx, reports("rlqs", usageOf(0, 0, 0, "tenant", "0")))
		require.NoError(t, err, "a bucket it has")
		_, err = s.report(ctx, reports("rlqs", usageOf(0, 0, 0, "tenant", "3")))
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		require.Len(t, s.buckets, 3)
	})
	t.Run("huge counts", func(t *testing.T) {
		f := newQuotaFixture(t)
		resp, err := f.q.newStream().report(ctx, reports("rlqs", usageOf(math.MaxUint64, math.MaxUint64, 0, "small", "a")))
		require.NoError(t, err)
		checkAccepted(t, resp.BucketAction[0])
		require.LessOrEqual(t, f.count(t, "small", "a"), int64(100))
	})
	t.Run("settings", func(t *testing.T) {
		for _, o := range []QuotaOption{WithQuotaTTL(0), WithQuotaTTL(1500 * time.Millisecond), WithQuotaFillInterval(time.Millisecond),
			WithQuotaReportInterval(-time.Second), WithQuotaAbandonAfter(0), WithQuotaMaxBuckets(0)} {
			_, err := NewQuotaServer(nil, nil, o)
			require.Error(t, err)
		}
	})
}

// TestQuotaRebalance: two Envoys of one bucket, 90/10 then 10/90 of a
// demand above the limit: within two reports each has its share.
func TestQuotaRebalance(t *testing.T) {
	f := newQuotaFixture(t)
	ctx := context.Background()
	a, b := f.q.newStream(), f.q.newStream()
	fill := func(s *quotaStream, demand uint64) uint32 {
		t.Helper()
		resp, err := s.report(ctx, reports("rlqs", usageOf(0, demand*5, 5*time.Second, "tenant", "acme")))
		require.NoError(t, err)
		require.Len(t, resp.BucketAction, 1)
		if tb := resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb != nil {
			return tb.GetTokensPerFill().GetValue()
		}
		return 0 // denied all: nothing left for it now
	}
	var fa, fb uint32
	at := time.Second
	for range 2 {
		f.at(at)
		fa, fb = fill(a, 90), fill(b, 10)
		at += 5 * time.Second
	}
	// 600 a minute is 10/s: 9 and 1, or what is within a quarter of the
	// bucket Envoy has, which it keeps
	require.InDelta(t, 9, fa, 1)
	require.InDelta(t, 1, fb, 0)
	for range 2 {
		f.at(at)
		fa, fb = fill(a, 10), fill(b, 90)
		at += 5 * time.Second
	}
	require.InDelta(t, 1, fa, 0)
	require.InDelta(t, 9, fb, 1)
}

// TestQuotaUnitSettled: what a unit (here a strict minute's sub-window of
// 6 s) counted and its Envoy did not spend comes back at the first report
// made after its last token bucket ended, though a new unit has started.
// When Redis has less left than a share needs, a bucket gets its demand's
// part of what is left, not all of it: the buckets that report after it
// get theirs.
func TestQuotaShortSharedByDemand(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) { shortSharedByDemand(t, newQuotaFixture(t)) })
	t.Run("redis-server", func(t *testing.T) { shortSharedByDemand(t, newQuotaFixtureOn(t, testredis.Start(t).Addr)) })
	t.Run("a small share that fits, near the limit", func(t *testing.T) { shortCapsSmallShares(t, newQuotaFixtureOn(t, testredis.Start(t).Addr)) })
}

// Once a share did not fit, a small share that would is held to its
// demand's part of what is left too: else it keeps its all, and the large
// share that did not fit gets less than it.
func shortCapsSmallShares(t *testing.T, f *quotaFixture) {
	ctx := context.Background()
	a, b := shortGroup(t, f, 60)

	// 60 left: a's share of 9 needs 99; its part, nine tenths, is 54: 4 a
	// second (44); 16 left, b's share of 1 needs 11, its part is 1
	f.at(13 * time.Second)
	resp, err := a.report(ctx, reports("rlqs", usageOf(110, 970, 12*time.Second, "tenant", "acme")))
	require.NoError(t, err)
	tb, _ := bucketOf(t, resp.BucketAction[0])
	require.Equal(t, uint32(4), tb.GetTokensPerFill().GetValue())
	resp, err = b.report(ctx, reports("rlqs", usageOf(11, 109, 12*time.Second, "tenant", "acme")))
	require.NoError(t, err)
	require.Equal(t, typev3.RateLimitStrategy_DENY_ALL, resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule(),
		"a tenth of 16 is no token, though its share of 11 fits")
	require.Equal(t, int64(600-16), f.count(t, "tenant", "acme"))
}

// shortGroup opens two streams of one bucket, a asking 90 a second and b
// 10, at 1 s, and counts what leaves left of the limit (600) unused.
func shortGroup(t *testing.T, f *quotaFixture, left int64) (a, b *quotaStream) {
	t.Helper()
	ctx := context.Background()
	a, b = f.q.newStream(), f.q.newStream()
	f.at(time.Second)
	_, err := a.report(ctx, reports("rlqs", usageOf(0, 90, 0, "tenant", "acme")))
	require.NoError(t, err)
	_, err = b.report(ctx, reports("rlqs", usageOf(0, 10, 0, "tenant", "acme")))
	require.NoError(t, err)
	// a alone in the group has the whole rate, 10 a second; then b a tenth
	require.Equal(t, int64(10+10*10+1+1*10), f.count(t, "tenant", "acme"), "a full bucket and 10 fills each")
	m := f.cfg.Match("rlqs", descriptorOf("tenant", "acme"))
	_, err = f.l.AllowN(ctx, m.ID, m.Rule.Limit, 600-121-left)
	require.NoError(t, err)
	return a, b
}

func shortSharedByDemand(t *testing.T, f *quotaFixture) {
	ctx := context.Background()
	a, b := shortGroup(t, f, 8)

	// both buckets expired and spent whole: 8 left, which neither share fits
	f.at(13 * time.Second)
	resp, err := b.report(ctx, reports("rlqs", usageOf(11, 109, 12*time.Second, "tenant", "acme")))
	require.NoError(t, err)
	require.Equal(t, typev3.RateLimitStrategy_DENY_ALL, resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule(),
		"a tenth of 8 is no token: it leaves the 8 to the bucket asking nine tenths")
	resp, err = a.report(ctx, reports("rlqs", usageOf(110, 970, 12*time.Second, "tenant", "acme")))
	require.NoError(t, err)
	tb, ttl := bucketOf(t, resp.BucketAction[0])
	require.Equal(t, uint32(1), tb.GetTokensPerFill().GetValue())
	require.Equal(t, 6*time.Second, ttl, "nine tenths of 8 is 7: a full bucket of 1 and 6 fills")
	require.Equal(t, int64(600-1), f.count(t, "tenant", "acme"))
}

func TestQuotaUnitSettled(t *testing.T) {
	f := newQuotaFixture(t)
	ctx := context.Background()
	s := f.q.newStream()
	f.at(time.Second)
	_, err := s.report(ctx, reports("rlqs", usageOf(0, 2, 0, "strict", "acme")))
	require.NoError(t, err)
	// demand 2/s: 3 a fill, a TTL of 4s (5s of the unit left, 1s of it for
	// delivery): 3 + 3×4 counted; Envoy may spend it until 6s
	require.Equal(t, int64(15), f.count(t, "strict", "acme"))

	f.at(5*time.Second + 500*time.Millisecond)
	resp, err := s.report(ctx, reports("rlqs", usageOf(4, 0, 4*time.Second, "strict", "acme")))
	require.NoError(t, err)
	require.Empty(t, resp.BucketAction, "no whole second is left of the unit")
	// 4 spent; after the report (made from 4.5s) Envoy may spend 3 and
	// what refills to 6s, 3×1.5: 4 given back
	require.Equal(t, int64(11), f.count(t, "strict", "acme"))

	// Envoy may spend the last unit's bucket after the last report was
	// made: the next unit's waits for a report made after it ended
	f.at(6*time.Second + 100*time.Millisecond)
	require.Empty(t, s.tick(ctx).BucketAction)

	// 2 spent, all of the last unit: the report was made from 6.5s, after
	// its bucket ended, and the next unit's had not started. Of its 11,
	// the 4 and the 2 reported stay, 5 come back; the next unit's bucket
	// (1/s of demand and half again, a TTL to 3s before its end at 12s)
	// counts 2 + 2×3.
	f.at(7*time.Second + 500*time.Millisecond)
	resp, err = s.report(ctx, reports("rlqs", usageOf(2, 0, 2*time.Second, "strict", "acme")))
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 1, "the next unit's assignment")
	tb, ttl := bucketOf(t, resp.BucketAction[0])
	require.Equal(t, uint32(2), tb.GetTokensPerFill().GetValue(), "1/s of demand, and half again")
	require.Equal(t, 3*time.Second, ttl)
	require.Equal(t, int64(6+2+2*3), f.count(t, "strict", "acme"))
	require.Empty(t, s.buckets["6:strict4:acme"].past, "the last unit is settled")
}

// TestQuotaAbandon: a bucket unreported for the abandon time gets its
// abandon_action, and what Envoy cannot have spent back.
func TestQuotaAbandon(t *testing.T) {
	f := newQuotaFixture(t)
	ctx := context.Background()
	s := f.q.newStream()
	f.at(time.Second)
	_, err := s.report(ctx, reports("rlqs", usageOf(2, 0, 0, "tenant", "acme")))
	require.NoError(t, err)
	f.at(6 * time.Second)
	_, err = s.report(ctx, reports("rlqs", usageOf(0, 0, 5*time.Second, "tenant", "acme")))
	require.NoError(t, err)
	before := f.count(t, "tenant", "acme")
	f.at(35 * time.Second)
	require.Empty(t, s.tick(ctx).BucketAction, "reported 29s ago")
	f.at(36 * time.Second)
	resp := s.tick(ctx)
	require.Len(t, resp.BucketAction, 1)
	require.NotNil(t, resp.BucketAction[0].GetAbandonAction())
	require.Empty(t, s.buckets)
	// after the last report (made from 5s) Envoy may have spent, of the
	// bucket of 3 (3 a fill) that the report replaced, 3 and the fills to
	// 7s (when the new one reached it); of the new one of 1 (demand 0, 1 a
	// fill), 1 and the fills from 6s to 17s
	require.Equal(t, int64(3+3*2+1+1*11), f.count(t, "tenant", "acme"))
	require.Less(t, f.count(t, "tenant", "acme"), before)
}

// TestQuotaStreamEnd: a stream that ends gives back what its Envoy cannot
// have spent at once; the stream it reconnects on counts its own share
// only.
func TestQuotaStreamEnd(t *testing.T) {
	f := newQuotaFixture(t)
	ctx := context.Background()
	s := f.q.newStream()
	f.at(time.Second)
	_, err := s.report(ctx, reports("rlqs", usageOf(10, 0, 0, "tenant", "acme")))
	require.NoError(t, err)
	f.at(6 * time.Second)
	_, err = s.report(ctx, reports("rlqs", usageOf(5, 0, 5*time.Second, "tenant", "acme")))
	require.NoError(t, err)
	// 5 spent; after the report (made from 5s) Envoy may spend, of its
	// bucket of 10 (10/s, the limit's rate), 10 and 10 a second until the
	// new one (2: 1/s and half again) reaches it at 7s; of that one, 2 and
	// 2 a second to 17s
	owed := int64(5 + 10 + 10*2 + 2 + 2*11)
	f.at(7 * time.Second)
	s.end(ctx)
	require.Equal(t, owed, f.count(t, "tenant", "acme"))
	require.Empty(t, f.q.groups, "the share group is gone with its last bucket")

	s2 := f.q.newStream()
	resp, err := s2.report(ctx, reports("rlqs", usageOf(1, 0, 0, "tenant", "acme")))
	require.NoError(t, err)
	tb, ttl := bucketOf(t, resp.BucketAction[0])
	require.Equal(t, owed+int64(tb.GetMaxTokens())+int64(tb.GetTokensPerFill().GetValue())*int64(ttl/time.Second),
		f.count(t, "tenant", "acme"))
}

// TestQuotaShutdown: every bucket gets a TTL of 0, and what Envoy cannot
// have spent is given back when the stream ends.
func TestQuotaShutdown(t *testing.T) {
	f := newQuotaFixture(t)
	ctx := context.Background()
	s := f.q.newStream()
	f.at(time.Second)
	_, err := s.report(ctx, reports("rlqs", usageOf(10, 0, 0, "tenant", "acme"), usageOf(1, 0, 0, "open", "x")))
	require.NoError(t, err)
	f.at(2 * time.Second)
	resp := s.shutdown()
	require.Len(t, resp.BucketAction, 2)
	for _, a := range resp.BucketAction {
		require.Zero(t, a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration())
	}
	s.end(ctx)
	// nothing reported spent of the bucket of 10 (the limit's rate): from
	// when it was sent (1s) until the TTL of 0 reaches Envoy (3s), 10 and
	// 10 a second
	require.Equal(t, int64(10+10*2), f.count(t, "tenant", "acme"))
}

// envoyBucket emulates the token bucket of Envoy's rate_limit_quota
// filter: a new strategy makes a full bucket, the same one renewed before
// its TTL ends keeps its tokens, a TTL under 1s expires it at once, and an
// expired or missing assignment denies (the fallback the bound asks for).
type envoyBucket struct {
	tb               *typev3.TokenBucket
	tokens           float64
	last, expires    time.Time
	allowed, denied  uint64
	lastReport       time.Time
	sawTTL, sawFresh bool
}

func (e *envoyBucket) apply(t *testing.T, a *rlqs.RateLimitQuotaResponse_BucketAction, now time.Time) {
	qa := a.GetQuotaAssignmentAction()
	require.NotNil(t, qa)
	checkAccepted(t, a)
	ttl := qa.GetAssignmentTimeToLive().AsDuration()
	tb := qa.GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		e.tb = nil
		return
	}
	same := e.tb != nil && now.Before(e.expires) && e.tb.GetMaxTokens() == tb.GetMaxTokens() &&
		e.tb.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue()
	if !same {
		e.tb, e.tokens, e.last = tb, float64(tb.GetMaxTokens()), now
		e.sawFresh = true
	} else {
		e.sawTTL = true
	}
	e.expires = now.Add(ttl)
}

func (e *envoyBucket) admit(now time.Time) bool {
	if e.tb == nil || !now.Before(e.expires) {
		e.denied++
		return false
	}
	rate := float64(e.tb.GetTokensPerFill().GetValue()) / e.tb.GetFillInterval().AsDuration().Seconds()
	e.tokens = min(float64(e.tb.GetMaxTokens()), e.tokens+rate*now.Sub(e.last).Seconds())
	e.last = now
	if e.tokens < 1 {
		e.denied++
		return false
	}
	e.tokens--
	e.allowed++
	return true
}

// TestQuotaLeaseBound: three Envoys that want far more than the limit,
// each on a replica of its own (which sees no other's demand: each assigns
// its Envoy the whole rate, and Redis alone holds them back), spend what
// their assignments let them for four minutes; at every admission what all
// admitted holds to the sliding rule of the limit. Steadily; and in bursts
// across a window's end, after which RLS requests of the same id fill what
// the count has left at the next window's end: a token counted in one
// window and spent in the next would be admitted on top of a full count
// (Redis weighs the window it was counted in less and less), which is why
// an assignment ends with the window its tokens were counted in.
func TestQuotaLeaseBound(t *testing.T) {
	const rate, window = 600, time.Minute
	never := func(time.Duration) int { return 0 }
	for _, c := range []struct {
		name string
		// tries in a step of 100ms of each Envoy, and of an RLS client
		envoyAsks, rlsAsks func(at time.Duration) int
		least              int64 // admitted in 4 minutes, more than
	}{
		{"steady", func(time.Duration) int { return 5 }, never, 4 * rate * 7 / 10},
		{"across a window's end, then RLS on a full count", func(at time.Duration) int {
			if at%(2*window) >= 52*time.Second && at%(2*window) < 70*time.Second {
				return 5
			}
			return 0
		}, func(at time.Duration) int {
			if at%(2*window) >= 110*time.Second {
				return 5
			}
			return 0
		}, 2 * rate},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newQuotaFixture(t)
			ctx := context.Background()
			type envoy struct {
				s *quotaStream
				b envoyBucket
			}
			envoys := make([]*envoy, 3)
			for i := range envoys {
				q, err := NewQuotaServer(f.l, func() *Config { return f.cfg })
				require.NoError(t, err)
				envoys[i] = &envoy{s: q.newStream()}
			}
			m := f.cfg.Match("rlqs", descriptorOf("tenant", "acme"))
			admitted := map[int64]int64{} // by window
			var total int64
			admit := func(now time.Time, at time.Duration) {
				t.Helper()
				w := now.UnixMilli() / window.Milliseconds()
				admitted[w]++
				total++
				elapsed := now.UnixMilli() - w*window.Milliseconds()
				est := admitted[w] + admitted[w-1]*(window.Milliseconds()-elapsed)/window.Milliseconds()
				require.LessOrEqual(t, est, int64(rate), "at %v", at)
			}
			step := 100 * time.Millisecond
			for at := time.Duration(0); at < 4*window; at += step {
				f.at(at)
				now := time.UnixMilli(f.now.Load())
				for i, e := range envoys {
					// each reports every 5s, its time_elapsed in whole seconds,
					// at its own phase
					phase := time.Duration(i) * 1700 * time.Millisecond
					if (at-phase)%(5*time.Second) == 0 && at >= phase {
						elapsed := now.Sub(e.b.lastReport).Truncate(time.Second)
						if e.b.lastReport.IsZero() {
							elapsed = 0
						}
						resp, err := e.s.report(ctx, reports("rlqs", usageOf(e.b.allowed, e.b.denied, elapsed, "tenant", "acme")))
						require.NoError(t, err)
						e.b.allowed, e.b.denied, e.b.lastReport = 0, 0, now
						for _, a := range resp.BucketAction {
							e.b.apply(t, a, now)
						}
					}
					for _, a := range e.s.tick(ctx).BucketAction {
						e.b.apply(t, a, now)
					}
					for range c.envoyAsks(at) { // 50 a second each
						if e.b.admit(now) {
							admit(now, at)
						}
					}
				}
				for range c.rlsAsks(at) {
					res, err := f.l.AllowN(ctx, m.ID, m.Rule.Limit, 1)
					require.NoError(t, err)
					if res.Allowed {
						admit(now, at)
					}
				}
			}
			// the limit is not left idle: most of it is used
			require.Greater(t, total, c.least, "admitted %d in 4 minutes", total)
			require.True(t, envoys[0].b.sawTTL && envoys[0].b.sawFresh, "renewals and new buckets both happened")
		})
	}
}
