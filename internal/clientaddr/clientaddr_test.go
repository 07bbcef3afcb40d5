package clientaddr

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKey(t *testing.T) {
	tests := []struct {
		addr string
		bits int
		want string
	}{
		{"203.0.113.7", 0, "ip:203.0.113.7"},
		{"203.0.113.7", 48, "ip:203.0.113.7"}, // the prefix is for IPv6 only
		{"::ffff:203.0.113.7", 0, "ip:203.0.113.7"},
		{"2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff", 0, "ip6:2001:db8:aaaa:bbbb::/64"},
		{"2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff", 48, "ip6:2001:db8:aaaa::/48"},
		{"2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff", 128, "ip6:2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff/128"},
		{"fe80::1%eth0", 0, "ip6:fe80::/64"},
		{"fe80::1%eth0", 128, "ip6:fe80::1/128"},
		{"0.0.0.0", 0, Unknown},
		{"::", 0, Unknown},
		{"2001:db8::1", 129, Unknown},
		{"2001:db8::1", -1, Unknown},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, Key(netip.MustParseAddr(tc.addr), tc.bits), "%s /%d", tc.addr, tc.bits)
	}
	require.Equal(t, Unknown, Key(netip.Addr{}, 0))
}

func TestParse(t *testing.T) {
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
		{strings.Repeat("0", MaxLen) + "1.2.3.4", ""},
		{"\x00\xff", ""},
	}
	for _, tc := range tests {
		a, ok := Parse(tc.in)
		if tc.want == "" {
			require.False(t, ok, "%q parsed as %v", tc.in, a)
			continue
		}
		require.True(t, ok, "%q", tc.in)
		require.Equal(t, netip.MustParseAddr(tc.want), a, "%q", tc.in)
	}
}

// strAddr is a net.Addr of a kind FromNetAddr does not know.
type strAddr string

func (a strAddr) Network() string { return "test" }
func (a strAddr) String() string  { return string(a) }

func TestFromNetAddr(t *testing.T) {
	tests := []struct {
		name string
		addr net.Addr
		want string // "" for no address
	}{
		{"tcp4", &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 1}, "203.0.113.7"},
		{"tcp4 in a 16-byte slice", &net.TCPAddr{IP: net.ParseIP("203.0.113.7").To16(), Port: 1}, "203.0.113.7"},
		{"tcp6 with zone", &net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0"}, "fe80::1"},
		{"udp", &net.UDPAddr{IP: net.ParseIP("2001:db8::1")}, "2001:db8::1"},
		{"ip", &net.IPAddr{IP: net.ParseIP("198.51.100.1")}, "198.51.100.1"},
		{"other kind, parsed", strAddr("[2001:db8::2]:80"), "2001:db8::2"},
		{"in-memory pipe", strAddr("bufconn"), ""},
		{"unix socket", &net.UnixAddr{Name: "/run/app.sock", Net: "unix"}, ""},
		{"unspecified", &net.TCPAddr{IP: net.IPv4zero}, ""},
		{"no IP", &net.TCPAddr{}, ""},
		{"bad IP slice", &net.IPAddr{IP: net.IP{1, 2, 3}}, ""},
		{"nil", nil, ""},
		{"nil *TCPAddr", (*net.TCPAddr)(nil), ""},
		{"nil *UDPAddr", (*net.UDPAddr)(nil), ""},
		{"nil *IPAddr", (*net.IPAddr)(nil), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, ok := FromNetAddr(tc.addr)
			if tc.want == "" {
				require.False(t, ok, "got %v", a)
				return
			}
			require.True(t, ok)
			require.Equal(t, netip.MustParseAddr(tc.want), a)
		})
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
		got, ok := NormalizePrefix(netip.MustParsePrefix(tc.in))
		require.True(t, ok, tc.in)
		require.Equal(t, netip.MustParsePrefix(tc.want), got, tc.in)
	}
	_, ok := NormalizePrefix(netip.Prefix{})
	require.False(t, ok)
}

func TestWalk(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	proxy := netip.MustParseAddr("10.0.0.1")
	tests := []struct {
		name   string
		values []string
		peer   netip.Addr
		want   string // "" for no address
	}{
		{"no list: the peer", nil, proxy, "10.0.0.1"},
		{"no list, no peer", nil, netip.Addr{}, ""},
		{"one entry", []string{"203.0.113.7"}, proxy, "203.0.113.7"},
		{"a fake prepended", []string{"1.1.1.1, 203.0.113.7"}, proxy, "203.0.113.7"},
		{"a trusted hop skipped", []string{"1.1.1.1, 203.0.113.7, 10.0.0.2"}, proxy, "203.0.113.7"},
		{"several lines", []string{"1.1.1.1", "203.0.113.7"}, proxy, "203.0.113.7"},
		{"empty entries", []string{", ,203.0.113.7 , \t,"}, proxy, "203.0.113.7"},
		{"every entry trusted", []string{"10.0.0.5, 10.0.0.2"}, proxy, "10.0.0.5"},
		{"garbage reached", []string{"203.0.113.7, unknown"}, proxy, ""},
		{"garbage not reached", []string{"unknown, 203.0.113.7"}, proxy, "203.0.113.7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, ok := Walk(tc.values, tc.peer, trusted, Parse)
			if tc.want == "" {
				require.False(t, ok, "got %v", a)
				return
			}
			require.True(t, ok)
			require.Equal(t, netip.MustParseAddr(tc.want), a)
		})
	}
}
