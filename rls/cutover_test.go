package rls

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit"
)

// cutoverConfig has the reference's shapes of key: a plain one, a nested
// one and share_threshold at two depths, as the reference's own
// test/limiter/base_limiter_test.go (TestGenerateCacheKeysWithShareThreshold).
const cutoverConfig = `
domain: domain
descriptors:
  - key: key
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: parent
    value: value1
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: top
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 5}
`

// newCutover returns a fixture whose Server is in cutover on its
// miniredis, with prefix, and the clock of the fixture for both the
// Limiter and the reference's windows.
func newCutover(t *testing.T, cfg, prefix string, opts ...Option) *fixture {
	f := &fixture{mr: miniredis.RunT(t), now: epoch.Add(30 * time.Second)}
	c := redis.NewClient(&redis.Options{Addr: f.mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	clock := func() time.Time { return f.now }
	l := ratelimit.New(c, ratelimit.WithClock(clock), ratelimit.WithTimeout(time.Minute))
	opts = append(opts, WithReferenceCutover(c, prefix, cutoverClock(clock), CutoverTimeout(time.Minute)))
	f.s = NewServer(l, load(t, cfg), opts...)
	return f
}

// TestReferenceKeys checks the keys the cutover counts in against the
// reference's: CacheKeyGenerator.GenerateCacheKey, src/limiter/cache_key.go
// lines 62-82 at 3fb702589d36, and the keys its test/limiter/base_limiter_test.go
// expects (lines 36, 55, 78, 107, 128) at unix second 1234.
func TestReferenceKeys(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix string
		d      *rlv3.RateLimitDescriptor
		want   string
	}{
		{"plain", "", desc("key", "value"), "domain_key_value_1234"},
		{"prefixed", "prefix:", desc("key", "value"), "prefix:domain_key_value_1234"},
		{"share_threshold", "", desc("files", "files/a.txt"), "domain_files_files/*_1234"},
		{"share_threshold, another value", "", desc("files", "files/b/c"), "domain_files_files/*_1234"},
		{"share_threshold nested", "", desc("parent", "value1", "files", "nested/x"), "domain_parent_value1_files_nested/*_1234"},
		{"share_threshold at two depths, an hour", "", desc("top", "top/a", "files", "nested/y"), "domain_top_top/*_files_nested/*_0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newCutover(t, cutoverConfig, tc.prefix)
			f.now = time.Unix(1234, 0)
			resp, err := f.s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "domain", Descriptors: []*rlv3.RateLimitDescriptor{tc.d}, HitsAddend: 3})
			require.NoError(t, err)
			require.Equal(t, pb.RateLimitResponse_OK, resp.OverallCode)
			got, err := f.mr.Get(tc.want)
			require.NoError(t, err, "keys: %v", f.mr.Keys())
			require.Equal(t, "3", got)
			unit := time.Second
			if tc.d.Entries[0].Key == "top" {
				unit = time.Hour
			}
			ttl := f.mr.TTL(tc.want)
			require.GreaterOrEqual(t, ttl, unit, "EXPIRE unit plus jitter")
			require.Less(t, ttl, unit+300*time.Second)
		})
	}
}

// TestOurKeysApart shows that no key the Limiter writes can be one of the
// reference's, with its prefix or without: every reference key ends with
// '_' and digits, and ours with ':' and digits (a window's index) or a
// calendar date; the prefix ours share is escaped and followed by ":{".
func TestOurKeysApart(t *testing.T) {
	reference := regexp.MustCompile(`_[0-9]+$`)
	for _, prefix := range []string{"", "ratelimit", "prefix_"} {
		f := newCutover(t, testConfig, prefix)
		f.ask(t, 0, desc("user", "ann_1"), desc("tenant", "t_60"))
		var refs, ours int
		for _, k := range f.mr.Keys() {
			if reference.MatchString(k) {
				refs++
				require.Regexp(t, `^`+regexp.QuoteMeta(prefix)+`api_(user_ann_1|tenant_t_60)_`+
					`1700002800$`, k)
			} else {
				ours++
				require.Regexp(t, `:\{.*\}:[0-9]+:[0-9]+$`, k)
			}
		}
		require.Equal(t, 2, refs)
		require.Positive(t, ours)
	}
}

// TestCutoverOr checks the rule of a descriptor in cutover: over when the
// reference's counter is over, or when the service's own window is.
func TestCutoverOr(t *testing.T) {
	const refKey = "api_user_ann_1700002800" // epoch starts a minute
	t.Run("the reference's counter over, ours within", func(t *testing.T) {
		f := newCutover(t, testConfig, "")
		f.mr.Set(refKey, "2") // two requests a reference pod admitted
		r := f.ask(t, 0, desc("user", "ann"))
		require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
		st := r.Statuses[0]
		require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, st.Code)
		require.Zero(t, st.LimitRemaining)
		require.GreaterOrEqual(t, st.DurationUntilReset.AsDuration(), 30*time.Second, "at least until the reference's window ends")
		got, _ := f.mr.Get(refKey)
		require.Equal(t, "3", got, "counted as the reference counts, over too")
		f.mr.Set(refKey, "0")
		r = f.ask(t, 0, desc("user", "ann"))
		require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
		require.Equal(t, uint32(1), r.Statuses[0].LimitRemaining, "the refused request was not counted in ours")
	})
	t.Run("without the cutover, the same counter changes nothing", func(t *testing.T) {
		f := newFixture(t)
		f.mr.Set(refKey, "2")
		r := f.ask(t, 0, desc("user", "ann"))
		require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
		require.Equal(t, uint32(1), r.Statuses[0].LimitRemaining)
		got, _ := f.mr.Get(refKey)
		require.Equal(t, "2", got)
	})
	t.Run("ours over, the reference's counter within", func(t *testing.T) {
		f := newCutover(t, testConfig, "")
		f.ask(t, 0, desc("user", "ann"))
		f.ask(t, 0, desc("user", "ann"))
		f.mr.Set(refKey, "0") // as if the reference's window had just begun
		r := f.ask(t, 0, desc("user", "ann"))
		require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
		require.Zero(t, r.Statuses[0].LimitRemaining)
	})
	t.Run("both within: ours remaining", func(t *testing.T) {
		f := newCutover(t, testConfig, "")
		f.mr.Set(refKey, "1")
		r := f.ask(t, 0, desc("user", "ann"))
		require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
		require.Equal(t, uint32(1), r.Statuses[0].LimitRemaining)
	})
	t.Run("a shadow rule over the reference's counter is OK, with 0 remaining", func(t *testing.T) {
		f := newCutover(t, testConfig, "")
		f.mr.Set("api_trial_x_1700002800", "1")
		r := f.ask(t, 0, desc("trial", "x"))
		require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
		require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[0].Code)
		require.Zero(t, r.Statuses[0].LimitRemaining)
	})
	t.Run("one descriptor over the reference's counter makes the request over", func(t *testing.T) {
		f := newCutover(t, testConfig, "")
		f.mr.Set("api_tenant_t_1700002800", "100")
		r := f.ask(t, 0, desc("user", "ann"), desc("tenant", "t"))
		require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
		require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[0].Code)
		require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[1].Code)
	})
}

// TestCutoverLeavesOut checks the descriptors the reference's counters do
// not see: no match, unlimited, a rule of 0, is_negative_hits, a replaced
// rule, a window of ours.
func TestCutoverLeavesOut(t *testing.T) {
	f := newCutover(t, testConfig+`
  - key: ours
    rate_limit: {window: 90s, requests_per_unit: 5}
`, "")
	negative := desc("user", "neg")
	negative.IsNegativeHits = true
	negative.HitsAddend = wrapperspb.UInt64(1)
	_, err := f.s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{
		desc("nothing", "x"), desc("health", "x"), desc("blocked", "x"), negative, desc("ours", "x"),
	}})
	require.NoError(t, err)
	f.ask(t, 0, desc("vip", "v"), desc("tenant", "replaced"))
	var refs []string
	for _, k := range f.mr.Keys() {
		if regexp.MustCompile(`_[0-9]+$`).MatchString(k) {
			refs = append(refs, k)
		}
	}
	require.Equal(t, []string{"api_vip_v_1700002800"}, refs)
}

// TestCutoverRedisFails: without a failure policy, UNAVAILABLE, as when
// the Limiter fails; with one, the Limiter's policy (here FailOpen) decides.
func TestCutoverRedisFails(t *testing.T) {
	f := newCutover(t, testConfig, "")
	f.mr.SetError("LOADING Redis is loading the dataset in memory")
	_, err := f.s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann")}})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	f = newCutover(t, testConfig, "", WithFailurePolicy(true))
	f.mr.SetError("LOADING Redis is loading the dataset in memory")
	r := f.ask(t, 0, desc("user", "ann"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
}
