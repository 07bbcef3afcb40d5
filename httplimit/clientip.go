package httplimit

import (
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// UnknownClient is the key of every request whose client address cannot be
// had: a peer that is not an IP address (a Unix socket under the default
// rule), a missing or malformed client-IP header from the edge, or a
// forwarding entry that a trusted proxy wrote and that is not an address.
// All such requests share this one count, so a client cannot escape its
// limit by sending garbage: it can only join everyone else who did.
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

// maxHopLen bounds one address as written in a header: the longest IPv6
// address with a port and brackets is 47 bytes; a zone adds a little. Longer
// entries are not addresses, and are rejected before any parsing.
const maxHopLen = 64

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
// peer. Each entry was written by the hop to its right; while that hop is
// trusted, the entry is the true address of the hop before it. The first
// address outside the trusted ranges is the client. If every entry is
// trusted, the left-most is: the request began inside the trusted ranges.
func (c *ipRule) walk(values []string, addr netip.Addr) (netip.Addr, bool) {
	for i := len(values) - 1; i >= 0; i-- {
		rest := values[i]
		for rest != "" {
			var entry string
			if j := strings.LastIndexByte(rest, ','); j >= 0 {
				entry, rest = rest[j+1:], rest[:j]
			} else {
				entry, rest = rest, ""
			}
			entry = trimOWS(entry)
			if entry == "" {
				continue // empty list elements are allowed and mean nothing
			}
			var ok bool
			if c.header == headerForwarded {
				addr, ok = forwardedFor(entry)
			} else {
				addr, ok = parseHop(entry)
			}
			if !ok {
				return netip.Addr{}, false
			}
			if !c.isTrusted(addr) {
				return addr, true
			}
		}
	}
	return addr, addr.IsValid()
}

func (c *ipRule) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// key returns the identity of r's client: "ip:203.0.113.7" for IPv4,
// "ip6:2001:db8:1:2::/64" for IPv6 (its prefix), or UnknownClient.
func (c *ipRule) key(r *http.Request) string {
	a, ok := c.clientAddr(r)
	if !ok {
		return UnknownClient
	}
	return c.addrKey(a)
}

func (c *ipRule) addrKey(a netip.Addr) string {
	if a.Is4() {
		return "ip:" + a.String()
	}
	bits := c.v6Bits
	if bits == 0 {
		bits = DefaultIPv6Prefix
	}
	p, err := a.Prefix(bits)
	if err != nil { // not reachable: a is a valid IPv6 address and 0 < bits <= 128
		return UnknownClient
	}
	return "ip6:" + p.String()
}

// parseHop parses one address as proxies write it: "203.0.113.7",
// "203.0.113.7:4711", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:4711".
// IPv4-mapped IPv6 addresses become IPv4, zones are dropped, and the
// unspecified address is not a client.
func parseHop(s string) (netip.Addr, bool) {
	if s == "" || len(s) > maxHopLen {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, perr := netip.ParseAddrPort(s)
		switch {
		case perr == nil:
			a = ap.Addr()
		case len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']':
			if a, err = netip.ParseAddr(s[1 : len(s)-1]); err != nil || !a.Is6() {
				return netip.Addr{}, false
			}
		default:
			return netip.Addr{}, false
		}
	}
	a = a.Unmap().WithZone("")
	if !a.IsValid() || a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a, true
}

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
		if !p.IsValid() {
			return nil, errors.New("httplimit: " + option + " was given an invalid prefix " + strconv.Quote(p.String()))
		}
		if a := p.Addr(); a.Is4In6() {
			bits := max(p.Bits()-96, 0)
			p = netip.PrefixFrom(a.Unmap(), bits)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
