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
// the client address to, and from which ranges to believe it; WithKeyFunc
// counts authenticated callers by who they are. WithMethodLimits gives
// methods limits of their own, several at once if need be. A stream is one
// decision, made when it opens: the messages it carries are not counted.
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
)

// UnaryServerInterceptor returns an interceptor that decides each unary
// call against limit with l (or against its method's limits, see
// WithMethodLimits) and passes it on to the handler only if it is allowed.
// The rate-limit metadata (see HeaderLimit) is set with grpc.SetHeader
// before the handler runs, or before the denial is returned.
//
// A denied call fails with codes.ResourceExhausted. Its status carries a
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
// names each problem.
func NewUnary(l *ratelimit.Limiter, limit ratelimit.Limit, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	in, err := newInterceptor("NewUnary", l, limit, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, d, err := in.decide(ctx, info.FullMethod)
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
		ctx = context.WithValue(ctx, decidedKey{}, d)
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
		md, d, err := in.decide(ss.Context(), info.FullMethod)
		if md != nil {
			_ = ss.SetHeader(md)
		}
		if err != nil {
			return err
		}
		if d == nil {
			return handler(srv, ss)
		}
		ws := &decidedStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), decidedKey{}, d)}
		code := codes.Internal // if the handler panics
		defer func() { in.settle(ws.ctx, info.FullMethod, d, code) }()
		err = handler(srv, ws)
		code = status.Code(err)
		return err
	}, nil
}

// decided is what a call's context carries of its decision, for Charge and
// WithCountIf.
type decided struct {
	limiter *ratelimit.Limiter
	id      string
	limits  []ratelimit.Limit
	results []ratelimit.Result
	cost    int64
}

type decidedKey struct{}

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
	if in.cfg.countIf == nil || in.cfg.countIf(ctx, fullMethod, code) {
		return
	}
	_ = d.limiter.Refund(context.WithoutCancel(ctx), d.id, d.results, d.cost)
}

// Charge charges the caller of the call whose context ctx is (a handler's,
// or one derived from it), under the limits the interceptor decided the
// call against, n more: for a handler that learns its cost while it works.
// It returns an error when the call did not pass through the interceptor,
// and the Limiter's Charge errors otherwise; it denies nothing.
func Charge(ctx context.Context, n int64) error {
	d, ok := ctx.Value(decidedKey{}).(*decided)
	if !ok {
		return errors.New("grpclimit: Charge: the call did not pass through the interceptor")
	}
	// The work is done: a caller that left owes it all the same, within the
	// Limiter's timeout.
	_, err := d.limiter.Charge(context.WithoutCancel(ctx), d.id, d.limits, n)
	return err
}

// errMisconfigured answers every call of an interceptor whose configuration
// was rejected. It says nothing of the configuration: that is in the log.
var errMisconfigured = status.Error(codes.Internal, "grpclimit: the rate limiter is misconfigured")

func logMisconfigured(err error) {
	slog.Error("grpclimit: the interceptor is misconfigured; it answers every call with codes.Internal", "error", err)
}

// policySet is the limits one kind of call is decided against, with what
// the headers say about them.
type policySet struct {
	limits   []ratelimit.Limit
	policies []policy
	// enforced are the indexes of the limits that can deny: all but Shadow
	// ones. The headers are theirs, as is the binding Result
	// (ratelimit.Binding passes over Shadow limits); a set of Shadow limits
	// only sends no header at all.
	enforced     []int
	policyValues []string // HeaderPolicy, for the enforced limits
	route        string   // "" for the default limit; else "<method>|"
}

func newPolicySet(route string, limits []ratelimit.Limit) *policySet {
	s := &policySet{limits: limits, route: route}
	for i, limit := range limits {
		s.policies = append(s.policies, newPolicy(limit))
		if !limit.Shadow {
			s.enforced = append(s.enforced, i)
		}
	}
	for _, i := range s.enforced {
		s.policyValues = append(s.policyValues, s.policies[i].header)
	}
	return s
}

type interceptor struct {
	cfg     config
	limiter *ratelimit.Limiter
	base    *policySet            // the limit given to the interceptor
	methods map[string]*policySet // WithMethodLimits; nil set: not limited
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
	base := []ratelimit.Limit{limit}
	if err := ratelimit.ValidateLimits(base); err != nil {
		cfg.errs = append(cfg.errs, fmt.Errorf("grpclimit: %s: %w", fn, err))
	}
	if len(cfg.errs) > 0 {
		return nil, errors.Join(cfg.errs...)
	}
	in := &interceptor{cfg: cfg, limiter: l, base: newPolicySet("", base)}
	if len(cfg.methods) > 0 {
		in.methods = make(map[string]*policySet, len(cfg.methods))
		for name, limits := range cfg.methods {
			if len(limits) == 0 {
				in.methods[name] = nil
				continue
			}
			in.methods[name] = newPolicySet(name+"|", limits)
		}
	}
	return in, nil
}

// decide decides one call and returns the header metadata to send, if
// any, the decision of a call let through (nil for a method not limited),
// and the status error to fail the call with, or nil to let it go on.
func (in *interceptor) decide(ctx context.Context, fullMethod string) (metadata.MD, *decided, error) {
	set := in.base
	if s, ok := in.methods[fullMethod]; ok {
		if s == nil {
			return nil, nil, nil
		}
		set = s
	}
	id := set.route + in.cfg.identity(ctx, fullMethod)
	cost := int64(1)
	if in.cfg.cost != nil {
		cost = in.cfg.cost(ctx, fullMethod)
	}
	results, err := in.limiter.AllowAll(ctx, id, set.limits, cost)
	if err != nil {
		var md metadata.MD
		if len(set.enforced) > 0 && len(results) > 0 && results[0].Degraded {
			md = headerMD(set, results, ratelimit.Binding(results))
		}
		return md, nil, in.errorStatus(ctx, fullMethod, err)
	}
	bind := ratelimit.Binding(results)
	if !bind.Allowed {
		return headerMD(set, results, bind), nil, denied(bind)
	}
	d := &decided{limiter: in.limiter, id: id, limits: set.limits, results: results, cost: cost}
	if len(set.enforced) == 0 || shadowedThrough(set, results) {
		return nil, d, nil
	}
	return headerMD(set, results, bind), d, nil
}

// shadowedThrough reports a decision that ratelimit.WithShadow let
// through: an enforced limit would have denied it. Its counts describe a
// denial the client never got, so it sends no header, as in httplimit.
func shadowedThrough(set *policySet, results []ratelimit.Result) bool {
	for _, i := range set.enforced {
		if results[i].Shadowed {
			return true
		}
	}
	return false
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
	case bind.RetryAfter < 0:
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
// for: the context's own when it ended, Unavailable when Redis could not
// decide under FailClosed, and Internal, logged, for anything else: invalid
// input, a bug in the configuration.
func (in *interceptor) errorStatus(ctx context.Context, fullMethod string, err error) error {
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
