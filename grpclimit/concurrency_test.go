package grpclimit_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
)

// slow is a service whose Hold (unary) and Watch (server stream) run until
// the test lets them go: each says on entered that it runs, and returns
// when leave is closed.
type slow struct {
	entered chan struct{}
	leave   chan struct{}
}

var slowService = grpc.ServiceDesc{
	ServiceName: "test.Slow",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Hold",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			if err := dec(new(emptypb.Empty)); err != nil {
				return nil, err
			}
			s := srv.(*slow)
			handler := func(context.Context, any) (any, error) {
				s.entered <- struct{}{}
				<-s.leave
				return &emptypb.Empty{}, nil
			}
			return icpt(ctx, &emptypb.Empty{}, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Slow/Hold"}, handler)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		ServerStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			s := srv.(*slow)
			if err := ss.RecvMsg(new(emptypb.Empty)); err != nil {
				return err
			}
			s.entered <- struct{}{}
			<-s.leave
			return ss.SendMsg(&emptypb.Empty{})
		},
	}},
}

// slowEnv serves the slow service behind the interceptors with opts, on
// miniredis (its clock is real time: a lease ends as time passes).
func slowEnv(t *testing.T, opts ...grpclimit.Option) (*grpc.ClientConn, *slow, *ratelimit.Limiter) {
	return slowEnvOf(t, ratelimit.PerMinute(100), opts...)
}

// slowEnvOf is slowEnv with limit for the interceptors' own.
func slowEnvOf(t *testing.T, limit ratelimit.Limit, opts ...grpclimit.Option) (*grpc.ClientConn, *slow, *ratelimit.Limiter) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	l := ratelimit.New(rdb, ratelimit.WithTimeout(time.Minute))
	unary, err := grpclimit.NewUnary(l, limit, opts...)
	require.NoError(t, err)
	stream, err := grpclimit.NewStream(l, limit, opts...)
	require.NoError(t, err)
	s := &slow{entered: make(chan struct{}), leave: make(chan struct{})}
	srv := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	srv.RegisterService(&slowService, s)
	var wg sync.WaitGroup
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	return dial(t, srv, &wg, "203.0.113.9:1"), s, l
}

func hold(ctx context.Context, conn *grpc.ClientConn) outcome {
	var header metadata.MD
	err := conn.Invoke(ctx, "/test.Slow/Hold", &emptypb.Empty{}, &emptypb.Empty{}, grpc.Header(&header))
	return outcomeOf(err, header)
}

// A unary call holds a slot while its handler runs: a second call of the
// same caller meanwhile is ResourceExhausted with a RetryInfo and the
// concurrency limit's metadata, counted by neither limit.
func TestWithConcurrencyUnary(t *testing.T) {
	c := ratelimit.Concurrency{Max: 1, Lease: time.Minute, Name: "exports"}
	conn, s, l := slowEnv(t, grpclimit.WithConcurrency(c))
	done := make(chan outcome, 1)
	go func() { done <- hold(t.Context(), conn) }()
	<-s.entered
	o := hold(t.Context(), conn)
	require.Equal(t, codes.ResourceExhausted, o.code, o.msg)
	require.NotNil(t, o.retry)
	require.Positive(t, *o.retry)
	require.Equal(t, []string{"1"}, o.header.Get(grpclimit.HeaderLimit))
	require.Equal(t, []string{"0"}, o.header.Get(grpclimit.HeaderRemaining))
	require.Contains(t, o.header.Get(grpclimit.HeaderPolicy), `"exports";q=1;qu="concurrent-requests"`)
	res, err := l.Peek(t.Context(), "ip:203.0.113.9", ratelimit.PerMinute(100))
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Count, "the refused call is not counted by the plan")
	close(s.leave)
	require.Equal(t, codes.OK, (<-done).code)
	s.leave = make(chan struct{})
	go func() { done <- hold(t.Context(), conn) }()
	select {
	case <-s.entered:
	case o := <-done:
		t.Fatalf("the call did not run: %v %s", o.code, o.msg)
	}
	close(s.leave)
	require.Equal(t, codes.OK, (<-done).code, "released when the first handler returned")
}

// A stream holds its slot for its life, its lease extended while it runs:
// past three of its leases, another call is still refused; once it ends,
// the slot is free.
func TestWithConcurrencyStream(t *testing.T) {
	c := ratelimit.Concurrency{Max: 1, Lease: 40 * time.Millisecond}
	conn, s, l := slowEnv(t, grpclimit.WithConcurrency(c))
	ctx := t.Context()
	st, err := conn.NewStream(ctx, &slowService.Streams[0], "/test.Slow/Watch")
	require.NoError(t, err)
	require.NoError(t, st.SendMsg(&emptypb.Empty{}))
	require.NoError(t, st.CloseSend())
	<-s.entered
	held := time.Now()
	for time.Since(held) < 3*c.Lease { // the lease runs on Redis's clock: real time must pass
		o := hold(ctx, conn)
		require.Equal(t, codes.ResourceExhausted, o.code, "the stream's slot is still held after %v", time.Since(held))
		time.Sleep(5 * time.Millisecond)
	}
	close(s.leave)
	require.NoError(t, st.RecvMsg(new(emptypb.Empty)))
	require.ErrorIs(t, st.RecvMsg(new(emptypb.Empty)), io.EOF, "the stream's status: its interceptor has returned")
	s.leave = make(chan struct{})
	done := make(chan outcome, 1)
	go func() { done <- hold(ctx, conn) }()
	select {
	case <-s.entered:
	case o := <-done:
		t.Fatalf("the call did not run: %v %s", o.code, o.msg)
	}
	close(s.leave)
	require.Equal(t, codes.OK, (<-done).code, "released when the stream ended")
	stats := l.Stats()
	require.Equal(t, stats.SlotsAcquired, stats.SlotsReleased)
}

func TestWithConcurrencyInvalid(t *testing.T) {
	_, err := grpclimit.NewUnary(ratelimit.New(nil), ratelimit.PerMinute(1), grpclimit.WithConcurrency(ratelimit.Concurrency{Max: 1}))
	require.ErrorContains(t, err, "WithConcurrency")
}

func TestWithConcurrencyNameCollision(t *testing.T) {
	_, err := grpclimit.NewUnary(ratelimit.New(nil), ratelimit.Limit{Rate: 10, Window: time.Second, Name: "exports"},
		grpclimit.WithConcurrency(ratelimit.Concurrency{Max: 2, Lease: time.Second, Name: "exports"}))
	require.ErrorContains(t, err, "both named")
}

// WithConcurrency alone, with the zero Limit, as httplimit's: calls hold
// slots and are decided by no rate plan.
func TestWithConcurrencyAlone(t *testing.T) {
	c := ratelimit.Concurrency{Max: 1, Lease: time.Minute, Name: "exports"}
	conn, s, l := slowEnvOf(t, ratelimit.Limit{}, grpclimit.WithConcurrency(c))
	done := make(chan outcome, 1)
	go func() { done <- hold(t.Context(), conn) }()
	<-s.entered
	o := hold(t.Context(), conn)
	require.Equal(t, codes.ResourceExhausted, o.code, o.msg)
	require.Equal(t, []string{`"exports";q=1;qu="concurrent-requests"`}, o.header.Get(grpclimit.HeaderPolicy), "no rate policy")
	close(s.leave)
	require.Equal(t, codes.OK, (<-done).code)
	res, err := l.Peek(t.Context(), "ip:203.0.113.9", ratelimit.PerMinute(100))
	require.NoError(t, err)
	require.Zero(t, res.Count, "no rate counted")
	for _, opts := range [][]grpclimit.Option{nil, {grpclimit.WithConcurrency(c), grpclimit.WithLimits(ratelimit.PerMinute(5))}} {
		_, err := grpclimit.NewUnary(l, ratelimit.Limit{}, opts...)
		require.ErrorContains(t, err, "zero Limit")
	}
}
