// Command example serves the standard gRPC health service behind the rate
// limit interceptors, 3 calls a second per client address, makes 5 calls
// to it as one client, prints what each got, and exits. The 4th and 5th
// calls are denied: ResourceExhausted, with a google.rpc.RetryInfo detail
// and the rate-limit header metadata. It keeps its counts in an embedded
// in-process Redis (miniredis), or a real one when REDIS_ADDR is set:
//
//	go run ./example
//	REDIS_ADDR=localhost:6379 go run ./example
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"strings"
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

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	rdb, stopRedis, err := connect()
	if err != nil {
		return err
	}
	defer stopRedis()
	// A prefix of its own, and a fresh one each run, so that a run against a
	// shared Redis starts from zero and touches nobody else's counts.
	limiter := ratelimit.New(rdb, ratelimit.WithPrefix(fmt.Sprintf("example-grpc-%d", time.Now().UnixNano())))
	limit := ratelimit.Limit{Rate: 3, Window: time.Second, Name: "per-client"}

	unary, err := grpclimit.NewUnary(limiter, limit)
	if err != nil {
		return err
	}
	stream, err := grpclimit.NewStream(limiter, limit)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())

	lis, err := net.Listen("tcp", "127.0.0.1:0") // a free loopback port
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.GracefulStop()
		<-served
		_ = limiter.Close(context.Background()) // after the server: no call runs
	}()
	fmt.Printf("gRPC server on %s, limit %v per client address\n\n", lis.Addr(), limit)

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The window is a wall-clock second. Start at the top of one, so that
	// the five calls, a few milliseconds in all, fall in one window and
	// every run prints the same outcomes.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	for i := 1; i <= 5; i++ {
		var header metadata.MD
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		if err == nil {
			fmt.Printf("call %d: OK %v\n", i, resp.GetStatus())
		} else {
			st := status.Convert(err)
			fmt.Printf("call %d: %v: %s\n", i, st.Code(), st.Message())
			for _, d := range st.Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					fmt.Printf("        RetryInfo retry_delay: %v\n", ri.GetRetryDelay().AsDuration())
				}
			}
		}
		printHeader(header)
	}
	return nil
}

// printHeader prints the rate-limit header metadata of a call.
func printHeader(md metadata.MD) {
	for _, k := range []string{
		grpclimit.HeaderLimit, grpclimit.HeaderRemaining, grpclimit.HeaderReset,
		grpclimit.HeaderRetryAfter, grpclimit.HeaderPolicy, grpclimit.HeaderRateLimit,
	} {
		if v := md.Get(k); len(v) > 0 {
			fmt.Printf("        %s: %s\n", k, strings.Join(v, ", "))
		}
	}
}

// connect returns a client of the Redis at REDIS_ADDR, or of an embedded
// miniredis, and a function that closes both.
func connect() (*redis.Client, func(), error) {
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, DialerRetries: 1})
		return rdb, func() { _ = rdb.Close() }, nil
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, DialerRetries: 1})
	return rdb, func() { _ = rdb.Close(); mr.Close() }, nil
}
