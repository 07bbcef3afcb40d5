package httplimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// APIKey returns a KeyFunc that counts a request by the API key in header,
// as "key:" and the first 32 hex digits (128 bits) of the key's SHA-256:
// keys are secrets, and Redis keys are seen by whoever can run SCAN or read
// a slow log. Only keys that known accepts count as an identity; a request
// with no key, or one known rejects, falls through to the next KeyFunc (at
// last the client address), so that a client cannot get a fresh count by
// sending a made-up key. known runs on every request with a key: it should
// be a map lookup or a cache, not a database round trip. An empty header
// means "X-API-Key"; a nil known recognises no key, so that every request
// falls through.
func APIKey(header string, known func(key string) bool) KeyFunc {
	if header == "" {
		header = "X-API-Key"
	}
	if known == nil {
		known = func(string) bool { return false }
	}
	header = http.CanonicalHeaderKey(header)
	return func(r *http.Request) string {
		k := r.Header.Get(header)
		if k == "" || !known(k) {
			return ""
		}
		return HashedKey(k)
	}
}

// HashedKey returns the identity APIKey gives key: "key:" and the first 32
// hex digits of its SHA-256. Use it to Reset or Peek a key's count.
func HashedKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key:" + hex.EncodeToString(sum[:16])
}

// UserID returns a KeyFunc that counts a request by the user id an earlier
// middleware (authentication) stored in the request's context under ctxKey,
// as "user:<id>". The value may be a string, an int, int32, int64, uint,
// uint32 or uint64, or a fmt.Stringer; a missing value, an empty id or a
// value of any other type (a named type such as `type UserID int64`
// included, unless it has a String method) falls through to the next
// KeyFunc.
func UserID(ctxKey any) KeyFunc {
	return func(r *http.Request) string {
		id := idString(r.Context().Value(ctxKey))
		if id == "" {
			return ""
		}
		return "user:" + id
	}
}

func idString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int:
		return strconv.Itoa(v)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case int64:
		return strconv.FormatInt(v, 10)
	case uint:
		return strconv.FormatUint(uint64(v), 10)
	case uint32:
		return strconv.FormatUint(uint64(v), 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	case fmt.Stringer:
		return v.String()
	}
	return ""
}

// ClientAddress is the KeyFunc of a request's client address as the
// middleware computes it, from RemoteAddr or the proxy headers it trusts
// (WithTrustedProxies, WithClientIPHeader), IPv6 addresses grouped by
// WithIPv6Prefix: the identity ClientKey gives. It is for WithLimitsPer,
// whose limits it counts per address beside the plan's own identity; the
// middleware hands the address to it, and outside the middleware it
// returns "".
func ClientAddress(r *http.Request) string {
	key, _ := r.Context().Value(clientAddressKey{}).(string)
	return key
}

// clientAddressKey is where the middleware puts a request's client
// address, for ClientAddress.
type clientAddressKey struct{}

// perIDs returns the id of each of c.per for r, "" for an identity r does
// not have. With WithRoute, the route comes first, as identity puts it,
// and '|' after it even for the empty route: "|<name>|<id>", so that no
// id of a further identity is the plan's id of a route named as it is,
// "<route>|<identity>" (or of a request of no route, its identity).
func (c *config) perIDs(r *http.Request) []string {
	r = r.WithContext(context.WithValue(r.Context(), clientAddressKey{}, c.ip.key(r)))
	route := ""
	if c.route != nil {
		route = routeEscaper.Replace(c.route(r)) + "|"
	}
	ids := make([]string, len(c.per))
	for i, p := range c.per {
		if id := p.key(r); id != "" {
			ids[i] = route + p.name + "|" + id
		}
	}
	return ids
}

// identity returns the id r is counted under: the first KeyFunc's non-empty
// answer or the client address, after the route if there is one.
func (c *config) identity(r *http.Request) string {
	id := ""
	for _, fn := range c.keys {
		if id = fn(r); id != "" {
			break
		}
	}
	if id == "" {
		id = c.ip.key(r)
	}
	if c.route == nil {
		return id
	}
	route := c.route(r)
	if route == "" {
		return id
	}
	return routeEscaper.Replace(route) + "|" + id
}

// routeEscaper keeps '|' out of the route, so that "<route>|<identity>"
// splits one way only.
var routeEscaper = strings.NewReplacer("%", "%25", "|", "%7C")
