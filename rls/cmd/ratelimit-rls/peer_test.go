package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

// peerConfig is what both services load, unchanged: rules of an hour, so
// that a trace runs within one window of each.
const peerConfig = `
domain: peer
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 12, name: tenant}
  - key: vip
    rate_limit: {unit: hour, requests_per_unit: 50, replaces: [{name: tenant}]}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: health
    rate_limit: {unlimited: true}
  - key: header_match
    value: checkout
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 4}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// startReference runs envoyproxy/ratelimit's service_cmd (RLS_REFERENCE
// names it; .ci/run builds it with go install) on redisAddr with config.
func startReference(t *testing.T, bin, redisAddr, config string) string {
	t.Helper()
	s := launchReference(t, bin, map[string]string{"config.yaml": config}, "REDIS_URL="+redisAddr)
	s.waitHealthy(t)
	return s.grpcAddr
}

// launchReference starts the reference as launch starts this service: its
// ports, a configuration directory of files (by name; written before it
// starts, since it reads them once at start-up and then watches), the
// environment env on top.
func launchReference(t *testing.T, bin string, files map[string]string, env ...string) *service {
	t.Helper()
	root := t.TempDir()
	s := &service{configDir: filepath.Join(root, "ratelimit", "config"), log: &syncBuffer{}}
	require.NoError(t, os.MkdirAll(s.configDir, 0o755))
	for name, data := range files {
		require.NoError(t, os.WriteFile(filepath.Join(s.configDir, name), []byte(data), 0o644))
	}
	grpcPort, httpPort, debugPort := testredis.FreePort(t), testredis.FreePort(t), testredis.FreePort(t)
	s.grpcAddr, s.httpAddr = fmt.Sprintf("127.0.0.1:%d", grpcPort), fmt.Sprintf("127.0.0.1:%d", httpPort)
	s.cmd = exec.Command(bin)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"), "USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=warn",
		"GRPC_HOST=127.0.0.1", fmt.Sprint("GRPC_PORT=", grpcPort), "HOST=127.0.0.1", fmt.Sprint("PORT=", httpPort),
		"DEBUG_HOST=127.0.0.1", fmt.Sprint("DEBUG_PORT=", debugPort),
		"REDIS_SOCKET_TYPE=tcp",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
	}, env...)
	require.NoError(t, s.cmd.Start())
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	})
	return s
}

// referenceBinary returns the reference's binary, or skips the test saying
// why.
func referenceBinary(t *testing.T) string {
	bin := os.Getenv("RLS_REFERENCE")
	if bin == "" {
		t.Skip("RLS_REFERENCE is not set: .ci/run builds envoyproxy/ratelimit (go install github.com/envoyproxy/ratelimit/src/service_cmd@…) and names it")
	}
	return bin
}

// TestPeer sends envoyproxy/ratelimit and this service the same calls, on
// one redis-server, with the same configuration file, on fresh keys within
// one window: their answers are equal field by field but for
// duration_until_reset, and where this service is better on purpose: a
// request over some limit is counted under none of its descriptors (the
// reference counts every one, past their limits too), so that an id such
// a request touched has, from then on, at least the reference's remaining,
// and is OK wherever the reference is.
func TestPeer(t *testing.T) {
	bin := referenceBinary(t)
	redisSrv := testredis.Start(t)
	ref := startReference(t, bin, redisSrv.Addr, peerConfig)
	ours := start(t, "REDIS_URL="+redisSrv.Addr)
	require.NoError(t, os.WriteFile(filepath.Join(ours.configDir, "config.yaml"), []byte(peerConfig), 0o644))
	waitFor(t, "our configuration", func() bool { return strings.Contains(ours.log.String(), "domains=[peer]") })
	dial := func(addr string) pb.RateLimitServiceClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return pb.NewRateLimitServiceClient(conn)
	}
	refClient, ourClient := dial(ref), dial(ours.grpcAddr)

	hour := time.Now().Truncate(time.Hour)
	run := fmt.Sprint(time.Now().UnixNano()) // fresh keys
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []func(int) *rlv3.RateLimitDescriptor{
		func(n int) *rlv3.RateLimitDescriptor { return desc("user", fmt.Sprint(run, "-u", n%40)) },
		func(n int) *rlv3.RateLimitDescriptor { return desc("user", fmt.Sprint(run, "-hot")) },
		func(n int) *rlv3.RateLimitDescriptor { return desc("tenant", fmt.Sprint(run, "-t", n%10)) },
		func(n int) *rlv3.RateLimitDescriptor { return desc("vip", run) },
		func(n int) *rlv3.RateLimitDescriptor { return desc("path", fmt.Sprint("/api/", run, n%20)) },
		func(n int) *rlv3.RateLimitDescriptor { return desc("path", "/other") },
		func(n int) *rlv3.RateLimitDescriptor { return desc("health", run) },
		func(n int) *rlv3.RateLimitDescriptor { return desc("nothing", run) },
		func(n int) *rlv3.RateLimitDescriptor {
			return desc("header_match", "checkout", "remote_address", fmt.Sprint(run, "-ip", n%10))
		},
		func(n int) *rlv3.RateLimitDescriptor { return desc("header_match", "checkout") },
		func(n int) *rlv3.RateLimitDescriptor { return desc("trial", fmt.Sprint(run, "-trial")) },
	}
	diverged := map[string]bool{} // ids a request over some limit touched
	idOf := func(d *rlv3.RateLimitDescriptor) string {
		var b strings.Builder
		for _, e := range d.Entries {
			b.WriteString(e.Key + "=" + e.Value + "|")
		}
		return b.String()
	}
	compared, exact, overs := 0, 0, 0
	for i := range 300 {
		var ds []*rlv3.RateLimitDescriptor
		for range 1 + rng.IntN(3) {
			d := kinds[rng.IntN(len(kinds))](rng.IntN(100))
			if rng.IntN(8) == 0 {
				d.HitsAddend = wrapperspb.UInt64(uint64(rng.IntN(3))) // 0 looks
			}
			ds = append(ds, d)
		}
		req := &pb.RateLimitRequest{Domain: "peer", Descriptors: ds, HitsAddend: uint32(rng.IntN(3))}
		ctx := context.Background()
		want, err := refClient.ShouldRateLimit(ctx, req)
		require.NoError(t, err)
		got, err := ourClient.ShouldRateLimit(ctx, req)
		require.NoError(t, err)
		where := fmt.Sprintf("call %d: %v", i, req)
		if os.Getenv("PEER_DEBUG") != "" {
			t.Logf("%s\n  ref %v\n  got %v", where, want, got)
		}
		touched := false
		for _, d := range ds {
			touched = touched || diverged[idOf(d)]
		}
		if !touched {
			require.Equal(t, want.OverallCode, got.OverallCode, where)
		} else if want.OverallCode == pb.RateLimitResponse_OK {
			require.Equal(t, pb.RateLimitResponse_OK, got.OverallCode, where)
		}
		overCall := want.OverallCode == pb.RateLimitResponse_OVER_LIMIT || got.OverallCode == pb.RateLimitResponse_OVER_LIMIT
		for j, w := range want.Statuses {
			g := got.Statuses[j]
			compared++
			require.Equal(t, w.CurrentLimit.GetRequestsPerUnit(), g.CurrentLimit.GetRequestsPerUnit(), where)
			require.Equal(t, w.CurrentLimit.GetUnit(), g.CurrentLimit.GetUnit(), where)
			require.Equal(t, w.CurrentLimit.GetName(), g.CurrentLimit.GetName(), where)
			switch {
			case diverged[idOf(ds[j])]: // the reference counted what it refused before
				require.GreaterOrEqual(t, g.LimitRemaining, w.LimitRemaining, "%s: descriptor %d", where, j)
				if w.Code == pb.RateLimitResponse_OK {
					require.Equal(t, pb.RateLimitResponse_OK, g.Code, "%s: descriptor %d", where, j)
				}
				continue
			case overCall: // the same counts before; the reference counts what it refuses now
				require.Equal(t, w.Code, g.Code, "%s: descriptor %d", where, j)
				require.GreaterOrEqual(t, g.LimitRemaining, w.LimitRemaining, "%s: descriptor %d", where, j)
				overs++
				continue
			}
			exact++
			require.Equal(t, w.Code, g.Code, "%s: descriptor %d", where, j)
			require.Equal(t, w.LimitRemaining, g.LimitRemaining, "%s: descriptor %d", where, j)
		}
		if overCall {
			for j, d := range ds {
				if want.Statuses[j].CurrentLimit != nil { // a count the two may now differ on
					diverged[idOf(d)] = true
				}
			}
		}
	}
	if !time.Now().Truncate(time.Hour).Equal(hour) {
		t.Skip("the trace crossed the hour, where the sliding window differs on purpose; run it again")
	}
	t.Logf("%d statuses compared: %d field by field, %d of requests over a limit by code, %d of ids such a request touched before",
		compared, exact, overs, compared-exact-overs)
	require.Greater(t, exact, compared/2, "most statuses compare exactly")
	require.Positive(t, overs, "the trace goes over limits")
}
