// Package otel records what a ratelimit.Limiter decides as OpenTelemetry
// metrics: decisions by outcome, source, shadow mode and policy; the time
// each Redis call took; decisions near their limit; and the state of the
// circuit breaker and the deny cache.
//
//	obs, err := otel.NewObserver(meterProvider)
//	if err != nil { ... }
//	limiter := ratelimit.New(client, ratelimit.WithObserver(obs))
//	if _, err := obs.ObserveLimiter(limiter); err != nil { ... }
//
// The package is a module of its own, so that a user of the core never
// downloads OpenTelemetry. Its name clashes with go.opentelemetry.io/otel's:
// import it under another, such as ratelimitotel.
//
// It records no span: an Observer sees a decision only once it is made, too
// late to be the parent of the Redis call's span.
package otel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/slidingwindow/ratelimit"
	global "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the Meter the Observer records
// with.
const ScopeName = "github.com/slidingwindow/ratelimit/otel"

// Instrument names. Prometheus exporters write them as
// ratelimit_decisions_total, ratelimit_redis_duration_seconds,
// ratelimit_near_limit_total, ratelimit_breaker_open and
// ratelimit_denycache_entries.
const (
	// DecisionsName counts decisions, one per call of the Limiter, looks
	// (Peek, PeekAll) included.
	DecisionsName = "ratelimit.decisions"
	// RedisDurationName is the histogram of the time each decision's Redis
	// call took, in seconds.
	RedisDurationName = "ratelimit.redis.duration"
	// NearLimitName counts the Results of admitted requests that left their
	// limit's count at or above the near-limit fraction of its Rate.
	NearLimitName = "ratelimit.near_limit"
	// BreakerOpenName is the gauge of the circuit breaker: 1 while it is
	// open or probing, 0 while it is closed.
	BreakerOpenName = "ratelimit.breaker.open"
	// AcquisitionsName counts the Limiter's Acquires (concurrency slots),
	// by outcome ("acquired" or "refused"), source and policy (the
	// Concurrency's Name).
	AcquisitionsName = "ratelimit.acquisitions"
	// DenyCacheEntriesName is the gauge of the number of clients the deny
	// cache holds.
	DenyCacheEntriesName = "ratelimit.denycache.entries"
)

// Attribute keys.
const (
	// OutcomeKey is "allowed" or "denied": what the decision would have been
	// without shadow mode, so "denied" for a request that shadow mode let
	// through.
	OutcomeKey = attribute.Key("ratelimit.outcome")
	// SourceKey is "redis", "cache" or "policy": ratelimit.Source.String().
	SourceKey = attribute.Key("ratelimit.source")
	// ShadowKey is ratelimit.Event.Shadow: the decision was made in shadow
	// mode, or against a Limit with Shadow set.
	ShadowKey = attribute.Key("ratelimit.shadow")
	// PolicyKey is the Limit.Name of the Result that decided; absent when
	// that name is empty.
	PolicyKey = attribute.Key("ratelimit.policy")
	// ErrorTypeKey is the kind of failure of a Redis call: "timeout",
	// "unavailable", "bad_reply" or "other". A decision of an open circuit
	// breaker makes no call, and so records no duration and no error.type.
	ErrorTypeKey = attribute.Key("error.type")
)

// maxPolicies is the number of distinct policy names the Observer labels
// apart (see OverflowPolicy).
const maxPolicies = 1000

// OverflowPolicy is the policy attribute of the names past the first 1000
// an Observer sees. Names are meant to be few (plans, endpoints); beyond
// 1000, new names are recorded as OverflowPolicy, so that names made from
// request data cannot grow the metrics without bound. Names seen before
// keep theirs.
const OverflowPolicy = "_other"

// durationBuckets are the histogram's bounds in seconds: a healthy Redis
// answers in tens to hundreds of microseconds, and the Limiter gives up at
// its timeout (100ms by default). An SDK View can replace them.
var durationBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
}

// Observer records a Limiter's decisions as OpenTelemetry metrics. Pass it
// to ratelimit.WithObserver; call ObserveLimiter for the gauges. One
// Observer may serve several Limiters: their decisions add up. An Observer
// is safe for simultaneous use by multiple goroutines.
type Observer struct {
	meter       metric.Meter
	decisions   metric.Int64Counter
	duration    metric.Float64Histogram
	nearLimit   metric.Int64Counter
	breakerOpen metric.Int64ObservableGauge
	denyEntries metric.Int64ObservableGauge
	acquire     metric.Int64Counter
	near        float64 // the near-limit fraction

	unnamed  *policyAttrs
	overflow *policyAttrs
	// policies maps Limit.Name to its attributes. It is copied on write:
	// names are few and come early, and a plain map read is several times
	// cheaper than a sync.Map's, which hashes an interface.
	policies atomic.Pointer[map[string]*policyAttrs]
	mu       sync.Mutex // serializes writers of policies

	durationOpts [numErrorTypes][]metric.RecordOption
}

var _ ratelimit.Observer = (*Observer)(nil)

// policyAttrs holds, for one policy name, the option of every attribute set
// a decision can have, so that a decision builds none.
type policyAttrs struct {
	decisions [2][numSources][2][]metric.AddOption // [denied][source][shadow]
	nearLimit []metric.AddOption
}

// numSources is the number of ratelimit.Source values, with one more for
// any value added to the core later ("unknown").
const numSources = int(ratelimit.SourceLease) + 2

// NewObserver returns an Observer that records with a Meter of mp named
// ScopeName; a nil mp means the global MeterProvider. The error reports an
// invalid option or an instrument mp could not make.
func NewObserver(mp metric.MeterProvider, opts ...Option) (*Observer, error) {
	cfg := config{nearLimit: defaultNearLimit}
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&cfg)
		}
	}
	if !(cfg.nearLimit > 0 && cfg.nearLimit <= 1) { // NaN too
		return nil, fmt.Errorf("ratelimit/otel: near-limit fraction %v is not in (0, 1]", cfg.nearLimit)
	}
	if mp == nil {
		mp = global.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	o := &Observer{meter: m, near: cfg.nearLimit}
	var errs [6]error
	o.decisions, errs[0] = m.Int64Counter(DecisionsName,
		metric.WithDescription("Rate-limit decisions, by outcome (what it would have been without shadow mode), source, shadow mode and policy."),
		metric.WithUnit("{decision}"))
	o.duration, errs[1] = m.Float64Histogram(RedisDurationName,
		metric.WithDescription("Time each decision's Redis call took, with error.type when it failed."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	o.nearLimit, errs[2] = m.Int64Counter(NearLimitName,
		metric.WithDescription(fmt.Sprintf("Admitted requests that left their limit's count at or above %v of its rate, by policy.", cfg.nearLimit)),
		metric.WithUnit("{decision}"))
	o.breakerOpen, errs[3] = m.Int64ObservableGauge(BreakerOpenName,
		metric.WithDescription("1 while the circuit breaker keeps decisions from Redis, 0 while it is closed."))
	o.denyEntries, errs[4] = m.Int64ObservableGauge(DenyCacheEntriesName,
		metric.WithDescription("Clients the deny cache holds."),
		metric.WithUnit("{client}"))
	o.acquire, errs[5] = m.Int64Counter(AcquisitionsName,
		metric.WithDescription("Acquires of concurrency slots, by outcome, source and policy."),
		metric.WithUnit("{acquire}"))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("ratelimit/otel: %w", err)
	}
	o.unnamed = newPolicyAttrs("")
	o.policies.Store(&map[string]*policyAttrs{})
	o.overflow = newPolicyAttrs(OverflowPolicy)
	for t := range o.durationOpts {
		var set attribute.Set
		if t != noError {
			set = attribute.NewSet(ErrorTypeKey.String(errorTypeNames[t]))
		}
		o.durationOpts[t] = []metric.RecordOption{metric.WithAttributeSet(set)}
	}
	return o, nil
}

func newPolicyAttrs(name string) *policyAttrs {
	// attribute.NewSet sorts the slice it is given: each set gets its own.
	with := func(kvs ...attribute.KeyValue) []metric.AddOption {
		if name != "" {
			kvs = append(kvs, PolicyKey.String(name))
		}
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
	}
	p := &policyAttrs{nearLimit: with()}
	for denied, outcome := range []string{"allowed", "denied"} {
		for src := range numSources {
			for shadow := range 2 {
				p.decisions[denied][src][shadow] = with(
					OutcomeKey.String(outcome),
					SourceKey.String(ratelimit.Source(src).String()),
					ShadowKey.Bool(shadow == 1))
			}
		}
	}
	return p
}

// attrs returns the attribute sets of the policy name.
func (o *Observer) attrs(name string) *policyAttrs {
	if name == "" {
		return o.unnamed
	}
	if p, ok := (*o.policies.Load())[name]; ok {
		return p
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.policies.Load()
	if p, ok := old[name]; ok {
		return p
	}
	if len(old) >= maxPolicies {
		return o.overflow
	}
	m := make(map[string]*policyAttrs, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	p := newPolicyAttrs(name)
	m[name] = p
	o.policies.Store(&m)
	return p
}

// ObserveCall records the Redis call of a Charge, a Refund, a GiveBack, an
// Acquire, or a decision whose caller left (Event.Left): its duration,
// with the error's type, and an Acquire in AcquisitionsName. It implements
// ratelimit.CallObserver. None is a decision: a refund's Results are a
// decision already counted, and a caller who left got none.
func (o *Observer) ObserveCall(ctx context.Context, e *ratelimit.Event) {
	if e.Duration > 0 {
		o.duration.Record(ctx, e.Duration.Seconds(), o.durationOpts[errorType(e.Err)]...)
	}
	if e.Kind == ratelimit.EventAcquire {
		outcome := "refused"
		if e.Allowed {
			outcome = "acquired"
		}
		kvs := []attribute.KeyValue{OutcomeKey.String(outcome), SourceKey.String(e.Source.String())}
		if e.Concurrency.Name != "" {
			kvs = append(kvs, PolicyKey.String(e.Concurrency.Name))
		}
		o.acquire.Add(ctx, 1, metric.WithAttributes(kvs...))
	}
}

// Observe records one decision: it implements ratelimit.Observer. It counts
// the decision under the policy of the Result that decided (see
// decidingPolicy); records the Redis call's duration if one was made; and
// counts each admitted Result at or above the near-limit fraction of its
// Rate, unless the decision was a look or the failure policy's. An Event
// that is no decision (see ObserveCall) is left to ObserveCall.
func (o *Observer) Observe(ctx context.Context, e *ratelimit.Event) {
	if e.Kind != ratelimit.EventDecision || e.Left {
		o.ObserveCall(ctx, e)
		return
	}
	if len(e.Results) == 0 {
		return
	}
	name, wouldDeny := decidingPolicy(e.Results)
	denied := 0
	if !e.Allowed || wouldDeny {
		denied = 1
	}
	shadow := 0
	if e.Shadow {
		shadow = 1
	}
	src := min(int(e.Source), numSources-1)
	p := o.attrs(name)
	o.decisions.Add(ctx, 1, p.decisions[denied][src][shadow]...)

	// The core reports no duration for a decision that made no Redis call:
	// the deny cache's, and an open breaker's, whose Err wraps
	// ratelimit.ErrCircuitOpen with a Duration of 0.
	if e.Duration > 0 {
		o.duration.Record(ctx, e.Duration.Seconds(), o.durationOpts[errorType(e.Err)]...)
	}

	if e.Cost == 0 {
		return
	}
	for i := range e.Results {
		r := &e.Results[i]
		if r.Allowed && !r.Shadowed && !r.Degraded && float64(r.Count) >= o.near*float64(r.Limit.Rate) {
			if r.Limit.Name != name {
				p = o.attrs(r.Limit.Name)
				name = r.Limit.Name
			}
			o.nearLimit.Add(ctx, 1, p.nearLimit...)
		}
	}
}

// decidingPolicy returns the Limit.Name of the Result that decided, and
// whether shadow mode let through a request some limit would have denied
// (some Result is Shadowed). The Result that decided is ratelimit.Binding's,
// under ratelimit.WithShadow too (every Result then reads Allowed, and the
// least remaining is a limit that would have denied). Only when it admitted
// the request and is not Shadowed, while a Shadow limit would have denied
// it, is the decision that limit's: a trial's would-be denials count under
// the trial's name (of several, the one ratelimit.Binding picks among them).
func decidingPolicy(results []ratelimit.Result) (name string, wouldDeny bool) {
	b := ratelimit.Binding(results)
	for i := range results {
		if results[i].Shadowed {
			wouldDeny = true
			break
		}
	}
	if !wouldDeny || !b.Allowed || b.Shadowed {
		return b.Limit.Name, wouldDeny
	}
	// On the stack: a decision has at most 16 limits (ratelimit.ValidateLimits).
	var buf [16]ratelimit.Result
	trials := buf[:0]
	for i := range results {
		if results[i].Shadowed {
			trials = append(trials, results[i])
		}
	}
	return ratelimit.Binding(trials).Limit.Name, true
}

// ObserveLimiter reports l.Stats() through the gauges
// ratelimit.breaker.open and ratelimit.denycache.entries at each
// collection, with attrs as their attributes: give each Limiter observed
// by one Observer its own, such as attribute.String("ratelimit.limiter",
// "api"). Unregister the Registration to stop; until then, it keeps l
// reachable.
func (o *Observer) ObserveLimiter(l *ratelimit.Limiter, attrs ...attribute.KeyValue) (metric.Registration, error) {
	if l == nil {
		return nil, errors.New("ratelimit/otel: ObserveLimiter was given a nil Limiter")
	}
	opt := metric.WithAttributeSet(attribute.NewSet(attrs...))
	reg, err := o.meter.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		s := l.Stats()
		open := int64(0)
		if s.BreakerOpen {
			open = 1
		}
		ob.ObserveInt64(o.breakerOpen, open, opt)
		ob.ObserveInt64(o.denyEntries, int64(s.DenyCacheEntries), opt)
		return nil
	}, o.breakerOpen, o.denyEntries)
	if err != nil {
		return nil, fmt.Errorf("ratelimit/otel: %w", err)
	}
	return reg, nil
}
