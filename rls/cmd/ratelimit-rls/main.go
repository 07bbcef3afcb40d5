// Command ratelimit-rls is a rate limit service for Envoy that reads
// envoyproxy/ratelimit's configuration files and settings and decides with
// sliding windows on Redis or Valkey (github.com/slidingwindow/ratelimit).
//
//	go install github.com/slidingwindow/ratelimit/rls/cmd/ratelimit-rls@latest
//	REDIS_SOCKET_TYPE=tcp REDIS_URL=localhost:6379 RUNTIME_ROOT=/data RUNTIME_SUBDIRECTORY=ratelimit ratelimit-rls
//
// It serves envoy.service.ratelimit.v3.RateLimitService and
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService on
// GRPC_HOST:GRPC_PORT (0.0.0.0:8081), GET /healthcheck and POST /json on HOST:PORT
// (0.0.0.0:8080), and with USE_PROMETHEUS=true the metrics on
// PROMETHEUS_ADDR PROMETHEUS_PATH (:9090 /metrics). The configuration files
// are RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY/*.yaml, read
// again when they change. docs/envoy.md lists every setting.
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	_ "time/tzdata" // the zones of calendar rules in the image (tools/rlsimage), which has no zone database

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	// REDIS_TLS in the image (tools/rlsimage), which has no system roots: Go uses these only where the system has none.
	_ "golang.org/x/crypto/x509roots/fallback"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/slidingwindow/ratelimit"
	ratelimitotel "github.com/slidingwindow/ratelimit/otel"
	"github.com/slidingwindow/ratelimit/rls"
)

// usage is what -h prints.
const usage = `ratelimit-rls: a rate limit service for Envoy (envoy.service.ratelimit.v3)
that reads envoyproxy/ratelimit's settings and configuration and decides
with sliding windows on Redis or Valkey.

Usage:
  ratelimit-rls            serve, configured by the environment
  ratelimit-rls -version   print the version and exit
  ratelimit-rls -h         print this and exit

Settings are the reference's environment variables (REDIS_URL, RUNTIME_ROOT,
CONFIG_TYPE, ...) and ours (RLS_*): every one is in docs/envoy.md,
https://github.com/slidingwindow/ratelimit/blob/main/docs/envoy.md
`

func main() {
	fs := flag.NewFlagSet("ratelimit-rls", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	version := fs.Bool("version", false, "")
	if err := fs.Parse(os.Args[1:]); err != nil || fs.NArg() > 0 {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(usage)
			return
		}
		if err == nil {
			err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
		}
		fmt.Fprintf(os.Stderr, "ratelimit-rls: %v\n\n%s", err, usage)
		os.Exit(2)
	}
	if *version {
		fmt.Println(versionLine())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.LookupEnv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// versionLine names the command's module version, as the go command
// stamped it (a release, a pseudo-version from a working tree, or
// "(devel)" under go run), and its Go.
func versionLine() string {
	v := "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
	}
	return fmt.Sprintf("ratelimit-rls %s %s", v, runtime.Version())
}

// run serves until ctx is done, with the settings env gives, logging to w.
func run(ctx context.Context, env func(string) (string, bool), w io.Writer) error {
	s, err := readSettings(env)
	if err != nil {
		return err
	}
	quotaOpts, err := quotaOptions(env)
	if err != nil {
		return err
	}
	log := newLogger(s, w)
	if len(s.notHonoured) > 0 {
		log.Warn("ratelimit-rls: these settings of envoyproxy/ratelimit are set and not honoured: " + strings.Join(s.notHonoured, " "))
	}
	if s.prometheusMapper != "" {
		// Envoy Gateway sets it to its statsd-exporter mapping, whose names
		// and labels the metrics have already
		log.Info("ratelimit-rls: PROMETHEUS_MAPPER_YAML is not applied: the metrics carry the names and labels of the reference's default mapping (Envoy Gateway's)", "file", s.prometheusMapper)
	}
	if s.stopIncrementOverLimit {
		log.Info("ratelimit-rls: STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT changes nothing: a request over any limit is counted under none, always")
	}

	client, err := newRedis(s)
	if err != nil {
		return err
	}
	defer client.Close()

	var metrics *rls.Metrics
	limiterOpts := []ratelimit.Option{
		ratelimit.WithTimeout(s.timeout),
		ratelimit.WithErrorHandler(func(ctx context.Context, _ string, err error) {
			log.WarnContext(ctx, "ratelimit-rls: Redis", "error", err)
		}),
	}
	if s.cacheKeyPrefix != "" {
		limiterOpts = append(limiterOpts, ratelimit.WithPrefix(s.cacheKeyPrefix))
	}
	switch s.failurePolicy {
	case "open":
		limiterOpts = append(limiterOpts, ratelimit.WithFailurePolicy(ratelimit.FailOpen))
	case "closed":
		limiterOpts = append(limiterOpts, ratelimit.WithFailurePolicy(ratelimit.FailClosed))
	case "local":
		limiterOpts = append(limiterOpts, ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithReplicas(s.replicas))
	}
	var registry *prometheus.Registry
	var observer *ratelimitotel.Observer
	if s.usePrometheus {
		registry = prometheus.NewRegistry()
		if metrics, err = rls.NewMetrics(registry); err != nil {
			return err
		}
		exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
		if err != nil {
			return err
		}
		provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
		defer provider.Shutdown(context.Background())
		if observer, err = ratelimitotel.NewObserver(provider); err != nil {
			return err
		}
		limiterOpts = append(limiterOpts, ratelimit.WithObserver(observer))
	}
	if s.statsd.enabled { // beside Prometheus, or alone
		if metrics == nil {
			if metrics, err = rls.NewMetrics(nil); err != nil {
				return err
			}
		}
		st := rls.NewStatsd(s.statsd.tags)
		metrics.SetStatsd(st)
		defer startStatsd(s.statsd, st, log)() // the last flush once no call runs
	}
	limiter := ratelimit.New(client, limiterOpts...)
	if observer != nil {
		reg, err := observer.ObserveLimiter(limiter)
		if err != nil {
			return err
		}
		defer reg.Unregister()
	}

	serverOpts := []rls.Option{
		rls.WithShadowMode(s.shadowMode),
		rls.WithQuotaMode(s.quotaMode),
		rls.WithDynamicMetadata(s.dynamicMetadata),
		rls.WithFailurePolicy(s.failurePolicy != "unavailable"),
		rls.WithNearLimitRatio(s.nearLimitRatio),
	}
	if s.headersEnabled {
		serverOpts = append(serverOpts, rls.WithResponseHeaders(s.limitH, s.remainingH, s.resetH))
	}
	if metrics != nil {
		serverOpts = append(serverOpts, rls.WithMetrics(metrics))
	}
	if s.cutover {
		// the reference's counters, under its own CACHE_KEY_PREFIX (docs/envoy.md, "Cutover from the reference")
		serverOpts = append(serverOpts, rls.WithReferenceCutover(client, s.cacheKeyPrefix,
			rls.CutoverJitter(s.jitter), rls.CutoverTimeout(s.timeout)))
		log.Info("ratelimit-rls: REFERENCE_CUTOVER: deciding by the reference's counters too", "prefix", s.cacheKeyPrefix)
	}
	server := rls.NewServer(limiter, nil, serverOpts...)
	if registry != nil {
		qm, err := rls.NewQuotaMetrics(registry)
		if err != nil {
			return err
		}
		quotaOpts = append(quotaOpts, rls.WithQuotaMetrics(qm))
	}
	quota, err := rls.NewQuotaServer(limiter, server.Config, quotaOpts...)
	if err != nil {
		return err
	}
	// the gRPC server's TLS before the first configuration, so that a
	// setting in error is said at once
	grpcOpts := []grpc.ServerOption{}
	if s.grpcTLS {
		creds, err := serverTLS(s)
		if err != nil {
			return err
		}
		grpcOpts = append(grpcOpts, grpc.Creds(creds))
	}
	var traces *tracing // nil: no interceptor, nothing a call
	if s.tracing.enabled {
		if traces, err = newTracing(ctx, s.tracing, log); err != nil {
			return err
		}
		defer traces.shutdown(log) // the last spans once no call runs
		grpcOpts = append(grpcOpts, grpc.UnaryInterceptor(traces.intercept))
	}
	healthSrv := health.NewServer()
	healthy := &healthCheck{grpc: healthSrv}
	healthy.ok.Store(true)
	if s.healthyWithConfig {
		healthy.loaded = func() bool { cfg := server.Config(); return cfg != nil && len(cfg.Domains()) > 0 }
	}
	healthy.sync()
	var watcher *configWatcher
	source := "files in " + s.configDir()
	if s.configType == "GRPC_XDS_SOTW" {
		source = fmt.Sprintf("xDS from %s as node %q", s.xds.url, s.xds.nodeID)
		xds := newXDSClient(s.xds, s.loader(), server, metrics, log)
		xds.applied = healthy.sync
		conn, err := xds.dial()
		if err != nil {
			return err
		}
		defer conn.Close()
		xctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { xds.run(xctx, conn); close(done) }()
		defer func() { cancel(); <-done }()
		if !s.forceStart {
			// as the reference: no port opens before the first
			// configuration (FORCE_START_WITHOUT_INITIAL_CONFIG opens them
			// at once)
			log.Info("ratelimit-rls: waiting for the first configuration over xDS", "server", s.xds.url)
			select {
			case <-xds.first:
			case <-ctx.Done():
				return nil
			}
		}
	} else {
		watcher = &configWatcher{dir: s.configDir(), ignoreDot: s.runtimeIgnoreDotFiles, load: s.loader(), server: server,
			applied: healthy.sync, metrics: metrics, log: log}
		watcher.poll()
	}

	// a worker per core serves the streams, rather than a new goroutine
	// each: 1.01x to 1.11x the calls a second with 1 and 8 callers in
	// bench/envoy (grpc-go marks the option experimental)
	g := grpc.NewServer(append(grpcOpts, grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))))...)
	server.Register(g)
	quota.Register(g)
	healthpb.RegisterHealthServer(g, healthSrv)
	reflection.Register(g) // grpcurl and the like without a protoset
	grpcLn, err := net.Listen("tcp", net.JoinHostPort(s.grpcHost, strconv.Itoa(s.grpcPort)))
	if err != nil {
		return err
	}
	httpLn, err := net.Listen("tcp", net.JoinHostPort(s.host, strconv.Itoa(s.port)))
	if err != nil {
		grpcLn.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /healthcheck", healthy)
	mux.HandleFunc("POST /json", jsonHandler(traces.wrap(server.ShouldRateLimit)))
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	servers := []func() error{
		func() error { return g.Serve(grpcLn) },
		func() error { return serveHTTP(httpSrv, httpLn) },
	}
	var promSrv *http.Server
	if registry != nil {
		promLn, err := net.Listen("tcp", s.prometheusAddr)
		if err != nil {
			grpcLn.Close()
			httpLn.Close()
			return err
		}
		pm := http.NewServeMux()
		pm.Handle(s.prometheusPath, promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
		promSrv = &http.Server{Handler: pm, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, func() error { return serveHTTP(promSrv, promLn) })
	}
	// one line an operator sees at the default level, as the reference's
	// "Listening for …" lines
	if server.Config() == nil {
		log.Warn("ratelimit-rls: serving with no configuration loaded: every call is UNAVAILABLE until one loads",
			"grpc", grpcLn.Addr().String(), "http", httpLn.Addr().String(), "config", source)
	} else {
		log.Warn("ratelimit-rls: serving", "grpc", grpcLn.Addr().String(), "http", httpLn.Addr().String(), "config", source,
			"domains", server.Config().Domains())
	}

	errc := make(chan error, len(servers))
	for _, serve := range servers {
		go func() { errc <- serve() }()
	}
	ticker := time.NewTicker(s.configPoll)
	defer ticker.Stop()
	for {
		select {
		case err := <-errc:
			g.Stop()
			return err
		case <-ticker.C:
			if watcher != nil {
				watcher.poll()
			}
			continue
		case <-ctx.Done():
		}
		break
	}
	healthy.ok.Store(false)
	healthSrv.Shutdown()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// the quota streams first: their Envoys go to their fallback and the
	// tokens they cannot have spent are given back; GracefulStop would
	// wait for the streams
	if err := quota.Shutdown(shutdown); err != nil {
		log.Warn("ratelimit-rls: ending the quota streams", "error", err)
	}
	_ = httpSrv.Shutdown(shutdown)
	if promSrv != nil {
		_ = promSrv.Shutdown(shutdown)
	}
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-shutdown.Done():
		g.Stop()
	}
	// No call runs now: give back what leases hold, and end the
	// Limiter's work in the background.
	if err := limiter.Close(shutdown); err != nil {
		log.Warn("ratelimit-rls: closing the limiter", "error", err)
	}
	return nil
}

// serveHTTP serves srv on ln until it is shut down.
func serveHTTP(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newLogger returns the logger LOG_LEVEL and LOG_FORMAT ask for (the
// reference's logrus levels: trace and debug are debug, fatal and panic
// error).
func newLogger(s *settings, w io.Writer) *slog.Logger {
	level := slog.LevelWarn
	switch strings.ToLower(s.logLevel) {
	case "trace", "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "error", "fatal", "panic":
		level = slog.LevelError
	}
	opts := &slog.HandlerOptions{Level: level}
	if strings.EqualFold(s.logFormat, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// dialTimeout bounds a connection attempt: go-redis's default of 5 s would
// hold a call past RLS_TIMEOUT to a server that is gone.
const dialTimeout = 500 * time.Millisecond

// newRedis returns the client REDIS_TYPE, REDIS_URL and the rest describe,
// as the reference reads them: a comma-separated list of a Cluster's
// nodes; for Sentinel, the master's name then the Sentinels; REDIS_AUTH a
// password, or user:password. It takes the library's advice (README,
// "Client options worth setting"): a short DialTimeout, DialerRetries 1 (a
// refused connection fails at once rather than after five dials that
// outlast RLS_TIMEOUT) and ContextTimeoutEnabled.
func newRedis(s *settings) (redis.UniversalClient, error) {
	user, pass := "", s.redisAuth
	if u, p, ok := strings.Cut(s.redisAuth, ":"); ok {
		user, pass = u, p
	}
	var tlsConfig *tls.Config
	if s.redisTLS {
		var err error
		if tlsConfig, err = redisTLS(s); err != nil {
			return nil, err
		}
	}
	urls := strings.Split(s.redisURL, ",")
	switch strings.ToUpper(s.redisType) {
	case "CLUSTER":
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: urls, Username: user, Password: pass,
			PoolSize: s.redisPoolSize, TLSConfig: tlsConfig, ContextTimeoutEnabled: true,
			DialTimeout: dialTimeout, DialerRetries: 1}), nil
	case "SENTINEL":
		if len(urls) < 2 {
			return nil, fmt.Errorf("ratelimit-rls: REDIS_URL=%q: a Sentinel setting is the master's name, then the Sentinels: mymaster,host:26379,…", s.redisURL)
		}
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: urls[0], SentinelAddrs: urls[1:],
			Username: user, Password: pass, PoolSize: s.redisPoolSize, TLSConfig: tlsConfig, ContextTimeoutEnabled: true,
			DialTimeout: dialTimeout, DialerRetries: 1}), nil
	}
	network := "tcp"
	if strings.EqualFold(s.redisSocketType, "unix") {
		network = "unix"
	}
	return redis.NewClient(&redis.Options{Network: network, Addr: s.redisURL, Username: user, Password: pass,
		PoolSize: s.redisPoolSize, TLSConfig: tlsConfig, ContextTimeoutEnabled: true,
		DialTimeout: dialTimeout, DialerRetries: 1}), nil
}

// redisTLS returns the TLS to Redis, as the reference's settings say: the
// client's certificate (REDIS_TLS_CLIENT_CERT, _KEY) for a server that asks
// for one; Redis's certificate verified against REDIS_TLS_CACERT (else the
// system's CAs, or Go's own where the system has none, as in the image)
// and, unless REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, for the address's host.
func redisTLS(s *settings) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.redisTLSCert != "" {
		cert, err := keyPair(s.redisTLSCert, s.redisTLSKey, "REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY")
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if s.redisTLSCA != "" {
		var err error
		if c.RootCAs, err = caPool(s.redisTLSCA, "REDIS_TLS_CACERT"); err != nil {
			return nil, err
		}
	}
	if s.redisTLSSkipHostname {
		// the chain is verified, the name is not
		roots := c.RootCAs
		c.InsecureSkipVerify = true
		c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			certs := make([]*x509.Certificate, len(raw))
			for i, der := range raw {
				cert, err := x509.ParseCertificate(der)
				if err != nil {
					return err
				}
				certs[i] = cert
			}
			if len(certs) == 0 {
				return errors.New("ratelimit-rls: Redis showed no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, cert := range certs[1:] {
				opts.Intermediates.AddCert(cert)
			}
			_, err := certs[0].Verify(opts)
			return err
		}
	}
	return c, nil
}

// keyPair loads a certificate and its key from the files cert and key,
// which the settings vars name.
func keyPair(cert, key, vars string) (tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return c, fmt.Errorf("ratelimit-rls: %s: %w", vars, err)
	}
	return c, nil
}

// caPool returns the CA certificates of the PEM file path, which the
// setting name names.
func caPool(path, name string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ratelimit-rls: %s: %w", name, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("ratelimit-rls: %s: no certificate in %s", name, path)
	}
	return pool, nil
}

// serverTLS returns the gRPC server's TLS: its certificate, and with
// GRPC_CLIENT_TLS_CACERT, clients must show one that CA signed (mTLS), and
// with GRPC_CLIENT_TLS_SAN, one that names that SAN.
func serverTLS(s *settings) (credentials.TransportCredentials, error) {
	cert, err := keyPair(s.grpcCert, s.grpcKey, "GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY")
	if err != nil {
		return nil, err
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if s.grpcClientCA != "" {
		pool, err := caPool(s.grpcClientCA, "GRPC_CLIENT_TLS_CACERT (or GRPC_SERVER_TLS_CA_CERT)")
		if err != nil {
			return nil, err
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	if san := s.grpcClientSAN; san != "" {
		c.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error {
			for _, chain := range chains {
				if len(chain) > 0 && names(chain[0], san) {
					return nil
				}
			}
			return fmt.Errorf("ratelimit-rls: the client's certificate does not name %s", san)
		}
	}
	return credentials.NewTLS(c), nil
}

// names reports whether cert has san among its subject alternative names.
func names(cert *x509.Certificate, san string) bool {
	if slices.Contains(cert.DNSNames, san) || slices.Contains(cert.EmailAddresses, san) {
		return true
	}
	for _, u := range cert.URIs {
		if u.String() == san {
			return true
		}
	}
	for _, ip := range cert.IPAddresses {
		if ip.String() == san {
			return true
		}
	}
	return false
}

// healthCheck answers GET /healthcheck, and keeps grpc.health.v1's status
// of the server ("") and of "ratelimit" (the reference's name) the same:
// healthy while serving, not once shutting down, and with loaded
// (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) not until a configuration of
// at least one domain is loaded, as the reference.
type healthCheck struct {
	ok     atomic.Bool
	loaded func() bool
	grpc   *health.Server
}

// healthy reports whether the service is.
func (h *healthCheck) healthy() bool { return h.ok.Load() && (h.loaded == nil || h.loaded()) }

// sync sets the gRPC health to what ServeHTTP answers; it is called at
// start-up and when a configuration is applied.
func (h *healthCheck) sync() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if h.healthy() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	h.grpc.SetServingStatus("", st)
	h.grpc.SetServingStatus("ratelimit", st)
}

// ServeHTTP answers OK, or 500 once shutting down or while a configuration
// it needs is missing.
func (h *healthCheck) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if !h.healthy() {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	_, _ = w.Write([]byte("OK"))
}

// jsonHandler answers POST /json: a RateLimitRequest as protobuf JSON, and
// its RateLimitResponse as decide answers it (the Server's ShouldRateLimit,
// traced or not), 429 when over the limit, as the reference's. A
// request it cannot read or that is invalid is 400; one Redis could not
// decide is 503 (the reference answers 400 for both).
func jsonHandler(decide func(context.Context, *pb.RateLimitRequest) (*pb.RateLimitResponse, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		var req pb.RateLimitRequest
		if err == nil {
			err = protojson.Unmarshal(body, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := decide(r.Context(), &req)
		if err != nil {
			code := http.StatusServiceUnavailable
			if status.Code(err) == codes.InvalidArgument {
				code = http.StatusBadRequest
			}
			http.Error(w, status.Convert(err).Message(), code)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	}
}

// configWatcher loads the configuration directory when its files change:
// a broken configuration is logged and counted, and the last good one
// stays.
type configWatcher struct {
	dir       string
	ignoreDot bool
	load      func([]rls.File) (*rls.Config, error) // rls.LoadConfig, or LoadConfigMerged
	server    *rls.Server
	applied   func() // after a configuration is applied
	metrics   *rls.Metrics
	log       *slog.Logger
	seen      [sha256.Size]byte
	loaded    bool
	failed    string // the last error reading the directory, logged once
}

// poll loads the directory if its files are not those of the last poll.
func (c *configWatcher) poll() {
	files, err := rls.ReadDir(c.dir, c.ignoreDot)
	if err != nil {
		if msg := err.Error(); msg != c.failed { // once, not every poll
			c.failed = msg
			if c.metrics != nil {
				c.metrics.ConfigLoaded(err)
			}
			c.log.Error("ratelimit-rls: the configuration directory could not be read; "+kept(c.server), "error", err)
		}
		return
	}
	c.failed = ""
	sum := fingerprint(files)
	if c.loaded && sum == c.seen {
		return
	}
	c.seen, c.loaded = sum, true
	cfg, err := c.load(files)
	if c.metrics != nil {
		c.metrics.ConfigLoaded(err)
	}
	if err != nil {
		c.log.Error("ratelimit-rls: the configuration did not load; "+kept(c.server), "error", err)
		return
	}
	c.server.SetConfig(cfg)
	if c.applied != nil {
		c.applied()
	}
	c.log.Info("ratelimit-rls: configuration loaded", "dir", c.dir, "domains", cfg.Domains())
}

// kept says what serves after a configuration failed to load: the last
// good one, or none.
func kept(s *rls.Server) string {
	if s.Config() == nil {
		return "no configuration is loaded: every call is UNAVAILABLE"
	}
	return "the last good one stays"
}

// fingerprint returns a digest of the names and contents of files: what a
// change of any of them, or of the directory a symbolic link points to,
// changes.
func fingerprint(files []rls.File) [sha256.Size]byte {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%s\x00%d\x00", f.Name, len(f.Data))
		h.Write(f.Data)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
