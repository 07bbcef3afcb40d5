package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"

	"github.com/slidingwindow/ratelimit"
)

// Option configures a Middleware; pass options to New or Middleware. A With…
// function given arguments that could only be a mistake never panics: it
// records a configuration error, starting "httplimit:", that New returns and
// Middleware logs once before answering every request with 500, so that a
// bad configuration is never an unlimited API. A nil Option is ignored.
type Option interface{ apply(*config) }

// optionFunc adapts a function to Option.
type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// HeaderSet selects the groups of rate-limit headers a response carries:
// XRateLimitHeaders, IETFHeaders, both (XRateLimitHeaders|IETFHeaders, the
// default) or none (0). Retry-After does not belong to any set: it is sent
// on every 429 that a later retry can pass, whatever the set, and on no
// other response.
type HeaderSet uint8

const (
	// XRateLimitHeaders are X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset, the de facto headers most clients read.
	XRateLimitHeaders HeaderSet = 1 << iota
	// IETFHeaders are RateLimit-Policy and RateLimit, as in
	// draft-ietf-httpapi-ratelimit-headers.
	IETFHeaders
)

// allHeaders is the default HeaderSet.
const allHeaders = XRateLimitHeaders | IETFHeaders

// KeyFunc returns the identity a request is counted under, or "" when the
// request has no identity of the kind it looks for, so that the next KeyFunc
// is tried. The identity should name its kind ("org:42") so that it cannot
// meet the identities of other KeyFuncs, and must come from something the
// client cannot choose freely: a KeyFunc that returns a raw request header
// gives every client as many counts as it has values to send.
type KeyFunc func(r *http.Request) string

type config struct {
	keys     []KeyFunc
	route    func(*http.Request) string
	ip       ipRule
	plan     func(*http.Request) []ratelimit.Limit
	extra    []ratelimit.Limit // WithLimits
	onShadow func(*http.Request, ratelimit.Result)
	cost     func(*http.Request) int64
	countIf  func(*http.Request, int) bool
	skip     func(*http.Request) bool
	allow    []netip.Prefix
	headers  HeaderSet
	denied   http.Handler
	onError  func(http.ResponseWriter, *http.Request, error)
	slots    *ratelimit.Concurrency // WithConcurrency
	per      []perIdentity          // WithLimitsPer, in order
	errs     []error                // what the options found wrong; New reports them
}

// perIdentity is one WithLimitsPer: limits counted under a further
// identity of each request.
type perIdentity struct {
	name string
	key  KeyFunc
	plan *Plan // its limits, each named for the headers, Leased dropped
}

// WithKeys sets how requests are told apart: each KeyFunc is tried in turn
// and the first identity that is not empty is the one counted. The client
// address is always the last resort, so that unauthenticated traffic is
// counted by address and authenticated traffic by key or user:
//
//	httplimit.WithKeys(httplimit.UserID(userKey), httplimit.APIKey("X-API-Key", known))
//
// With no KeyFunc (the default), every request is counted by client address.
func WithKeys(fns ...KeyFunc) Option {
	return optionFunc(func(c *config) {
		c.keys = c.keys[:0]
		for _, fn := range fns {
			if fn != nil {
				c.keys = append(c.keys, fn)
			}
		}
	})
}

// WithRoute counts each route separately: the identity becomes
// "<route>|<identity>", with '%' and '|' in the route percent-encoded. fn
// must return one of a fixed set of names, never the raw URL path, which
// the client chooses (a count per path is a fresh count per request). With
// http.ServeMux, the pattern that will serve the request is such a name:
//
//	httplimit.WithRoute(func(r *http.Request) string { _, p := mux.Handler(r); return p })
//
// An empty route leaves the identity as it is.
func WithRoute(fn func(r *http.Request) string) Option {
	return optionFunc(func(c *config) { c.route = fn })
}

// WithTrustedProxies makes the client address come from header, which the
// proxies in front of the application append to: "X-Forwarded-For" or
// "Forwarded" (RFC 7239, its for= parameters). proxies are the ranges every
// such proxy's address lies in.
//
// The client is the right-most address that is not in proxies, counting the
// peer (RemoteAddr) as the right-most of all: a request from a peer outside
// proxies is counted by the peer's address whatever its headers say, and
// entries left of the first untrusted one are never read, so a client cannot
// move its key by sending the header itself. If every address is trusted,
// the left-most is the client. A peer that is not an IP address (a Unix
// socket) counts as a trusted proxy. An entry that is reached but is not an
// address ("unknown", "_hidden", garbage) makes the request UnknownClient.
//
// A header that is neither, an empty proxies, or an invalid prefix is a
// configuration error (see New).
func WithTrustedProxies(header string, proxies ...netip.Prefix) Option {
	h := http.CanonicalHeaderKey(header)
	trusted, err := normalizePrefixes("WithTrustedProxies", proxies)
	switch {
	case h != headerXFF && h != headerForwarded:
		err = errors.New("httplimit: WithTrustedProxies reads X-Forwarded-For or Forwarded, not " + strconv.Quote(header) +
			"; for a header that holds one address use WithClientIPHeader")
	case len(proxies) == 0:
		err = errors.New("httplimit: WithTrustedProxies was given no proxy range; without one, leave it out")
	}
	return optionFunc(func(c *config) {
		if err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.ip.mode, c.ip.header, c.ip.trusted = fromProxies, h, trusted
	})
}

// WithClientIPHeader makes the client address the value of header, one that
// holds a single address and that the edge in front of the application sets
// on every request, replacing any the client sent: X-Real-IP,
// CF-Connecting-IP, True-Client-IP, Fly-Client-IP and the like. If from is
// given, the header is believed only from peers in those ranges, and any
// other peer is counted by its own address; without from, the application
// must be unreachable except through the edge, or any client can choose its
// key. A request whose header is missing or not one address is UnknownClient.
//
// A header that is empty, X-Forwarded-For or Forwarded (lists: use
// WithTrustedProxies), or an invalid prefix in from, is a configuration
// error (see New).
func WithClientIPHeader(header string, from ...netip.Prefix) Option {
	h := http.CanonicalHeaderKey(header)
	senders, err := normalizePrefixes("WithClientIPHeader", from)
	if h == "" || h == headerXFF || h == headerForwarded {
		err = errors.New("httplimit: WithClientIPHeader needs a header that holds one address, not " + strconv.Quote(header) +
			"; for X-Forwarded-For and Forwarded use WithTrustedProxies")
	}
	return optionFunc(func(c *config) {
		if err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.ip.mode, c.ip.header, c.ip.trusted = fromHeader, h, senders
	})
}

// WithIPv6Prefix sets how many leading bits of an IPv6 client address make
// its key (default 64, the smallest network an ISP hands out, in which a
// host picks any address freely): every address in one such prefix shares a
// count (see ClientKey). bits outside 1..128 is a configuration error (see
// New).
func WithIPv6Prefix(bits int) Option {
	return optionFunc(func(c *config) {
		if bits < 1 || bits > 128 {
			c.errs = append(c.errs, errors.New("httplimit: WithIPv6Prefix needs 1 to 128 bits, not "+strconv.Itoa(bits)))
			return
		}
		c.ip.v6Bits = bits
	})
}

// WithLimits adds limits beside the one given to New (or Middleware): the
// default plan. Each request is decided against all of them at once, in one
// script call (ratelimit.Limiter.AllowAll), and is allowed, and counted
// under each, only if every enforced limit admits it: a request one of them
// denies is counted under none of them (a Shadow limit counts what it alone
// admits). A burst limit with a daily one:
//
//	burst := ratelimit.Limit{Name: "burst", Rate: 10, Window: time.Second}
//	daily := ratelimit.Limit{Name: "daily", Rate: 10000, Window: 24 * time.Hour}
//	httplimit.New(limiter, burst, httplimit.WithLimits(daily))
//
// Each limit's Name names it in the IETF headers; a limit with no Name is
// given one there, as in "100-per-60s" (see PolicyName). The headers list
// every enforced limit (see Middleware). The plan must be one that
// ratelimit.ValidateLimits accepts (at most 16 limits, no two of the same
// Window and Strict, which would share one count), with no zero Limit and
// no two limits of the same name, which the headers could not tell apart:
// New reports any of these as a configuration error naming WithLimits.
// WithLimits given twice keeps the last list.
func WithLimits(limits ...ratelimit.Limit) Option {
	limits = append([]ratelimit.Limit(nil), limits...)
	return optionFunc(func(c *config) { c.extra = limits })
}

// WithLimitsPer holds every request to limits counted under a further
// identity besides the plan's own (WithKeys'): the id key gives it, or with
// ClientAddress the client's address as the middleware computes it
// (trusted proxies, IPv6 prefix), counted as "<name>|<id>" (with WithRoute,
// after the route and '|', for an empty route too: "|<name>|<id>", so that
// they never meet the plan's ids of a route that has the identity's name).
// The API key and the address at once, as public
// APIs hold them:
//
//	httplimit.New(limiter, ratelimit.Limit{Name: "per-key", Rate: 5000, Window: time.Hour},
//		httplimit.WithKeys(httplimit.APIKey("X-API-Key", known)),
//		httplimit.WithLimitsPer("per-ip", httplimit.ClientAddress, ratelimit.PerMinute(100)))
//
// The plan's limits and every identity's are decided in one call of the
// Limiter's AllowMany, all or nothing: a request that any of them denies is
// counted under none. A request for which key returns "" has no such
// identity, and its limits are left out of its decision (never counted
// under another identity). A Leased limit is decided from the lease of its
// identity's id, as AllowMany decides it.
//
// name tells the identity's limits apart in the headers: each of limits
// with no Name is named name, or with several limits name and its derived
// name ("per-ip-100-per-60s"). RateLimit-Policy and RateLimit list every
// enforced limit of the decision, the plan's first, then each identity's in
// the order of the options; the X-RateLimit headers and Retry-After follow
// the binding one, of whichever identity; FromContextAll returns every
// Result in that order. WithCountIf's refunds, Charge, WithConcurrency (a
// slot of the plan's identity), shadow limits and the failure policy treat
// the decision as one. A further identity's ids are "<name>|<id>": like
// every KeyFunc's, key's answers must name their kind and come from nothing
// the client chooses freely (see KeyFunc), or a client could name another
// identity's count. name must be unique among WithLimitsPer's, key not
// nil, limits a valid plan (see WithLimits), every name in the headers
// distinct, and the plan and every identity at most 16 limits in all: New
// reports what is not.
func WithLimitsPer(name string, key KeyFunc, limits ...ratelimit.Limit) Option {
	limits = append([]ratelimit.Limit(nil), limits...)
	return optionFunc(func(c *config) {
		pl, err := NewPlanPer(name, limits...)
		switch {
		case err == nil && key == nil:
			err = fmt.Errorf("WithLimitsPer(%q): the KeyFunc is nil (ClientAddress for the client's address)", name)
		case err == nil && slices.ContainsFunc(c.per, func(p perIdentity) bool { return p.name == name }):
			err = fmt.Errorf("WithLimitsPer(%q) given twice", name)
		}
		if err != nil {
			c.errs = append(c.errs, fmt.Errorf("httplimit: %w", err))
			return
		}
		c.per = append(c.per, perIdentity{name: name, key: key, plan: pl})
	})
}

// WithPlanFunc chooses the limits each request is decided against, for
// plans per tier or per route:
//
//	plans := map[string][]ratelimit.Limit{
//		"free": {{Name: "burst", Rate: 5, Window: time.Second}, {Name: "hourly", Rate: 100, Window: time.Hour}},
//		"paid": {{Name: "burst", Rate: 50, Window: time.Second}, {Name: "hourly", Rate: 10000, Window: time.Hour}},
//	}
//	httplimit.WithPlanFunc(func(r *http.Request) []ratelimit.Limit { return plans[tier(r)] })
//
// fn runs before the decision. The limits it returns are the request's
// whole plan, decided as WithLimits' are, all at once, in that order: the
// limit given to New, and WithLimits', count only if fn returns them. A nil
// or empty plan selects the default plan (the limit given to New and
// WithLimits'). A plan that New would reject (see WithLimits), a zero Limit
// in it included, goes to the error handler, which answers 500 by default,
// with an error naming WithPlanFunc. Routes that should not share counts
// need WithRoute as well. A client whose plan changes keeps its counts, if
// its identity stays the same: limits of the same window length share
// counts.
func WithPlanFunc(fn func(r *http.Request) []ratelimit.Limit) Option {
	return optionFunc(func(c *config) { c.plan = fn })
}

// WithShadowHandler sets a function called when shadow mode lets through
// a request that would have been denied (default none): once for each
// Shadow limit (Limit.Shadow) that would have denied it on its own, with
// that limit's Result, and, under ratelimit.WithShadow, once for a decision
// that would have answered 429, with FromContext's Result (every Result
// then reads Allowed, so ratelimit.Binding picks the least remaining: a limit
// that would have denied; FromContextAll has each such one Shadowed). It is
// called on the request's goroutine, with FromContext and
// FromContextAll already set, before the next handler (or the denied
// handler, when an enforced limit denies the request), so it should be
// quick: a log line, a metric. A nil fn calls nothing.
func WithShadowHandler(fn func(r *http.Request, res ratelimit.Result)) Option {
	return optionFunc(func(c *config) { c.onShadow = fn })
}

// WithCost sets what each request costs (default 1), as for endpoints
// heavier than others; the cost counts under every limit of the plan. A
// cost below 1 is an error (ratelimit.ErrInvalidCost) that goes to the
// error handler; to let a request through uncounted, use WithSkip. A cost
// above any enforced limit's rate is always denied, and its 429 names no
// time to retry at: no Retry-After, X-RateLimit-Reset or RateLimit t.
func WithCost(fn func(r *http.Request) int64) Option {
	return optionFunc(func(c *config) { c.cost = fn })
}

// WithCountIf counts a request only if fn, given its response's status, says so: the
// request is decided before the handler as always, and refunded after it when it should not
// count (a login endpoint that counts only 401s; an API that does not count 5xx). A denied
// request (429) is never refunded.
//
// The status is the one the handler wrote (200 if it wrote none). The
// refund gives back the cost the request was decided at, not what Charge
// added since; it goes through the Limiter's Refund, whose failures reach
// the Limiter's error handler. The response's rate-limit headers describe
// the decision, as they were written before the handler ran.
func WithCountIf(fn func(r *http.Request, status int) bool) Option {
	return optionFunc(func(c *config) { c.countIf = fn })
}

// WithSkip lets the requests for which fn is true through uncounted and
// without rate-limit headers: health checks, metrics, CORS preflights.
// WithSkip given twice keeps the last fn.
func WithSkip(fn func(r *http.Request) bool) Option {
	return optionFunc(func(c *config) { c.skip = fn })
}

// WithAllowList lets requests from client addresses in prefixes through
// uncounted and without rate-limit headers. The address is the one the
// client-IP rule finds (WithTrustedProxies, WithClientIPHeader), so a client
// cannot get on the list by sending a header. An invalid prefix is a
// configuration error (see New). WithAllowList given twice keeps the last
// list.
func WithAllowList(prefixes ...netip.Prefix) Option {
	allow, err := normalizePrefixes("WithAllowList", prefixes)
	return optionFunc(func(c *config) {
		if err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.allow = allow
	})
}

// WithHeaders selects the rate-limit headers every counted response carries
// (default both sets). WithHeaders(0) sends none but Retry-After.
func WithHeaders(set HeaderSet) Option {
	return optionFunc(func(c *config) { c.headers = set })
}

// WithDeniedHandler sets the handler that answers a request the limit
// denies (default: 429 with an RFC 9457 problem+json body). When it runs the
// rate-limit headers are set (Retry-After too, if a later retry can pass)
// and the status is not yet written; FromContext gives it the Result. It
// also answers the denials of ratelimit.FailLocal, which carry
// X-RateLimit-Limit and RateLimit-Policy only. A handler that writes no
// status answers 200, so it should write one. A nil h keeps the default.
func WithDeniedHandler(h http.Handler) Option {
	return optionFunc(func(c *config) { c.denied = h })
}

// WithErrorHandler sets the function that answers a request the limiter
// returned an error for. The default answers 503 with a problem+json body
// when Redis could not decide under ratelimit.FailClosed (the error wraps
// ratelimit.ErrUnavailable) or the request's context ended, and 500, logging
// the error through log/slog, for any other error: invalid input, which is a
// bug in the configuration (a cost below 1 from WithCost, a plan from
// WithPlanFunc that New would reject).
// FromContext gives it the Result; under FailClosed it is Degraded, and the
// response already carries X-RateLimit-Limit and RateLimit-Policy.
// A nil fn keeps the default.
func WithErrorHandler(fn func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return optionFunc(func(c *config) { c.onError = fn })
}

// WithConcurrency has each request hold one of c's slots while its handler
// runs: at most c.Max requests of a client (its identity, as the plan
// counts it) in flight at once, across every server sharing the Redis. The
// slot's lease is extended every half c.Lease while the handler runs
// (ratelimit.Slot.Keep), so a request may run for longer than a Lease, and
// the slot is released when the handler returns or panics, the client's
// disconnect included (the handler's context ends): one Redis call after
// the handler, before the response ends. A server that dies holding slots
// loses them within a Lease.
//
// A request must pass both the rate plan and the concurrency limit. The
// plan decides first; a request it allows then takes a slot, and one the
// full limit refuses is refunded to the plan (the Limiter's Refund), so
// that it is counted by neither: the plan's denials, an abuser's, cost no
// slot call, and the deny cache keeps answering them without Redis. A full
// limit answers 429 (the denied handler) with Retry-After until the
// earliest held lease ends, X-RateLimit-Limit the limit's Max and
// X-RateLimit-Remaining 0, and in the IETF headers an item of
// qu="concurrent-requests" named by c.Name (or "<Max>-concurrent"):
//
//	RateLimit-Policy: "burst";q=10;w=1, "exports";q=2;qu="concurrent-requests"
//	RateLimit: "burst";r=9;t=1, "exports";r=0;t=30
//
// A request that holds a slot carries the item too, with what remains and
// no t. Under the failure policies a slot is as Acquire decides it. For a
// concurrency limit with no rate plan, give New the zero Limit.
func WithConcurrency(c ratelimit.Concurrency) Option {
	return optionFunc(func(cfg *config) {
		if err := c.Validate(); err != nil {
			cfg.errs = append(cfg.errs, fmt.Errorf("httplimit: WithConcurrency: %w", err))
			return
		}
		cfg.slots = &c
	})
}
