package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// FuzzClientIP feeds hostile RemoteAddr and header values to every client-IP
// rule and checks what must hold whatever they are: no panic, a key that is
// never empty and is an address, a prefix or UnknownClient, a key that with
// no proxy trusted depends on RemoteAddr alone, and, behind trusted proxies,
// a key that is the right-most untrusted address and never one left of it.
// A '\n' in a header value splits it into several header lines.
func FuzzClientIP(f *testing.F) {
	f.Add("203.0.113.7:1234", "1.1.1.1, 203.0.113.9", `for="[2001:db8::1]:80"`, "198.51.100.1")
	f.Add("10.0.0.1:80", "1.1.1.1,10.9.9.9,\n203.0.113.7", "for=unknown;proto=https", "")
	f.Add("[fd00::1]:443", "[2001:db8:1:2::3]:4711, , fe80::1%eth0", "For=_hidden, for=10.0.0.2", "::ffff:1.2.3.4")
	f.Add("@", strings.Repeat("10.0.0.3,", 100), `for="1.1.1.1, for=2.2.2.2"`, "\x00\xff")
	f.Fuzz(func(t *testing.T, remoteAddr, xff, forwarded, realIP string) {
		r := &http.Request{RemoteAddr: remoteAddr, Header: http.Header{}}
		lines := func(name, v string) {
			if v != "" {
				r.Header[name] = strings.Split(v, "\n")
			}
		}
		lines(headerXFF, xff)
		lines(headerForwarded, forwarded)
		lines("X-Real-Ip", realIP)
		bare := &http.Request{RemoteAddr: remoteAddr, Header: http.Header{}}

		peerKey := ruleNone.key(bare)
		for _, rule := range []ipRule{ruleNone, ruleXFF, ruleFwd, ruleReal, ruleRealF, {v6Bits: 128}, {v6Bits: 1}} {
			key := rule.key(r)
			checkKey(t, rule, key)
			if rule.mode == fromPeer {
				if want := rule.key(bare); key != want {
					t.Fatalf("no proxy trusted: key %q depends on headers (from RemoteAddr alone: %q)", key, want)
				}
			}
		}

		// Behind trusted proxies: an untrusted peer is the client, whatever
		// it sends; a trusted peer's right-most entry, if it is an address
		// outside the trusted ranges, is the client.
		for _, rule := range []ipRule{ruleXFF, ruleFwd} {
			key := rule.key(r)
			peer, ok := parseHop(remoteAddr)
			if rule.header == headerXFF { // the exported rule is the middleware's
				want := UnknownClient
				if a, ok := ForwardedClient(peer, r.Header.Values(headerXFF), rule.trusted); ok {
					want = ClientKey(a, rule.v6Bits)
				}
				if key != want {
					t.Fatalf("ForwardedClient's key is %q, the middleware's %q", want, key)
				}
			}
			if ok && !rule.isTrusted(peer) {
				if key != peerKey {
					t.Fatalf("untrusted peer %q: key %q, want %q", remoteAddr, key, peerKey)
				}
				continue
			}
			last, ok := rightmost(rule, r.Header.Values(rule.header))
			if ok && !rule.isTrusted(last) {
				if want := ClientKey(last, rule.v6Bits); key != want {
					t.Fatalf("right-most entry %v is untrusted: key %q, want %q", last, key, want)
				}
			}
		}
	})
}

// rightmost returns the last non-empty list entry of values, parsed
// independently of walk, and whether it is an address.
func rightmost(rule ipRule, values []string) (netip.Addr, bool) {
	var entries []string
	for _, v := range values {
		for _, e := range strings.Split(v, ",") {
			if e = strings.Trim(e, " \t"); e != "" {
				entries = append(entries, e)
			}
		}
	}
	if len(entries) == 0 {
		return netip.Addr{}, false
	}
	e := entries[len(entries)-1]
	if rule.header == headerForwarded {
		return forwardedFor(e)
	}
	return parseHop(e)
}

// checkKey fails t unless key is UnknownClient, "ip:" and an IPv4 address
// in canonical form, or "ip6:" and a canonical, masked IPv6 prefix of the
// rule's length.
func checkKey(t *testing.T, rule ipRule, key string) {
	t.Helper()
	switch {
	case key == UnknownClient:
		return
	case strings.HasPrefix(key, "ip:"):
		a, err := netip.ParseAddr(key[len("ip:"):])
		if err != nil || !a.Is4() || a.String() != key[len("ip:"):] || a.IsUnspecified() {
			t.Fatalf("key %q is not ip:<IPv4>", key)
		}
	case strings.HasPrefix(key, "ip6:"):
		p, err := netip.ParsePrefix(key[len("ip6:"):])
		bits := rule.v6Bits
		if bits == 0 {
			bits = 64
		}
		if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Bits() != bits || p != p.Masked() ||
			p.String() != key[len("ip6:"):] || p.Addr().Zone() != "" {
			t.Fatalf("key %q is not ip6:<IPv6 prefix>/%d", key, bits)
		}
	default:
		t.Fatalf("key %q is neither an address, a prefix nor %q", key, UnknownClient)
	}
}
