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
// grpclimit counts calls without a usable address under the same key.
const UnknownClient = "ip:unknown"

// ClientKey returns the identity the middleware counts a client address
// under: "ip:203.0.113.7" for IPv4 (IPv4-mapped IPv6 included), and for IPv6
// "ip6:" and the prefix of its first ipv6Bits bits, as in
// "ip6:2001:db8:1:2::/64", since a host picks any address in its /64 freely.
// ipv6Bits is what WithIPv6Prefix was given, 0 for its default of 64. The
// zone is dropped; an invalid or unspecified address, or ipv6Bits outside
// 0..128, gives UnknownClient. Use it to Reset or Peek the count of an
// address, as HashedKey for an API key. grpclimit counts calls by the same
// keys, so that one client is one count over HTTP and gRPC alike.
func ClientKey(addr netip.Addr, ipv6Bits int) string {
	a, ok := normalizeAddr(addr)
	if !ok {
		return UnknownClient
	}
	if a.Is4() {
		return "ip:" + a.String()
	}
	if ipv6Bits == 0 {
		ipv6Bits = 64
	}
	p, err := a.Prefix(ipv6Bits)
	if err != nil {
		return UnknownClient
	}
	return "ip6:" + p.String()
}

// ForwardedClient returns the client address of a request that came from
// peer with the X-Forwarded-For values forwarded (its header lines, in the
// order received), believing only the proxies whose addresses lie in
// trusted: the rule of WithTrustedProxies("X-Forwarded-For", trusted...),
// for code that needs the address the middleware counts (a log line, an
// audit), and grpclimit's WithTrustedMetadata.
//
// A peer outside trusted is the client, whatever the list says. Otherwise
// the entries are read right to left, each written by the trusted hop to
// its right: the first address outside trusted is the client, so that
// entries a client wrote itself, left of it, are never read. If every entry
// is trusted, the left-most is the client; with no entry, the peer. An
// invalid peer (a Unix socket) counts as trusted. An entry reached that is
// not an address ("unknown", garbage) reports false, as does an invalid
// peer with no entry: count such a request as UnknownClient. Entries are
// addresses with or without a port, IPv6 in brackets or not; IPv4-mapped
// addresses and prefixes count as IPv4.
func ForwardedClient(peer netip.Addr, forwarded []string, trusted []netip.Prefix) (netip.Addr, bool) {
	peer, _ = normalizeAddr(peer)
	return behindProxies(peer, forwarded, trusted, parseHop)
}

// maxAddrLen bounds one address as written in a header: the longest IPv6
// address with a port and brackets is 47 bytes; a zone adds a little.
// Longer values are not addresses, and are rejected before any parsing.
const maxAddrLen = 64

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
// zero value reads RemoteAddr only and groups IPv6 by /64.
type ipRule struct {
	mode    ipMode
	header  string         // canonical header name (fromHeader, fromProxies)
	trusted []netip.Prefix // normalized: proxies (fromProxies) or header senders (fromHeader; none: any)
	v6Bits  int            // 0: 64
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
		parse := parseHop
		if c.header == headerForwarded {
			parse = forwardedFor
		}
		return behindProxies(peer, r.Header[c.header], c.trusted, parse)
	}
	return peer, peerOK
}

func (c *ipRule) isTrusted(a netip.Addr) bool { return trustedBy(c.trusted, a) }

// key returns the identity of r's client (see ClientKey), or UnknownClient.
func (c *ipRule) key(r *http.Request) string {
	a, ok := c.clientAddr(r)
	if !ok {
		return UnknownClient
	}
	return ClientKey(a, c.v6Bits)
}

// behindProxies is ForwardedClient for a normalized peer (the zero Addr if
// it has no address) and a parser of one entry.
func behindProxies(peer netip.Addr, values []string, trusted []netip.Prefix, parse func(string) (netip.Addr, bool)) (netip.Addr, bool) {
	// A peer that is not an IP address is a Unix socket client: a process
	// on this host, as trusted as loopback.
	if peer.IsValid() && !trustedBy(trusted, peer) {
		return peer, true
	}
	addr := peer
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
			if addr, ok = parse(entry); !ok {
				return netip.Addr{}, false
			}
			if !trustedBy(trusted, addr) {
				return addr, true
			}
		}
	}
	return addr, addr.IsValid()
}

// trustedBy reports whether a, normalized, lies in one of prefixes; an
// IPv4-mapped prefix matches as its IPv4 one.
func trustedBy(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Addr().Is4In6() {
			p, _ = normalizePrefix(p)
		}
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// normalizeAddr returns a as keys and trusted ranges see it: IPv4-mapped
// IPv6 unmapped, without its zone. It reports false, with the zero Addr,
// for an invalid or the unspecified address, which is no client.
func normalizeAddr(a netip.Addr) (netip.Addr, bool) {
	a = a.Unmap().WithZone("")
	if !a.IsValid() || a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a, true
}

// normalizePrefix returns p masked, with an IPv4-mapped IPv6 prefix turned
// into the IPv4 one, so that it matches the unmapped addresses
// normalizeAddr gives; false for an invalid prefix.
func normalizePrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	if a := p.Addr(); a.Is4In6() {
		p = netip.PrefixFrom(a.Unmap(), max(p.Bits()-96, 0))
	}
	return p.Masked(), true
}

// parseHop parses one address as proxies write it: "203.0.113.7",
// "203.0.113.7:4711", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:4711",
// normalized as by normalizeAddr. It reports false for anything else, and
// for values longer than maxAddrLen. It never panics.
func parseHop(s string) (netip.Addr, bool) {
	if s == "" || len(s) > maxAddrLen {
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
	return normalizeAddr(a)
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
		np, ok := normalizePrefix(p)
		if !ok {
			return nil, errors.New("httplimit: " + option + " was given an invalid prefix " + strconv.Quote(p.String()))
		}
		out = append(out, np)
	}
	return out, nil
}
