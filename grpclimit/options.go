package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/slidingwindow/ratelimit"
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

type config struct {
	keyFunc func(ctx context.Context, fullMethod string) string
	mdKey   string         // trusted metadata key; "": the peer address only
	trusted []netip.Prefix // the peers mdKey is believed from
	v6Bits  int            // 0: 64
	methods map[string][]ratelimit.Limit
	cost    func(ctx context.Context, fullMethod string) int64
	countIf func(ctx context.Context, fullMethod string, code codes.Code) bool
	errs    []error // what the options found wrong; NewUnary reports them
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

// WithKeyFunc counts calls by the identity fn returns, for authenticated
// callers: a user or tenant id from the credentials.AuthInfo of
// peer.FromContext (an mTLS certificate), or from a token an earlier
// interceptor verified. fn gets the call's context and its full method
// name ("/pkg.Service/Method"); an empty answer counts the call by the
// client address instead, as if there were no fn.
//
// The identity should name its kind ("user:42", "svc:billing"), so that it
// cannot meet an address key ("ip:…", "ip6:…"), and must come from
// something the client cannot choose freely: a raw metadata value gives
// every client as many counts as it has values to send. Hash secrets such
// as API keys before returning them: Redis keys are seen by whoever can run
// SCAN. fn runs on every call, on the call's goroutine, and must be safe
// for simultaneous use. WithKeyFunc given twice keeps the last fn; a nil fn
// counts by address.
func WithKeyFunc(fn func(ctx context.Context, fullMethod string) string) Option {
	return optionFunc(func(c *config) { c.keyFunc = fn })
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
// method not in m is decided against the limit given to the interceptor,
// all of them sharing one count per identity. A method mapped to no limits
// (nil or empty) is not limited at all: no decision and no rate-limit
// metadata, as for health checks.
//
// m is copied. A name that is not "/service/method", or limits that
// ratelimit.ValidateLimits rejects (more than 16, an invalid or zero Limit,
// two of the same Window and Strict, which would share one count), is a
// configuration error naming WithMethodLimits and the method.
// WithMethodLimits given twice keeps the last m.
func WithMethodLimits(m map[string][]ratelimit.Limit) Option {
	methods := make(map[string][]ratelimit.Limit, len(m))
	var errs []error
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names) // errors in a stable order
	for _, name := range names {
		limits := m[name]
		if err := checkMethodLimits(name, limits); err != nil {
			errs = append(errs, err)
			continue
		}
		methods[name] = append([]ratelimit.Limit(nil), limits...)
	}
	return optionFunc(func(c *config) {
		if len(errs) > 0 {
			c.errs = append(c.errs, errs...)
			return
		}
		c.methods = methods
	})
}

// checkMethodLimits reports what is wrong with one entry of
// WithMethodLimits, naming the method.
func checkMethodLimits(name string, limits []ratelimit.Limit) error {
	service, method, ok := strings.Cut(strings.TrimPrefix(name, "/"), "/")
	if !strings.HasPrefix(name, "/") || !ok || service == "" || method == "" || strings.Contains(method, "/") {
		return fmt.Errorf("grpclimit: WithMethodLimits: %q is not a full method name (/pkg.Service/Method)", name)
	}
	if len(limits) == 0 {
		return nil // not limited
	}
	if err := ratelimit.ValidateLimits(limits); err != nil {
		return fmt.Errorf("grpclimit: WithMethodLimits: %s: %w", name, err)
	}
	return nil
}

// WithCost sets what each call costs (default 1), for methods heavier than
// others; fn gets the call's context and full method name. A cost below 1
// answers the call with codes.Internal and logs it (ratelimit.ErrInvalidCost:
// a bug in fn); to let calls through uncounted, map their method to no
// limits in WithMethodLimits. A cost above a limit's rate can never pass: it
// is denied without a RetryInfo. For a stream, the cost is that of opening
// it.
func WithCost(fn func(ctx context.Context, fullMethod string) int64) Option {
	return optionFunc(func(c *config) { c.cost = fn })
}
