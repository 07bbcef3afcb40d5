// Package grpclimit puts a ratelimit.Limiter in front of a gRPC server, as
// unary and stream server interceptors:
//
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(limiter, ratelimit.PerSecond(100))),
//		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(limiter, ratelimit.PerSecond(100))),
//	)
//
// Each call is counted under one identity: by default the address of its
// peer, the connection the call came in on, and nothing the client sends;
// IPv6 addresses are grouped by /64, exactly as httplimit groups them, so
// that one client is one count over HTTP and gRPC alike.
// WithTrustedMetadata says which metadata key the proxies in front write
// the client address to, and from which ranges to believe it; WithKeys
// counts authenticated callers by who they are. A call may be held to
// several limits at once (WithLimits; WithPlanFunc per tier), and
// WithMethodLimits gives methods limits of their own, counted apart. A
// stream is one decision, made when it opens: the messages it carries are
// not counted.
//
// An allowed call goes on to its handler; a denied one fails with
// codes.ResourceExhausted and a google.rpc.RetryInfo detail that carries
// the exact wait after which it would pass (none for a call that can never
// pass, as its message says). Both carry response header metadata with the
// information of httplimit's headers: ratelimit-limit, ratelimit-remaining,
// ratelimit-reset, retry-after, and the IETF draft's ratelimit-policy and
// ratelimit (see HeaderLimit). A decision Redis did not make
// (Result.Degraded) carries ratelimit-limit and ratelimit-policy only;
// Shadow limits, and calls that ratelimit.WithShadow let through, carry
// none. A call Redis could not decide under ratelimit.FailClosed fails with
// codes.Unavailable; a call whose context ended while it was decided fails
// with that context's status (codes.Canceled, codes.DeadlineExceeded);
// invalid input (a cost below 1 from WithCost) fails with codes.Internal
// and is logged through log/slog.
//
// # Twins
//
// grpclimit is httplimit's twin: the same concept has the same name and the
// same rule in both, in each protocol's idiom: an option's function gets
// the call's context and full method name where httplimit's gets the
// *http.Request, a handler that answers a request (WithDeniedHandler,
// WithErrorHandler) becomes a function that returns the call's status
// error, and metadata keys are lower case. Both have WithKeys (KeyFunc),
// WithLimits, WithPlanFunc, WithCost, WithCountIf, Charge, WithSkip,
// WithAllowList, WithShadowHandler, WithDeniedHandler, WithErrorHandler,
// WithIPv6Prefix, FromContext and FromContextAll, and ClientKey,
// UnknownClient, PolicyName and ResetSeconds, which are httplimit's, here so
// that a gRPC server need not import httplimit.
//
// The rules they share: an empty plan (nil or no limit, from WithPlanFunc)
// is the default plan, never "not limited", since a tier missing from a map
// must not make an unlimited API; what is to go uncounted says so with
// WithSkip (a method mapped to no limits in WithMethodLimits is therefore a
// configuration error). WithCountIf settles a handler that panics as one
// that failed (codes.Internal here, 500 there), and gives its cost back if
// that should not count.
//
// What one has and the other has not, and why: httplimit's WithHeaders
// chooses between the de facto X-RateLimit headers and the IETF ones; gRPC
// has one set of lower-case names, always sent, which a client reads only if
// it asks. WithRoute has no twin: a gRPC method is a fixed name the server
// knows, and WithMethodLimits counts methods apart, while net/http's routes
// are the router's. httplimit's WithTrustedProxies and WithClientIPHeader
// are WithTrustedMetadata here: gRPC has no Forwarded header, and one rule
// reads a list or a single address alike. APIKey, HashedKey and UserID,
// KeyFuncs of headers and request contexts, have no twins: a gRPC caller's
// identity comes from credentials an auth interceptor verified, a one-line
// KeyFunc (hash a secret with httplimit.HashedKey). Problem and WriteProblem
// are HTTP bodies; a denied call carries a google.rpc.RetryInfo instead.
//
// NewUnary and NewStream report a configuration error;
// UnaryServerInterceptor and StreamServerInterceptor, which cannot fail,
// log it once and answer every call with codes.Internal. Nothing in the
// package panics on configuration.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// UnaryServerInterceptor returns an interceptor that decides each unary
// call against limit with l (and the limits of WithLimits, if any) and
// passes it on to the handler only if it is allowed.
//
// In the order it happens, as httplimit.Middleware's: a call WithSkip or
// WithAllowList lets through goes on untouched. The others are counted
// under their identity (WithKeys; by default the client address), at their
// cost (WithCost; default 1), against their plan (WithMethodLimits' for
// their method, else WithPlanFunc's, else limit and WithLimits'), in one
// call of l.AllowAll. The Results are stored in the call's context
// (FromContext, FromContextAll); the shadow handler sees each denial shadow
// mode let through (WithShadowHandler). The rate-limit metadata (see
// HeaderLimit) is set with grpc.SetHeader before the handler runs, or
// before the denied or error handler chooses the call's status.
//
// A denied call fails with codes.ResourceExhausted (WithDeniedHandler
// chooses another status). Its status carries a
// google.rpc.RetryInfo detail whose retry_delay is the binding Result's
// RetryAfter, exact to the millisecond; a call that can never pass (its
// cost is above the limit's rate) has none, and its message says it can
// never pass. For the other outcomes see the package documentation.
//
// The interceptor is safe for simultaneous use by multiple goroutines, as
// long as the functions given to the options are.
//
// A configuration that NewUnary rejects (a nil l, an invalid limit, an
// option given invalid values) is logged once through log/slog, and the
// interceptor then answers every call with codes.Internal: loud in the
// first test, never an unlimited API. Call NewUnary to get the error at
// start-up instead.
func UnaryServerInterceptor(l *ratelimit.Limiter, limit ratelimit.Limit, opts ...Option) grpc.UnaryServerInterceptor {
	ui, err := NewUnary(l, limit, opts...)
	if err != nil {
		logMisconfigured(err)
		return func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
			return nil, errMisconfigured
		}
	}
	return ui
}

// StreamServerInterceptor returns an interceptor that decides each stream
// against limit with l (or its method's limits) once, when the stream
// opens, and passes it on to the handler only if it is allowed: a stream is
// one call, whatever number of messages it then carries, and a long-lived
// stream that was allowed is never cut off. The rate-limit metadata is set
// with ServerStream.SetHeader. Denials, errors and a bad configuration are
// as for UnaryServerInterceptor; call NewStream to get a configuration
// error at start-up.
func StreamServerInterceptor(l *ratelimit.Limiter, limit ratelimit.Limit, opts ...Option) grpc.StreamServerInterceptor {
	si, err := NewStream(l, limit, opts...)
	if err != nil {
		logMisconfigured(err)
		return func(any, grpc.ServerStream, *grpc.StreamServerInfo, grpc.StreamHandler) error {
			return errMisconfigured
		}
	}
	return si
}

// NewUnary is UnaryServerInterceptor that reports a configuration error
// instead of answering codes.Internal: a nil l, an invalid limit (see
// ratelimit.ValidateLimits), or an option given invalid values; the error
// names each problem. With WithConcurrency and the zero Limit (and neither
// WithLimits, WithPlanFunc, WithMethodLimits nor WithLimitsPer), calls are
// held to the concurrency limit alone, with no rate plan, as
// httplimit.New's requests are; otherwise the zero Limit is an error.
func NewUnary(l *ratelimit.Limiter, limit ratelimit.Limit, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	in, err := newInterceptor("NewUnary", l, limit, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, md, d, err := in.decide(ctx, info.FullMethod)
		var slot ratelimit.Slot
		if err == nil && d != nil {
			slot, md, err = in.acquire(ctx, info.FullMethod, d, md)
		}
		if md != nil {
			// It fails only when the call has no stream or its header is
			// already sent; neither is so before the handler runs.
			_ = grpc.SetHeader(ctx, md)
		}
		if err != nil {
			return nil, err
		}
		if d == nil {
			return handler(ctx, req)
		}
		if slot.Acquired {
			defer slot.Keep(ctx)() // extended while the handler runs, then released
		}
		code := codes.Internal // if the handler panics
		defer func() { in.settle(ctx, info.FullMethod, d, code) }()
		resp, err := handler(ctx, req)
		code = status.Code(err)
		return resp, err
	}, nil
}

// NewStream is StreamServerInterceptor that reports a configuration error
// instead of answering codes.Internal, as NewUnary does.
func NewStream(l *ratelimit.Limiter, limit ratelimit.Limit, opts ...Option) (grpc.StreamServerInterceptor, error) {
	in, err := newInterceptor("NewStream", l, limit, opts)
	if err != nil {
		return nil, err
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, md, d, err := in.decide(ss.Context(), info.FullMethod)
		var slot ratelimit.Slot
		if err == nil && d != nil {
			slot, md, err = in.acquire(ctx, info.FullMethod, d, md)
		}
		if md != nil {
			_ = ss.SetHeader(md)
		}
		if err != nil {
			return err
		}
		if d == nil {
			return handler(srv, ss)
		}
		if slot.Acquired {
			defer slot.Keep(ctx)() // extended for the stream's life, then released
		}
		ws := &decidedStream{ServerStream: ss, ctx: ctx}
		code := codes.Internal // if the handler panics
		defer func() { in.settle(ws.ctx, info.FullMethod, d, code) }()
		err = handler(srv, ws)
		code = status.Code(err)
		return err
	}, nil
}

// acquire takes a slot of WithConcurrency's limit for the call d allowed,
// if the option is given, and adds its items to md. When the limit is full,
// or the Limiter fails, d is refunded (counted by neither) and the call's
// status error is returned.
func (in *interceptor) acquire(ctx context.Context, fullMethod string, d *decided, md metadata.MD) (ratelimit.Slot, metadata.MD, error) {
	c := in.cfg.slots
	if c == nil || d.limiter == nil {
		return ratelimit.Slot{}, md, nil
	}
	slot, err := in.limiter.Acquire(ctx, d.parts[0].ID, *c)
	if err != nil || !slot.Acquired {
		d.refund(ctx)
	}
	if err != nil {
		return slot, md, in.errorStatus(ctx, fullMethod, err)
	}
	md = slotMD(md, slot)
	if !slot.Acquired {
		if in.cfg.denied != nil {
			if err := in.cfg.denied(ctx, fullMethod); err != nil {
				return slot, md, err
			}
		}
		return slot, md, slotDenied(slot)
	}
	return slot, md, nil
}

// slotDenied is the status of a call the full concurrency limit refused:
// ResourceExhausted with a RetryInfo of the wait until the earliest held
// lease ends.
func slotDenied(slot ratelimit.Slot) error {
	name := PolicyName(ratelimit.Limit{Name: slotName(slot.Concurrency)})
	if slot.Degraded {
		return status.Errorf(codes.ResourceExhausted,
			"grpclimit: concurrency limit %s full (decided locally while Redis is unavailable)", name)
	}
	st := status.Newf(codes.ResourceExhausted, "grpclimit: concurrency limit %s full; retry in %v", name, slot.RetryAfter.Round(time.Millisecond))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(slot.RetryAfter)}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// decided is what a call's context carries of its decision, for
// FromContext, Charge and WithCountIf. limiter is nil when the Limiter
// returned an error: there is nothing to charge or refund.
type decided struct {
	limiter *ratelimit.Limiter
	// parts are the identities the decision counted under, each with its
	// limits, whose Results are results in the same order: the plan's
	// identity first, then WithLimitsPer's that the call has.
	parts   httplimit.Identities
	one     [1]httplimit.Identity // parts of a decision of one identity: no allocation of its own
	results []ratelimit.Result
	binding ratelimit.Result
	cost    int64
}

// refund gives back the call's cost under every identity of d: what a full
// concurrency limit or WithCountIf does not count (see
// httplimit.Identities.Refund).
func (d *decided) refund(ctx context.Context) {
	d.parts.Refund(ctx, d.limiter, d.results, d.cost)
}

// withPer adds to parts, the plan pl's identity, each WithLimitsPer
// identity the call has, and returns the plan of all their limits, for the
// metadata. A plan whose names meet an identity's is an error, returned
// with what planFor returns for a plan it refuses. With WithMethodLimits,
// the ids of a call of no method of its start with '|', as httplimit's do
// with WithRoute for a request of no route: "|<name>|<id>" is no id of a
// method's calls.
func (in *interceptor) withPer(ctx context.Context, fullMethod, prefix string, pl *httplimit.Plan, parts httplimit.Identities) (*httplimit.Plan, httplimit.Identities, []ratelimit.Result, error) {
	if prefix == "" && len(in.methods) > 0 {
		prefix = "|"
	}
	var plans []*httplimit.Plan
	for i, id := range in.cfg.perIDs(ctx, fullMethod, prefix) {
		if id != "" {
			parts = append(parts, httplimit.Identity{ID: id, Limits: in.cfg.per[i].plan.Limits()})
			plans = append(plans, in.cfg.per[i].plan)
		}
	}
	if len(plans) == 0 {
		return pl, parts, nil, nil
	}
	all, err := pl.Join(plans...)
	if err != nil {
		return nil, nil, parts.Results(), fmt.Errorf("grpclimit: the plan with WithLimitsPer: %w", err)
	}
	return all, parts, nil, nil
}

type decidedKey struct{}

// maxLimits is the most limits one decision takes (ratelimit.ValidateLimits,
// AllowMany).
const maxLimits = 16

// limitsOf returns pl's limits; none for a nil plan.
func limitsOf(pl *httplimit.Plan) []ratelimit.Limit {
	if pl == nil {
		return nil
	}
	return pl.Limits()
}

// FromContext returns the binding Result of the decision the interceptor
// made for the call whose context ctx is (a handler's, a denied or error
// handler's, or one derived from them), and whether there was one: there is
// none for a call it let through uncounted (WithSkip, WithAllowList). It is
// ratelimit.Binding of FromContextAll's Results: the enforced limit with the
// longest wait on a denial and the least remaining otherwise. It is the
// Result the rate-limit metadata and the RetryInfo describe, as
// httplimit.FromContext is the one its headers describe.
func FromContext(ctx context.Context) (ratelimit.Result, bool) {
	d, ok := ctx.Value(decidedKey{}).(*decided)
	if !ok || len(d.results) == 0 { // WithConcurrency alone decides no rate
		return ratelimit.Result{}, false
	}
	return d.binding, true
}

// FromContextAll returns every Result of the decision the interceptor made
// for the call whose context ctx is, one per limit, Shadow ones included,
// in the order of the call's plan, then of each WithLimitsPer the call has
// an identity for, and whether there was a decision. The slice is the
// caller's own.
func FromContextAll(ctx context.Context) ([]ratelimit.Result, bool) {
	d, ok := ctx.Value(decidedKey{}).(*decided)
	if !ok || len(d.results) == 0 {
		return nil, false
	}
	return append([]ratelimit.Result(nil), d.results...), true
}

// decidedStream is a stream whose context carries its decision.
type decidedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *decidedStream) Context() context.Context { return s.ctx }

// settle refunds a call that WithCountIf says should not count, once its
// handler has returned with code, or panicked (codes.Internal, as a
// recovery interceptor answers it, if anything does). It runs deferred, so
// that a panic is settled as httplimit settles one. The caller may have
// left: the refund is owed all the same, within the Limiter's timeout. A
// call that counted nothing (shadow mode let a denial through, the failure
// policy decided) has nothing to refund, and Refund says so: no failure to
// report.
func (in *interceptor) settle(ctx context.Context, fullMethod string, d *decided, code codes.Code) {
	if in.cfg.countIf == nil || len(d.results) == 0 || in.cfg.countIf(ctx, fullMethod, code) {
		return
	}
	d.refund(ctx)
}

// Charge charges the caller of the call whose context ctx is (a handler's,
// or one derived from it), under the limits the interceptor decided the
// call against, n more: for a handler that learns its cost while it works.
// It returns an error when the call did not pass through the interceptor,
// and the Limiter's Charge errors otherwise; it denies nothing.
func Charge(ctx context.Context, n int64) error {
	d, ok := ctx.Value(decidedKey{}).(*decided)
	if !ok || d.limiter == nil {
		return errors.New("grpclimit: Charge: the call did not pass through the interceptor")
	}
	if len(d.results) == 0 {
		return errors.New("grpclimit: Charge: the interceptor decides no rate (WithConcurrency alone)")
	}
	// The work is done: a caller that left owes it all the same, within the
	// Limiter's timeout.
	return d.parts.Charge(ctx, d.limiter, n)
}

// errMisconfigured answers every call of an interceptor whose configuration
// was rejected. It says nothing of the configuration: that is in the log.
var errMisconfigured = status.Error(codes.Internal, "grpclimit: the rate limiter is misconfigured")

func logMisconfigured(err error) {
	slog.Error("grpclimit: the interceptor is misconfigured; it answers every call with codes.Internal", "error", err)
}

type interceptor struct {
	cfg     config
	limiter *ratelimit.Limiter
	base    *httplimit.Plan            // the default plan: the limit given to the interceptor and WithLimits'
	methods map[string]*httplimit.Plan // WithMethodLimits
}

// planFor returns the plan a call is decided against, and whether it is
// counted apart: its method's (WithMethodLimits), counted apart under
// "<method>|<identity>", or the one WithPlanFunc returns for it, checked by
// httplimit.NewPlan, or the default plan when there is no plan function or
// it returns no limit: an empty plan is never "not limited" (that is
// WithSkip), in grpclimit as in httplimit. For a plan NewPlan rejects, it
// returns what AllowAll returns with an error, one Result per limit, zero
// but for its Limit, and the error.
func (in *interceptor) planFor(ctx context.Context, fullMethod string) (*httplimit.Plan, bool, []ratelimit.Result, error) {
	if pl, ok := in.methods[fullMethod]; ok {
		return pl, true, nil, nil
	}
	if in.cfg.plan == nil {
		return in.base, false, nil, nil
	}
	limits := in.cfg.plan(ctx, fullMethod)
	if len(limits) == 0 {
		return in.base, false, nil, nil
	}
	pl, err := httplimit.NewPlan(limits...)
	if err != nil {
		results := make([]ratelimit.Result, len(limits))
		for i, limit := range limits {
			results[i].Limit = limit
		}
		return nil, false, results, fmt.Errorf("grpclimit: WithPlanFunc's plan: %w", err)
	}
	return pl, false, nil, nil
}

// defaultPlan returns the default plan, the limit given to fn (NewUnary or
// NewStream) followed by WithLimits' extra, or the error naming the
// argument at fault, as httplimit's New does: a limit invalid alone, else
// the plan they make together.
func defaultPlan(fn string, limit ratelimit.Limit, extra []ratelimit.Limit) (*httplimit.Plan, error) {
	where := fn + "'s limit"
	for i, l := range append([]ratelimit.Limit{limit}, extra...) {
		if _, err := httplimit.NewPlan(l); err != nil {
			return nil, fmt.Errorf("grpclimit: %s: %w", where, err)
		}
		where = fmt.Sprintf("WithLimits' limit number %d", i+1)
	}
	pl, err := httplimit.NewPlan(append([]ratelimit.Limit{limit}, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("grpclimit: %s with WithLimits: %w", fn, err)
	}
	return pl, nil
}

// newInterceptor builds the interceptor of NewUnary or NewStream, which
// fn names in the error.
func newInterceptor(fn string, l *ratelimit.Limiter, limit ratelimit.Limit, opts []Option) (*interceptor, error) {
	var cfg config
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&cfg)
		}
	}
	if l == nil {
		cfg.errs = append(cfg.errs, errors.New("grpclimit: the Limiter is nil"))
	}
	var base *httplimit.Plan
	if limit != (ratelimit.Limit{}) || cfg.slots == nil || len(cfg.extra) > 0 || cfg.plan != nil || len(cfg.per) > 0 || len(cfg.methods) > 0 {
		var err error
		if base, err = defaultPlan(fn, limit, cfg.extra); err != nil {
			cfg.errs = append(cfg.errs, err)
		}
	}
	var perPlans []*httplimit.Plan
	perLimits := []ratelimit.Limit{}
	for _, p := range cfg.per {
		perPlans = append(perPlans, p.plan)
		perLimits = append(perLimits, p.plan.Limits()...)
	}
	if n := len(perLimits) + len(limitsOf(base)); len(perPlans) > 0 && n > maxLimits {
		cfg.errs = append(cfg.errs, fmt.Errorf("grpclimit: %s with WithLimitsPer: %d limits in all, more than %d, which one decision (AllowMany) takes", fn, n, maxLimits))
	}
	if base == nil && cfg.slots != nil && len(cfg.errs) == 0 {
		for name, set := range map[string]bool{"WithCost": cfg.cost != nil, "WithCountIf": cfg.countIf != nil, "WithShadowHandler": cfg.onShadow != nil} {
			if set {
				cfg.errs = append(cfg.errs, fmt.Errorf("grpclimit: %s with WithConcurrency alone (the zero Limit): there is no rate plan for it to act on", name))
			}
		}
	}
	if base != nil && len(perPlans) > 0 {
		if _, err := base.Join(perPlans...); err != nil {
			cfg.errs = append(cfg.errs, fmt.Errorf("grpclimit: %s with WithLimitsPer: %w", fn, err))
		}
		for method, pl := range cfg.methods {
			if _, err := pl.Join(perPlans...); err != nil {
				cfg.errs = append(cfg.errs, fmt.Errorf("grpclimit: WithMethodLimits' %s with WithLimitsPer: %w", method, err))
			}
		}
	}
	if cfg.slots != nil {
		name := PolicyName(ratelimit.Limit{Name: slotName(*cfg.slots)})
		for _, l := range append(append([]ratelimit.Limit{limit}, cfg.extra...), perLimits...) {
			if PolicyName(l) == name {
				cfg.errs = append(cfg.errs, fmt.Errorf("grpclimit: WithConcurrency's limit and the plan's %v are both named %s: the metadata could not tell them apart", l, name))
			}
		}
	}
	if len(cfg.errs) > 0 {
		return nil, errors.Join(cfg.errs...)
	}
	return &interceptor{cfg: cfg, limiter: l, base: base, methods: cfg.methods}, nil
}

// decide decides one call and returns its context, carrying the decision
// when there is one, the header metadata to send, if any, the decision of
// a call let through (nil for one let through uncounted), and the status
// error to fail the call with, or nil to let it go on.
func (in *interceptor) decide(ctx context.Context, fullMethod string) (context.Context, metadata.MD, *decided, error) {
	c := &in.cfg
	if c.skip != nil && c.skip(ctx, fullMethod) {
		return ctx, nil, nil, nil
	}
	if len(c.allow) > 0 {
		if a, ok := c.clientAddr(ctx); ok {
			for _, p := range c.allow {
				if p.Contains(a) {
					return ctx, nil, nil, nil
				}
			}
		}
	}
	d := &decided{}
	if in.base == nil { // WithConcurrency alone: a slot, no rate plan
		d.parts = d.one[:]
		d.parts[0] = httplimit.Identity{ID: c.identity(ctx, fullMethod)}
		d.limiter = in.limiter
		return context.WithValue(ctx, decidedKey{}, d), nil, d, nil
	}
	pl, apart, results, err := in.planFor(ctx, fullMethod)
	var parts httplimit.Identities
	cost := int64(1)
	if err == nil {
		prefix := ""
		if apart {
			prefix = fullMethod + "|"
		}
		if c.cost != nil {
			cost = c.cost(ctx, fullMethod)
		}
		parts = d.one[:]
		parts[0] = httplimit.Identity{ID: prefix + c.identity(ctx, fullMethod), Limits: pl.Limits()}
		if len(c.per) > 0 {
			pl, parts, results, err = in.withPer(ctx, fullMethod, prefix, pl, parts)
		}
	}
	if err == nil {
		results, err = parts.Allow(ctx, in.limiter, cost)
	}
	d.results, d.binding, d.cost = results, ratelimit.Binding(results), cost
	if err == nil {
		d.limiter, d.parts = in.limiter, parts
	}
	ctx = context.WithValue(ctx, decidedKey{}, d)
	if err != nil {
		var md metadata.MD
		if d.binding.Degraded { // a refused plan (pl nil) decided nothing
			md = headerMD(pl, results, d.binding, in.limiter.Now())
		}
		return ctx, md, nil, in.errorStatus(ctx, fullMethod, err)
	}
	if c.onShadow != nil {
		in.reportShadowed(ctx, fullMethod, d)
	}
	md := headerMD(pl, results, d.binding, in.limiter.Now())
	if !d.binding.Allowed {
		return ctx, md, nil, in.deniedStatus(ctx, fullMethod, d.binding)
	}
	return ctx, md, d, nil
}

// reportShadowed calls the shadow handler for each denial shadow mode let
// through (see WithShadowHandler), as httplimit's does.
func (in *interceptor) reportShadowed(ctx context.Context, fullMethod string, d *decided) {
	whole := false
	for _, res := range d.results {
		if !res.Limit.Shadow {
			whole = whole || res.Shadowed
		} else if res.Shadowed {
			in.cfg.onShadow(ctx, fullMethod, res)
		}
	}
	if whole {
		in.cfg.onShadow(ctx, fullMethod, d.binding)
	}
}

// deniedStatus is the status a denied call fails with: the denied
// handler's, or the default when there is none or it returns nil.
func (in *interceptor) deniedStatus(ctx context.Context, fullMethod string, bind ratelimit.Result) error {
	if in.cfg.denied != nil {
		if err := in.cfg.denied(ctx, fullMethod); err != nil {
			return err
		}
	}
	return denied(bind)
}

// denied returns the status of a denied call: ResourceExhausted, with a
// RetryInfo of the exact wait when a retry can pass and Redis decided. The
// message names the limit as the metadata does.
func denied(bind ratelimit.Result) error {
	name := PolicyName(bind.Limit)
	switch {
	case bind.Degraded:
		// The wait of a local decision is this process's guess, not the
		// shared count's: name none.
		return status.Errorf(codes.ResourceExhausted,
			"grpclimit: rate limit %s exceeded (decided locally while Redis is unavailable)", name)
	case bind.RetryAfter == ratelimit.InfDuration:
		return status.Errorf(codes.ResourceExhausted,
			"grpclimit: rate limit %s exceeded: the call costs more than the limit's rate of %d per %v and can never pass; do not retry",
			name, bind.Limit.Rate, bind.Limit.Window)
	}
	st := status.Newf(codes.ResourceExhausted, "grpclimit: rate limit %s exceeded; retry in %v", name, bind.RetryAfter.Round(time.Millisecond))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(bind.RetryAfter)}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// errorStatus returns the status of a call the limiter returned an error
// for: the error handler's, or the default when there is none or it returns
// nil.
func (in *interceptor) errorStatus(ctx context.Context, fullMethod string, err error) error {
	if in.cfg.onError != nil {
		if st := in.cfg.onError(ctx, fullMethod, err); st != nil {
			return st
		}
	}
	return defaultErrorStatus(ctx, fullMethod, err)
}

// defaultErrorStatus is the status of a call the limiter returned an error
// for, when no error handler chose one: the context's own when it ended,
// Unavailable when Redis could not decide under FailClosed, and Internal,
// logged, for anything else: invalid input, a bug in the configuration.
func defaultErrorStatus(ctx context.Context, fullMethod string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return status.FromContextError(ctxErr).Err()
	}
	if errors.Is(err, ratelimit.ErrUnavailable) {
		return status.Error(codes.Unavailable, "grpclimit: the rate limiter cannot decide: its store is unavailable")
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return status.FromContextError(ctxErr).Err()
	}
	slog.ErrorContext(ctx, "grpclimit: the limiter rejected a call's input", "method", fullMethod, "error", err)
	return status.Error(codes.Internal, "grpclimit: the rate limiter failed")
}
