package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// Option configures an interceptor; pass options to UnaryServerInterceptor,
// StreamServerInterceptor, NewUnary or NewStream. A With… function given
// arguments that could only be a mistake never panics: it records a
// configuration error, starting "grpclimit:", that NewUnary and NewStream
// return and the interceptors log once before answering every call with
// codes.Internal, so that a bad configuration is never an unlimited API. A
// nil Option is ignored.
type Option interface{ apply(*config) }

// optionFunc adapts a function to Option.
type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// KeyFunc returns the identity a call is counted under, given the call's
// context and its full method name ("/pkg.Service/Method"), or "" when the
// call has no identity of the kind it looks for, so that the next KeyFunc
// is tried: httplimit.KeyFunc, as a function of the gRPC call. The identity
// should name its kind ("user:42", "svc:billing") so that it cannot meet
// the identities of other KeyFuncs or an address key ("ip:…", "ip6:…"),
// and must come from something the client cannot choose freely: a raw
// metadata value gives every client as many counts as it has values to
// send.
type KeyFunc func(ctx context.Context, fullMethod string) string

type config struct {
	keys     []KeyFunc
	mdKey    string            // trusted metadata key; "": the peer address only
	trusted  []netip.Prefix    // the peers mdKey is believed from
	v6Bits   int               // 0: 64
	extra    []ratelimit.Limit // WithLimits
	plan     func(ctx context.Context, fullMethod string) []ratelimit.Limit
	methods  map[string]*httplimit.Plan // WithMethodLimits
	cost     func(ctx context.Context, fullMethod string) int64
	countIf  func(ctx context.Context, fullMethod string, code codes.Code) bool
	skip     func(ctx context.Context, fullMethod string) bool
	allow    []netip.Prefix
	onShadow func(ctx context.Context, fullMethod string, res ratelimit.Result)
	denied   func(ctx context.Context, fullMethod string) error
	onError  func(ctx context.Context, fullMethod string, err error) error
	slots    *ratelimit.Concurrency // WithConcurrency
	per      []perIdentity          // WithLimitsPer, in order
	errs     []error                // what the options found wrong; NewUnary reports them
}

// perIdentity is one WithLimitsPer: limits counted under a further
// identity of each call.
type perIdentity struct {
	name string
	key  KeyFunc
	plan *httplimit.Plan // its limits, each named for the metadata, Leased dropped
}

// WithCountIf counts a call only if fn, given the status code its handler
// returned with, says so: the call is decided before the handler as
// always, and refunded after it when it should not count (a login method
// that counts only codes.Unauthenticated; an API that does not count
// codes.Internal or codes.Unavailable). A denied call is never refunded.
// The refund gives back the cost the call was decided at, not what Charge
// added since; it goes through the Limiter's Refund, whose failures reach
// the Limiter's error handler. For a stream, the code is the one its
// handler returned with, when the stream ends. A handler that panics is
// given codes.Internal, as a recovery interceptor chained before this one
// answers it (without one, grpc-go lets the panic end the process), and
// the refund is made as the panic goes on up: httplimit gives a panic 500
// by the same rule.
func WithCountIf(fn func(ctx context.Context, fullMethod string, code codes.Code) bool) Option {
	return optionFunc(func(c *config) { c.countIf = fn })
}

// WithKeys sets how calls are told apart, as httplimit.WithKeys does: each
// KeyFunc is tried in turn and the first identity that is not empty is the
// one counted. The client address is always the last resort, so that
// unauthenticated calls are counted by address and authenticated ones by
// who they are: a user or tenant id from the credentials.AuthInfo of
// peer.FromContext (an mTLS certificate), or from a token an earlier
// interceptor verified. Hash secrets such as API keys before returning
// them (httplimit.HashedKey): Redis keys are seen by whoever can run SCAN.
// Each KeyFunc runs on the call's goroutine and must be safe for
// simultaneous use. With no KeyFunc (the default), every call is counted by
// client address; nil KeyFuncs are dropped, and WithKeys given twice keeps
// the last list.
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

// WithKeyFunc is WithKeys(fn): calls are counted by the identity fn
// returns, or by client address when it returns "". A nil fn counts by
// address.
//
// Deprecated: use WithKeys, its name in httplimit too, which also takes
// several KeyFuncs tried in turn.
func WithKeyFunc(fn func(ctx context.Context, fullMethod string) string) Option {
	return WithKeys(fn)
}

// WithLimits adds limits beside the one given to the interceptor: the
// default plan, as httplimit.WithLimits makes it. Each call is decided
// against all of them at once, in one script call
// (ratelimit.Limiter.AllowAll), and is allowed, and counted under each,
// only if every enforced limit admits it: a burst limit with a daily one.
// The metadata lists every enforced limit; each is named by PolicyName. The
// plan must be one that ratelimit.ValidateLimits accepts, with no zero
// Limit and no two limits of the same name, which the metadata could not
// tell apart: NewUnary and NewStream report any of these as a configuration
// error naming WithLimits. WithLimits given twice keeps the last list.
func WithLimits(limits ...ratelimit.Limit) Option {
	limits = append([]ratelimit.Limit(nil), limits...)
	return optionFunc(func(c *config) { c.extra = limits })
}

// WithLimitsPer holds every call to limits counted under a further
// identity besides the plan's own (WithKeys'), as httplimit.WithLimitsPer
// holds requests: the id key gives it, or with ClientAddress the client's
// address as the interceptor computes it (WithTrustedMetadata, IPv6
// prefix), counted as "<name>|<id>" (with WithMethodLimits, after
// "<method>|" for a method of its, and after "|" for the others, so that
// they never meet the ids of a method's calls). The API key and the
// address at once:
//
//	grpclimit.NewUnary(limiter, ratelimit.Limit{Name: "per-key", Rate: 5000, Window: time.Hour},
//		grpclimit.WithKeys(apiKey),
//		grpclimit.WithLimitsPer("per-ip", grpclimit.ClientAddress, ratelimit.PerMinute(100)))
//
// The plan's limits and every identity's are decided in one call of the
// Limiter's AllowMany, all or nothing: a call that any of them denies is
// counted under none. A call for which key returns "" has no such identity,
// and its limits are left out of its decision. A Leased limit is decided
// from the lease of its identity's id. Each of limits with no Name is named name,
// or with several limits name and its derived name ("per-ip-100-per-60s");
// ratelimit-policy and ratelimit list every enforced limit, the plan's
// first, then each identity's in the order of the options, the other
// metadata and the RetryInfo follow the binding one, FromContextAll returns
// every Result in that order; WithCountIf's refunds, Charge,
// WithConcurrency (a slot of the plan's identity), shadow limits and the
// failure policy treat the decision as one. A further identity's ids are
// "<name>|<id>": like every KeyFunc's, key's answers must name their kind
// and come from nothing the client chooses freely (see KeyFunc), or a
// client could name another identity's count. name must be unique among
// WithLimitsPer's, key not nil, limits a valid plan (see WithLimits), every
// name in the metadata distinct, and the plan and every identity at most 16
// limits in all: NewUnary and NewStream report what is not.
func WithLimitsPer(name string, key KeyFunc, limits ...ratelimit.Limit) Option {
	limits = append([]ratelimit.Limit(nil), limits...)
	return optionFunc(func(c *config) {
		pl, err := httplimit.NewPlanPer(name, limits...)
		switch {
		case err == nil && key == nil:
			err = fmt.Errorf("WithLimitsPer(%q): the KeyFunc is nil (ClientAddress for the client's address)", name)
		case err == nil && slices.ContainsFunc(c.per, func(p perIdentity) bool { return p.name == name }):
			err = fmt.Errorf("WithLimitsPer(%q) given twice", name)
		}
		if err != nil {
			c.errs = append(c.errs, fmt.Errorf("grpclimit: %w", err))
			return
		}
		c.per = append(c.per, perIdentity{name: name, key: key, plan: pl})
	})
}

// WithPlanFunc chooses the limits each call is decided against, for plans
// per tier, as httplimit.WithPlanFunc does; fn gets the call's context and
// full method name and runs before the decision, for every method not in
// WithMethodLimits. The limits it returns are the call's whole plan,
// decided all at once, in that order. A nil or empty plan selects the
// default plan (the limit given to the interceptor and WithLimits'), never
// "not limited": a tier missing from a map must not make an unlimited API;
// to let calls through uncounted, use WithSkip. A plan that the default
// one could not be (see WithLimits) fails the call with codes.Internal,
// logged, naming WithPlanFunc. Calls of every method share their counts per
// identity; a method counted apart belongs in WithMethodLimits.
func WithPlanFunc(fn func(ctx context.Context, fullMethod string) []ratelimit.Limit) Option {
	return optionFunc(func(c *config) { c.plan = fn })
}

// WithSkip lets the calls for which fn is true through uncounted and
// without rate-limit metadata: health checks, reflection. fn gets the
// call's context and full method name. WithSkip given twice keeps the last
// fn.
func WithSkip(fn func(ctx context.Context, fullMethod string) bool) Option {
	return optionFunc(func(c *config) { c.skip = fn })
}

// WithAllowList lets calls from client addresses in prefixes through
// uncounted and without rate-limit metadata, as httplimit.WithAllowList
// does. The address is the one the call is counted by (the peer's, or
// WithTrustedMetadata's from a trusted peer), so a client cannot get on the
// list by sending metadata. An invalid prefix is a configuration error.
// WithAllowList given twice keeps the last list.
func WithAllowList(prefixes ...netip.Prefix) Option {
	allow := make([]netip.Prefix, 0, len(prefixes))
	var err error
	for _, p := range prefixes {
		if !p.IsValid() {
			err = errors.New("grpclimit: WithAllowList was given an invalid prefix " + strconv.Quote(p.String()))
			break
		}
		allow = append(allow, unmapPrefix(p))
	}
	return optionFunc(func(c *config) {
		if err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.allow = allow
	})
}

// unmapPrefix returns p masked, an IPv4-mapped IPv6 prefix as the IPv4 one,
// so that it matches the unmapped addresses calls are counted by.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}

// WithShadowHandler sets a function called when shadow mode lets through
// a call that would have been denied (default none), as
// httplimit.WithShadowHandler does: once for each Shadow limit
// (Limit.Shadow) that would have denied it on its own, with that limit's
// Result, and, under ratelimit.WithShadow, once for a decision that would
// have failed the call, with FromContext's Result. It is called on the
// call's goroutine, with FromContext and FromContextAll already set, before
// the handler, so it should be quick: a log line, a metric. A nil fn calls
// nothing.
func WithShadowHandler(fn func(ctx context.Context, fullMethod string, res ratelimit.Result)) Option {
	return optionFunc(func(c *config) { c.onShadow = fn })
}

// WithDeniedHandler sets the function that chooses the status a denied
// call fails with, httplimit.WithDeniedHandler as a function of the gRPC
// call: the default is codes.ResourceExhausted with a google.rpc.RetryInfo
// (see UnaryServerInterceptor). When it runs the rate-limit metadata is
// set and FromContext gives it the Result. It should return a status error
// (status.Error); a nil return keeps the default for that call, since a
// denied call never goes on to its handler, so that fn may be a log line
// alone. A nil fn keeps the default.
func WithDeniedHandler(fn func(ctx context.Context, fullMethod string) error) Option {
	return optionFunc(func(c *config) { c.denied = fn })
}

// WithErrorHandler sets the function that chooses the status of a call the
// limiter returned an error for, httplimit.WithErrorHandler as a function of
// the gRPC call. The default fails the call with the context's status when
// it ended, codes.Unavailable when Redis could not decide under
// ratelimit.FailClosed (err wraps ratelimit.ErrUnavailable), and
// codes.Internal, logging err through log/slog, for any other error:
// invalid input, a bug in the configuration (a cost below 1 from WithCost,
// a plan from WithPlanFunc the default one could not be). FromContext gives
// it the Result; under FailClosed it is Degraded. It should return a status
// error; a nil return keeps the default for that call (a call is never let
// through on an error here: that is ratelimit.FailOpen's to decide). A nil
// fn keeps the default.
func WithErrorHandler(fn func(ctx context.Context, fullMethod string, err error) error) Option {
	return optionFunc(func(c *config) { c.onError = fn })
}

// WithTrustedMetadata makes the client address come from the request
// metadata key, which the proxies in front of the server set or append to
// (Envoy's "x-forwarded-for", or a single-address "x-real-ip"), and from
// nowhere else. from are the ranges those proxies' addresses lie in: the
// metadata is read only on calls whose peer is in from (or a Unix socket,
// a process on this host), so a client that sends the key itself from
// anywhere else is counted by its own address, with everyone else who sent
// it from there.
//
// The value is a list read as X-Forwarded-For is: entries are separated by
// commas, and several values of the key are one list in the order received.
// The client is the right-most entry that is not in from, so entries a
// client put left of what a trusted proxy wrote are never read; if every
// entry is in from, the left-most is. A trusted peer that sent no value is
// counted by its own address. An entry that is reached and is not an
// address makes the call UnknownClient. The rule is
// httplimit.ForwardedClient's, and so httplimit.WithTrustedProxies'.
//
// A key that is not a valid metadata key, a binary ("-bin") or reserved
// ("grpc-", ":") key, no from, or an invalid prefix is a configuration
// error.
func WithTrustedMetadata(key string, from ...netip.Prefix) Option {
	k := strings.ToLower(key)
	var err error
	switch {
	case !validMDKey(k):
		err = fmt.Errorf("grpclimit: WithTrustedMetadata needs a metadata key of 0-9 a-z - _ . only, not %q", key)
	case strings.HasSuffix(k, "-bin") || strings.HasPrefix(k, "grpc-"):
		err = fmt.Errorf("grpclimit: WithTrustedMetadata cannot read %q: binary and grpc- keys hold no address", key)
	case len(from) == 0:
		err = errors.New("grpclimit: WithTrustedMetadata was given no proxy range; without one, leave it out")
	}
	trusted := make([]netip.Prefix, 0, len(from))
	for _, p := range from {
		if !p.IsValid() {
			err = errors.New("grpclimit: WithTrustedMetadata was given an invalid prefix " + strconv.Quote(p.String()))
			break
		}
		trusted = append(trusted, p.Masked())
	}
	return optionFunc(func(c *config) {
		if err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.mdKey, c.trusted = k, trusted
	})
}

// validMDKey reports whether k is a lower-case gRPC metadata key that a
// client can send as ASCII: 0-9 a-z - _ . (pseudo-headers start with ':').
func validMDKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// WithIPv6Prefix sets how many leading bits of an IPv6 client address make
// its key (default 64): every address in one such prefix shares a count, as
// httplimit.WithIPv6Prefix does (see ClientKey). bits outside
// 1..128 is a configuration error.
func WithIPv6Prefix(bits int) Option {
	return optionFunc(func(c *config) {
		if bits < 1 || bits > 128 {
			c.errs = append(c.errs, errors.New("grpclimit: WithIPv6Prefix needs 1 to 128 bits, not "+strconv.Itoa(bits)))
			return
		}
		c.v6Bits = bits
	})
}

// WithMethodLimits gives methods limits of their own, by full method name
// ("/pkg.Service/Method", as grpc.UnaryServerInfo.FullMethod has it). A
// call to a method in m is decided against all of its limits at once, with
// one ratelimit.Limiter.AllowAll: it goes ahead only if every limit admits
// it (say, 10 a second and 1000 an hour). A method in m is counted apart
// from every other: its calls are counted under "<method>|<identity>", so
// that they neither use up nor draw on the budget of other methods. Every
// method not in m is decided against WithPlanFunc's plan or the default
// plan, all of them sharing one count per identity.
//
// m is copied. A name that is not "/service/method", a method mapped to no
// limits (nil or empty), limits that ratelimit.ValidateLimits rejects
// (more than 16, an invalid or zero Limit, two of the same Window and
// Strict, which would share one count), or two limits of one name, which
// the metadata could not tell apart (httplimit.NewPlan's rule for every
// plan), is a configuration error naming WithMethodLimits and the method. An empty plan is never "not limited",
// here as in WithPlanFunc and httplimit: a method to let through uncounted
// belongs in WithSkip.
// WithMethodLimits given twice keeps the last m.
func WithMethodLimits(m map[string][]ratelimit.Limit) Option {
	methods := make(map[string]*httplimit.Plan, len(m))
	var errs []error
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names) // errors in a stable order
	for _, name := range names {
		pl, err := methodPlan(name, m[name])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		methods[name] = pl
	}
	return optionFunc(func(c *config) {
		if len(errs) > 0 {
			c.errs = append(c.errs, errs...)
			return
		}
		c.methods = methods
	})
}

// methodPlan returns the plan of one entry of WithMethodLimits, or what is
// wrong with it, naming the method.
func methodPlan(name string, limits []ratelimit.Limit) (*httplimit.Plan, error) {
	service, method, ok := strings.Cut(strings.TrimPrefix(name, "/"), "/")
	if !strings.HasPrefix(name, "/") || !ok || service == "" || method == "" || strings.Contains(method, "/") {
		return nil, fmt.Errorf("grpclimit: WithMethodLimits: %q is not a full method name (/pkg.Service/Method)", name)
	}
	if len(limits) == 0 {
		return nil, fmt.Errorf("grpclimit: WithMethodLimits: %s is mapped to no limits; "+
			"an empty plan is never \"not limited\": to let its calls through uncounted, use WithSkip", name)
	}
	// ValidateLimits first: this option has always named a zero Limit by
	// ValidateLimits' words for it ("rate 0 is below 1").
	if err := ratelimit.ValidateLimits(limits); err != nil {
		return nil, fmt.Errorf("grpclimit: WithMethodLimits: %s: %w", name, err)
	}
	pl, err := httplimit.NewPlan(limits...)
	if err != nil {
		return nil, fmt.Errorf("grpclimit: WithMethodLimits: %s: %w", name, err)
	}
	return pl, nil
}

// WithCost sets what each call costs (default 1), for methods heavier than
// others; fn gets the call's context and full method name. A cost below 1
// answers the call with codes.Internal and logs it (ratelimit.ErrInvalidCost:
// a bug in fn); to let calls through uncounted, use WithSkip. A cost above
// a limit's rate can never pass: it is denied without a RetryInfo. For a stream, the cost is that of opening
// it.
func WithCost(fn func(ctx context.Context, fullMethod string) int64) Option {
	return optionFunc(func(c *config) { c.cost = fn })
}

// WithConcurrency has each call hold one of c's slots while its handler
// runs: at most c.Max calls of a caller (its identity, as the plan counts
// it) in flight at once, across every server sharing the Redis. The slot's
// lease is extended every half c.Lease while the handler runs
// (ratelimit.Slot.Keep): a stream holds its slot for its life. It is
// released when the handler returns or panics. A server that dies holding
// slots loses them within a Lease.
//
// A call must pass both the plan and the concurrency limit, in that order,
// as in httplimit.WithConcurrency: one the full limit refuses is refunded
// to the plan, so that neither counts it. A full limit is
// codes.ResourceExhausted with a google.rpc.RetryInfo of the wait until the
// earliest held lease ends, ratelimit-limit the limit's Max,
// ratelimit-remaining 0, retry-after, and a ratelimit-policy item of
// qu="concurrent-requests" (ratelimit's with r and t); a call that holds a
// slot carries the items too. Under the failure policies a slot is as
// ratelimit.Limiter.Acquire decides it.
func WithConcurrency(c ratelimit.Concurrency) Option {
	return optionFunc(func(cfg *config) {
		if err := c.Validate(); err != nil {
			cfg.errs = append(cfg.errs, fmt.Errorf("grpclimit: WithConcurrency: %w", err))
			return
		}
		cfg.slots = &c
	})
}
