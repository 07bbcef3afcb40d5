package httplimit

import (
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/slidingwindow/ratelimit/internal/clientaddr"
)

// UnknownClient is the key of every request whose client address cannot be
// had: a peer that is not an IP address (a Unix socket under the default
// rule), a missing or malformed client-IP header from the edge, or a
// forwarding entry that a trusted proxy wrote and that is not an address.
// All such requests share this one count, so a client cannot escape its
// limit by sending garbage: it can only join everyone else who did. It is
// the same key under which grpclimit counts calls without a usable address.
const UnknownClient = "ip:unknown"

// DefaultIPv6Prefix is how many leading bits of an IPv6 client address
// make its key unless WithIPv6Prefix says otherwise. A /64 is the smallest
// network an ISP hands out, and a host picks any address inside it freely.
const DefaultIPv6Prefix = 64

// Canonical names of the forwarding headers WithTrustedProxies reads.
const (
	headerXFF       = "X-Forwarded-For"
	headerForwarded = "Forwarded"
)

// ipMode is where the client address comes from.
type ipMode int

const (
	fromPeer    ipMode = iota // RemoteAddr only: trusts nothing
	fromHeader                // a single-address header the edge sets
	fromProxies               // X-Forwarded-For or Forwarded, behind trusted proxies
)

// ipRule finds the client address of a request and turns it into a key. Its
// zero value reads RemoteAddr only and groups IPv6 by DefaultIPv6Prefix.
type ipRule struct {
	mode    ipMode
	header  string         // canonical header name (fromHeader, fromProxies)
	trusted []netip.Prefix // proxies (fromProxies) or header senders (fromHeader; none: any)
	v6Bits  int            // 0: DefaultIPv6Prefix
}

// clientAddr returns the client address of r by the rule, or false when
// there is no usable one. It never panics, whatever the headers hold.
func (c *ipRule) clientAddr(r *http.Request) (netip.Addr, bool) {
	peer, peerOK := parseHop(r.RemoteAddr)
	switch c.mode {
	case fromHeader:
		if len(c.trusted) > 0 && !(peerOK && c.isTrusted(peer)) {
			return peer, peerOK
		}
		values := r.Header[c.header]
		if len(values) == 0 {
			return netip.Addr{}, false
		}
		return parseHop(trimOWS(values[len(values)-1]))
	case fromProxies:
		// A peer that is not an IP address is a Unix socket client: a
		// process on this host, as trusted as loopback.
		if peerOK && !c.isTrusted(peer) {
			return peer, true
		}
		return c.walk(r.Header[c.header], peer)
	}
	return peer, peerOK
}

// walk reads the forwarding entries right to left, starting from a trusted
// peer, and returns the first address outside the trusted ranges; if every
// entry is trusted, the left-most (clientaddr.Walk, which grpclimit's
// trusted metadata shares).
func (c *ipRule) walk(values []string, peer netip.Addr) (netip.Addr, bool) {
	parse := parseHop
	if c.header == headerForwarded {
		parse = forwardedFor
	}
	return clientaddr.Walk(values, peer, c.trusted, parse)
}

func (c *ipRule) isTrusted(a netip.Addr) bool { return clientaddr.Contains(c.trusted, a) }

// key returns the identity of r's client: "ip:203.0.113.7" for IPv4,
// "ip6:2001:db8:1:2::/64" for IPv6 (its prefix), or UnknownClient.
func (c *ipRule) key(r *http.Request) string {
	a, ok := c.clientAddr(r)
	if !ok {
		return UnknownClient
	}
	return c.addrKey(a)
}

// addrKey is the key of a usable client address under the rule's IPv6
// grouping: clientaddr.Key, the one rule for HTTP and gRPC.
func (c *ipRule) addrKey(a netip.Addr) string { return clientaddr.Key(a, c.v6Bits) }

// parseHop parses one address as proxies write it: "203.0.113.7",
// "203.0.113.7:4711", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:4711".
// IPv4-mapped IPv6 addresses become IPv4, zones are dropped, and the
// unspecified address is not a client (clientaddr.Parse).
func parseHop(s string) (netip.Addr, bool) { return clientaddr.Parse(s) }

// forwardedFor returns the address in the for= parameter of one element of
// a Forwarded header (RFC 7239), as in `for="[2001:db8::17]:4711";proto=https`.
// Obfuscated identifiers ("_hidden") and "unknown" are not addresses.
func forwardedFor(element string) (netip.Addr, bool) {
	for element != "" {
		var pair string
		if j := strings.IndexByte(element, ';'); j >= 0 {
			pair, element = element[:j], element[j+1:]
		} else {
			pair, element = element, ""
		}
		name, value, ok := strings.Cut(trimOWS(pair), "=")
		if !ok || !strings.EqualFold(trimOWS(name), "for") {
			continue
		}
		value = trimOWS(value)
		if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			value = value[1 : len(value)-1]
		}
		return parseHop(value)
	}
	return netip.Addr{}, false
}

// trimOWS trims HTTP optional white space (spaces and tabs).
func trimOWS(s string) string { return strings.Trim(s, " \t") }

// normalizePrefixes returns ps masked, with IPv4-mapped IPv6 prefixes
// turned into IPv4 ones, so that they match the unmapped addresses the rule
// compares them with; or an error naming the option and an invalid prefix.
func normalizePrefixes(option string, ps []netip.Prefix) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		np, ok := clientaddr.NormalizePrefix(p)
		if !ok {
			return nil, errors.New("httplimit: " + option + " was given an invalid prefix " + strconv.Quote(p.String()))
		}
		out = append(out, np)
	}
	return out, nil
}
