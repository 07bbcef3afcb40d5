// OpenTelemetry traces of the calls, as the reference's TRACING_* settings
// ask: a span a call, exported over OTLP.

package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/uuid"
	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// tracingSettings are the reference's TRACING_* variables. The exporter's
// endpoint, headers, TLS and timeout are the standard OTEL_EXPORTER_OTLP_*
// variables, which the OTLP exporters read themselves.
type tracingSettings struct {
	enabled                bool    // TRACING_ENABLED
	serviceName, namespace string  // TRACING_SERVICE_NAME, TRACING_SERVICE_NAMESPACE
	instanceID             string  // TRACING_SERVICE_INSTANCE_ID: a random UUID when empty, as the reference
	protocol               string  // TRACING_EXPORTER_PROTOCOL: http or grpc
	samplingRate           float64 // TRACING_SAMPLING_RATE: of the calls that come with no sampled parent
}

// spanName is the span of a call, the reference's.
const spanName = "ShouldRateLimit Execution"

// tracing makes a span of each call, exported over OTLP.
type tracing struct {
	provider   *sdktrace.TracerProvider
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

// newTracing returns the tracing s asks for, as the reference's: sampled
// as the caller's span was, else at s.samplingRate (parent-based); the
// caller's trace context read as W3C traceparent or B3 (zipkin, single or
// multiple headers); the resource named by the TRACING_SERVICE_*
// variables.
func newTracing(ctx context.Context, s tracingSettings, log *slog.Logger) (*tracing, error) {
	var exporter *otlptrace.Exporter
	var err error
	switch s.protocol {
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	default:
		exporter, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("ratelimit-rls: the OTLP trace exporter (TRACING_EXPORTER_PROTOCOL=%s, OTEL_EXPORTER_OTLP_*): %w", s.protocol, err)
	}
	instance := s.instanceID
	if instance == "" {
		instance = uuid.NewString()
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(s.serviceName),
		semconv.ServiceNamespace(s.namespace), semconv.ServiceInstanceID(instance))
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(s.samplingRate))),
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(res),
	)
	log.Info("ratelimit-rls: tracing", "protocol", s.protocol, "service.name", s.serviceName,
		"service.namespace", s.namespace, "service.instance.id", instance, "sampling_rate", s.samplingRate)
	return &tracing{
		provider:   provider,
		tracer:     provider.Tracer("ratelimit"),
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, b3.New(), propagation.Baggage{}),
	}, nil
}

// shutdown exports the spans not yet exported, waiting at most 5 s.
func (t *tracing) shutdown(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.provider.Shutdown(ctx); err != nil {
		log.Warn("ratelimit-rls: exporting the last spans", "error", err)
	}
}

// intercept traces the gRPC calls of ShouldRateLimit, in the trace whose
// context Envoy sent in the call's metadata.
func (t *tracing) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	r, ok := req.(*pb.RateLimitRequest)
	if !ok || info.FullMethod != pb.RateLimitService_ShouldRateLimit_FullMethodName {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = t.propagator.Extract(ctx, metadataCarrier(md))
	return t.span(ctx, r, func(ctx context.Context, r *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
		resp, err := handler(ctx, r)
		out, _ := resp.(*pb.RateLimitResponse)
		return out, err
	})
}

// wrap returns decide traced: for POST /json, whose calls start a trace of
// their own, as the reference's.
func (t *tracing) wrap(decide func(context.Context, *pb.RateLimitRequest) (*pb.RateLimitResponse, error)) func(context.Context, *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if t == nil {
		return decide
	}
	return func(ctx context.Context, r *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
		return t.span(ctx, r, decide)
	}
}

// span decides r in a span of the reference's name and attributes (domain,
// "request string"), with the answer's overall_code, or the error's gRPC
// code and message.
func (t *tracing) span(ctx context.Context, r *pb.RateLimitRequest, decide func(context.Context, *pb.RateLimitRequest) (*pb.RateLimitResponse, error)) (*pb.RateLimitResponse, error) {
	ctx, span := t.tracer.Start(ctx, spanName, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("domain", r.GetDomain())))
	defer span.End()
	if span.IsRecording() { // the request's text only for a span that is kept
		span.SetAttributes(attribute.String("request string", r.String()))
	}
	resp, err := decide(ctx, r)
	if err != nil {
		st := status.Convert(err)
		span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.Code())))
		span.SetStatus(otelcodes.Error, st.Message())
		return resp, err
	}
	span.SetAttributes(attribute.String("overall_code", resp.GetOverallCode().String()))
	return resp, err
}

// metadataCarrier reads a trace context from gRPC metadata, whose keys are
// lower case.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, strings.ToLower(k))
	}
	return keys
}
