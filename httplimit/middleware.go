// Package httplimit puts a ratelimit.Limiter in front of any net/http
// handler. Middleware returns a func(http.Handler) http.Handler, the shape
// http.ServeMux users wrap by hand and chi, gorilla/mux and most other
// routers take as middleware.
//
// Each request is counted under one identity: by default its client address,
// taken from RemoteAddr and nothing else (WithTrustedProxies and
// WithClientIPHeader say which proxy headers to believe, and from whom);
// IPv6 addresses are grouped by /64. WithKeys counts authenticated traffic by
// API key or user id instead, WithRoute counts each route apart, and
// WithLimitFunc picks a limit per request, for plans.
//
// Every counted response carries X-RateLimit-Limit, X-RateLimit-Remaining
// and X-RateLimit-Reset, and the IETF draft's RateLimit-Policy and
// RateLimit; a denied request gets 429 with Retry-After, and a request Redis
// could not decide under ratelimit.FailClosed gets 503. A decision Redis did
// not make (Result.Degraded) gets X-RateLimit-Limit and RateLimit-Policy
// only, and a request that can never pass gets no time to retry at.
//
// New reports a configuration error; Middleware, which cannot fail, logs it
// once and answers every request with 500. Nothing in the package panics on
// configuration.
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/slidingwindow/ratelimit"
)

// Middleware returns middleware that decides each request against limit
// with l, and passes it on to the next handler only if it is allowed.
//
// In the order it happens: a request WithSkip or WithAllowList lets through
// goes on untouched. The others are counted under their identity (WithKeys,
// WithRoute; by default the client address), at their cost (WithCost;
// default 1), against their limit (WithLimitFunc; default limit). The
// Result is stored in the request's context (FromContext). Then:
//
//   - allowed: the rate-limit headers (WithHeaders) are set and the next
//     handler serves the request;
//   - denied: the rate-limit headers are set and the denied handler answers
//     (WithDeniedHandler; default 429 with Retry-After, in whole seconds
//     rounded up, and a problem+json body). A request whose cost is above
//     the limit's rate can never pass: its 429 carries the limit, the
//     remaining count and the policy, but no Retry-After, X-RateLimit-Reset
//     or RateLimit t, since any of them would invite a retry that fails;
//   - the limiter returned an error: the error handler answers
//     (WithErrorHandler; default 503 for Redis down under FailClosed or the
//     request's context ended, 500 for invalid input), with
//     X-RateLimit-Limit and RateLimit-Policy set if the Result is Degraded.
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
// 500: a nil l, an invalid limit (see ratelimit.Limit.Validate), or an
// option given invalid values; the error names each problem.
func New(l *ratelimit.Limiter, limit ratelimit.Limit, opts ...Option) (func(http.Handler) http.Handler, error) {
	cfg := config{headers: AllHeaders}
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&cfg)
		}
	}
	if l == nil {
		cfg.errs = append(cfg.errs, errors.New("httplimit: the Limiter is nil"))
	}
	if err := limit.Validate(); err != nil {
		cfg.errs = append(cfg.errs, fmt.Errorf("httplimit: %w", err))
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
	name := cfg.name
	if name == "" {
		name = policyName(limit)
	}
	m := &middleware{cfg: cfg, limiter: l, base: newPolicy(name, limit)}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next)
		})
	}, nil
}

// FromContext returns the Result of the decision the middleware made for
// the request whose context ctx is, and whether there was one: there is
// none for a request it let through uncounted.
func FromContext(ctx context.Context) (ratelimit.Result, bool) {
	res, ok := ctx.Value(resultKey{}).(ratelimit.Result)
	return res, ok
}

type resultKey struct{}

// policy is a limit with its name already quoted for the IETF headers.
type policy struct {
	limit  ratelimit.Limit
	quoted string
}

func newPolicy(name string, limit ratelimit.Limit) *policy {
	return &policy{limit: limit, quoted: sfString(name)}
}

type middleware struct {
	cfg     config
	limiter *ratelimit.Limiter
	base    *policy // the limit given to Middleware, with its name
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
	p := m.policyFor(r)
	cost := int64(1)
	if c.cost != nil {
		cost = c.cost(r)
	}
	res, err := m.limiter.AllowN(r.Context(), c.identity(r), p.limit, cost)
	r = r.WithContext(context.WithValue(r.Context(), resultKey{}, res))
	if err != nil {
		if res.Degraded {
			setPolicyHeaders(w.Header(), c.headers, p)
		}
		c.onError(w, r, err)
		return
	}
	setHeaders(w.Header(), c.headers, p, res)
	if !res.Allowed {
		c.denied.ServeHTTP(w, r)
		return
	}
	next.ServeHTTP(w, r)
}

// policyFor returns the limit r is decided against, and its name.
func (m *middleware) policyFor(r *http.Request) *policy {
	if m.cfg.policy == nil {
		return m.base
	}
	p := m.cfg.policy(r)
	if p.Limit == (ratelimit.Limit{}) {
		if p.Name == "" {
			return m.base
		}
		return newPolicy(p.Name, m.base.limit)
	}
	if p.Name == "" {
		p.Name = policyName(p.Limit)
	}
	return newPolicy(p.Name, p.Limit)
}
