package grpclimit_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

const client = "203.0.113.7:4711"

// TestUnaryDenial checks what a client sees, header metadata and status,
// on allowed calls and on the denial after them, and that the RetryInfo
// delay is exact: the call fails 1ms before it and passes at it.
func TestUnaryDenial(t *testing.T) {
	e := newEnv(t, ratelimit.PerSecond(3), nil)
	conn := e.dial(client)

	first := call(t, conn, "A")
	require.Equal(t, codes.OK, first.code)
	require.Nil(t, first.retry)
	// One call counted at the start of the window: 2 left, and the count is
	// 0 again only when the next window has slid past it, 2s on.
	require.Equal(t, metadata.MD{
		"ratelimit-limit":     {"3"},
		"ratelimit-remaining": {"2"},
		"ratelimit-reset":     {"2"},
		"ratelimit-policy":    {`"3-per-1s";q=3;w=1`},
		"ratelimit":           {`"3-per-1s";r=2;t=2`},
	}, rateHeaders(first.header))
	require.Equal(t, []codes.Code{codes.OK, codes.OK}, callCodes(t, conn, "A", 2))

	denied := call(t, conn, "A")
	require.Equal(t, codes.ResourceExhausted, denied.code)
	// Three calls in [0s, 1s): one more fits once the estimate,
	// floor(3 × (1000 - e) / 1000) in the next window, is 2: at e = 1ms.
	require.Equal(t, ms(1001), denied.retry)
	require.Equal(t, `grpclimit: rate limit "3-per-1s" exceeded; retry in 1.001s`, denied.msg)
	require.Equal(t, metadata.MD{
		"ratelimit-limit":     {"3"},
		"ratelimit-remaining": {"0"},
		"ratelimit-reset":     {"2"},
		"ratelimit-policy":    {`"3-per-1s";q=3;w=1`},
		"ratelimit":           {`"3-per-1s";r=0;t=2`},
		"retry-after":         {"2"},
	}, rateHeaders(denied.header))

	e.clock.Add(*denied.retry - time.Millisecond)
	require.Equal(t, codes.ResourceExhausted, call(t, conn, "A").code)
	e.clock.Add(time.Millisecond)
	require.Equal(t, codes.OK, call(t, conn, "A").code)
}

// TestNeverPasses checks a call whose cost is above the rate: denied with
// no RetryInfo and nothing that names a time to retry at.
func TestNeverPasses(t *testing.T) {
	cost := grpclimit.WithCost(func(ctx context.Context, fullMethod string) int64 { return 5 })
	e := newEnv(t, ratelimit.Limit{Rate: 3, Window: time.Second, Name: `bulk "export"`}, []grpclimit.Option{cost})
	o := call(t, e.dial(client), "A")
	require.Equal(t, codes.ResourceExhausted, o.code)
	require.Nil(t, o.retry)
	require.Contains(t, o.msg, "can never pass; do not retry")
	require.Equal(t, metadata.MD{
		"ratelimit-limit":     {"3"},
		"ratelimit-remaining": {"3"},
		"ratelimit-policy":    {`"bulk \"export\"";q=3;w=1`},
		"ratelimit":           {`"bulk \"export\"";r=3`},
	}, rateHeaders(o.header))
}

// TestSpoofing checks that metadata a client sends never chooses its key:
// not without WithTrustedMetadata, and not from a peer outside the trusted
// ranges with it. Behind a trusted proxy, each client the proxy names has
// its own count.
func TestSpoofing(t *testing.T) {
	trusted := grpclimit.WithTrustedMetadata("X-Forwarded-For", netip.MustParsePrefix("10.0.0.0/8"))
	for _, tc := range []struct {
		name string
		opts []grpclimit.Option
	}{
		{"no trusted metadata", nil},
		{"untrusted peer", []grpclimit.Option{trusted}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, ratelimit.PerSecond(3), tc.opts)
			conn := e.dial(client)
			var got []codes.Code
			for i := range 5 {
				fake := netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}).String()
				got = append(got, call(t, conn, "A", "x-forwarded-for", fake, "x-real-ip", fake).code)
			}
			require.Equal(t, []codes.Code{codes.OK, codes.OK, codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}, got)
			res, err := e.limiter.Peek(t.Context(), "ip:203.0.113.7", ratelimit.PerSecond(3))
			require.NoError(t, err)
			require.Equal(t, int64(3), res.Count)
		})
	}

	t.Run("trusted proxy", func(t *testing.T) {
		e := newEnv(t, ratelimit.PerSecond(3), []grpclimit.Option{trusted})
		proxy := e.dial("10.0.0.1:443")
		// The proxy appends the address it saw to what the client sent.
		for _, c := range []string{"198.51.100.1", "198.51.100.2"} {
			require.Equal(t, repeat(codes.OK, 3), callCodes(t, proxy, "A", 3, "x-forwarded-for", "1.1.1.1, "+c))
		}
		require.Equal(t, codes.ResourceExhausted, call(t, proxy, "A", "x-forwarded-for", "198.51.100.1").code)
		// The proxy's own calls, with no client named, count as the proxy.
		require.Equal(t, repeat(codes.OK, 3), callCodes(t, proxy, "A", 3))
		// A trusted hop that wrote garbage: every such call shares one count.
		require.Equal(t, repeat(codes.OK, 3), callCodes(t, proxy, "A", 3, "x-forwarded-for", "198.51.100.1, unknown"))
		require.Equal(t, codes.ResourceExhausted, call(t, proxy, "A", "x-forwarded-for", "_hidden").code)
		res, err := e.limiter.Peek(t.Context(), httplimit.UnknownClient, ratelimit.PerSecond(3))
		require.NoError(t, err)
		require.Equal(t, int64(3), res.Count)
	})
}

// TestIPv6Grouping checks that addresses in one /64 share a count, and
// that WithIPv6Prefix changes the grouping, as in httplimit.
func TestIPv6Grouping(t *testing.T) {
	e := newEnv(t, ratelimit.PerSecond(2), nil)
	require.Equal(t, codes.OK, call(t, e.dial("[2001:db8:1:2::a]:1"), "A").code)
	require.Equal(t, codes.OK, call(t, e.dial("[2001:db8:1:2::b]:1"), "A").code)
	require.Equal(t, codes.ResourceExhausted, call(t, e.dial("[2001:db8:1:2:ffff::1]:1"), "A").code)
	require.Equal(t, codes.OK, call(t, e.dial("[2001:db8:1:3::a]:1"), "A").code)

	e = newEnv(t, ratelimit.PerSecond(2), []grpclimit.Option{grpclimit.WithIPv6Prefix(128)})
	for _, peer := range []string{"[2001:db8:1:2::a]:1", "[2001:db8:1:2::b]:1", "[2001:db8:1:2:ffff::1]:1"} {
		require.Equal(t, codes.OK, call(t, e.dial(peer), "A").code, peer)
	}
}

// TestKeyFunc counts authenticated callers by who they are, wherever they
// call from, and everyone else by address.
func TestKeyFunc(t *testing.T) {
	tokens := map[string]string{"secret-alice": "alice"} // what an auth service verified
	keyFunc := grpclimit.WithKeys(func(ctx context.Context, fullMethod string) string {
		v := metadata.ValueFromIncomingContext(ctx, "authorization")
		if len(v) != 1 || tokens[v[0]] == "" {
			return ""
		}
		return "user:" + tokens[v[0]]
	})
	e := newEnv(t, ratelimit.PerSecond(2), []grpclimit.Option{keyFunc})
	home, office := e.dial("198.51.100.1:1"), e.dial("198.51.100.2:1")
	require.Equal(t, codes.OK, call(t, home, "A", "authorization", "secret-alice").code)
	require.Equal(t, codes.OK, call(t, office, "A", "authorization", "secret-alice").code)
	require.Equal(t, codes.ResourceExhausted, call(t, office, "A", "authorization", "secret-alice").code)
	// A made-up token gets no fresh count: it is counted by its address.
	require.Equal(t, repeat(codes.OK, 2), callCodes(t, office, "A", 2, "authorization", "made-up"))
	require.Equal(t, codes.ResourceExhausted, call(t, office, "A").code)
}

// TestMethodLimits checks methods with limits of their own, several at
// once, counted apart from the rest, and a method that is not limited
// (WithSkip).
func TestMethodLimits(t *testing.T) {
	perSecond, perMinute := ratelimit.PerSecond(2), ratelimit.Limit{Rate: 3, Window: time.Minute, Name: "a-minute"}
	methods := grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{
		"/test.Echo/A": {perSecond, perMinute},
	})
	skip := grpclimit.WithSkip(func(_ context.Context, m string) bool { return m == "/test.Echo/C" })
	e := newEnv(t, ratelimit.PerSecond(3), []grpclimit.Option{methods, skip})
	conn := e.dial(client)

	require.Equal(t, codes.OK, call(t, conn, "A").code)
	o := call(t, conn, "A")
	require.Equal(t, codes.OK, o.code)
	require.Equal(t, metadata.MD{
		"ratelimit-limit":     {"2"}, // the least remaining: 0 of 2 a second
		"ratelimit-remaining": {"0"},
		"ratelimit-reset":     {"2"},
		"ratelimit-policy":    {`"2-per-1s";q=2;w=1`, `"a-minute";q=3;w=60`},
		// 2 calls at the start of a minute weigh 1 once floor(2 × (60 - e) / 60)
		// is 1 in the next minute, at e = 0.001s: 60.001s, 61 whole seconds,
		// when r grows (t; they are all gone only at 90.001s).
		"ratelimit": {`"2-per-1s";r=0;t=2`, `"a-minute";r=1;t=61`},
	}, rateHeaders(o.header))

	o = call(t, conn, "A")
	require.Equal(t, codes.ResourceExhausted, o.code)
	require.Equal(t, ms(1001), o.retry) // floor(2 × (1000 - e) / 1000) ≤ 1 at e = 1ms into the next second
	require.Contains(t, o.msg, `"2-per-1s"`)

	// B and C draw on the limit given to the interceptor, apart from A.
	require.Equal(t, append(repeat(codes.OK, 3), codes.ResourceExhausted), callCodes(t, conn, "B", 4))
	for range 10 {
		o := call(t, conn, "C")
		require.Equal(t, codes.OK, o.code)
		require.Empty(t, rateHeaders(o.header))
	}

	// A second later, a third call fits the second's limit but not the
	// minute's, which now binds: it passes in a minute and a bit.
	e.clock.Add(time.Second + 500*time.Millisecond)
	require.Equal(t, codes.OK, call(t, conn, "A").code)
	o = call(t, conn, "A")
	require.Equal(t, codes.ResourceExhausted, o.code)
	require.Equal(t, "3", o.header.Get(grpclimit.HeaderLimit)[0])
	require.Contains(t, o.msg, `"a-minute"`)
	// At 1.5s, 3 calls in this minute: one more fits at 1ms into the next.
	require.Equal(t, ms(60_001-1_500), o.retry)
	e.clock.Add(*o.retry - time.Millisecond)
	require.Equal(t, codes.ResourceExhausted, call(t, conn, "A").code)
	e.clock.Add(time.Millisecond)
	require.Equal(t, codes.OK, call(t, conn, "A").code)
}

// TestShadow checks trials: a Shadow limit among a method's limits never
// denies and stays out of the metadata, a method of Shadow limits only
// sends none, and a call that ratelimit.WithShadow let through sends none
// either, while the calls before it carry theirs.
func TestShadow(t *testing.T) {
	trial := ratelimit.Limit{Rate: 1, Window: time.Minute, Shadow: true}
	methods := grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{
		"/test.Echo/A": {ratelimit.PerSecond(3), trial},
		"/test.Echo/B": {trial},
	})
	e := newEnv(t, ratelimit.PerSecond(3), []grpclimit.Option{methods})
	conn := e.dial(client)
	for range 3 {
		o := call(t, conn, "A")
		require.Equal(t, codes.OK, o.code)
		require.Equal(t, []string{`"3-per-1s";q=3;w=1`}, o.header.Get(grpclimit.HeaderPolicy))
	}
	require.Equal(t, codes.ResourceExhausted, call(t, conn, "A").code)
	for range 3 {
		o := call(t, conn, "B")
		require.Equal(t, codes.OK, o.code)
		require.Empty(t, rateHeaders(o.header))
	}

	e = newEnv(t, ratelimit.PerSecond(2), nil, ratelimit.WithShadow(true))
	conn = e.dial(client)
	for i := range 2 {
		o := call(t, conn, "A")
		require.Equal(t, codes.OK, o.code)
		require.Equal(t, []string{strconv.Itoa(1 - i)}, o.header.Get(grpclimit.HeaderRemaining))
	}
	for range 2 {
		o := call(t, conn, "A")
		require.Equal(t, codes.OK, o.code)
		require.Empty(t, rateHeaders(o.header), "no metadata for a call shadow mode let through")
	}
}

// openStream opens /test.Echo/Stream and reads it to the end, returning its
// header metadata, how many messages came, and how it ended.
func openStream(t *testing.T, conn *grpc.ClientConn) (outcome, int) {
	t.Helper()
	cs, err := conn.NewStream(t.Context(), &grpc.StreamDesc{ServerStreams: true}, "/test.Echo/Stream")
	require.NoError(t, err)
	require.NoError(t, cs.SendMsg(&emptypb.Empty{}))
	require.NoError(t, cs.CloseSend())
	n := 0
	for {
		if err = cs.RecvMsg(new(emptypb.Empty)); err != nil {
			break
		}
		n++
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	header, herr := cs.Header()
	if herr != nil {
		header = cs.Trailer()
	}
	return outcomeOf(err, header), n
}

// TestStream checks that a stream is one decision, made when it opens,
// whatever number of messages it carries, and that it shares the count of
// unary calls to methods without limits of their own.
func TestStream(t *testing.T) {
	e := newEnv(t, ratelimit.PerSecond(3), nil)
	conn := e.dial(client)
	o, n := openStream(t, conn)
	require.Equal(t, codes.OK, o.code)
	require.Equal(t, streamMessages, n)
	require.Equal(t, []string{"2"}, o.header.Get(grpclimit.HeaderRemaining))

	o, n = openStream(t, conn)
	require.Equal(t, codes.OK, o.code)
	require.Equal(t, streamMessages, n)
	require.Equal(t, []string{"1"}, o.header.Get(grpclimit.HeaderRemaining))

	require.Equal(t, codes.OK, call(t, conn, "A").code)
	o, n = openStream(t, conn)
	require.Equal(t, codes.ResourceExhausted, o.code)
	require.Zero(t, n)
	require.Equal(t, ms(1001), o.retry)
	require.Equal(t, []string{"0"}, o.header.Get(grpclimit.HeaderRemaining))
	require.Equal(t, []string{"2"}, o.header.Get(grpclimit.HeaderRetryAfter))
}

// TestRedisDown checks each failure policy with Redis gone: FailOpen lets
// calls through, FailClosed fails them with Unavailable, FailLocal decides
// them in this process; each sends only the metadata that needs no count.
func TestRedisDown(t *testing.T) {
	policyOnly := metadata.MD{"ratelimit-limit": {"2"}, "ratelimit-policy": {`"2-per-1s";q=2;w=1`}}
	quiet := ratelimit.WithErrorHandler(func(context.Context, string, error) {})
	for _, tc := range []struct {
		policy ratelimit.FailurePolicy
		want   []codes.Code
	}{
		{ratelimit.FailOpen, repeat(codes.OK, 3)},
		{ratelimit.FailClosed, repeat(codes.Unavailable, 3)},
		{ratelimit.FailLocal, []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			e := newEnv(t, ratelimit.PerSecond(2), nil, ratelimit.WithFailurePolicy(tc.policy), quiet)
			conn := e.dial(client)
			e.mr.Close()
			for i, want := range tc.want {
				o := call(t, conn, "A")
				require.Equal(t, want, o.code, "call %d: %s", i, o.msg)
				require.Nil(t, o.retry, "call %d", i)
				require.Equal(t, policyOnly, rateHeaders(o.header), "call %d", i)
				if want == codes.ResourceExhausted {
					require.Contains(t, o.msg, "decided locally while Redis is unavailable")
				}
			}
		})
	}
}

// TestContextDone checks that a call whose context ends while it is
// decided fails with the context's status, not Unavailable, whatever the
// failure policy.
func TestContextDone(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: silentRedis(t)}) // looks alive, never answers
	t.Cleanup(func() { _ = rdb.Close() })
	l := ratelimit.New(rdb, ratelimit.WithTimeout(0), ratelimit.WithFailurePolicy(ratelimit.FailClosed),
		ratelimit.WithCircuitBreaker(0, 0), ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
	unary, err := grpclimit.NewUnary(l, ratelimit.PerSecond(3))
	require.NoError(t, err)
	info := &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}
	handler := func(context.Context, any) (any, error) { return "ran", nil }

	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = unary(canceled, nil, info, handler)
	require.Equal(t, codes.Canceled, status.Code(err), "%v", err)

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = unary(ctx, nil, info, handler)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
}

// TestInvalidCost checks that a cost below 1, a bug in WithCost's fn, fails
// the call with Internal and is logged.
func TestInvalidCost(t *testing.T) {
	logs := captureLog(t)
	e := newEnv(t, ratelimit.PerSecond(3), []grpclimit.Option{
		grpclimit.WithCost(func(context.Context, string) int64 { return 0 }),
	})
	o := call(t, e.dial(client), "A")
	require.Equal(t, codes.Internal, o.code)
	require.Empty(t, rateHeaders(o.header))
	require.Contains(t, logs.String(), "invalid cost")
	require.Contains(t, logs.String(), "/test.Echo/A")
}

// captureLog sends log/slog's default logger to a buffer until t ends.
func captureLog(t *testing.T) *syncBuffer {
	buf := &syncBuffer{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return buf
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestBadConfig checks that each configuration mistake is reported by
// NewUnary and NewStream, naming it, and that the interceptors that cannot
// report it log it once and fail every call with Internal, never letting
// one through unlimited.
func TestBadConfig(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	l := ratelimit.New(rdb)
	valid := ratelimit.PerSecond(1)
	tests := []struct {
		name    string
		limiter *ratelimit.Limiter
		limit   ratelimit.Limit
		opts    []grpclimit.Option
		want    string
	}{
		{"nil limiter", nil, valid, nil, "grpclimit: the Limiter is nil"},
		{"invalid limit", l, ratelimit.Limit{Rate: 0, Window: time.Second}, nil, ": ratelimit: invalid limit: rate 0 is below 1"},
		{"IPv6 prefix", l, valid, []grpclimit.Option{grpclimit.WithIPv6Prefix(129)}, "1 to 128 bits, not 129"},
		{"metadata key", l, valid, []grpclimit.Option{grpclimit.WithTrustedMetadata("x client", netip.MustParsePrefix("10.0.0.0/8"))}, `not "x client"`},
		{"binary key", l, valid, []grpclimit.Option{grpclimit.WithTrustedMetadata("x-ip-bin", netip.MustParsePrefix("10.0.0.0/8"))}, "binary and grpc- keys"},
		{"reserved key", l, valid, []grpclimit.Option{grpclimit.WithTrustedMetadata("grpc-peer", netip.MustParsePrefix("10.0.0.0/8"))}, "binary and grpc- keys"},
		{"pseudo-header", l, valid, []grpclimit.Option{grpclimit.WithTrustedMetadata(":authority", netip.MustParsePrefix("10.0.0.0/8"))}, "needs a metadata key"},
		{"no proxy range", l, valid, []grpclimit.Option{grpclimit.WithTrustedMetadata("x-forwarded-for")}, "no proxy range"},
		{"invalid prefix", l, valid, []grpclimit.Option{grpclimit.WithTrustedMetadata("x-forwarded-for", netip.Prefix{})}, "invalid prefix"},
		{"method name", l, valid, []grpclimit.Option{grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{"test.Echo/A": {valid}})}, `"test.Echo/A" is not a full method name`},
		{"method limit", l, valid, []grpclimit.Option{grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{"/test.Echo/A": {{Rate: 1}}})}, "/test.Echo/A: ratelimit: invalid limit"},
		{"shared count", l, valid, []grpclimit.Option{grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{"/test.Echo/A": {valid, ratelimit.PerSecond(5)}})}, "would share one count"},
		{"too many limits", l, valid, []grpclimit.Option{grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{"/test.Echo/A": make([]ratelimit.Limit, 17)})}, "/test.Echo/A: ratelimit: invalid limit: 17 limits, more than 16"},
		{"zero limit", l, valid, []grpclimit.Option{grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{"/test.Echo/A": {valid, {}}})}, "/test.Echo/A: ratelimit: invalid limit: rate 0 is below 1"},
		{"same name", l, valid, []grpclimit.Option{grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{"/test.Echo/A": {
			{Name: "p", Rate: 1, Window: time.Second}, {Name: "p", Rate: 10, Window: time.Minute}}})},
			`/test.Echo/A: ratelimit: invalid limit: two limits are named "p"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ui, err := grpclimit.NewUnary(tc.limiter, tc.limit, tc.opts...)
			require.Nil(t, ui)
			require.ErrorContains(t, err, tc.want)
			si, err := grpclimit.NewStream(tc.limiter, tc.limit, tc.opts...)
			require.Nil(t, si)
			require.ErrorContains(t, err, tc.want)

			logs := captureLog(t)
			var wg sync.WaitGroup
			srv := serve(t, &wg,
				grpc.UnaryInterceptor(grpclimit.UnaryServerInterceptor(tc.limiter, tc.limit, tc.opts...)),
				grpc.StreamInterceptor(grpclimit.StreamServerInterceptor(tc.limiter, tc.limit, tc.opts...)))
			conn := dial(t, srv, &wg, client)
			for range 3 {
				require.Equal(t, codes.Internal, call(t, conn, "A").code)
			}
			o, n := openStream(t, conn)
			require.Equal(t, codes.Internal, o.code)
			require.Zero(t, n)
			require.Equal(t, 2, strings.Count(logs.String(), "misconfigured"), "one line for each interceptor made:\n%s", logs)
			require.Contains(t, strings.ReplaceAll(logs.String(), `\"`, `"`), tc.want)
		})
	}
	// The error names the function it came from.
	_, err := grpclimit.NewUnary(l, ratelimit.Limit{})
	require.ErrorContains(t, err, "grpclimit: NewUnary's limit: ratelimit: invalid limit")
	_, err = grpclimit.NewStream(l, ratelimit.PerMinute(0))
	require.ErrorContains(t, err, "grpclimit: NewStream's limit: ratelimit: invalid limit")
	_, err = grpclimit.NewUnary(l, ratelimit.PerMinute(1), grpclimit.WithLimits(ratelimit.PerSecond(1), ratelimit.PerMinute(2)))
	require.ErrorContains(t, err, "grpclimit: NewUnary with WithLimits: ratelimit: invalid limit")
	// Several mistakes are all named.
	_, err = grpclimit.NewUnary(nil, ratelimit.Limit{}, grpclimit.WithIPv6Prefix(0))
	require.ErrorContains(t, err, "the Limiter is nil")
	require.ErrorContains(t, err, "WithIPv6Prefix")
	require.ErrorContains(t, err, "invalid limit")
}
