package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	rlqs "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/rls"
	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

// TestQuotaService: the binary on redis-server serves RLQS: a report of a
// bucket gets a token bucket counted in Redis under the id an RLS request
// of the bucket's descriptor counts under; on SIGTERM every bucket gets a
// TTL of 0, the stream ends, what Envoy cannot have spent is given back,
// and the process exits.
func TestQuotaService(t *testing.T) {
	redisSrv := testredis.Start(t)
	s := start(t, "REDIS_URL="+redisSrv.Addr)
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := rlqs.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&rlqs.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqs.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqs.BucketId{Bucket: map[string]string{"tenant": "acme"}}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1,
	}}}))
	resp, err := stream.Recv()
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 1)
	qa := resp.BucketAction[0].GetQuotaAssignmentAction()
	tb := qa.GetRateLimitStrategy().GetTokenBucket()
	require.NotNil(t, tb, "%v", resp)
	ttl := qa.GetAssignmentTimeToLive().AsDuration()
	require.GreaterOrEqual(t, ttl, time.Second)
	require.Equal(t, time.Second, tb.GetFillInterval().AsDuration())
	m, f := int64(tb.GetMaxTokens()), int64(tb.GetTokensPerFill().GetValue())

	// the count as the conformance harness reads it
	cfg, err := rls.LoadConfig([]rls.File{{Name: "config.yaml", Data: []byte(config)}})
	require.NoError(t, err)
	match := cfg.Match("api", desc("tenant", "acme"))
	c := redis.NewClient(&redis.Options{Addr: redisSrv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	l := ratelimit.New(c)
	count := func() int64 {
		res, err := l.Peek(context.Background(), match.ID, match.Rule.Limit)
		require.NoError(t, err)
		return res.Count
	}
	require.Equal(t, m+f*int64(ttl/time.Second), count())

	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	resp, err = stream.Recv()
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 1)
	require.Zero(t, resp.BucketAction[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration())
	_, err = stream.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "%s", s.log)
	case <-time.After(20 * time.Second):
		t.Fatalf("ratelimit-rls did not exit after SIGTERM\n%s", s.log)
	}
	// given back: all but what Envoy may have spent from the report until
	// the TTL of 0 reached it, a second (delivery) and the time from the
	// report to SIGTERM, at most 2s of it on a busy machine
	require.LessOrEqual(t, count(), m+3*f)
	require.Less(t, count(), m+f*int64(ttl/time.Second))
}
