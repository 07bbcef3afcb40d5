package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

// TestXDSPeer runs the xDS sequence against the reference and this service
// at once, each a node of one management server, where the two are meant
// to agree: no port before the first configuration; a push applied and
// acknowledged; a configuration that does not load refused with a NACK
// naming the version applied last, the last good one kept; a good push
// after it applied; an empty one unloading every domain.
func TestXDSPeer(t *testing.T) {
	bin := referenceBinary(t)
	redisSrv := testredis.Start(t)
	m := startManagement(t, "127.0.0.1:0")
	xdsEnvOf := func(node string) []string {
		return []string{"REDIS_URL=" + redisSrv.Addr, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + m.addr,
			"CONFIG_GRPC_XDS_NODE_ID=" + node, "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=50ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=200ms"}
	}
	services := map[string]*service{
		"reference": launchReference(t, bin, nil, xdsEnvOf("reference")...),
		"ours":      launch(t, xdsEnvOf("ours")...),
	}
	push := func(version string, configs ...*rlsconf.RateLimitConfig) {
		for node := range services {
			m.pushTo(t, node, version, configs...)
		}
	}
	for node := range services {
		waitFor(t, node+" asking for its configuration", func() bool {
			for _, r := range m.requests() {
				if r.GetNode().GetId() == node {
					return true
				}
			}
			return false
		})
	}
	for node, s := range services {
		_, err := http.Get("http://" + s.httpAddr + "/healthcheck")
		require.Error(t, err, "%s: no port before the first configuration", node)
	}
	push("1", apiConfig(123))
	for node, s := range services {
		s.waitHealthy(t)
		require.Equal(t, uint32(123), tenantLimit(t, s), node)
		waitFor(t, node+"'s ACK of version 1", func() bool { return m.ackedBy(node, "1") })
	}
	pushed := time.Now()
	push("2", apiConfig(500))
	took := map[string]time.Duration{}
	waitFor(t, "both under version 2", func() bool {
		for node, s := range services {
			if _, done := took[node]; !done && tenantLimit(t, s) == 500 {
				took[node] = time.Since(pushed)
			}
		}
		return len(took) == len(services)
	})
	t.Logf("from the push to the first answer under it: %v", took)
	broken := apiConfig(7)
	broken.Domain = ""
	push("3", broken)
	for node, s := range services {
		waitFor(t, node+"'s NACK of version 3", func() bool {
			for _, r := range m.requests() {
				if r.GetNode().GetId() == node && r.GetErrorDetail() != nil {
					require.Equal(t, "2", r.GetVersionInfo(), "%s: a NACK names the version applied last", node)
					return true
				}
			}
			return false
		})
		require.Equal(t, uint32(500), tenantLimit(t, s), "%s keeps the last good configuration", node)
	}
	push("4", apiConfig(42))
	for node, s := range services {
		waitFor(t, node+" under version 4", func() bool { return tenantLimit(t, s) == 42 })
	}
	push("5")
	for node, s := range services {
		waitFor(t, node+" with every domain unloaded", func() bool { return tenantLimit(t, s) == 0 })
	}
}

// Where an operator migrating from the reference's January build (the
// newest the Go module proxy serves) meets a difference, with its answer
// beside ours, and MERGE_DOMAIN_CONFIG=true splitting a domain over two
// files. Ours follows the reference as Envoy Gateway v1.6 and v1.7 ship
// it, newer than that build: a '*' inside a value matches any run of
// bytes (PR #1085, src/config/config_impl.go at f2fb157, wildcardMatch,
// lines 199-237), and a request whose only quota_mode descriptor is over
// is OVER_LIMIT (PR #1059, src/service/ratelimit.go at f2fb157, lines
// 250-255); the January build reads the '*' as itself and answers OK.
func TestPeerMigration(t *testing.T) {
	bin := referenceBinary(t)
	redisSrv := testredis.Start(t)
	const first = `
domain: api
descriptors:
  - key: role
    value: a*b
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 7}
`
	const second = `
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 8}
  - key: tokens
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`
	ref := launchReference(t, bin, map[string]string{"a.yaml": first, "b.yaml": second}, "REDIS_URL="+redisSrv.Addr, "MERGE_DOMAIN_CONFIG=true")
	ref.waitHealthy(t)
	ours := start(t, "REDIS_URL="+redisSrv.Addr, "MERGE_DOMAIN_CONFIG=true")
	require.NoError(t, os.WriteFile(filepath.Join(ours.configDir, "config.yaml"), []byte(first), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ours.configDir, "more.yaml"), []byte(second), 0o644))
	waitFor(t, "our two files", func() bool { return ruleOf(t, ours, "tenant", "x") == 8 })
	for _, tc := range []struct {
		key, value    string
		rate, january uint32
	}{
		{"role", "a*b", 6, 6}, {"role", "axb", 6, 0}, {"path", "/api/v1", 7, 7}, {"tenant", "x", 8, 8},
	} {
		require.Equal(t, tc.january, ruleOf(t, ref, tc.key, tc.value), "reference: %s=%s", tc.key, tc.value)
		require.Equal(t, tc.rate, ruleOf(t, ours, tc.key, tc.value), "ours: %s=%s", tc.key, tc.value)
	}
	// quota_mode over its limit: the January build answers OK, the
	// descriptor's status OK too; ours keeps the status OVER_LIMIT, and the
	// request, its only quota over, is OVER_LIMIT
	for i := range 3 {
		want := map[*service]pb.RateLimitResponse_Code{ref: pb.RateLimitResponse_OK, ours: pb.RateLimitResponse_OK}
		if i > 0 {
			want[ours] = pb.RateLimitResponse_OVER_LIMIT
		}
		for s, code := range want {
			r, err := ask(context.Background(), s.client(t), desc("tokens", "t"))
			require.NoError(t, err)
			require.Equal(t, code, r.OverallCode, "request %d of 1 a minute in quota_mode (reference: %t)", i+1, s == ref)
			require.Equal(t, code, r.Statuses[0].Code, "request %d of 1 a minute in quota_mode (reference: %t)", i+1, s == ref)
		}
	}
}

// ruleOf returns the rate of the rule s answers key=value of domain api
// with, 0 for none.
func ruleOf(t *testing.T, s *service, key, value string) uint32 {
	t.Helper()
	r, err := ask(context.Background(), s.client(t), desc(key, value))
	require.NoError(t, err)
	return r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
}

// The same entries twice in a request, once under a rule in shadow mode
// (1 a minute) and once with Envoy's override (5 a minute): the override
// limits the request, and both services give the same ten answers (two
// OK, then over: 2 hits a request against 5).
func TestPeerShadowBesideOverride(t *testing.T) {
	bin := referenceBinary(t)
	redisSrv := testredis.Start(t)
	const config = `
domain: api
descriptors:
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`
	ref := launchReference(t, bin, map[string]string{"config.yaml": config}, "REDIS_URL="+redisSrv.Addr, "CACHE_KEY_PREFIX=ref")
	ref.waitHealthy(t)
	ours := start(t, "REDIS_URL="+redisSrv.Addr)
	require.NoError(t, os.WriteFile(filepath.Join(ours.configDir, "config.yaml"), []byte(config), 0o644))
	waitFor(t, "our configuration", func() bool { return ruleOf(t, ours, "trial", "x") == 1 })
	over := desc("trial", "t")
	over.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 2} // a minute
	answers := map[string][]string{}
	for name, s := range map[string]*service{"reference": ref, "ours": ours} {
		c := s.client(t)
		for range 10 {
			r, err := ask(context.Background(), c, desc("trial", "t"), over)
			require.NoError(t, err)
			answers[name] = append(answers[name], r.OverallCode.String())
		}
	}
	t.Logf("%v", answers)
	require.Equal(t, answers["reference"], answers["ours"])
	require.Equal(t, []string{"OK", "OK"}, answers["ours"][:2])
	require.NotContains(t, answers["ours"][2:], "OK")
}

// RESPONSE_DYNAMIC_METADATA against the reference's January build, which
// has it (PR #1027): the same domain, descriptors (entries, own limit, own
// hits_addend) and hitsAddend. The rules' metadata came later (PR #1112,
// April 2026): TestDynamicMetadata in package rls holds it to the source.
func TestPeerDynamicMetadata(t *testing.T) {
	bin := referenceBinary(t)
	redisSrv := testredis.Start(t)
	ref := launchReference(t, bin, map[string]string{"config.yaml": peerConfig}, "REDIS_URL="+redisSrv.Addr, "RESPONSE_DYNAMIC_METADATA=true")
	ref.waitHealthy(t)
	ours := start(t, "REDIS_URL="+redisSrv.Addr, "RESPONSE_DYNAMIC_METADATA=true", "CACHE_KEY_PREFIX=ours:")
	require.NoError(t, os.WriteFile(filepath.Join(ours.configDir, "config.yaml"), []byte(peerConfig), 0o644))
	own := desc("tenant", "acme")
	own.HitsAddend = wrapperspb.UInt64(2)
	override := desc("path", "/api/x")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 9, Unit: typev3.RateLimitUnit_HOUR}
	req := &pb.RateLimitRequest{Domain: "peer", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann"), own, override}}
	got := map[string]map[string]any{}
	for name, s := range map[string]*service{"reference": ref, "ours": ours} {
		waitFor(t, name+" serving peer", func() bool {
			r, err := s.client(t).ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "peer", Descriptors: []*rlv3.RateLimitDescriptor{desc("health", "x")}})
			return err == nil && r.Statuses[0].LimitRemaining > 0
		})
		r, err := s.client(t).ShouldRateLimit(context.Background(), req)
		require.NoError(t, err)
		m := r.GetDynamicMetadata().AsMap()
		// the limit in protobuf's text form, whose spacing each binary picks
		d := m["descriptors"].([]any)[2].(map[string]any)
		d["limit"] = strings.Join(strings.Fields(d["limit"].(string)), " ")
		got[name] = m
	}
	// the January build's quotaModeEnabled, which the source at f2fb157
	// no longer writes (src/service/ratelimit.go, lines 277-305)
	require.Equal(t, false, got["reference"]["quotaModeEnabled"])
	delete(got["reference"], "quotaModeEnabled")
	require.Equal(t, got["reference"], got["ours"])
	require.Equal(t, "peer", got["ours"]["domain"])
	require.Equal(t, 3.0, got["ours"]["hitsAddend"])
}
