package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

// otlpReceiver is an OTLP/HTTP trace receiver: what POST /v1/traces
// brought.
type otlpReceiver struct {
	mu       sync.Mutex
	requests []*coltracepb.ExportTraceServiceRequest
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	req := &coltracepb.ExportTraceServiceRequest{}
	if err == nil {
		err = proto.Unmarshal(body, req)
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || err != nil {
		http.Error(w, fmt.Sprintf("%s %s: %v", r.Method, r.URL.Path, err), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	o.requests = append(o.requests, req)
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// exported is a span received, with its resource's attributes.
type exported struct {
	span     *tracepb.Span
	resource map[string]string
}

func (o *otlpReceiver) spans() []exported {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []exported
	for _, req := range o.requests {
		for _, rs := range req.GetResourceSpans() {
			res := attrs(rs.GetResource().GetAttributes())
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					out = append(out, exported{sp, res})
				}
			}
		}
	}
	return out
}

// attrs returns kvs as text.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[kv.GetKey()] = strings.Trim(kv.GetValue().String(), " ")
	}
	return m
}

// TRACING_ENABLED with Envoy Gateway's variables: a span a call, in the
// trace Envoy's metadata names (W3C traceparent or B3), exported over
// OTLP/HTTP when the service stops; at TRACING_SAMPLING_RATE=0 a call
// without a sampled parent makes none (parent-based).
func TestTracing(t *testing.T) {
	receiver := &otlpReceiver{}
	otlp := httptest.NewServer(receiver)
	t.Cleanup(otlp.Close)
	redisSrv := testredis.Start(t)
	s := start(t, "REDIS_URL="+redisSrv.Addr, "TRACING_ENABLED=true", "TRACING_SERVICE_NAME=ratelimit",
		"TRACING_SERVICE_NAMESPACE=envoy-gateway-system", "TRACING_SERVICE_INSTANCE_ID=ratelimit-7d9f-x2", "TRACING_EXPORTER_PROTOCOL=http",
		"TRACING_SAMPLING_RATE=0", "OTEL_EXPORTER_OTLP_ENDPOINT="+otlp.URL)
	require.NotContains(t, s.log.String(), "not honoured")
	c := s.client(t)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	const b3TraceID, b3ParentID = "80f198ee56343ba864fe8b2a57d3eff7", "e457b5a2e4d86bd1"
	w3c := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	_, err := ask(w3c, c, desc("user", "ann"))
	require.NoError(t, err)
	b3 := metadata.AppendToOutgoingContext(context.Background(), "x-b3-traceid", b3TraceID, "x-b3-spanid", b3ParentID, "x-b3-sampled", "1")
	_, err = ask(b3, c, desc("tenant", "acme"))
	require.NoError(t, err)
	_, err = ask(context.Background(), c, desc("user", "bob"))
	require.NoError(t, err, "no parent: not sampled at rate 0")

	require.NoError(t, s.cmd.Process.Signal(os.Interrupt))
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "%s", s.log)
	case <-time.After(30 * time.Second):
		t.Fatalf("ratelimit-rls did not stop\n%s", s.log)
	}

	spans := receiver.spans()
	require.Len(t, spans, 2, "a span a sampled call, exported at shutdown")
	got := map[string]exported{}
	for _, e := range spans {
		got[hex.EncodeToString(e.span.GetTraceId())] = e
		t.Logf("span %q kind %v trace %x parent %x\n  attributes %v\n  resource %v", e.span.GetName(), e.span.GetKind(),
			e.span.GetTraceId(), e.span.GetParentSpanId(), attrs(e.span.GetAttributes()), e.resource)
	}
	e, ok := got[traceID]
	require.True(t, ok, "the W3C traceparent's trace")
	require.Equal(t, parentID, hex.EncodeToString(e.span.GetParentSpanId()))
	require.Equal(t, "ShouldRateLimit Execution", e.span.GetName())
	require.Equal(t, tracepb.Span_SPAN_KIND_SERVER, e.span.GetKind())
	a := attrs(e.span.GetAttributes())
	require.Equal(t, `string_value:"api"`, a["domain"])
	require.Equal(t, `string_value:"OK"`, a["overall_code"])
	require.Contains(t, a["request string"], "ann")
	require.Equal(t, `string_value:"ratelimit"`, e.resource["service.name"])
	require.Equal(t, `string_value:"envoy-gateway-system"`, e.resource["service.namespace"])
	require.Equal(t, `string_value:"ratelimit-7d9f-x2"`, e.resource["service.instance.id"])
	e, ok = got[b3TraceID]
	require.True(t, ok, "the B3 headers' trace")
	require.Equal(t, b3ParentID, hex.EncodeToString(e.span.GetParentSpanId()))
}

// The tracing and statsd settings: the reference's defaults, but for
// USE_STATSD (off unless true); values that do not parse are errors; none
// of them is named as not honoured.
func TestObservabilitySettings(t *testing.T) {
	s, err := readSettings(env())
	require.NoError(t, err)
	require.Equal(t, tracingSettings{serviceName: "RateLimit", protocol: "http", samplingRate: 1}, s.tracing)
	require.Equal(t, statsdSettings{host: "localhost", port: 8125, network: "tcp", tags: map[string]string{}, flushEvery: 10 * time.Second}, s.statsd)

	s, err = readSettings(env("TRACING_ENABLED=true", "TRACING_SERVICE_NAME=rl", "TRACING_SERVICE_NAMESPACE=ns",
		"TRACING_SERVICE_INSTANCE_ID=i", "TRACING_EXPORTER_PROTOCOL=GRPC", "TRACING_SAMPLING_RATE=0.25",
		"USE_STATSD=true", "STATSD_HOST=statsd", "STATSD_PORT=9125", "STATSD_PROTOCOL=udp", "EXTRA_TAGS=a:1,b:2",
		"STATS_FLUSH_INTERVAL=1s"))
	require.NoError(t, err)
	require.Equal(t, tracingSettings{enabled: true, serviceName: "rl", namespace: "ns", instanceID: "i", protocol: "grpc", samplingRate: 0.25}, s.tracing)
	require.Equal(t, statsdSettings{enabled: true, host: "statsd", port: 9125, network: "udp", tags: map[string]string{"a": "1", "b": "2"},
		flushEvery: time.Second}, s.statsd)
	require.Empty(t, s.notHonoured)

	for _, tc := range []struct{ v, says string }{
		{"TRACING_EXPORTER_PROTOCOL=zipkin", "TRACING_EXPORTER_PROTOCOL"},
		{"TRACING_SAMPLING_RATE=most", "TRACING_SAMPLING_RATE"},
		{"STATSD_PROTOCOL=unix", "STATSD_PROTOCOL"},
		{"STATS_FLUSH_INTERVAL=10", "STATS_FLUSH_INTERVAL"},
		{"USE_STATSD=yes", "USE_STATSD"},
	} {
		_, err := readSettings(env(tc.v))
		require.ErrorContains(t, err, tc.says, tc.v)
	}
}
