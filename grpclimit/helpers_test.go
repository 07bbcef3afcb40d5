package grpclimit_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
)

// start is where every test's fake clock starts: on a whole minute, so
// that a window of a second or a minute begins there.
var start = time.Unix(1_700_000_040, 0)

// streamMessages is how many messages the test service's stream sends.
const streamMessages = 5

// testService is a gRPC service registered by hand, no protoc needed:
// unary methods A, B and C that answer an Empty with an Empty, and a
// server-streaming method Stream that answers with streamMessages Empties.
var testService = grpc.ServiceDesc{
	ServiceName: "test.Echo",
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{unaryMethod("A"), unaryMethod("B"), unaryMethod("C")},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			if err := ss.RecvMsg(new(emptypb.Empty)); err != nil {
				return err
			}
			for range streamMessages {
				if err := ss.SendMsg(&emptypb.Empty{}); err != nil {
					return err
				}
			}
			return nil
		},
	}},
}

func unaryMethod(name string) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			handler := func(context.Context, any) (any, error) { return &emptypb.Empty{}, nil }
			if icpt == nil {
				return handler(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Echo/" + name}, handler)
		},
	}
}

// env is one test's world: miniredis, a fake clock, a Limiter on both, and
// a gRPC server with the interceptors under test.
type env struct {
	t       *testing.T
	mr      *miniredis.Miniredis
	clock   *fakeClock
	limiter *ratelimit.Limiter
	srv     *grpc.Server
	serving sync.WaitGroup
}

// newEnv starts a server whose calls are decided against limit with opts.
// limiterOpts go to ratelimit.New, after the fake clock.
func newEnv(t *testing.T, limit ratelimit.Limit, opts []grpclimit.Option, limiterOpts ...ratelimit.Option) *env {
	t.Helper()
	e := &env{t: t, mr: miniredis.RunT(t), clock: newFakeClock(start)}
	rdb := redis.NewClient(&redis.Options{Addr: e.mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	e.limiter = ratelimit.New(rdb, append([]ratelimit.Option{ratelimit.WithClock(e.clock.Now)}, limiterOpts...)...)
	t.Cleanup(func() { require.NoError(t, e.limiter.Close(context.Background())) }) // before the client closes
	unary, err := grpclimit.NewUnary(e.limiter, limit, opts...)
	require.NoError(t, err)
	stream, err := grpclimit.NewStream(e.limiter, limit, opts...)
	require.NoError(t, err)
	e.srv = serve(t, &e.serving, grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	return e
}

// serve makes a server with the test service that stops when t ends.
func serve(t *testing.T, wg *sync.WaitGroup, opts ...grpc.ServerOption) *grpc.Server {
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&testService, struct{}{})
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})
	return srv
}

// dial returns a client whose connections reach srv from peer, an
// "addr:port", or any other string for a peer that is not an IP address.
// Each client has its own in-memory listener, whose connections report
// peer as their remote address, so that one server sees many peers.
func dial(t *testing.T, srv *grpc.Server, wg *sync.WaitGroup, peer string) *grpc.ClientConn {
	t.Helper()
	var remote net.Addr = fakeAddr(peer)
	if ap, err := netip.ParseAddrPort(peer); err == nil {
		remote = net.TCPAddrFromAddrPort(ap)
	}
	lis := &peerListener{Listener: bufconn.Listen(1 << 16), remote: remote}
	wg.Go(func() { _ = srv.Serve(lis) })
	conn, err := grpc.NewClient("passthrough:///"+peer,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func (e *env) dial(peer string) *grpc.ClientConn { return dial(e.t, e.srv, &e.serving, peer) }

// peerListener is a bufconn.Listener whose connections come from remote.
type peerListener struct {
	*bufconn.Listener
	remote net.Addr
}

func (l *peerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &peerConn{Conn: c, remote: l.remote}, nil
}

type peerConn struct {
	net.Conn
	remote net.Addr
}

func (c *peerConn) RemoteAddr() net.Addr { return c.remote }

// fakeAddr is the address of a peer that is not an IP address.
type fakeAddr string

func (a fakeAddr) Network() string { return "fake" }
func (a fakeAddr) String() string  { return string(a) }

// outcome is what a client saw of one call.
type outcome struct {
	code   codes.Code
	msg    string
	header metadata.MD
	retry  *time.Duration // the RetryInfo's delay; nil for none
}

// call calls /test.Echo/<method> on conn, sending md (key, value pairs).
func call(t *testing.T, conn *grpc.ClientConn, method string, md ...string) outcome {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(t.Context(), md...)
	var header metadata.MD
	err := conn.Invoke(ctx, "/test.Echo/"+method, &emptypb.Empty{}, &emptypb.Empty{}, grpc.Header(&header))
	return outcomeOf(err, header)
}

func outcomeOf(err error, header metadata.MD) outcome {
	st := status.Convert(err)
	o := outcome{code: st.Code(), msg: st.Message(), header: header}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay := ri.GetRetryDelay().AsDuration()
			o.retry = &delay
		}
	}
	return o
}

// rateHeaders returns the rate-limit metadata of md, leaving out what gRPC
// itself sends (content-type).
func rateHeaders(md metadata.MD) metadata.MD {
	out := metadata.MD{}
	for _, k := range []string{
		grpclimit.HeaderLimit, grpclimit.HeaderRemaining, grpclimit.HeaderReset,
		grpclimit.HeaderPolicy, grpclimit.HeaderRateLimit, grpclimit.HeaderRetryAfter,
	} {
		if v := md.Get(k); len(v) > 0 {
			out[k] = v
		}
	}
	return out
}

// callCodes returns the codes of n calls of method.
func callCodes(t *testing.T, conn *grpc.ClientConn, method string, n int, md ...string) []codes.Code {
	t.Helper()
	out := make([]codes.Code, n)
	for i := range out {
		out[i] = call(t, conn, method, md...).code
	}
	return out
}

func repeat(c codes.Code, n int) []codes.Code {
	out := make([]codes.Code, n)
	for i := range out {
		out[i] = c
	}
	return out
}

func ms(n int64) *time.Duration {
	d := time.Duration(n) * time.Millisecond
	return &d
}

// fakeClock is a clock that moves only when told to. Its Now fits
// ratelimit.WithClock; it is safe for simultaneous use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// silentRedis returns the address of a listener that accepts connections
// and reads from them but never answers: a Redis that looks alive and
// hangs. It stops when t ends.
func silentRedis(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
		}
	})
	return ln.Addr().String()
}
