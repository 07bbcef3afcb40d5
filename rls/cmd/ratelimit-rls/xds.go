// Configuration over xDS (CONFIG_TYPE=GRPC_XDS_SOTW), as envoyproxy/ratelimit
// takes it and Envoy Gateway serves it: a state-of-the-world subscription,
// over ADS, to every RateLimitConfig the management server holds for this
// node. Each response is the whole configuration, loaded as the files are
// (the same loader, errors and metrics), all or nothing: acknowledged and
// applied, or refused (a NACK) with the last good one kept.

package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/slidingwindow/ratelimit/rls"
)

// configTypeURL is the one resource type the service subscribes to.
const configTypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// xdsSettings are the reference's CONFIG_GRPC_XDS_* and XDS_CLIENT_*
// settings.
type xdsSettings struct {
	url, nodeID           string
	nodeMetadata          map[string]string // CONFIG_GRPC_XDS_NODE_METADATA: k=v,…
	headers               map[string]string // CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: k:v,…, sent on the stream
	connectRetry          time.Duration     // between attempts to connect
	useTLS                bool
	clientCert, clientKey string // the client's certificate, for mTLS
	serverCA, serverSAN   string // who the server must be; no CA: the system's
	backoffInitial        time.Duration
	backoffMax            time.Duration
	backoffFactor         float64 // XDS_CLIENT_BACKOFF_RANDOM_FACTOR: the reference's growth factor (see backoff)
	backoffJitter         bool
	maxMsgSize            int // 0: gRPC's default
}

// xdsClient keeps a subscription to the management server and applies
// what it pushes to server.
type xdsClient struct {
	s       xdsSettings
	load    func([]rls.File) (*rls.Config, error) // rls.LoadConfig, or LoadConfigMerged
	server  *rls.Server
	applied func() // after a configuration is applied, if not nil
	metrics *rls.Metrics
	log     *slog.Logger
	node    *core.Node

	first     chan struct{} // closed once the first response is handled, loaded or not
	firstOnce sync.Once

	// the stream's state, kept across streams: the version applied last,
	// and the digest and error of the response refused last (a snapshot
	// cache sends a refused version again at once after each NACK)
	version  string
	refused  [sha256.Size]byte
	refusedE string
}

// newXDSClient returns a client of the management server s names.
func newXDSClient(s xdsSettings, load func([]rls.File) (*rls.Config, error), server *rls.Server, metrics *rls.Metrics, log *slog.Logger) *xdsClient {
	md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range s.nodeMetadata {
		md.Fields[k] = structpb.NewStringValue(v)
	}
	return &xdsClient{s: s, load: load, server: server, metrics: metrics, log: log,
		node:  &core.Node{Id: s.nodeID, Metadata: md},
		first: make(chan struct{})}
}

// dial returns the connection to the management server: TLS as the
// settings say, a new attempt every connectRetry while it is down.
func (x *xdsClient) dial() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if x.s.useTLS {
		c, err := x.tlsConfig()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(c)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: x.s.connectRetry, Multiplier: 1, Jitter: 0.5, MaxDelay: x.s.connectRetry},
			MinConnectTimeout: 20 * time.Second,
		}),
	}
	if x.s.maxMsgSize > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(x.s.maxMsgSize)))
	}
	return grpc.NewClient(x.s.url, opts...)
}

// tlsConfig returns the client's TLS: its certificate for a server that
// asks for one (mTLS), the server verified against serverCA (else the
// system's CAs) under the name serverSAN (else the URL's host).
func (x *xdsClient) tlsConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: x.s.serverSAN}
	if x.s.clientCert != "" {
		cert, err := keyPair(x.s.clientCert, x.s.clientKey, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT, CONFIG_GRPC_XDS_CLIENT_TLS_KEY")
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if x.s.serverCA != "" {
		var err error
		if c.RootCAs, err = caPool(x.s.serverCA, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// run keeps a stream open on conn until ctx ends: when one ends, the next
// opens after the wait backoff gives, which starts again from its first
// once a stream has brought a response.
func (x *xdsClient) run(ctx context.Context, conn *grpc.ClientConn) {
	client := discovery.NewAggregatedDiscoveryServiceClient(conn)
	for attempt := 0; ; attempt++ {
		answered, err := x.stream(ctx, client)
		if ctx.Err() != nil {
			return
		}
		if answered {
			attempt = 0
		}
		d := x.backoff(attempt, rand.Float64())
		x.log.Warn("ratelimit-rls: the xDS stream ended or did not open; "+kept(x.server)+"; trying again", "server", x.s.url, "error", err, "in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// backoff returns the wait before a stream's attempt-th retry (from 0), as
// the reference's client computes it (jpillora/backoff): backoffInitial ×
// factor^attempt (a factor of 0 is 2), with jitter a point between
// backoffInitial and that, r of the way (r in [0, 1)), kept within
// [backoffInitial, backoffMax]. The reference's default factor, 0.5, keeps
// every wait at backoffInitial.
func (x *xdsClient) backoff(attempt int, r float64) time.Duration {
	lo, hi := x.s.backoffInitial, x.s.backoffMax
	if lo >= hi {
		return hi
	}
	factor := x.s.backoffFactor
	if factor <= 0 {
		factor = 2
	}
	d := float64(lo) * math.Pow(factor, float64(attempt))
	if x.s.backoffJitter {
		d = r*(d-float64(lo)) + float64(lo)
	}
	switch {
	case d > float64(hi):
		return hi
	case d < float64(lo):
		return lo
	}
	return time.Duration(d)
}

// stream subscribes once and handles the responses until the stream
// ends; it reports whether any came.
func (x *xdsClient) stream(ctx context.Context, client discovery.AggregatedDiscoveryServiceClient) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(x.s.headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(x.s.headers))
	}
	// not WaitForReady: a server that refuses the connection (its TLS, say)
	// is an error to log and wait on, not a silent wait
	st, err := client.StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	// the version applied last, so that a server restarted with the same
	// snapshot need not send it again
	if err := st.Send(&discovery.DiscoveryRequest{Node: x.node, TypeUrl: configTypeURL, VersionInfo: x.version}); err != nil {
		return false, err
	}
	answered := false
	for {
		resp, err := st.Recv()
		if err != nil {
			return answered, err
		}
		answered = true
		req, again := x.handle(resp)
		if again {
			// A snapshot cache answers a NACK with the refused version at
			// once: paced, the two of them do not spin (about 1,400 round
			// trips a second unpaced), and a new version still comes at
			// the next request.
			select {
			case <-ctx.Done():
				return answered, ctx.Err()
			case <-time.After(refusedPace):
			}
		}
		if err := st.Send(req); err != nil {
			return answered, err
		}
	}
}

// refusedPace is how long a refused version sent again waits for its
// NACK.
const refusedPace = 250 * time.Millisecond

// handle applies resp and returns its ACK, or refuses it and returns the
// NACK: the version applied last, resp's nonce and why; again reports a
// response refused before, sent again.
func (x *xdsClient) handle(resp *discovery.DiscoveryResponse) (req *discovery.DiscoveryRequest, again bool) {
	defer x.firstOnce.Do(func() { close(x.first) })
	req = &discovery.DiscoveryRequest{Node: x.node, TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
	sum := digest(resp)
	if x.refusedE != "" && sum == x.refused {
		// sent again after its NACK: refused again, logged and counted once
		req.VersionInfo, req.ErrorDetail = x.version, &statuspb.Status{Code: int32(codes.InvalidArgument), Message: x.refusedE}
		return req, true
	}
	cfg, err := loadXDS(resp, x.load)
	if x.metrics != nil {
		x.metrics.ConfigLoaded(err)
	}
	if err != nil {
		x.refused, x.refusedE = sum, err.Error()
		x.log.Error("ratelimit-rls: the configuration pushed over xDS did not load and is refused; "+kept(x.server),
			"version", resp.GetVersionInfo(), "error", err)
		req.VersionInfo, req.ErrorDetail = x.version, &statuspb.Status{Code: int32(codes.InvalidArgument), Message: x.refusedE}
		return req, false
	}
	x.refusedE = ""
	x.server.SetConfig(cfg)
	if x.applied != nil {
		x.applied()
	}
	x.version = resp.GetVersionInfo()
	x.log.Info("ratelimit-rls: configuration loaded over xDS", "version", x.version, "domains", cfg.Domains())
	req.VersionInfo = x.version
	return req, false
}

// digest returns a digest of resp's type and resources, which tells a
// response sent again from a new one.
func digest(resp *discovery.DiscoveryResponse) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte(resp.GetTypeUrl()))
	for _, r := range resp.GetResources() {
		fmt.Fprintf(h, "\x00%s\x00%d\x00", r.GetTypeUrl(), len(r.GetValue()))
		h.Write(r.GetValue())
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// loadXDS loads the configuration resp holds with load: each
// RateLimitConfig as the file of the reference's format it stands for,
// named by its name.
func loadXDS(resp *discovery.DiscoveryResponse, load func([]rls.File) (*rls.Config, error)) (*rls.Config, error) {
	if resp.GetTypeUrl() != configTypeURL {
		return nil, fmt.Errorf("a response of type %q; this service subscribes to %s only", resp.GetTypeUrl(), configTypeURL)
	}
	files := make([]rls.File, 0, len(resp.GetResources()))
	for i, r := range resp.GetResources() {
		var c rlsconf.RateLimitConfig
		if err := anypb.UnmarshalTo(r, &c, proto.UnmarshalOptions{}); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		y, err := yamlOf(&c)
		if err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		data, err := yaml.Marshal(y)
		if err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		name := c.GetName()
		if name == "" {
			name = fmt.Sprintf("resource %d", i)
		}
		files = append(files, rls.File{Name: name, Data: data})
	}
	return load(files)
}

// The reference's file format, as far as RateLimitConfig carries it.
type (
	xdsFile struct {
		Domain      string          `yaml:"domain"`
		Descriptors []xdsDescriptor `yaml:"descriptors,omitempty"`
	}
	xdsDescriptor struct {
		Key            string          `yaml:"key"`
		Value          string          `yaml:"value,omitempty"`
		RateLimit      *xdsRateLimit   `yaml:"rate_limit,omitempty"`
		Descriptors    []xdsDescriptor `yaml:"descriptors,omitempty"`
		ShadowMode     bool            `yaml:"shadow_mode,omitempty"`
		DetailedMetric bool            `yaml:"detailed_metric,omitempty"`
		QuotaMode      bool            `yaml:"quota_mode,omitempty"`
		Metadata       map[string]any  `yaml:"metadata,omitempty"`
	}
	xdsRateLimit struct {
		RequestsPerUnit uint32       `yaml:"requests_per_unit"`
		Unit            string       `yaml:"unit"`
		Unlimited       bool         `yaml:"unlimited,omitempty"`
		Name            string       `yaml:"name,omitempty"`
		Replaces        []xdsReplace `yaml:"replaces,omitempty"`
	}
	xdsReplace struct {
		Name string `yaml:"name"`
	}
)

// yamlOf returns the file c stands for.
func yamlOf(c *rlsconf.RateLimitConfig) (xdsFile, error) {
	ds, err := descriptorsOf(c.GetDescriptors())
	return xdsFile{Domain: c.GetDomain(), Descriptors: ds}, err
}

func descriptorsOf(ds []*rlsconf.RateLimitDescriptor) ([]xdsDescriptor, error) {
	out := make([]xdsDescriptor, 0, len(ds))
	for _, d := range ds {
		children, err := descriptorsOf(d.GetDescriptors())
		if err != nil {
			return nil, err
		}
		y := xdsDescriptor{Key: d.GetKey(), Value: d.GetValue(), Descriptors: children,
			ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric()}
		if y.QuotaMode, y.Metadata, err = newerFields(d); err != nil {
			return nil, fmt.Errorf("descriptor %s: %w", d.GetKey(), err)
		}
		if p := d.GetRateLimit(); p != nil {
			y.RateLimit = &xdsRateLimit{RequestsPerUnit: p.GetRequestsPerUnit(), Unit: p.GetUnit().String(),
				Unlimited: p.GetUnlimited(), Name: p.GetName()}
			for _, r := range p.GetReplaces() {
				y.RateLimit.Replaces = append(y.RateLimit.Replaces, xdsReplace{Name: r.GetName()})
			}
		}
		out = append(out, y)
	}
	return out, nil
}

// The fields of RateLimitDescriptor that go-control-plane/ratelimit v0.1.0,
// the newest release, has not: quota_mode = 7 and metadata = 8 (a
// google.protobuf.Struct), as its rls_conf.proto has them since
// envoyproxy/ratelimit PRs #1148 and #1174 (May and June 2026).
const (
	quotaModeField protowire.Number = 7
	metadataField  protowire.Number = 8
)

// newerFields reads quota_mode and metadata from d's unknown fields, where
// a message of a newer proto puts them: the last of each wins, as in
// proto3; a field of another number is left alone.
func newerFields(d *rlsconf.RateLimitDescriptor) (quota bool, metadata map[string]any, err error) {
	b := d.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false, nil, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == quotaModeField && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false, nil, protowire.ParseError(n)
			}
			quota, b = v != 0, b[n:]
			continue
		case num == metadataField && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false, nil, protowire.ParseError(n)
			}
			var s structpb.Struct
			if err := proto.Unmarshal(v, &s); err != nil {
				return false, nil, fmt.Errorf("metadata: %w", err)
			}
			metadata, b = s.AsMap(), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return false, nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return quota, metadata, nil
}
