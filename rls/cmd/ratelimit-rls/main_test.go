package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

// binary is the command, built once for the tests that run it.
var binary string

// TestMain builds the command for the tests that run it, with -race when
// they run with it. go-redis's logger is silenced in the tests' own
// process: a Redis that goes away makes it log every failed dial, lines
// that would bury a failing test's FAIL lines.
func TestMain(m *testing.M) {
	redis.SetLogger(&logging.VoidLogger{})
	dir, err := os.MkdirTemp("", "ratelimit-rls")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "ratelimit-rls")
	args := []string{"build", "-o", binary}
	if raceEnabled { // the service's goroutines (the xDS client's, the handlers') under the detector too
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const config = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// service is a running ratelimit-rls.
type service struct {
	grpcAddr, httpAddr, promAddr string
	configDir                    string
	cmd                          *exec.Cmd
	log                          *syncBuffer
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs the command as a user would: the environment env (on top of
// the ports, the configuration directory and a config file of config) and
// waits until it serves.
func start(t *testing.T, env ...string) *service {
	t.Helper()
	s := launch(t, env...)
	s.waitHealthy(t)
	return s
}

// launch starts the command as start does, without waiting.
func launch(t *testing.T, env ...string) *service {
	t.Helper()
	root := t.TempDir()
	s := &service{configDir: filepath.Join(root, "ratelimit", "config"), log: &syncBuffer{}}
	require.NoError(t, os.MkdirAll(s.configDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(s.configDir, "config.yaml"), []byte(config), 0o644))
	grpcPort, httpPort, promPort := testredis.FreePort(t), testredis.FreePort(t), testredis.FreePort(t)
	s.grpcAddr = fmt.Sprintf("127.0.0.1:%d", grpcPort)
	s.httpAddr = fmt.Sprintf("127.0.0.1:%d", httpPort)
	s.promAddr = fmt.Sprintf("127.0.0.1:%d", promPort)
	s.cmd = exec.Command(binary)
	s.cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"GRPC_HOST=127.0.0.1", fmt.Sprint("GRPC_PORT=", grpcPort),
		"HOST=127.0.0.1", fmt.Sprint("PORT=", httpPort),
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + s.promAddr,
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"REDIS_SOCKET_TYPE=tcp", "LOG_LEVEL=info", "RLS_CONFIG_POLL=50ms",
	}, env...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, s.cmd.Start())
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		if strings.Contains(s.log.String(), "WARNING: DATA RACE") {
			t.Errorf("the service reported a data race:\n%s", s.log)
		}
	})
	return s
}

// waitHealthy waits until s's /healthcheck is OK.
func (s *service) waitHealthy(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + s.httpAddr + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if s.cmd.ProcessState != nil || time.Now().After(deadline) {
			t.Fatalf("ratelimit-rls did not start: %v\n%s", err, s.log)
		}
		time.Sleep(20 * time.Millisecond) // a process starting
	}
}

// client returns a gRPC client of s, with opts (insecure without).
func (s *service) client(t *testing.T, opts ...grpc.DialOption) pb.RateLimitServiceClient {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(s.grpcAddr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func ask(ctx context.Context, c pb.RateLimitServiceClient, ds ...*rlv3.RateLimitDescriptor) (*pb.RateLimitResponse, error) {
	return c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "api", Descriptors: ds})
}

// The service as a user runs it, on redis-server: decisions over gRPC and
// /json, the health check, the metrics, the settings it does not honour.
func TestService(t *testing.T) {
	redisSrv := testredis.Start(t)
	s := start(t, "REDIS_URL="+redisSrv.Addr, "REDIS_PIPELINE_WINDOW=150us", "LIMIT_RESPONSE_HEADERS_ENABLED=true")
	require.Contains(t, s.log.String(), "not honoured: REDIS_PIPELINE_WINDOW")
	c := s.client(t)
	ctx := context.Background()
	r := fillUser(t, c, desc("user", "ann"), desc("tenant", "acme"))
	require.Equal(t, uint32(98), r.Statuses[1].LimitRemaining, "the refused request is counted under no descriptor")
	require.Len(t, r.ResponseHeadersToAdd, 3)

	resp, err := http.Post("http://"+s.httpAddr+"/json", "application/json",
		strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), `"overallCode":"OVER_LIMIT"`)
	resp, err = http.Post("http://"+s.httpAddr+"/json", "application/json", strings.NewReader(`{"domain":""}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)

	resp, err = http.Get("http://" + s.promAddr + "/metrics")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), `ratelimit_service_rate_limit_over_limit{domain="api",key1="user",key2=""} 2`)
	require.Contains(t, string(body), "ratelimit_service_response_time_seconds_count")
	require.Contains(t, string(body), "ratelimit_decisions", "the library's own metrics (otel)")

	_, err = c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "api"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err = ask(gone, c, desc("user", "bob"))
	require.Equal(t, codes.Canceled, status.Code(err))
}

// -h and -version print and exit, and start nothing; anything else is
// refused with the usage.
func TestFlags(t *testing.T) {
	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
		return string(out), err
	}
	out, err := run("-h")
	require.NoError(t, err)
	require.Contains(t, out, "Usage:")
	out, err = run("-version")
	require.NoError(t, err)
	require.Regexp(t, `^ratelimit-rls \S+ go\S+\n$`, out)
	out, err = run("serve")
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 2, exit.ExitCode())
	require.Contains(t, out, `unexpected argument "serve"`)
}

// A changed configuration is used without a restart; a broken one is
// logged, and the last good one stays.
func TestConfigReload(t *testing.T) {
	redisSrv := testredis.Start(t)
	s := start(t, "REDIS_URL="+redisSrv.Addr)
	c := s.client(t)
	ctx := context.Background()
	remaining := func() uint32 {
		r, err := ask(ctx, c, desc("tenant", "reload"))
		require.NoError(t, err)
		return r.Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	require.Equal(t, uint32(100), remaining())
	require.NoError(t, os.WriteFile(filepath.Join(s.configDir, "config.yaml"), []byte(strings.Replace(config, "100", "500", 1)), 0o644))
	waitFor(t, "the new limit", func() bool { return remaining() == 500 })
	require.NoError(t, os.WriteFile(filepath.Join(s.configDir, "config.yaml"), []byte("domain: api\nbogus: 1\n"), 0o644))
	waitFor(t, "the error logged", func() bool { return strings.Contains(s.log.String(), "unknown key 'bogus'") })
	require.Equal(t, uint32(500), remaining(), "the last good configuration stays")
}

// MERGE_DOMAIN_CONFIG=true: a domain's descriptors over two files load as
// one domain (without it, the second file is an error and the first one
// stays).
func TestMergeDomainConfig(t *testing.T) {
	redisSrv := testredis.Start(t)
	s := start(t, "REDIS_URL="+redisSrv.Addr, "MERGE_DOMAIN_CONFIG=true")
	more := "domain: api\ndescriptors:\n  - key: region\n    rate_limit: {unit: hour, requests_per_unit: 7}\n"
	require.NoError(t, os.WriteFile(filepath.Join(s.configDir, "more.yaml"), []byte(more), 0o644))
	c := s.client(t)
	waitFor(t, "the second file's rule", func() bool {
		r, err := ask(context.Background(), c, desc("region", "eu"))
		return err == nil && r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 7
	})
	r, err := ask(context.Background(), c, desc("tenant", "acme"))
	require.NoError(t, err)
	require.Equal(t, uint32(100), r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(), "the first file's rules stay")
	require.NotContains(t, s.log.String(), "not honoured")
}

// Redis refused: each call is UNAVAILABLE at once (the client takes the
// library's advice: DialerRetries 1). With go-redis's default of 5 dials,
// each call waited out its redials, about 400 ms (or RLS_TIMEOUT, 100 ms
// by default, if shorter): five calls took 2 s, where they now take
// milliseconds.
func TestRedisRefusedFailsFast(t *testing.T) {
	s := start(t, fmt.Sprintf("REDIS_URL=127.0.0.1:%d", testredis.FreePort(t)), "RLS_TIMEOUT=10s")
	c := s.client(t)
	began := time.Now()
	for range 5 {
		_, err := ask(context.Background(), c, desc("user", "ann"))
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	}
	require.Less(t, time.Since(began), 1500*time.Millisecond, "five calls waited out go-redis's redials")
}

// Redis down: UNAVAILABLE, so that Envoy's failure_mode_deny decides; with
// RLS_FAILURE_POLICY=open, OK.
func TestRedisDown(t *testing.T) {
	redisSrv := testredis.Start(t)
	s := start(t, "REDIS_URL="+redisSrv.Addr)
	open := start(t, "REDIS_URL="+redisSrv.Addr, "RLS_FAILURE_POLICY=open")
	redisSrv.Stop()
	_, err := ask(context.Background(), s.client(t), desc("user", "ann"))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	r, err := ask(context.Background(), open.client(t), desc("user", "ann"))
	require.NoError(t, err)
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
}

// On a Redis Cluster (REDIS_TYPE=cluster, any case), a request of two
// descriptors whose ids are in two slots: refused by one, counted under
// neither once the other's give-back has landed.
func TestCluster(t *testing.T) {
	addrs := testredis.StartCluster(t)
	s := start(t, "REDIS_TYPE=cluster", "REDIS_URL="+strings.Join(addrs, ","))
	c := s.client(t)
	ctx := context.Background()
	fillUser(t, c, desc("tenant", "acme"), desc("user", "ann"))
	r, err := ask(ctx, c, desc("tenant", "acme"))
	require.NoError(t, err)
	require.Equal(t, uint32(97), r.Statuses[0].LimitRemaining, "2 counted, the refused one given back, this one")
}

// Under Sentinel (REDIS_TYPE=sentinel, REDIS_URL the master's name, then
// the Sentinels), as the reference reads it.
func TestSentinel(t *testing.T) {
	master := testredis.Start(t)
	sentinel := testredis.StartSentinel(t, "mymaster", master)
	s := start(t, "REDIS_TYPE=sentinel", "REDIS_URL=mymaster,"+sentinel)
	r := fillUser(t, s.client(t), desc("user", "ann"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[0].Code)
}

// mTLS, as Envoy Gateway uses it: a client with a certificate the CA signed
// and the SAN asked for is served; one without a certificate, or with
// another SAN, is refused. The CA under the reference's name, and under
// Envoy Gateway's (which the reference does not read).
func TestMutualTLS(t *testing.T) {
	for _, name := range []string{"GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"} {
		t.Run(name, func(t *testing.T) { testMutualTLS(t, name) })
	}
}

func testMutualTLS(t *testing.T, caVar string) {
	redisSrv := testredis.Start(t)
	ca := newCA(t)
	serverCert := ca.issue(t, "127.0.0.1")
	write := writer(t)
	s := start(t, "REDIS_URL="+redisSrv.Addr, "GRPC_SERVER_USE_TLS=true",
		"GRPC_SERVER_TLS_CERT="+write("server.crt", serverCert.certPEM), "GRPC_SERVER_TLS_KEY="+write("server.key", serverCert.keyPEM),
		caVar+"="+write("ca.crt", ca.certPEM), "GRPC_CLIENT_TLS_SAN=envoy.example")
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	dial := func(certs ...tls.Certificate) error {
		c := s.client(t, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: certs, ServerName: "127.0.0.1"})))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := ask(ctx, c, desc("user", "tls"))
		return err
	}
	require.NoError(t, dial(ca.issue(t, "envoy.example").pair(t)))
	require.Error(t, dial(), "no client certificate")
	require.Error(t, dial(ca.issue(t, "other.example").pair(t)), "another SAN")
	_, err := ask(context.Background(), s.client(t), desc("user", "plain"))
	require.Error(t, err, "no TLS at all")
}

// gRPC server reflection: a client such as grpcurl finds the service and
// its messages without a protoset.
func TestReflection(t *testing.T) {
	redisSrv := testredis.Start(t)
	s := start(t, "REDIS_URL="+redisSrv.Addr)
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	resp, err := st.Recv()
	require.NoError(t, err)
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	require.Contains(t, names, "envoy.service.ratelimit.v3.RateLimitService")
	require.NoError(t, st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "envoy.service.ratelimit.v3.RateLimitRequest"}}))
	resp, err = st.Recv()
	require.NoError(t, err)
	require.NotEmpty(t, resp.GetFileDescriptorResponse().GetFileDescriptorProto(), "the messages' descriptors")
}

// HOST and GRPC_HOST of "::", as Envoy Gateway sets them: both families
// served.
func TestDualStack(t *testing.T) {
	redisSrv := testredis.Start(t)
	s := start(t, "REDIS_URL="+redisSrv.Addr, "HOST=::", "GRPC_HOST=::")
	_, err := ask(context.Background(), s.client(t), desc("user", "v4"))
	require.NoError(t, err, "IPv4")
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here (%v): IPv4 checked only", err)
	}
	ln.Close()
	_, port, _ := net.SplitHostPort(s.grpcAddr)
	v6 := &service{grpcAddr: net.JoinHostPort("::1", port)}
	_, err = ask(context.Background(), v6.client(t), desc("user", "v6"))
	require.NoError(t, err, "IPv6")
}

// TLS to Redis as the reference's settings and Envoy Gateway's give it: a
// server that wants a client certificate (REDIS_TLS_CLIENT_CERT, _KEY),
// verified against REDIS_TLS_CACERT; without the client's certificate,
// UNAVAILABLE.
func TestRedisTLS(t *testing.T) {
	write := writer(t)
	ca := newCA(t)
	server, client := ca.issue(t, "127.0.0.1"), ca.issue(t, "ratelimit")
	tlsPort := testredis.FreePort(t)
	testredis.Start(t, "--tls-port", fmt.Sprint(tlsPort), "--tls-cert-file", write("redis.crt", server.certPEM),
		"--tls-key-file", write("redis.key", server.keyPEM), "--tls-ca-cert-file", write("redis-ca.crt", ca.certPEM), "--tls-auth-clients", "yes")
	caFile, certFile, keyFile := write("ca.crt", ca.certPEM), write("client.crt", client.certPEM), write("client.key", client.keyPEM)
	env := []string{fmt.Sprintf("REDIS_URL=127.0.0.1:%d", tlsPort), "REDIS_TLS=true", "REDIS_TLS_CACERT=" + caFile}
	s := start(t, append(env, "REDIS_TLS_CLIENT_CERT="+certFile, "REDIS_TLS_CLIENT_KEY="+keyFile)...)
	r, err := ask(context.Background(), s.client(t), desc("user", "tls"))
	require.NoError(t, err)
	require.Equal(t, uint32(1), r.Statuses[0].LimitRemaining, "decided in Redis")
	require.NotContains(t, s.log.String(), "not honoured")

	skip := start(t, append(env, "REDIS_TLS_CLIENT_CERT="+certFile, "REDIS_TLS_CLIENT_KEY="+keyFile,
		"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true")...)
	_, err = ask(context.Background(), skip.client(t), desc("user", "tls-skip"))
	require.NoError(t, err, "the chain verified, not the name")

	noCert := start(t, env...)
	_, err = ask(context.Background(), noCert.client(t), desc("user", "tls2"))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
}

// writer returns a function that writes a file of data, named name, in a
// directory of t's own, and returns its path.
func writer(t *testing.T) func(name string, data []byte) string {
	dir := t.TempDir()
	return func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
}

// fillUser sends the user ann's 2 a minute with the tenant acme, then ds,
// and returns the answer to ds, which is over the user's limit.
func fillUser(t *testing.T, c pb.RateLimitServiceClient, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	ctx := context.Background()
	for range 2 {
		r, err := ask(ctx, c, desc("user", "ann"), desc("tenant", "acme"))
		require.NoError(t, err)
		require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	}
	r, err := ask(ctx, c, ds...)
	require.NoError(t, err)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	return r
}

// waitFor polls cond, a state of the process under test, until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 30 s", what)
		}
		time.Sleep(20 * time.Millisecond) // another process's poll
	}
}

// certificate is a certificate and key, PEM encoded.
type certificate struct {
	cert            *x509.Certificate
	key             *ecdsa.PrivateKey
	certPEM, keyPEM []byte
}

func (c certificate) pair(t *testing.T) tls.Certificate {
	p, err := tls.X509KeyPair(c.certPEM, c.keyPEM)
	require.NoError(t, err)
	return p
}

func newCA(t *testing.T) certificate {
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	return makeCert(t, tmpl, nil)
}

// issue returns a certificate that c signed for san (an IP or a DNS name),
// good for servers and clients.
func (c certificate) issue(t *testing.T, san string) certificate {
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: san},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	if ip := net.ParseIP(san); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{san}
	}
	return makeCert(t, tmpl, &c)
}

func makeCert(t *testing.T, tmpl *x509.Certificate, parent *certificate) certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return certificate{cert: cert, key: key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}
}
