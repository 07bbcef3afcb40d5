package grpclimit

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/slidingwindow/ratelimit/httplimit"
)

var private = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}

// configs are the identity rules the tests and the fuzz test try.
var (
	cfgPeer    = config{}
	cfgXFF     = config{mdKey: "x-forwarded-for", trusted: private}
	cfgRealIP  = config{mdKey: "x-real-ip", trusted: private, v6Bits: 128}
	cfgV6Wide  = config{v6Bits: 1}
	cfgKeyFunc = config{mdKey: "x-forwarded-for", trusted: private, keys: []KeyFunc{func(ctx context.Context, _ string) string {
		v := metadata.ValueFromIncomingContext(ctx, "x-user")
		if len(v) == 0 {
			return ""
		}
		return "user:" + v[0]
	}}}
)

// strAddr is a peer address of a kind fromNetAddr does not know.
type strAddr string

func (a strAddr) Network() string { return "test" }
func (a strAddr) String() string  { return string(a) }

// peerAddr returns the net.Addr of a peer written as "ip:port", "unix:path",
// "none" for no peer at all, or anything else as an address of unknown kind.
func peerAddr(s string) net.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return net.TCPAddrFromAddrPort(ap)
	}
	if path, ok := strings.CutPrefix(s, "unix:"); ok {
		return &net.UnixAddr{Name: path, Net: "unix"}
	}
	return strAddr(s)
}

// callContext returns the context a server handler would see for a call
// from peerStr with metadata md (key, value pairs).
func callContext(peerStr string, md ...string) context.Context {
	ctx := context.Background()
	if peerStr != "none" {
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: peerAddr(peerStr)})
	}
	return metadata.NewIncomingContext(ctx, metadata.Pairs(md...))
}

// unknownClient is httplimit's: one client without an address is one
// count over HTTP and gRPC alike.
const unknownClient = httplimit.UnknownClient

// TestSharedKeys checks that a call's key is the one httplimit gives its
// address, whatever the prefix length.
func TestSharedKeys(t *testing.T) {
	for _, peer := range []string{"203.0.113.7", "::ffff:203.0.113.7", "2001:db8:1:2::7", "fe80::1%eth0"} {
		for _, bits := range []int{0, 48, 128} {
			a := netip.MustParseAddr(peer)
			cfg := config{v6Bits: bits}
			ctx := callContext(netip.AddrPortFrom(a, 1).String())
			require.Equal(t, httplimit.ClientKey(a, bits), cfg.identity(ctx, "/test.Echo/A"), "%s /%d", peer, bits)
		}
	}
}

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
		{"ip with zone", &net.IPAddr{IP: net.ParseIP("fe80::2"), Zone: "eth0"}, "fe80::2"},
		{"other kind, parsed", strAddr("[2001:db8::2]:80"), "2001:db8::2"},
		{"other kind, no port", strAddr("::ffff:198.51.100.3"), "198.51.100.3"},
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
			a, ok := fromNetAddr(tc.addr)
			if tc.want == "" {
				require.False(t, ok, "got %v", a)
				return
			}
			require.True(t, ok)
			require.Equal(t, netip.MustParseAddr(tc.want), a)
		})
	}
}

func TestIdentity(t *testing.T) {
	spoofs := []string{"x-forwarded-for", "1.1.1.1", "x-real-ip", "1.1.1.1", "x-user", "mallory"}
	tests := []struct {
		name string
		cfg  config
		ctx  context.Context
		want string
	}{
		{"peer: IPv4", cfgPeer, callContext("203.0.113.7:1", spoofs...), "ip:203.0.113.7"},
		{"peer: IPv6 by /64", cfgPeer, callContext("[2001:db8:1:2::7]:1", spoofs...), "ip6:2001:db8:1:2::/64"},
		{"peer: IPv6 by /1", cfgV6Wide, callContext("[2001:db8:1:2::7]:1"), "ip6:::/1"},
		{"peer: IPv4-mapped", cfgPeer, callContext("[::ffff:203.0.113.7]:1"), "ip:203.0.113.7"},
		{"peer: zone dropped", cfgPeer, callContext("[fe80::1%eth0]:1"), "ip6:fe80::/64"},
		{"peer: unix socket", cfgPeer, callContext("unix:/run/app.sock", spoofs...), unknownClient},
		{"peer: in-memory", cfgPeer, callContext("bufconn", spoofs...), unknownClient},
		{"peer: none", cfgPeer, callContext("none", spoofs...), unknownClient},
		{"peer: unspecified", cfgPeer, callContext("0.0.0.0:1"), unknownClient},

		{"xff: untrusted peer", cfgXFF, callContext("203.0.113.7:1", spoofs...), "ip:203.0.113.7"},
		{"xff: untrusted in-memory peer", cfgXFF, callContext("bufconn", spoofs...), unknownClient},
		{"xff: no peer", cfgXFF, callContext("none", spoofs...), unknownClient},
		{"xff: trusted peer", cfgXFF, callContext("10.0.0.1:1", "x-forwarded-for", "203.0.113.9"), "ip:203.0.113.9"},
		{"xff: client prepends a fake", cfgXFF, callContext("10.0.0.1:1", "x-forwarded-for", "1.1.1.1, 203.0.113.9"), "ip:203.0.113.9"},
		{"xff: two proxies", cfgXFF, callContext("10.0.0.1:1", "x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.0.0.2"), "ip:203.0.113.9"},
		{"xff: several values", cfgXFF, callContext("10.0.0.1:1", "x-forwarded-for", "1.1.1.1", "x-forwarded-for", "203.0.113.9"), "ip:203.0.113.9"},
		{"xff: IPv6 client", cfgXFF, callContext("[fd00::1]:1", "x-forwarded-for", "[2001:db8:1:2::7]:443"), "ip6:2001:db8:1:2::/64"},
		{"xff: every hop trusted", cfgXFF, callContext("10.0.0.1:1", "x-forwarded-for", "10.0.0.5, 10.0.0.2"), "ip:10.0.0.5"},
		{"xff: trusted peer, no value", cfgXFF, callContext("10.0.0.1:1"), "ip:10.0.0.1"},
		{"xff: garbage reached", cfgXFF, callContext("10.0.0.1:1", "x-forwarded-for", "203.0.113.9, unknown"), unknownClient},
		{"xff: unix socket proxy", cfgXFF, callContext("unix:/run/envoy.sock", "x-forwarded-for", "1.1.1.1, 203.0.113.9"), "ip:203.0.113.9"},
		{"xff: unix socket proxy, no value", cfgXFF, callContext("unix:/run/envoy.sock"), unknownClient},
		{"xff: other key not read", cfgXFF, callContext("10.0.0.1:1", "x-real-ip", "203.0.113.9"), "ip:10.0.0.1"},

		{"real-ip: trusted, /128", cfgRealIP, callContext("10.0.0.1:1", "x-real-ip", "2001:db8::9"), "ip6:2001:db8::9/128"},
		{"real-ip: untrusted", cfgRealIP, callContext("198.51.100.2:1", spoofs...), "ip:198.51.100.2"},

		{"key func: authenticated", cfgKeyFunc, callContext("203.0.113.7:1", "x-user", "alice"), "user:alice"},
		{"key func: empty falls back", cfgKeyFunc, callContext("10.0.0.1:1", "x-forwarded-for", "203.0.113.9"), "ip:203.0.113.9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.cfg.identity(tc.ctx, "/test.Echo/A"))
		})
	}
}

// FuzzIdentity feeds hostile peers and metadata values to every identity
// rule and checks what must hold whatever they are: no panic, a key that is
// never empty and is an address, a prefix or unknownClient (when no key
// function answers), a key that without trusted metadata, or from a peer
// outside the trusted ranges, depends on the peer alone, and, from a
// trusted peer, the right-most untrusted entry. A '\n' in a value splits it
// into several values of the key.
func FuzzIdentity(f *testing.F) {
	f.Add("203.0.113.7:1234", "1.1.1.1, 203.0.113.9", "198.51.100.1", "")
	f.Add("10.0.0.1:80", "1.1.1.1,10.9.9.9,\n203.0.113.7", "garbage", "alice")
	f.Add("[fd00::1]:443", "[2001:db8:1:2::3]:4711, , fe80::1%eth0", "::ffff:1.2.3.4", "")
	f.Add("unix:/run/envoy.sock", strings.Repeat("10.0.0.3,", 100), "\x00\xff", "")
	f.Add("bufconn", "203.0.113.9", "203.0.113.9", "bob")
	f.Add("none", "203.0.113.9", "", "")
	f.Fuzz(func(t *testing.T, peerStr, xff, realIP, user string) {
		var md []string
		add := func(key, v string) {
			if v == "" {
				return
			}
			for _, line := range strings.Split(v, "\n") {
				md = append(md, key, line)
			}
		}
		add("x-forwarded-for", xff)
		add("x-real-ip", realIP)
		add("x-user", user)
		ctx := callContext(peerStr, md...)
		bare := callContext(peerStr)
		peerKey := cfgPeer.identity(bare, "")

		for _, cfg := range []config{cfgPeer, cfgXFF, cfgRealIP, cfgV6Wide, cfgKeyFunc} {
			key := cfg.identity(ctx, "/test.Echo/A")
			if key == "" {
				t.Fatal("empty key")
			}
			if len(cfg.keys) > 0 && key == "user:"+firstLine(user) && user != "" {
				continue // the key function answered
			}
			checkKey(t, cfg, key)
			if want := cfg.identity(bare, ""); cfg.mdKey == "" && key != want {
				t.Fatalf("no trusted metadata: key %q depends on metadata (from the peer alone: %q)", key, want)
			}
			if cfg.mdKey == "" {
				continue
			}
			p, ok := peer.FromContext(ctx)
			if !ok {
				if key != unknownClient {
					t.Fatalf("no peer: key %q, want %q", key, unknownClient)
				}
				continue
			}
			a, isIP := fromNetAddr(p.Addr)
			_, isUnix := p.Addr.(*net.UnixAddr)
			trusted := isIP && contains(cfg.trusted, a) || !isIP && isUnix
			if !trusted {
				if want := cfg.identity(bare, ""); key != want {
					t.Fatalf("untrusted peer %q: key %q depends on metadata (from the peer alone: %q)", peerStr, key, want)
				}
				if cfg.v6Bits == 0 && key != peerKey {
					t.Fatalf("untrusted peer %q: key %q, want %q", peerStr, key, peerKey)
				}
				continue
			}
			values := metadata.ValueFromIncomingContext(ctx, cfg.mdKey)
			if last, ok := rightmost(values); ok && !contains(cfg.trusted, last) {
				if want := httplimit.ClientKey(last, cfg.v6Bits); key != want {
					t.Fatalf("right-most entry %v is untrusted: key %q, want %q", last, key, want)
				}
			}
		}
	})
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// rightmost returns the last non-empty entry of values, parsed apart from
// httplimit.ForwardedClient, and whether it is an address.
func rightmost(values []string) (netip.Addr, bool) {
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
	if len(e) > 64 {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(e)
	if err != nil {
		ap, perr := netip.ParseAddrPort(e)
		if perr != nil {
			if len(e) < 3 || e[0] != '[' || e[len(e)-1] != ']' {
				return netip.Addr{}, false
			}
			if a, err = netip.ParseAddr(e[1 : len(e)-1]); err != nil || !a.Is6() {
				return netip.Addr{}, false
			}
		} else {
			a = ap.Addr()
		}
	}
	a = a.Unmap().WithZone("")
	return a, a.IsValid() && !a.IsUnspecified()
}

// contains reports whether a lies in one of prefixes.
func contains(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// checkKey fails t unless key is unknownClient, "ip:" and an IPv4 address
// in canonical form, or "ip6:" and a canonical, masked IPv6 prefix of the
// config's length.
func checkKey(t *testing.T, cfg config, key string) {
	t.Helper()
	switch {
	case key == unknownClient:
		return
	case strings.HasPrefix(key, "ip:"):
		a, err := netip.ParseAddr(key[len("ip:"):])
		if err != nil || !a.Is4() || a.String() != key[len("ip:"):] || a.IsUnspecified() {
			t.Fatalf("key %q is not ip:<IPv4>", key)
		}
	case strings.HasPrefix(key, "ip6:"):
		p, err := netip.ParsePrefix(key[len("ip6:"):])
		bits := cfg.v6Bits
		if bits == 0 {
			bits = 64
		}
		if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Bits() != bits || p != p.Masked() ||
			p.String() != key[len("ip6:"):] || p.Addr().Zone() != "" {
			t.Fatalf("key %q is not ip6:<IPv6 prefix>/%d", key, bits)
		}
	default:
		t.Fatalf("key %q is neither an address, a prefix nor %q", key, unknownClient)
	}
}
