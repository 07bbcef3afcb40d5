// Package clientaddr turns a client's IP address into the key it is counted
// under, for every face of the limiter that counts clients by address
// (httplimit, grpclimit): the same client gets the same key whichever way it
// came in, and both faces parse, group and trust addresses by one set of
// rules.
//
// IPv4 addresses are keys as they are ("ip:203.0.113.7"). IPv6 addresses
// are grouped by a prefix, /64 unless told otherwise ("ip6:2001:db8::/64"),
// since a host picks any address inside its /64 freely. IPv4-mapped IPv6
// addresses count as IPv4, zones are dropped, and the unspecified address is
// no client. Whatever has no usable address shares the one key Unknown.
package clientaddr

import (
	"net"
	"net/netip"
	"strings"
)

// Unknown is the key of every client whose address cannot be had. All such
// clients share this one count, so that a client cannot escape its limit by
// sending garbage: it can only join everyone else who did.
const Unknown = "ip:unknown"

// DefaultIPv6Prefix is how many leading bits of an IPv6 address make its
// key unless the caller says otherwise.
const DefaultIPv6Prefix = 64

// MaxLen bounds one address as written in a header or metadata value: the
// longest IPv6 address with a port and brackets is 47 bytes; a zone adds a
// little. Longer values are not addresses, and are rejected before any
// parsing.
const MaxLen = 64

// Key returns the key a is counted under: "ip:" and the address for IPv4
// (IPv4-mapped IPv6 included), "ip6:" and its masked prefix of v6Bits bits
// for IPv6 (0 means DefaultIPv6Prefix), or Unknown for an invalid or
// unspecified address or v6Bits outside 0..128. The zone, if any, is
// dropped.
func Key(a netip.Addr, v6Bits int) string {
	a, ok := Normalize(a)
	if !ok {
		return Unknown
	}
	if a.Is4() {
		return "ip:" + a.String()
	}
	if v6Bits == 0 {
		v6Bits = DefaultIPv6Prefix
	}
	p, err := a.Prefix(v6Bits)
	if err != nil { // v6Bits out of range; callers check it first
		return Unknown
	}
	return "ip6:" + p.String()
}

// Normalize returns a as keys and trusted ranges see it: IPv4-mapped IPv6
// unmapped, without its zone. It reports false for an invalid or the
// unspecified address, which is no client.
func Normalize(a netip.Addr) (netip.Addr, bool) {
	a = a.Unmap().WithZone("")
	if !a.IsValid() || a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a, true
}

// Parse parses one address as proxies write it: "203.0.113.7",
// "203.0.113.7:4711", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:4711",
// normalized as by Normalize. It reports false for anything else, and for
// values longer than MaxLen. It never panics.
func Parse(s string) (netip.Addr, bool) {
	if s == "" || len(s) > MaxLen {
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
	return Normalize(a)
}

// FromNetAddr returns the IP address of a connection's peer, normalized as
// by Normalize: from a *net.TCPAddr, *net.UDPAddr or *net.IPAddr, or else by
// parsing its String. It reports false for nil, for a peer that is not an IP
// address (a Unix socket, an in-memory pipe) and for the unspecified
// address.
func FromNetAddr(addr net.Addr) (netip.Addr, bool) {
	switch a := addr.(type) {
	case nil:
		return netip.Addr{}, false
	case *net.TCPAddr:
		if a == nil {
			return netip.Addr{}, false
		}
		return Normalize(a.AddrPort().Addr())
	case *net.UDPAddr:
		if a == nil {
			return netip.Addr{}, false
		}
		return Normalize(a.AddrPort().Addr())
	case *net.IPAddr:
		if a == nil {
			return netip.Addr{}, false
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			return netip.Addr{}, false
		}
		return Normalize(ip.WithZone(a.Zone))
	case *net.UnixAddr:
		return netip.Addr{}, false
	}
	return Parse(addr.String())
}

// NormalizePrefix returns p masked, with an IPv4-mapped IPv6 prefix turned
// into the IPv4 one, so that it matches the unmapped addresses Normalize
// gives; false for an invalid prefix.
func NormalizePrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	if a := p.Addr(); a.Is4In6() {
		p = netip.PrefixFrom(a.Unmap(), max(p.Bits()-96, 0))
	}
	return p.Masked(), true
}

// Contains reports whether a lies in one of prefixes.
func Contains(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Walk finds the client in a forwarding list that trusted proxies append
// to (X-Forwarded-For, or metadata of that shape), given the address of the
// peer, which must be trusted. values are the list's lines in the order
// received; each holds comma-separated entries, and parse reads one entry
// (trimmed of spaces and tabs; empty entries are skipped).
//
// The entries are read right to left. Each was written by the hop to its
// right; while that hop is trusted, the entry is the true address of the
// hop before it. The first address outside trusted is the client. If every
// entry is trusted, the left-most is; with no entry at all, the peer is.
// An entry reached that is not an address reports false: the caller counts
// the request as Unknown.
func Walk(values []string, peer netip.Addr, trusted []netip.Prefix, parse func(string) (netip.Addr, bool)) (netip.Addr, bool) {
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
			entry = strings.Trim(entry, " \t")
			if entry == "" {
				continue // empty list elements are allowed and mean nothing
			}
			var ok bool
			if addr, ok = parse(entry); !ok {
				return netip.Addr{}, false
			}
			if !Contains(trusted, addr) {
				return addr, true
			}
		}
	}
	return addr, addr.IsValid()
}
