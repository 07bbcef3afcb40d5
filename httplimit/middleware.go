// Package httplimit puts a ratelimit.Limiter in front of any net/http
// handler. Middleware returns a func(http.Handler) http.Handler, the shape
// http.ServeMux users wrap by hand and chi, gorilla/mux and most other
// routers take as middleware.
//
// Each request is counted under one identity: by default its client address,
// taken from RemoteAddr and nothing else (WithTrustedProxies and
// WithClientIPHeader say which proxy headers to believe, and from whom);
// IPv6 addresses are grouped by /64. WithKeys counts authenticated traffic by
// API key or user id instead, and WithRoute counts each route apart.
//
// A request may be held to several limits at once, such as a burst limit
// and a daily one (WithLimits; WithPlanFunc per tier or route): one script
// call decides them all, and a request one of them denies is counted under
// none of them. Each limit is named in the headers by its Limit.Name. A
// plan is a []ratelimit.Limit that lists every limit it holds: the one
// WithPlanFunc returns is the request's whole plan, and no value, the zero
// Limit least of all, stands for another limit.
// A limit can be shadowed (Limit.Shadow) to see what it would do before
// enforcing it: it is counted, never denies and sends no header, and its
// would-be denials go to WithShadowHandler.
//
// Every counted response carries X-RateLimit-Limit, X-RateLimit-Remaining
// and X-RateLimit-Reset, for the binding limit, and the IETF draft's
// RateLimit-Policy and RateLimit, which list every enforced limit; a denied
// request gets 429 with Retry-After, and a request Redis could not decide
// under ratelimit.FailClosed gets 503. A decision Redis did not make
// (Result.Degraded) gets X-RateLimit-Limit and RateLimit-Policy only, and a
// request that can never pass gets no time to retry at.
//
// grpclimit is this package's twin for gRPC servers: the same concept has
// the same name and the same rule in both (see its package documentation
// for what only one of them has, and why). An empty plan from WithPlanFunc
// (nil or no limit) is the default plan, never "not limited", in both: a
// tier missing from a map must not make an unlimited API, and what is to go
// uncounted says so with WithSkip. WithCountIf settles a handler that
// panics as one that answered 500 (codes.Internal in grpclimit).
// grpclimit's WithMethodLimits has no twin here: net/http's routes are the
// router's, so a route's plan is WithPlanFunc's, counted apart with
// WithRoute.
//
// New reports a configuration error; Middleware, which cannot fail, logs it
// once and answers every request with 500. Nothing in the package panics on
// configuration.
package httplimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/slidingwindow/ratelimit"
)

// Middleware returns middleware that decides each request against limit
// (and the limits of WithLimits, if any) with l, and passes it on to the
// next handler only if it is allowed.
//
// In the order it happens: a request WithSkip or WithAllowList lets through
// goes on untouched. The others are counted under their identity (WithKeys,
// WithRoute; by default the client address), at their cost (WithCost;
// default 1), against their plan (WithPlanFunc's; by default limit and
// WithLimits'), in one call of l.AllowAll. The Results are stored in
// the request's context (FromContext for the binding one, FromContextAll
// for each). The shadow handler sees each denial that shadow mode let
// through (WithShadowHandler). Then:
//
//   - allowed: the rate-limit headers (WithHeaders) are set and the next
//     handler serves the request;
//   - denied: the rate-limit headers are set and the denied handler answers
//     (WithDeniedHandler; default 429 with Retry-After, in whole seconds
//     rounded up, and a problem+json body). A request whose cost is above
//     an enforced limit's rate can never pass: its 429 carries the limits, the
//     remaining counts and the policies, but no Retry-After,
//     X-RateLimit-Reset or RateLimit t, since any of them would invite a
//     retry that fails;
//   - the limiter returned an error: the error handler answers
//     (WithErrorHandler; default 503 for Redis down under FailClosed or the
//     request's context ended, 500 for invalid input), with
//     X-RateLimit-Limit and RateLimit-Policy set if the Result is Degraded.
//
// With several limits, RateLimit-Policy and RateLimit list every enforced
// limit in the plan's order, each RateLimit item with its own r and t:
//
//	RateLimit-Policy: "burst";q=5;w=1, "hourly";q=100;w=3600
//	RateLimit: "burst";r=0;t=1, "hourly";r=95;t=6195
//
// X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset and
// Retry-After describe the binding limit (see FromContext): on a 429 the
// one whose wait is longest, so that Retry-After is when every limit admits
// the request again; otherwise the one with the least remaining.
//
// Shadow limits send no header at all, so that clients see nothing of a
// trial. Under ratelimit.WithShadow the Limiter never denies, so neither
// does the middleware; a request the limits would have denied (its Results
// are Shadowed) goes through with no rate-limit header either, while the
// others carry theirs, which are true: their counts are real. To trial a
// whole plan with no trace in any response, shadow its limits rather than
// the Limiter, or add WithHeaders(0).
//
// Under ratelimit.FailOpen, a request Redis could not decide is allowed; its
// response carries X-RateLimit-Limit and RateLimit-Policy, which are true,
// but no Remaining, Reset or RateLimit, which would be made up. Under
// ratelimit.FailLocal the local decision stands (429 when it denies, with no
// Retry-After) with the same two headers only.
//
// The middleware is safe for simultaneous use by multiple goroutines, as
// long as the functions given to the options are.
//
// A configuration that New rejects (a nil l, an invalid limit, an option
// given invalid values) is logged once through log/slog, and the middleware
// then answers every request with 500: loud in the first test, never an
// unlimited API. Call New instead to get the error at start-up.
func Middleware(l *ratelimit.Limiter, limit ratelimit.Limit, opts ...Option) func(http.Handler) http.Handler {
	mw, err := New(l, limit, opts...)
	if err != nil {
		slog.Error("httplimit: the middleware is misconfigured; it answers every request with 500", "error", err)
		return func(http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				WriteProblem(w, http.StatusInternalServerError, "")
			})
		}
	}
	return mw
}

// New is Middleware that reports a configuration error instead of serving
// 500. With WithConcurrency and the zero Limit (and neither WithLimits,
// WithPlanFunc nor WithLimitsPer), it holds requests to the concurrency
// limit alone, with no rate plan:
//
//	httplimit.New(limiter, ratelimit.Limit{}, httplimit.WithConcurrency(exports))
//
// Otherwise the zero Limit is an error, as any limit that is none. The
// errors: a nil l, an invalid limit (see ratelimit.Limit.Validate), a default
// plan (limit and WithLimits') that ratelimit.ValidateLimits rejects or
// that holds two limits of one name, or an option given invalid values; the
// error names each problem, and the argument at fault: the limit given to
// New ("New's limit"), one of WithLimits' ("WithLimits' limit number 2"),
// the plan they make together ("New with WithLimits") or another option.
func New(l *ratelimit.Limiter, limit ratelimit.Limit, opts ...Option) (func(http.Handler) http.Handler, error) {
	cfg := config{headers: allHeaders}
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&cfg)
		}
	}
	if l == nil {
		cfg.errs = append(cfg.errs, errors.New("httplimit: the Limiter is nil"))
	}
	var static *Plan
	if limit != (ratelimit.Limit{}) || cfg.slots == nil || len(cfg.extra) > 0 || cfg.plan != nil || len(cfg.per) > 0 {
		var err error
		if static, err = defaultPlan(limit, cfg.extra); err != nil {
			cfg.errs = append(cfg.errs, err)
		}
	}
	if len(cfg.per) > 0 {
		n := 0
		if static != nil {
			n = len(static.limits)
		}
		for _, p := range cfg.per {
			n += len(p.plan.limits)
		}
		if n > maxLimits {
			cfg.errs = append(cfg.errs, fmt.Errorf("httplimit: New with WithLimitsPer: %d limits in all, more than %d, which one decision (AllowMany) takes", n, maxLimits))
		}
	}
	if static == nil && cfg.slots != nil && len(cfg.errs) == 0 {
		for name, set := range map[string]bool{"WithCost": cfg.cost != nil, "WithCountIf": cfg.countIf != nil, "WithShadowHandler": cfg.onShadow != nil} {
			if set {
				cfg.errs = append(cfg.errs, fmt.Errorf("httplimit: %s with WithConcurrency alone (the zero Limit): there is no rate plan for it to act on", name))
			}
		}
	}
	if static != nil && len(cfg.per) > 0 {
		var plans []*Plan
		for _, p := range cfg.per {
			plans = append(plans, p.plan)
		}
		if _, err := static.Join(plans...); err != nil {
			cfg.errs = append(cfg.errs, fmt.Errorf("httplimit: New with WithLimitsPer: %w", err))
		}
	}
	if cfg.slots != nil {
		name, _ := slotPolicy(*cfg.slots)
		all := append([]ratelimit.Limit{limit}, cfg.extra...)
		for _, p := range cfg.per {
			all = append(all, p.plan.limits...)
		}
		for _, limit := range all {
			if PolicyName(limit) == name {
				cfg.errs = append(cfg.errs, fmt.Errorf("httplimit: WithConcurrency's limit and the plan's %v are both named %s: the headers could not tell them apart", limit, name))
			}
		}
	}
	if len(cfg.errs) > 0 {
		return nil, errors.Join(cfg.errs...)
	}
	if cfg.denied == nil {
		cfg.denied = http.HandlerFunc(tooManyRequests)
	}
	if cfg.onError == nil {
		cfg.onError = defaultErrorHandler
	}
	m := &middleware{cfg: cfg, limiter: l, static: static}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next)
		})
	}, nil
}

// decided is what the middleware stores in a request's context: the
// decision, and what Charge needs to charge the same client under the same
// plan.
type decided struct {
	results []ratelimit.Result
	binding ratelimit.Result
	limiter *ratelimit.Limiter
	// parts are the identities the decision counted under, each with its
	// limits, whose Results are results in the same order: the plan's
	// identity first, then WithLimitsPer's that the request has.
	parts Identities
	one   [1]Identity // parts of a decision of one identity: no allocation of its own
}

// refund gives back cost under every identity of d: what a full
// concurrency limit or WithCountIf does not count (see Identities.Refund).
func (d *decided) refund(ctx context.Context, cost int64) {
	d.parts.Refund(ctx, d.limiter, d.results, cost)
}

// Charge charges the client of r, under the plan the middleware decided r against,
// n more: for a handler that learns its cost while it works (tokens, rows). It returns an error
// when r did not pass through the middleware.
//
// It is the Limiter's Charge: it denies nothing, and returns the Limiter's
// errors (invalid n, Redis failures). The decision's Results, which
// FromContext returns, and the headers already written do not change.
func Charge(r *http.Request, n int64) error {
	d, ok := r.Context().Value(resultKey{}).(*decided)
	if !ok || d.limiter == nil {
		return errors.New("httplimit: Charge: the request did not pass through the middleware")
	}
	if len(d.results) == 0 {
		return errors.New("httplimit: Charge: the middleware decides no rate (WithConcurrency alone)")
	}
	// The work is done: a client that left owes it all the same, within the
	// Limiter's timeout.
	return d.parts.Charge(r.Context(), d.limiter, n)
}

type resultKey struct{}

// maxLimits is the most limits one decision takes (ratelimit.ValidateLimits,
// AllowMany).
const maxLimits = 16

// FromContext returns the binding Result of the decision the middleware
// made for the request whose context ctx is, and whether there was one:
// there is none for a request it let through uncounted. It is
// ratelimit.Binding of FromContextAll's Results: with one limit, its
// Result; with several, the enforced limit with the longest wait on a 429
// and the least remaining otherwise (among all, when every limit is
// Shadow). It is the Result the X-RateLimit headers and Retry-After
// describe.
func FromContext(ctx context.Context) (ratelimit.Result, bool) {
	d, ok := ctx.Value(resultKey{}).(*decided)
	if !ok || len(d.results) == 0 { // WithConcurrency alone decides no rate
		return ratelimit.Result{}, false
	}
	return d.binding, true
}

// FromContextAll returns every Result of the decision the middleware made
// for the request whose context ctx is, one per limit, Shadow ones
// included, in the order of the plan (the limit given to New first, then
// WithLimits' in order; or WithPlanFunc's), then of each WithLimitsPer the
// request has an identity for, and whether there was a decision. The
// slice is the caller's own.
func FromContextAll(ctx context.Context) ([]ratelimit.Result, bool) {
	d, ok := ctx.Value(resultKey{}).(*decided)
	if !ok || len(d.results) == 0 {
		return nil, false
	}
	return append([]ratelimit.Result(nil), d.results...), true
}

type middleware struct {
	cfg     config
	limiter *ratelimit.Limiter
	// static is the default plan, the limit given to New and WithLimits',
	// built and checked once by New.
	static *Plan
	// withPerStatic holds the default plan with the limits of each set
	// of WithLimitsPer's identities, by the set's bits, made once each.
	withPerStatic sync.Map // uint64 -> *Plan
}

// withPer adds to parts, the plan pl's identity, each WithLimitsPer
// identity r has, and returns the plan of all their limits, for the
// headers. A plan of WithPlanFunc whose names meet an identity's is an
// error, returned with what planFor returns for a plan it refuses.
func (m *middleware) withPer(r *http.Request, pl *Plan, parts Identities) (*Plan, Identities, []ratelimit.Result, error) {
	var set uint64
	var plans []*Plan
	for i, id := range m.cfg.perIDs(r) {
		if id != "" {
			set |= 1 << i
			parts = append(parts, Identity{ID: id, Limits: m.cfg.per[i].plan.limits})
			plans = append(plans, m.cfg.per[i].plan)
		}
	}
	if set == 0 {
		return pl, parts, nil, nil
	}
	if pl == m.static {
		if all, ok := m.withPerStatic.Load(set); ok {
			return all.(*Plan), parts, nil, nil
		}
	}
	all, err := pl.Join(plans...)
	if err != nil {
		return nil, nil, parts.Results(), fmt.Errorf("httplimit: WithPlanFunc's plan with WithLimitsPer: %w", err)
	}
	if pl == m.static {
		m.withPerStatic.Store(set, all)
	}
	return all, parts, nil, nil
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	c := &m.cfg
	if c.skip != nil && c.skip(r) {
		next.ServeHTTP(w, r)
		return
	}
	if len(c.allow) > 0 {
		if a, ok := c.ip.clientAddr(r); ok {
			for _, p := range c.allow {
				if p.Contains(a) {
					next.ServeHTTP(w, r)
					return
				}
			}
		}
	}
	d := &decided{}
	parts := Identities(d.one[:])
	if m.static == nil { // WithConcurrency alone: a slot, no rate plan
		parts[0] = Identity{ID: c.identity(r)}
		d.limiter, d.parts = m.limiter, parts
		r = r.WithContext(context.WithValue(r.Context(), resultKey{}, d))
		m.hold(w, r, next, d, 0)
		return
	}
	pl, results, err := m.planFor(r)
	cost := int64(1)
	if err == nil {
		if c.cost != nil {
			cost = c.cost(r)
		}
		parts[0] = Identity{ID: c.identity(r), Limits: pl.limits}
		if len(c.per) > 0 {
			pl, parts, results, err = m.withPer(r, pl, parts)
		}
	}
	if err == nil {
		results, err = parts.Allow(r.Context(), m.limiter, cost)
	}
	d.results, d.binding = results, ratelimit.Binding(results)
	if err == nil {
		d.limiter, d.parts = m.limiter, parts
	}
	r = r.WithContext(context.WithValue(r.Context(), resultKey{}, d))
	if err != nil {
		if d.binding.Degraded && pl.Shown(results) { // a refused plan (pl nil) decided nothing
			setPolicyHeaders(w.Header(), c.headers, pl, d.binding, m.limiter.Now)
		}
		c.onError(w, r, err)
		return
	}
	if c.onShadow != nil {
		m.reportShadowed(r, d)
	}
	setHeaders(w.Header(), c.headers, pl, results, d.binding, m.limiter.Now)
	if !d.binding.Allowed {
		c.denied.ServeHTTP(w, r)
		return
	}
	m.hold(w, r, next, d, cost)
}

// hold serves r, which d allowed (or which has no rate plan), once it holds
// a slot of WithConcurrency's limit, if given, and settles WithCountIf
// when the handler returns.
func (m *middleware) hold(w http.ResponseWriter, r *http.Request, next http.Handler, d *decided, cost int64) {
	c := &m.cfg
	if c.slots != nil {
		slot, err := m.limiter.Acquire(r.Context(), d.parts[0].ID, *c.slots)
		if err != nil || !slot.Acquired {
			// counted by neither: the plan gives back what it counted
			d.refund(r.Context(), cost)
			if err != nil {
				c.onError(w, r, err)
				return
			}
			setSlotHeaders(w.Header(), c.headers, slot)
			c.denied.ServeHTTP(w, r)
			return
		}
		setSlotHeaders(w.Header(), c.headers, slot)
		// Extended while the handler runs, however long; released when it
		// returns, whether or not the client still waits.
		defer slot.Keep(r.Context())()
	}
	if c.countIf == nil || len(d.results) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	panicked := true
	defer func() {
		status := sw.status
		switch {
		case panicked: // as net/http answers it, if it answers at all
			status = http.StatusInternalServerError
		case status == 0:
			status = http.StatusOK
		}
		if !c.countIf(r, status) {
			d.refund(r.Context(), cost)
		}
	}()
	next.ServeHTTP(sw, r)
	panicked = false
}

// statusWriter records the status a handler answers with, for WithCountIf.
type statusWriter struct {
	http.ResponseWriter
	status int // 0 until a final status is written
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) { // other 1xx are not final
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Hijack hands over the connection, when the ResponseWriter it wraps can
// (http.ErrNotSupported otherwise): the status is then 101.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return h.Hijack()
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush flushes the response, when the ResponseWriter it wraps can.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		if w.status == 0 {
			w.status = http.StatusOK
		}
		f.Flush()
	}
}

// ReadFrom copies src to the response through the wrapped ResponseWriter's
// own ReadFrom when it has one, so that a handler's io.Copy from a file
// keeps net/http's sendfile; otherwise through Write.
func (w *statusWriter) ReadFrom(src io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(writerOnly{w.ResponseWriter}, src)
}

// writerOnly hides every method of a Writer but Write, so that io.Copy
// does not come back to ReadFrom.
type writerOnly struct{ io.Writer }

// Unwrap returns the ResponseWriter it wraps, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// reportShadowed calls the shadow handler for each denial shadow mode let
// through (see WithShadowHandler).
func (m *middleware) reportShadowed(r *http.Request, d *decided) {
	whole := false
	for _, res := range d.results {
		if !res.Limit.Shadow {
			whole = whole || res.Shadowed
		} else if res.Shadowed {
			m.cfg.onShadow(r, res)
		}
	}
	if whole {
		m.cfg.onShadow(r, d.binding)
	}
}
