package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/rls"
	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

// management is an xDS management server as Envoy Gateway runs one:
// go-control-plane's server on a snapshot cache, in the test's process.
type management struct {
	addr  string
	cache cachev3.SnapshotCache
	g     *grpc.Server

	mu   sync.Mutex
	reqs []*discovery.DiscoveryRequest // every request the service sent, in order
}

// startManagement serves on addr ("127.0.0.1:0" for any port) with opts.
func startManagement(t *testing.T, addr string, opts ...grpc.ServerOption) *management {
	t.Helper()
	var ln net.Listener
	var err error
	for range 100 { // the port of a management server stopped a moment ago
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // the kernel releasing the port
	}
	require.NoError(t, err)
	m := &management{addr: ln.Addr().String(), cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.reqs = append(m.reqs, proto.Clone(r).(*discovery.DiscoveryRequest))
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	m.g = grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(m.g, serverv3.NewServer(ctx, m.cache, cb))
	go func() { _ = m.g.Serve(ln) }()
	t.Cleanup(func() { m.g.Stop(); cancel() })
	return m
}

// push sets the snapshot of node envoy-ratelimit (Envoy Gateway's) to
// version, of configs.
func (m *management) push(t *testing.T, version string, configs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	m.pushTo(t, "envoy-ratelimit", version, configs...)
}

// pushTo sets the snapshot of node to version, of configs.
func (m *management) pushTo(t *testing.T, node, version string, configs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	require.NoError(t, err)
	require.NoError(t, m.cache.SetSnapshot(context.Background(), node, snap))
}

// requests returns what the service has sent so far.
func (m *management) requests() []*discovery.DiscoveryRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*discovery.DiscoveryRequest(nil), m.reqs...)
}

// acked reports whether the service acknowledged version.
func (m *management) acked(version string) bool { return m.ackedBy("envoy-ratelimit", version) }

// ackedBy reports whether node acknowledged version.
func (m *management) ackedBy(node, version string) bool {
	for _, r := range m.requests() {
		if r.GetNode().GetId() == node && r.GetResponseNonce() != "" && r.GetVersionInfo() == version && r.GetErrorDetail() == nil {
			return true
		}
	}
	return false
}

// apiConfig is the tests' file config as a pushed resource, the tenant's
// rate tenantRate (not the file's 100, so that an answer tells the two
// apart).
func apiConfig(tenantRate uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: "api", Domain: "api", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "user", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 2}},
		{Key: "tenant", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: tenantRate}},
	}}
}

// xdsEnv is the environment of a service configured over xDS from m, with
// waits short enough for a test.
func xdsEnv(addr string, more ...string) []string {
	return append([]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + addr,
		"CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=50ms",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=50ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=200ms"}, more...)
}

// tenantLimit returns the tenant's rate as the service's answer reports
// it, 0 for no rule, and 1<<32-1 for no answer.
func tenantLimit(t *testing.T, s *service) uint32 {
	t.Helper()
	r, err := ask(context.Background(), s.client(t), desc("tenant", "xds"))
	if err != nil {
		return 1<<32 - 1
	}
	return r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
}

// Configuration pushed over xDS: applied and acknowledged without a
// restart; a configuration that does not load refused (a NACK with the
// last good version, the nonce and the error) while the last good one
// stays, the snapshot cache's re-sends of it refused without a log line
// each; a good one after it applied; an empty one unloads every domain.
func TestXDSPushes(t *testing.T) {
	redisSrv := testredis.Start(t)
	m := startManagement(t, "127.0.0.1:0")
	m.push(t, "1", apiConfig(123))
	s := start(t, xdsEnv(m.addr, "REDIS_URL="+redisSrv.Addr)...)
	require.Equal(t, uint32(123), tenantLimit(t, s))
	require.Contains(t, s.log.String(), `config="xDS from `+m.addr+` as node \"envoy-ratelimit\""`, "the start-up line names the source")
	waitFor(t, "the ACK of version 1", func() bool { return m.acked("1") })

	pushed := time.Now()
	m.push(t, "2", apiConfig(500))
	waitFor(t, "version 2 applied", func() bool { return tenantLimit(t, s) == 500 })
	t.Logf("from a push to the first answer under it: %v", time.Since(pushed))
	waitFor(t, "the ACK of version 2", func() bool { return m.acked("2") })

	broken := apiConfig(7)
	broken.Domain = ""
	pushed = time.Now()
	m.push(t, "3", broken)
	waitFor(t, "the NACK of version 3", func() bool {
		for _, r := range m.requests() {
			if r.GetErrorDetail() != nil {
				return true
			}
		}
		return false
	})
	t.Logf("from a push that does not load to its NACK: %v", time.Since(pushed))
	var nacks []*discovery.DiscoveryRequest
	waitFor(t, "version 3 refused again after its NACK", func() bool {
		nacks = nacks[:0]
		for _, r := range m.requests() {
			if r.GetErrorDetail() != nil {
				nacks = append(nacks, r)
			}
		}
		return len(nacks) >= 3
	})
	// paced: unpaced, the cache and the service exchange about 1,400 a
	// second; paced, 4 (this bound allows 100)
	refusing := time.Since(pushed)
	require.LessOrEqual(t, len(nacks), 2+int(refusing/(10*time.Millisecond)), "%d NACKs in %v: the refusals spin", len(nacks), refusing)
	for _, r := range m.requests() {
		require.Equal(t, "envoy-ratelimit", r.GetNode().GetId(), "the node on every request")
		require.Equal(t, configTypeURL, r.GetTypeUrl())
		require.Empty(t, r.GetResourceNames(), "a wildcard subscription")
	}
	for _, n := range nacks {
		require.Equal(t, "2", n.GetVersionInfo(), "a NACK names the version applied last")
		require.NotEmpty(t, n.GetResponseNonce())
		require.Contains(t, n.GetErrorDetail().GetMessage(), "config file cannot have empty domain")
	}
	require.Equal(t, uint32(500), tenantLimit(t, s), "the last good configuration stays")
	require.Equal(t, 1, strings.Count(s.log.String(), "did not load"), "a refused version sent again is logged once")
	require.False(t, m.acked("3"))

	pushed = time.Now()
	m.push(t, "4", apiConfig(42))
	waitFor(t, "version 4 applied after the refused one", func() bool { return tenantLimit(t, s) == 42 })
	t.Logf("from a good push after the refused one to the first answer under it: %v (the refusals are paced at %v)", time.Since(pushed), refusedPace)

	m.push(t, "5")
	waitFor(t, "every domain unloaded", func() bool { return tenantLimit(t, s) == 0 })
	waitFor(t, "the ACK of version 5", func() bool { return m.acked("5") })
}

// Start-up as the reference: without FORCE_START_WITHOUT_INITIAL_CONFIG no
// port opens before the first configuration; with it, /healthcheck is OK
// at once and each call is UNAVAILABLE until a configuration comes. The
// stream is opened again when the management server comes back.
func TestXDSStartAndReconnect(t *testing.T) {
	redisSrv := testredis.Start(t)
	m := startManagement(t, "127.0.0.1:0")
	waiting := launch(t, xdsEnv(m.addr, "REDIS_URL="+redisSrv.Addr)...)
	waitFor(t, "the service asking for its configuration", func() bool { return len(m.requests()) > 0 })
	_, err := http.Get("http://" + waiting.httpAddr + "/healthcheck")
	require.Error(t, err, "no port before the first configuration")
	require.Contains(t, waiting.log.String(), "waiting for the first configuration over xDS")
	m.push(t, "1", apiConfig(123))
	waiting.waitHealthy(t)
	require.Equal(t, uint32(123), tenantLimit(t, waiting))

	// FORCE_START, with the management server down
	addr := m.addr
	m.g.Stop()
	forced := start(t, xdsEnv(addr, "REDIS_URL="+redisSrv.Addr, "FORCE_START_WITHOUT_INITIAL_CONFIG=true")...)
	require.Contains(t, forced.log.String(), "serving with no configuration loaded")
	_, err = ask(context.Background(), forced.client(t), desc("tenant", "xds"))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "no rate limit configuration loaded")

	// the management server back on its address, with a new version: both
	// services connect again and apply it
	back := startManagement(t, addr)
	back.push(t, "2", apiConfig(300))
	waitFor(t, "the forced service configured", func() bool { return tenantLimit(t, forced) == 300 })
	waitFor(t, "the first service configured again", func() bool { return tenantLimit(t, waiting) == 300 })
}

// Envoy Gateway's TLS: RSA certificates with PKCS#1 keys and no extended
// key usage, one pair for the service's client; a management server that
// wants TLS 1.3 and a client certificate. The server's name is checked.
func TestXDSMutualTLS(t *testing.T) {
	redisSrv := testredis.Start(t)
	write := writer(t)
	ca := newRSACA(t)
	serverPEM, serverKey := ca.issue(t, "envoy-gateway")
	clientPEM, clientKey := ca.issue(t, "envoy-ratelimit")
	serverPair, err := tls.X509KeyPair(serverPEM, serverKey)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	m := startManagement(t, "127.0.0.1:0", grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverPair},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})))
	m.push(t, "1", apiConfig(123))
	tlsEnv := []string{"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + write("ca.crt", ca.certPEM),
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN=envoy-gateway"}
	s := start(t, xdsEnv(m.addr, append(tlsEnv, "REDIS_URL="+redisSrv.Addr,
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+write("tls.crt", clientPEM), "CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+write("tls.key", clientKey))...)...)
	require.Equal(t, uint32(123), tenantLimit(t, s))

	// without a client certificate: never configured
	noCert := start(t, xdsEnv(m.addr, append(tlsEnv, "REDIS_URL="+redisSrv.Addr, "FORCE_START_WITHOUT_INITIAL_CONFIG=true")...)...)
	waitFor(t, "the refused handshake logged", func() bool { return strings.Contains(noCert.log.String(), "xDS stream ended or did not open") })
	_, err = ask(context.Background(), noCert.client(t), desc("tenant", "xds"))
	require.Equal(t, codes.Unavailable, status.Code(err))
}

// rsaCA is a certificate authority as Envoy Gateway's: RSA, its
// certificates' keys PKCS#1.
type rsaCA struct {
	cert    *x509.Certificate
	key     *rsa.PrivateKey
	certPEM []byte
}

func newRSACA(t *testing.T) rsaCA {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "envoy-gateway CA"}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return rsaCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate for the DNS name san, with no extended key
// usage, and its PKCS#1 key.
func (c rsaCA) issue(t *testing.T, san string) (certPEM, keyPEM []byte) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: san},
		DNSNames: []string{san}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
}

// The pushed resources load as the files they stand for: one loader, the
// same rules and the same errors.
func TestLoadXDS(t *testing.T) {
	anyOf := func(cs ...*rlsconf.RateLimitConfig) *discovery.DiscoveryResponse {
		resp := &discovery.DiscoveryResponse{TypeUrl: configTypeURL}
		for _, c := range cs {
			a, err := anypb.New(c)
			require.NoError(t, err)
			resp.Resources = append(resp.Resources, a)
		}
		return resp
	}
	full := &rlsconf.RateLimitConfig{Name: "gw", Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: "httproute/default/route/rule/0/match/0", Value: "httproute/default/route/rule/0/match/0",
		Descriptors: []*rlsconf.RateLimitDescriptor{{
			Key: "rule-0-match-0", ShadowMode: true, DetailedMetric: true,
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 10, Name: "quota",
				Replaces: []*rlsconf.RateLimitReplace{{Name: "other"}}},
		}},
	}, {Key: "open", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}}}}
	cfg, err := loadXDS(anyOf(full), rls.LoadConfig)
	require.NoError(t, err)
	require.Equal(t, []string{"default/eg/http"}, cfg.Domains())

	_, err = loadXDS(anyOf(apiConfig(1), apiConfig(2)), rls.LoadConfig)
	require.ErrorContains(t, err, "duplicate domain 'api'")
	bad := apiConfig(1)
	bad.Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	_, err = loadXDS(anyOf(bad), rls.LoadConfig)
	require.ErrorContains(t, err, "api:")
	resp := anyOf(apiConfig(1))
	resp.TypeUrl = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	_, err = loadXDS(resp, rls.LoadConfig)
	require.ErrorContains(t, err, "subscribes to")
	user, tenant := apiConfig(1), apiConfig(2)
	user.Descriptors, tenant.Descriptors = user.Descriptors[:1], tenant.Descriptors[1:]
	merged, err := loadXDS(anyOf(user, tenant), rls.LoadConfigMerged)
	require.NoError(t, err, "MERGE_DOMAIN_CONFIG: one domain over two resources")
	require.NotNil(t, merged.Match("api", desc("tenant", "x")))
	require.NotNil(t, merged.Match("api", desc("user", "x")))
	empty, err := loadXDS(anyOf(), rls.LoadConfig)
	require.NoError(t, err)
	require.Empty(t, empty.Domains())
}

// quota_mode (7) and metadata (8), which RateLimitDescriptor of
// go-control-plane/ratelimit v0.1.0 has not, are read from the unknown
// fields where a newer control plane's message leaves them (the numbers of
// rls_conf.proto at go-control-plane/ratelimit
// v0.1.1-0.20260629194254-5581fade6089, which envoyproxy/ratelimit f2fb157
// builds with); another unknown field is skipped. requests_per_unit 0 over
// xDS is a rule that always denies (Envoy Gateway #9333).
func TestLoadXDSNewerFields(t *testing.T) {
	md, err := proto.Marshal(&structpb.Struct{Fields: map[string]*structpb.Value{
		"backend": structpb.NewStringValue("b"), "route": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"w": structpb.NewNumberValue(2)}})}})
	require.NoError(t, err)
	var unknown []byte
	unknown = protowire.AppendTag(unknown, 99, protowire.BytesType)
	unknown = protowire.AppendBytes(unknown, []byte("a field of the future"))
	unknown = protowire.AppendTag(unknown, 7, protowire.VarintType)
	unknown = protowire.AppendVarint(unknown, 1)
	unknown = protowire.AppendTag(unknown, 8, protowire.BytesType)
	unknown = protowire.AppendBytes(unknown, md)
	tokens := &rlsconf.RateLimitDescriptor{Key: "tokens", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 5}}
	tokens.ProtoReflect().SetUnknown(unknown)
	c := &rlsconf.RateLimitConfig{Name: "ai", Domain: "ai", Descriptors: []*rlsconf.RateLimitDescriptor{tokens,
		{Key: "blocked", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND}}}}
	a, err := anypb.New(c) // marshals the unknown fields with the rest, as a newer control plane's bytes
	require.NoError(t, err)
	cfg, err := loadXDS(&discovery.DiscoveryResponse{TypeUrl: configTypeURL, Resources: []*anypb.Any{a}}, rls.LoadConfig)
	require.NoError(t, err)
	r := cfg.Match("ai", desc("tokens", "t")).Rule
	require.True(t, r.QuotaMode)
	require.Equal(t, map[string]any{"backend": "b", "route": map[string]any{"w": 2.0}}, r.Metadata.AsMap())
	blocked := cfg.Match("ai", desc("blocked", "x")).Rule
	require.Zero(t, blocked.Limit.Rate, "a rule of 0: denies without asking Redis")
	require.False(t, blocked.Unlimited)

	tokens.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 8, protowire.BytesType), []byte{0x0a, 0x05, 'a'})) // no Struct
	a, err = anypb.New(c)
	require.NoError(t, err)
	_, err = loadXDS(&discovery.DiscoveryResponse{TypeUrl: configTypeURL, Resources: []*anypb.Any{a}}, rls.LoadConfig)
	require.ErrorContains(t, err, "descriptor tokens: metadata")
}

// The configuration Envoy Gateway's translator pushes, and the requests its
// Envoys send: a listener's domain, the route's name as the outer
// descriptor, rule-<i>-match-<j> keys (a distinct header: key only),
// masked_remote_address then remote_address (a bucket per client address
// in a CIDR), a rule in shadow mode, and a response's cost as a
// descriptor's hits_addend.
func TestXDSEnvoyGatewayShapes(t *testing.T) {
	redisSrv := testredis.Start(t)
	const route = "httproute/default/backend/rule/0"
	policy := func(n uint32, unit rlsconf.RateLimitUnit) *rlsconf.RateLimitPolicy {
		return &rlsconf.RateLimitPolicy{RequestsPerUnit: n, Unit: unit}
	}
	gw := &rlsconf.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: route, Value: route,
		Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "rule-0-match-0", RateLimit: policy(2, rlsconf.RateLimitUnit_MINUTE)},
			{Key: "masked_remote_address", Value: "0.0.0.0/0", Descriptors: []*rlsconf.RateLimitDescriptor{
				{Key: "remote_address", RateLimit: policy(3, rlsconf.RateLimitUnit_MINUTE)},
			}},
			{Key: "rule-2-match--1", Value: "rule-2-match--1", ShadowMode: true, RateLimit: policy(1, rlsconf.RateLimitUnit_HOUR)},
			{Key: "rule-3-match--1", Value: "rule-3-match--1", RateLimit: policy(10, rlsconf.RateLimitUnit_MINUTE)},
		},
	}}}
	m := startManagement(t, "127.0.0.1:0")
	m.push(t, "1", gw)
	s := start(t, xdsEnv(m.addr, "REDIS_URL="+redisSrv.Addr)...)
	c := s.client(t)
	call := func(ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
		t.Helper()
		r, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "default/eg/http", Descriptors: ds})
		require.NoError(t, err)
		return r
	}
	codes := func(n int, ds ...*rlv3.RateLimitDescriptor) []pb.RateLimitResponse_Code {
		var out []pb.RateLimitResponse_Code
		for range n {
			out = append(out, call(ds...).OverallCode)
		}
		return out
	}
	ok, over := pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT

	require.Equal(t, []pb.RateLimitResponse_Code{ok, ok, over}, codes(3, desc(route, route, "rule-0-match-0", "alice")), "2 a minute per header value")
	require.Equal(t, ok, call(desc(route, route, "rule-0-match-0", "bob")).OverallCode, "another value, another bucket")

	ip := func(addr string) *rlv3.RateLimitDescriptor {
		return desc(route, route, "masked_remote_address", "0.0.0.0/0", "remote_address", addr)
	}
	require.Equal(t, []pb.RateLimitResponse_Code{ok, ok, ok, over}, codes(4, ip("10.0.0.1")), "3 a minute per address")
	require.Equal(t, ok, call(ip("10.0.0.2")).OverallCode)

	shadow := desc(route, route, "rule-2-match--1", "rule-2-match--1")
	require.Equal(t, []pb.RateLimitResponse_Code{ok, ok}, codes(2, shadow), "shadow mode lets it through")

	cost := desc(route, route, "rule-3-match--1", "rule-3-match--1")
	cost.HitsAddend = wrapperspb.UInt64(4) // the response's cost, as Envoy Gateway sends it
	r := call(cost)
	require.Equal(t, uint32(6), r.Statuses[0].LimitRemaining, "4 of 10 counted")
}

// The wait before a stream opens again, as the reference's client
// computes it (jpillora/backoff): its default factor of 0.5 keeps every
// wait at the initial interval; a factor of 2 doubles it up to the max;
// jitter picks a point between the initial and that.
func TestXDSBackoff(t *testing.T) {
	s, err := readSettings(env())
	require.NoError(t, err)
	x := &xdsClient{s: s.xds}
	for attempt := range 5 {
		require.Equal(t, 10*time.Second, x.backoff(attempt, 0.9), "the reference's defaults")
	}
	x.s.backoffFactor, x.s.backoffJitter = 2, false
	var waits []time.Duration
	for attempt := range 5 {
		waits = append(waits, x.backoff(attempt, 0.9))
	}
	require.Equal(t, []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, time.Minute, time.Minute}, waits)
	x.s.backoffJitter = true
	require.Equal(t, 15*time.Second, x.backoff(1, 0.5), "halfway between 10 s and 20 s")
	x.s.backoffFactor = 0
	require.Equal(t, 40*time.Second, x.backoff(2, 1), "a factor of 0 is 2")
	x.s.backoffInitial = 2 * time.Minute
	require.Equal(t, time.Minute, x.backoff(0, 0), "an initial above the max: the max")
}

// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, as the reference: unhealthy
// (/healthcheck 500, grpc.health.v1 NOT_SERVING, "" and "ratelimit") until
// a configuration of at least one domain is loaded, and again once an
// empty one is.
func TestXDSHealthyWithConfig(t *testing.T) {
	redisSrv := testredis.Start(t)
	m := startManagement(t, "127.0.0.1:0")
	s := launch(t, xdsEnv(m.addr, "REDIS_URL="+redisSrv.Addr, "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true")...)
	httpHealth := func() int {
		resp, err := http.Get("http://" + s.httpAddr + "/healthcheck")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	grpcHealth := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return r.GetStatus()
	}
	healthy := func(want bool) func() bool {
		code, st := http.StatusInternalServerError, healthpb.HealthCheckResponse_NOT_SERVING
		if want {
			code, st = http.StatusOK, healthpb.HealthCheckResponse_SERVING
		}
		return func() bool { return httpHealth() == code && grpcHealth("") == st && grpcHealth("ratelimit") == st }
	}
	waitFor(t, "unhealthy with no configuration", healthy(false))
	m.push(t, "1", apiConfig(123))
	waitFor(t, "healthy with one", healthy(true))
	m.push(t, "2")
	waitFor(t, "unhealthy with an empty one", healthy(false))
}
