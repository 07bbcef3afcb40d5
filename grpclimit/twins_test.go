package grpclimit_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// grpclimit's ClientKey, PolicyName and ResetSeconds are httplimit's: one
// client is one count, and one limit one name, over HTTP and gRPC alike.
func TestTwinsShareKeysAndNames(t *testing.T) {
	require.Equal(t, httplimit.UnknownClient, grpclimit.UnknownClient)
	for _, a := range []string{"203.0.113.7", "::ffff:203.0.113.7", "2001:db8:1:2:3:4:5:6", "fe80::1%eth0", "::"} {
		addr := netip.MustParseAddr(a)
		for _, bits := range []int{0, 48, 64, 128, 129} {
			require.Equal(t, httplimit.ClientKey(addr, bits), grpclimit.ClientKey(addr, bits), "%s /%d", a, bits)
		}
	}
	for _, limit := range []ratelimit.Limit{
		{Name: "burst", Rate: 5, Window: time.Second},
		ratelimit.PerMinute(100),
		{Rate: 10, Window: 500 * time.Millisecond},
		{Name: `a "quoted" name`, Rate: 1, Window: time.Hour},
	} {
		require.Equal(t, httplimit.PolicyName(limit), grpclimit.PolicyName(limit))
	}
	for _, res := range []ratelimit.Result{
		{Allowed: true, ResetAfter: 1500 * time.Millisecond},
		{RetryAfter: 200 * time.Millisecond, ResetAfter: time.Minute},
		{RetryAfter: -1, ResetAfter: time.Minute},
	} {
		require.Equal(t, httplimit.ResetSeconds(res), grpclimit.ResetSeconds(res))
	}
}

type ctxKey string

// WithKeys tries each KeyFunc in turn, the client address last, as
// httplimit.WithKeys does; WithKeyFunc is WithKeys of one.
func TestKeysInTurn(t *testing.T) {
	fromCtx := func(k ctxKey, kind string) grpclimit.KeyFunc {
		return func(ctx context.Context, _ string) string {
			if v, _ := ctx.Value(k).(string); v != "" {
				return kind + v
			}
			return ""
		}
	}
	in, ctx, _ := unaryOf(t, ratelimit.PerMinute(1),
		grpclimit.WithKeys(fromCtx("user", "user:"), nil, fromCtx("svc", "svc:")))
	info := &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}
	code := func(ctx context.Context) codes.Code {
		_, err := in(ctx, nil, info, func(context.Context, any) (any, error) { return "ok", nil })
		return status.Code(err)
	}
	alice := context.WithValue(ctx, ctxKey("user"), "alice")
	both := context.WithValue(alice, ctxKey("svc"), "billing")
	billing := context.WithValue(ctx, ctxKey("svc"), "billing")
	require.Equal(t, codes.OK, code(alice))
	require.Equal(t, codes.ResourceExhausted, code(both), "the first KeyFunc answers: alice again")
	require.Equal(t, codes.OK, code(billing), "the second KeyFunc: a count of its own")
	require.Equal(t, codes.OK, code(ctx), "no identity: the address, a count of its own")
	require.Equal(t, codes.ResourceExhausted, code(ctx))

	old, ctx, _ := unaryOf(t, ratelimit.PerMinute(1), grpclimit.WithKeyFunc(fromCtx("user", "user:")))
	for _, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
		_, err := old(alice, nil, info, func(context.Context, any) (any, error) { return "ok", nil })
		require.Equal(t, want, status.Code(err))
	}
	_, err := old(ctx, nil, info, func(context.Context, any) (any, error) { return "ok", nil })
	require.NoError(t, err, "WithKeyFunc falls back to the address too")
}

// An empty plan from WithPlanFunc (nil or no limit) is the default plan,
// the interceptor's limit and WithLimits', never "not limited", as in
// httplimit (TestEmptyPlanIsTheDefaultPlan there); a method mapped to no
// limits is a configuration error that names WithSkip.
func TestEmptyPlanIsTheDefaultPlan(t *testing.T) {
	burst := ratelimit.Limit{Name: "burst", Rate: 2, Window: time.Second}
	daily := ratelimit.Limit{Name: "daily", Rate: 100, Window: 24 * time.Hour}
	in, ctx, _ := unaryOf(t, burst, grpclimit.WithLimits(daily),
		grpclimit.WithPlanFunc(func(_ context.Context, m string) []ratelimit.Limit {
			if m == "/test.Echo/A" {
				return nil
			}
			return []ratelimit.Limit{}
		}))
	var seen []ratelimit.Limit
	handler := func(ctx context.Context, _ any) (any, error) {
		rs, ok := grpclimit.FromContextAll(ctx)
		require.True(t, ok)
		seen = seen[:0]
		for _, r := range rs {
			seen = append(seen, r.Limit)
		}
		return "ok", nil
	}
	for _, m := range []string{"/test.Echo/A", "/test.Echo/B"} {
		_, err := in(ctx, nil, &grpc.UnaryServerInfo{FullMethod: m}, handler)
		require.NoError(t, err)
		require.Equal(t, []ratelimit.Limit{burst, daily}, seen, m)
	}
	_, err := in(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/test.Echo/C"}, handler)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "both methods drew on the default plan's one count")

	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	_, err = grpclimit.NewUnary(ratelimit.New(rdb), burst,
		grpclimit.WithMethodLimits(map[string][]ratelimit.Limit{"/grpc.health.v1.Health/Check": nil}))
	require.ErrorContains(t, err, "WithSkip")
}

// A plan from WithPlanFunc that the default one could not be fails the
// call with codes.Internal, as httplimit answers it with 500.
func TestBadPlanIsInternal(t *testing.T) {
	in, ctx, _ := unaryOf(t, ratelimit.PerMinute(5), grpclimit.WithPlanFunc(func(context.Context, string) []ratelimit.Limit {
		return []ratelimit.Limit{{Name: "x", Rate: 1, Window: time.Second}, {Name: "x", Rate: 5, Window: time.Minute}}
	}))
	var seen error
	in2, ctx2, _ := unaryOf(t, ratelimit.PerMinute(5), grpclimit.WithPlanFunc(func(context.Context, string) []ratelimit.Limit {
		return []ratelimit.Limit{{}}
	}), grpclimit.WithErrorHandler(func(_ context.Context, _ string, err error) error { seen = err; return nil }))
	logs := captureLog(t)
	_, err := in(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}, okHandler)
	require.Equal(t, codes.Internal, status.Code(err))
	require.Contains(t, logs.String(), "two limits are named")
	_, err = in2(ctx2, nil, &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}, okHandler)
	require.Equal(t, codes.Internal, status.Code(err), "the handler's nil keeps the default")
	require.ErrorIs(t, seen, ratelimit.ErrInvalidLimit)
	require.ErrorContains(t, seen, "WithPlanFunc")
}

func okHandler(context.Context, any) (any, error) { return "ok", nil }

// FromContext and FromContextAll give the handler, and the denied and
// error handlers, the call's decision, as httplimit's give a request's;
// a call let through uncounted has none.
func TestFromContext(t *testing.T) {
	var denied ratelimit.Result
	in, ctx, _ := unaryOf(t, ratelimit.PerMinute(2), grpclimit.WithDeniedHandler(func(ctx context.Context, _ string) error {
		var ok bool
		denied, ok = grpclimit.FromContext(ctx)
		require.True(t, ok)
		return nil
	}))
	info := &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}
	var got ratelimit.Result
	var ok bool
	for i := range 2 {
		_, err := in(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
			got, ok = grpclimit.FromContext(ctx)
			return "ok", nil
		})
		require.NoError(t, err)
		require.True(t, ok)
		require.True(t, got.Allowed)
		require.Equal(t, int64(1-i), got.Remaining)
	}
	_, err := in(ctx, nil, info, okHandler)
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	require.False(t, denied.Allowed)
	require.Equal(t, ratelimit.PerMinute(2), denied.Limit)
	_, ok = grpclimit.FromContext(context.Background())
	require.False(t, ok)
	_, ok = grpclimit.FromContextAll(context.Background())
	require.False(t, ok)
}

// WithSkip and WithAllowList let calls through uncounted, with no
// decision in their context, as httplimit's do; the allow list reads the
// address the call is counted by.
func TestSkipAndAllowList(t *testing.T) {
	in, ctx, _ := unaryOf(t, ratelimit.PerMinute(1),
		grpclimit.WithSkip(func(_ context.Context, m string) bool { return m == "/grpc.health.v1.Health/Check" }),
		grpclimit.WithAllowList(netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::ffff:192.0.2.0/120")))
	uncounted := func(ctx context.Context, _ any) (any, error) {
		_, ok := grpclimit.FromContext(ctx)
		require.False(t, ok, "no decision")
		return "ok", nil
	}
	health := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
	for range 5 {
		_, err := in(ctx, nil, health, uncounted)
		require.NoError(t, err)
	}
	office := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 1}})
	mapped := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.9"), Port: 1}})
	info := &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}
	for range 5 {
		_, err := in(office, nil, info, uncounted)
		require.NoError(t, err)
		_, err = in(mapped, nil, info, uncounted)
		require.NoError(t, err)
	}
	_, err := in(ctx, nil, info, okHandler)
	require.NoError(t, err)
	_, err = in(ctx, nil, info, okHandler)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "others are counted")

	_, err = grpclimit.NewUnary(nil, ratelimit.PerMinute(1), grpclimit.WithAllowList(netip.Prefix{}))
	require.ErrorContains(t, err, "WithAllowList was given an invalid prefix")
}

// WithDeniedHandler and WithErrorHandler choose the status of a denied
// call and of one the limiter failed, as httplimit's answer the request;
// a nil return keeps the default.
func TestDeniedAndErrorHandlers(t *testing.T) {
	slow := status.Error(codes.Unavailable, "slow down")
	custom := true
	var costErr error
	in, ctx, _ := unaryOf(t, ratelimit.PerMinute(1),
		grpclimit.WithDeniedHandler(func(context.Context, string) error {
			if custom {
				return slow
			}
			return nil
		}),
		grpclimit.WithCost(func(_ context.Context, m string) int64 {
			if m == "/test.Echo/Free" {
				return 0
			}
			return 1
		}),
		grpclimit.WithErrorHandler(func(ctx context.Context, _ string, err error) error {
			costErr = err
			if _, ok := grpclimit.FromContext(ctx); !ok {
				return status.Error(codes.DataLoss, "no decision in the context")
			}
			if custom {
				return status.Error(codes.FailedPrecondition, "bad cost")
			}
			return nil
		}))
	info := &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}
	_, err := in(ctx, nil, info, okHandler)
	require.NoError(t, err)
	_, err = in(ctx, nil, info, okHandler)
	require.Equal(t, slow, err)
	custom = false
	_, err = in(ctx, nil, info, okHandler)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "the default")
	require.Len(t, status.Convert(err).Details(), 1, "with its RetryInfo")

	free := &grpc.UnaryServerInfo{FullMethod: "/test.Echo/Free"}
	custom = true
	_, err = in(ctx, nil, free, okHandler)
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	require.ErrorIs(t, costErr, ratelimit.ErrInvalidCost)
	custom = false
	logs := captureLog(t)
	_, err = in(ctx, nil, free, okHandler)
	require.Equal(t, codes.Internal, status.Code(err), "the default")
	require.Contains(t, logs.String(), "rejected a call's input")
}

// WithShadowHandler hears each denial a Shadow limit would have made, and
// the call goes on, as in httplimit.
func TestShadowHandler(t *testing.T) {
	trial := ratelimit.Limit{Name: "trial", Rate: 1, Window: time.Hour, Shadow: true}
	var heard []ratelimit.Result
	in, ctx, _ := unaryOf(t, ratelimit.PerMinute(10), grpclimit.WithLimits(trial),
		grpclimit.WithShadowHandler(func(ctx context.Context, m string, res ratelimit.Result) {
			_, ok := grpclimit.FromContext(ctx)
			require.True(t, ok)
			require.Equal(t, "/test.Echo/A", m)
			heard = append(heard, res)
		}))
	info := &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}
	for range 3 {
		_, err := in(ctx, nil, info, okHandler)
		require.NoError(t, err)
	}
	require.Len(t, heard, 2, "the 2nd and 3rd calls")
	require.Equal(t, trial, heard[0].Limit)
	require.True(t, heard[0].Shadowed)
}
