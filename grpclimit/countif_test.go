package grpclimit_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
)

// unaryOf returns the interceptor of limit with opts on a Limiter of its
// own, and a context of a call from one peer.
func unaryOf(t *testing.T, limit ratelimit.Limit, opts ...grpclimit.Option) (grpc.UnaryServerInterceptor, context.Context, *fakeClock) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	clk := newFakeClock(start)
	l := ratelimit.New(rdb, ratelimit.WithClock(clk.Now), ratelimit.WithTimeout(time.Minute))
	in, err := grpclimit.NewUnary(l, limit, opts...)
	require.NoError(t, err)
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 1}})
	return in, ctx, clk
}

// A login method that counts failed attempts only: 5 failures a minute,
// successes never count, and a 6th failure is denied.
func TestCountIfLogin(t *testing.T) {
	in, ctx, clk := unaryOf(t, ratelimit.PerMinute(5),
		grpclimit.WithCountIf(func(_ context.Context, _ string, code codes.Code) bool { return code == codes.Unauthenticated }))
	info := &grpc.UnaryServerInfo{FullMethod: "/auth.Auth/Login"}
	login := func(right bool) codes.Code {
		_, err := in(ctx, nil, info, func(context.Context, any) (any, error) {
			if !right {
				return nil, status.Error(codes.Unauthenticated, "wrong password")
			}
			return "welcome", nil
		})
		return status.Code(err)
	}
	for i := range 20 {
		require.Equal(t, codes.OK, login(true), "success %d never counts", i)
	}
	for i := range 5 {
		require.Equal(t, codes.Unauthenticated, login(false), "failure %d", i)
	}
	require.Equal(t, codes.ResourceExhausted, login(false), "the 6th failure")
	clk.Add(2 * time.Minute)
	require.Equal(t, codes.OK, login(true))
}

// Charge adds to the caller's counts what its handler learns the call
// costs; outside a call that passed the interceptor it is an error.
func TestCharge(t *testing.T) {
	in, ctx, _ := unaryOf(t, ratelimit.PerMinute(10))
	info := &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}
	var chargeErr error
	work := func(ctx context.Context, _ any) (any, error) {
		chargeErr = grpclimit.Charge(ctx, 4)
		return nil, nil
	}
	for range 2 {
		_, err := in(ctx, nil, info, work)
		require.NoError(t, err)
		require.NoError(t, chargeErr)
	}
	_, err := in(ctx, nil, info, work)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "10 counted: 5 a call")
	require.Error(t, grpclimit.Charge(context.Background(), 1))
}

// fakeStream is a server stream of ctx that carries no messages.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s fakeStream) Context() context.Context     { return s.ctx }
func (s fakeStream) SetHeader(metadata.MD) error  { return nil }
func (s fakeStream) SendHeader(metadata.MD) error { return nil }
func (s fakeStream) SetTrailer(metadata.MD)       {}
func (s fakeStream) SendMsg(any) error            { return nil }
func (s fakeStream) RecvMsg(any) error            { return nil }

// A stream's code is its handler's return: the same login rule, by stream,
// and Charge from the stream's context.
func TestCountIfStream(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	l := ratelimit.New(rdb, ratelimit.WithClock(newFakeClock(start).Now), ratelimit.WithTimeout(time.Minute))
	in, err := grpclimit.NewStream(l, ratelimit.PerMinute(5),
		grpclimit.WithCountIf(func(_ context.Context, _ string, code codes.Code) bool { return code == codes.Unauthenticated }))
	require.NoError(t, err)
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 1}})
	info := &grpc.StreamServerInfo{FullMethod: "/auth.Auth/Login"}
	open := func(handler grpc.StreamHandler) codes.Code {
		return status.Code(in(nil, fakeStream{ctx: ctx}, info, handler))
	}
	ok := func(any, grpc.ServerStream) error { return nil }
	fail := func(any, grpc.ServerStream) error { return status.Error(codes.Unauthenticated, "no") }
	for range 10 {
		require.Equal(t, codes.OK, open(ok))
	}
	for range 5 {
		require.Equal(t, codes.Unauthenticated, open(fail))
	}
	require.Equal(t, codes.ResourceExhausted, open(fail))
	var chargeErr error
	in2, err := grpclimit.NewStream(l, ratelimit.PerMinute(10))
	require.NoError(t, err)
	code := status.Code(in2(nil, fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: "/test.Echo/Other"}, func(_ any, ss grpc.ServerStream) error {
		chargeErr = grpclimit.Charge(ss.Context(), 9)
		return nil
	}))
	require.Equal(t, codes.OK, code)
	require.NoError(t, chargeErr)
	code = status.Code(in2(nil, fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: "/test.Echo/Other"}, ok))
	require.Equal(t, codes.ResourceExhausted, code, "1 + 9 counted")
}

// A handler that panics is codes.Internal, as a recovery interceptor
// answers it: WithCountIf sees Internal, so an API that does not count its
// failures does not count it, unary or stream; httplimit's
// TestCountIfPanic is the same rule with 500.
func TestCountIfPanic(t *testing.T) {
	notInternal := func(_ context.Context, _ string, code codes.Code) bool { return code != codes.Internal }
	in, ctx, _ := unaryOf(t, ratelimit.PerMinute(2), grpclimit.WithCountIf(notInternal))
	info := &grpc.UnaryServerInfo{FullMethod: "/test.Echo/A"}
	boom := func(context.Context, any) (any, error) { panic("boom") }
	for range 5 {
		require.PanicsWithValue(t, "boom", func() { _, _ = in(ctx, nil, info, boom) })
	}
	ok := func(context.Context, any) (any, error) { return "ok", nil }
	for range 2 {
		_, err := in(ctx, nil, info, ok)
		require.NoError(t, err, "no panic was counted")
	}

	// The same with a rule that counts everything: each panic counted.
	all, ctx, _ := unaryOf(t, ratelimit.PerMinute(2),
		grpclimit.WithCountIf(func(context.Context, string, codes.Code) bool { return true }))
	for range 2 {
		require.Panics(t, func() { _, _ = all(ctx, nil, info, boom) })
	}
	_, err := all(ctx, nil, info, ok)
	require.Equal(t, codes.ResourceExhausted, status.Code(err))

	// A stream's panic, refunded as well.
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	l := ratelimit.New(rdb, ratelimit.WithClock(newFakeClock(start).Now), ratelimit.WithTimeout(time.Minute))
	sin, err := grpclimit.NewStream(l, ratelimit.PerMinute(2), grpclimit.WithCountIf(notInternal))
	require.NoError(t, err)
	sinfo := &grpc.StreamServerInfo{FullMethod: "/test.Echo/Stream"}
	for range 5 {
		require.Panics(t, func() {
			_ = sin(nil, fakeStream{ctx: ctx}, sinfo, func(any, grpc.ServerStream) error { panic("boom") })
		})
	}
	require.NoError(t, sin(nil, fakeStream{ctx: ctx}, sinfo, func(any, grpc.ServerStream) error { return nil }), "no panic was counted")
}
