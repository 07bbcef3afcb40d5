package httplimit

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	private   = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	ruleNone  = ipRule{}
	ruleXFF   = ipRule{mode: fromProxies, header: headerXFF, trusted: private}
	ruleFwd   = ipRule{mode: fromProxies, header: headerForwarded, trusted: private}
	ruleReal  = ipRule{mode: fromHeader, header: "X-Real-Ip"}
	ruleRealF = ipRule{mode: fromHeader, header: "X-Real-Ip", trusted: private}
)

// req builds a request from peer with header lines given as name, value
// pairs; a name may repeat, for a header sent on several lines.
func req(peer string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = peer
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

// TestSpoofing checks that a client's own forwarding headers never choose
// its key: not at all when no proxy is trusted, and never left of the
// right-most untrusted address when some are.
func TestSpoofing(t *testing.T) {
	spoofs := []string{
		"X-Forwarded-For", "1.1.1.1",
		"Forwarded", "for=1.1.1.1",
		"X-Real-IP", "1.1.1.1",
		"CF-Connecting-IP", "1.1.1.1",
		"True-Client-IP", "1.1.1.1",
	}
	huge := strings.Repeat("1.1.1.1, ", 50_000) + "203.0.113.7"
	tests := []struct {
		name string
		rule ipRule
		r    *http.Request
		want string
	}{
		// Nothing trusted: RemoteAddr, whatever the headers say.
		{"no proxy: every header ignored", ruleNone, req("203.0.113.7:1", spoofs...), "ip:203.0.113.7"},
		{"no proxy: IPv6 peer", ruleNone, req("[2001:db8::1]:1", spoofs...), "ip6:2001:db8::/64"},
		{"no proxy: peer without port", ruleNone, req("203.0.113.7", spoofs...), "ip:203.0.113.7"},
		{"no proxy: unix socket", ruleNone, req("@", spoofs...), UnknownClient},
		{"no proxy: empty RemoteAddr", ruleNone, req("", spoofs...), UnknownClient},

		// X-Forwarded-For behind 10.0.0.0/8.
		{"xff: untrusted peer is the client", ruleXFF, req("203.0.113.7:1", spoofs...), "ip:203.0.113.7"},
		{"xff: client prepends a fake", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "1.1.1.1, 203.0.113.7"), "ip:203.0.113.7"},
		{"xff: two proxies", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "1.1.1.1, 203.0.113.7, 10.0.0.2"), "ip:203.0.113.7"},
		{"xff: client fakes a trusted hop", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "1.1.1.1, 10.9.9.9, 203.0.113.7"), "ip:203.0.113.7"},
		{"xff: several lines", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "1.1.1.1", "X-Forwarded-For", "203.0.113.7"), "ip:203.0.113.7"},
		{"xff: the client's line and the proxy's", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "203.0.113.7, 1.1.1.1", "X-Forwarded-For", "198.51.100.2"), "ip:198.51.100.2"},
		{"xff: garbage left of the client", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "<script>, 203.0.113.7"), "ip:203.0.113.7"},
		{"xff: port and spaces", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", " \t203.0.113.7:4711\t "), "ip:203.0.113.7"},
		{"xff: bracketed IPv6 with port", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "[2001:db8:1:2::7]:443"), "ip6:2001:db8:1:2::/64"},
		{"xff: bracketed IPv6", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "[2001:db8:1:2::7]"), "ip6:2001:db8:1:2::/64"},
		{"xff: zone dropped", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "fe80::1%eth0"), "ip6:fe80::/64"},
		{"xff: IPv4-mapped", ruleXFF, req("[::ffff:10.0.0.1]:1", "X-Forwarded-For", "::ffff:203.0.113.7"), "ip:203.0.113.7"},
		{"xff: empty elements", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", ", ,203.0.113.7, ,"), "ip:203.0.113.7"},
		{"xff: Forwarded is not read", ruleXFF, req("10.0.0.1:1", "Forwarded", "for=1.1.1.1", "X-Forwarded-For", "203.0.113.7"), "ip:203.0.113.7"},
		{"xff: every hop trusted", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "10.0.0.5, 10.0.0.2"), "ip:10.0.0.5"},
		{"xff: trusted peer, no header", ruleXFF, req("10.0.0.1:1"), "ip:10.0.0.1"},
		{"xff: a trusted hop wrote garbage", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "203.0.113.7, unknown"), UnknownClient},
		{"xff: unspecified address", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", "0.0.0.0"), UnknownClient},
		{"xff: too long an entry", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", strings.Repeat("0", 70)+"1.2.3.4"), UnknownClient},
		{"xff: unix socket proxy", ruleXFF, req("@", "X-Forwarded-For", "1.1.1.1, 203.0.113.7"), "ip:203.0.113.7"},
		{"xff: unix socket proxy, no header", ruleXFF, req("@"), UnknownClient},
		{"xff: huge header", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", huge), "ip:203.0.113.7"},
		{"xff: huge trusted header", ruleXFF, req("10.0.0.1:1", "X-Forwarded-For", strings.Repeat("10.0.0.3,", 50_000)), "ip:10.0.0.3"},

		// Forwarded (RFC 7239) behind the same ranges.
		{"fwd: untrusted peer", ruleFwd, req("203.0.113.7:1", spoofs...), "ip:203.0.113.7"},
		{"fwd: client prepends a fake", ruleFwd, req("10.0.0.1:1", "Forwarded", `for=1.1.1.1, for=203.0.113.7;proto=https`), "ip:203.0.113.7"},
		{"fwd: quoted IPv6 with port", ruleFwd, req("10.0.0.1:1", "Forwarded", `for="[2001:db8:cafe::17]:4711"`), "ip6:2001:db8:cafe::/64"},
		{"fwd: parameters in any order and case", ruleFwd, req("10.0.0.1:1", "Forwarded", `proto=http;By=10.0.0.1;For=192.0.2.60`), "ip:192.0.2.60"},
		{"fwd: two proxies", ruleFwd, req("10.0.0.1:1", "Forwarded", `for=192.0.2.60, for=10.0.0.2`), "ip:192.0.2.60"},
		{"fwd: quoted comma in a spoof", ruleFwd, req("10.0.0.1:1", "Forwarded", `for="1.1.1.1, for=2.2.2.2", for=192.0.2.60`), "ip:192.0.2.60"},
		{"fwd: unknown", ruleFwd, req("10.0.0.1:1", "Forwarded", `for=unknown`), UnknownClient},
		{"fwd: obfuscated", ruleFwd, req("10.0.0.1:1", "Forwarded", `for=_hidden`), UnknownClient},
		{"fwd: no for", ruleFwd, req("10.0.0.1:1", "Forwarded", `proto=https`), UnknownClient},
		{"fwd: X-Forwarded-For is not read", ruleFwd, req("10.0.0.1:1", "X-Forwarded-For", "1.1.1.1", "Forwarded", "for=192.0.2.60"), "ip:192.0.2.60"},

		// A single-address header set by the edge.
		{"header: believed", ruleReal, req("10.0.0.1:1", "X-Real-IP", "203.0.113.7"), "ip:203.0.113.7"},
		{"header: last line wins", ruleReal, req("10.0.0.1:1", "X-Real-IP", "1.1.1.1", "X-Real-IP", "203.0.113.7"), "ip:203.0.113.7"},
		{"header: missing", ruleReal, req("10.0.0.1:1", "X-Forwarded-For", "203.0.113.7"), UnknownClient},
		{"header: a list", ruleReal, req("10.0.0.1:1", "X-Real-IP", "1.1.1.1, 203.0.113.7"), UnknownClient},
		{"header: garbage", ruleReal, req("10.0.0.1:1", "X-Real-IP", "\x00\xff"), UnknownClient},
		{"header from trusted sender", ruleRealF, req("10.0.0.1:1", "X-Real-IP", "203.0.113.7"), "ip:203.0.113.7"},
		{"header from anyone else is ignored", ruleRealF, req("198.51.100.2:1", spoofs...), "ip:198.51.100.2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.rule.key(tc.r))
		})
	}
}

func TestIPv6Prefix(t *testing.T) {
	tests := []struct {
		bits int
		want string
	}{
		{0, "ip6:2001:db8:aaaa:bbbb::/64"}, // the default
		{48, "ip6:2001:db8:aaaa::/48"},
		{56, "ip6:2001:db8:aaaa:bb00::/56"},
		{128, "ip6:2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff/128"},
	}
	for _, tc := range tests {
		rule := ipRule{v6Bits: tc.bits}
		require.Equal(t, tc.want, rule.key(req("[2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff]:1")), "bits %d", tc.bits)
	}
}

func TestNormalizePrefixes(t *testing.T) {
	got, err := normalizePrefixes("test", []netip.Prefix{
		netip.MustParsePrefix("10.1.2.3/8"),
		netip.MustParsePrefix("::ffff:192.0.2.0/120"),
		netip.MustParsePrefix("2001:db8::1/32"),
	})
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("192.0.2.0/24"),
		netip.MustParsePrefix("2001:db8::/32"),
	}, got)
	// A trusted range written as IPv4-mapped still matches the unmapped peer.
	rule := ipRule{mode: fromProxies, header: headerXFF, trusted: got}
	require.Equal(t, "ip:203.0.113.7", rule.key(req("192.0.2.9:1", "X-Forwarded-For", "203.0.113.7")))
}

// TestClientKey pins the keys of addresses, which grpclimit shares: one
// client is one count over HTTP and gRPC alike.
func TestClientKey(t *testing.T) {
	tests := []struct {
		addr string
		bits int
		want string
	}{
		{"203.0.113.7", 0, "ip:203.0.113.7"},
		{"203.0.113.7", 48, "ip:203.0.113.7"}, // the prefix is for IPv6 only
		{"::ffff:203.0.113.7", 0, "ip:203.0.113.7"},
		{"2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff", 0, "ip6:2001:db8:aaaa:bbbb::/64"},
		{"2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff", 64, "ip6:2001:db8:aaaa:bbbb::/64"},
		{"2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff", 48, "ip6:2001:db8:aaaa::/48"},
		{"2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff", 128, "ip6:2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff/128"},
		{"fe80::1%eth0", 0, "ip6:fe80::/64"},
		{"fe80::1%eth0", 128, "ip6:fe80::1/128"},
		{"0.0.0.0", 0, UnknownClient},
		{"::", 0, UnknownClient},
		{"2001:db8::1", 129, UnknownClient},
		{"2001:db8::1", -1, UnknownClient},
	}
	for _, tc := range tests {
		a := netip.MustParseAddr(tc.addr)
		require.Equal(t, tc.want, ClientKey(a, tc.bits), "%s /%d", tc.addr, tc.bits)
		if tc.bits >= 0 && tc.bits <= 128 {
			rule := ipRule{v6Bits: tc.bits}
			require.Equal(t, tc.want, rule.key(req(netip.AddrPortFrom(a, 1).String())), "the middleware's key of %s /%d", tc.addr, tc.bits)
		}
	}
	require.Equal(t, UnknownClient, ClientKey(netip.Addr{}, 0))
	require.Equal(t, UnknownClient, ruleNone.key(req("@")))
}

func TestParseHop(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" for no address
	}{
		{"203.0.113.7", "203.0.113.7"},
		{"203.0.113.7:4711", "203.0.113.7"},
		{"2001:db8::1", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"[2001:db8::1]:4711", "2001:db8::1"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
		{"[::ffff:203.0.113.7]:1", "203.0.113.7"},
		{"fe80::1%eth0", "fe80::1"},
		{"[203.0.113.7]", ""}, // brackets hold IPv6 only
		{"0.0.0.0", ""},
		{"[::]:80", ""},
		{"", ""},
		{"unknown", ""},
		{"_hidden", ""},
		{" 203.0.113.7", ""}, // the caller trims
		{strings.Repeat("0", maxAddrLen) + "1.2.3.4", ""},
		{"\x00\xff", ""},
	}
	for _, tc := range tests {
		a, ok := parseHop(tc.in)
		if tc.want == "" {
			require.False(t, ok, "%q parsed as %v", tc.in, a)
			continue
		}
		require.True(t, ok, "%q", tc.in)
		require.Equal(t, netip.MustParseAddr(tc.want), a, "%q", tc.in)
	}
}

func TestNormalizePrefix(t *testing.T) {
	tests := []struct{ in, want string }{
		{"10.1.2.3/8", "10.0.0.0/8"},
		{"::ffff:192.0.2.0/120", "192.0.2.0/24"},
		{"::ffff:0.0.0.0/90", "0.0.0.0/0"},
		{"2001:db8::1/32", "2001:db8::/32"},
	}
	for _, tc := range tests {
		got, ok := normalizePrefix(netip.MustParsePrefix(tc.in))
		require.True(t, ok, tc.in)
		require.Equal(t, netip.MustParsePrefix(tc.want), got, tc.in)
	}
	_, ok := normalizePrefix(netip.Prefix{})
	require.False(t, ok)
}

func TestForwardedClient(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	proxy := netip.MustParseAddr("10.0.0.1")
	tests := []struct {
		name    string
		values  []string
		peer    netip.Addr
		trusted []netip.Prefix // nil: trusted
		want    string         // "" for no address
	}{
		{"no list: the peer", nil, proxy, nil, "10.0.0.1"},
		{"no list, no peer", nil, netip.Addr{}, nil, ""},
		{"an untrusted peer, whatever it sends", []string{"203.0.113.7"}, netip.MustParseAddr("198.51.100.1"), nil, "198.51.100.1"},
		{"an untrusted IPv4-mapped peer", []string{"203.0.113.7"}, netip.MustParseAddr("::ffff:198.51.100.1"), nil, "198.51.100.1"},
		{"one entry", []string{"203.0.113.7"}, proxy, nil, "203.0.113.7"},
		{"a peer with no address is trusted", []string{"203.0.113.7"}, netip.Addr{}, nil, "203.0.113.7"},
		{"a fake prepended", []string{"1.1.1.1, 203.0.113.7"}, proxy, nil, "203.0.113.7"},
		{"a trusted hop skipped", []string{"1.1.1.1, 203.0.113.7, 10.0.0.2"}, proxy, nil, "203.0.113.7"},
		{"several lines", []string{"1.1.1.1", "203.0.113.7"}, proxy, nil, "203.0.113.7"},
		{"empty entries", []string{", ,203.0.113.7 , \t,"}, proxy, nil, "203.0.113.7"},
		{"every entry trusted", []string{"10.0.0.5, 10.0.0.2"}, proxy, nil, "10.0.0.5"},
		{"garbage reached", []string{"203.0.113.7, unknown"}, proxy, nil, ""},
		{"garbage not reached", []string{"unknown, 203.0.113.7"}, proxy, nil, "203.0.113.7"},
		{"an IPv4-mapped trusted range", []string{"1.1.1.1, 203.0.113.7, 10.0.0.2"}, proxy,
			[]netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}, "203.0.113.7"},
		{"ports and brackets", []string{"[2001:db8::7]:4711, 10.0.0.2:80"}, proxy, nil, "2001:db8::7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := trusted
			if tc.trusted != nil {
				tr = tc.trusted
			}
			a, ok := ForwardedClient(tc.peer, tc.values, tr)
			if tc.want == "" {
				require.False(t, ok, "got %v", a)
				return
			}
			require.True(t, ok)
			require.Equal(t, netip.MustParseAddr(tc.want), a)
		})
	}
}
