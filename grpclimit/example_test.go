package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
)

// The interceptors in front of the health service, 2 calls a second per
// client, and what a client sees of the third call.
func ExampleUnaryServerInterceptor() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	// A clock that stands still at the top of a second, so that the output
	// is the same on every run; leave WithClock out in a real server.
	now := time.Unix(1_700_000_000, 0)
	limiter := ratelimit.New(rdb, ratelimit.WithClock(func() time.Time { return now }))

	limit := ratelimit.PerSecond(2)
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(limiter, limit)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(limiter, limit)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 16) // in memory: a real server listens on TCP
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, _ := grpc.NewClient("passthrough:///example",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for i := 1; i <= 3; i++ {
		var header metadata.MD
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		st := status.Convert(err)
		fmt.Printf("call %d: %v, ratelimit-remaining %v\n", i, st.Code(), header.Get(grpclimit.HeaderRemaining))
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Println("  retry in", ri.GetRetryDelay().AsDuration())
			}
		}
	}
	// Output:
	// call 1: OK, ratelimit-remaining [1]
	// call 2: OK, ratelimit-remaining [0]
	// call 3: ResourceExhausted, ratelimit-remaining [0]
	//   retry in 1.001s
}
