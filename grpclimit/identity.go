package grpclimit

import (
	"context"
	"net"
	"net/netip"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/slidingwindow/ratelimit/httplimit"
)

// UnknownClient is the key of every call whose client address cannot be
// had: a peer that is not an IP address, or a trusted metadata entry that
// is not an address. All such calls share this one count, so that a client
// cannot escape its limit by sending garbage. It is httplimit's
// UnknownClient, so that one client is one count over HTTP and gRPC alike.
const UnknownClient = httplimit.UnknownClient

// ClientKey returns the identity the interceptors count a client address
// under: "ip:203.0.113.7" for IPv4, and for IPv6 "ip6:" and the prefix of
// its first ipv6Bits bits ("ip6:2001:db8:1:2::/64"); ipv6Bits is what
// WithIPv6Prefix was given, 0 for its default of 64. An invalid or
// unspecified address, or ipv6Bits outside 0..128, gives UnknownClient. Use
// it to Reset or Peek the count of an address. It is httplimit.ClientKey,
// here so that a gRPC server need not import httplimit: the two packages
// count one client under one key.
func ClientKey(addr netip.Addr, ipv6Bits int) string { return httplimit.ClientKey(addr, ipv6Bits) }

// ClientAddress is the KeyFunc of a call's client address as the
// interceptor computes it, from the peer or the metadata it trusts
// (WithTrustedMetadata), IPv6 addresses grouped by WithIPv6Prefix: the
// identity ClientKey gives (UnknownClient without a usable address). It is
// for WithLimitsPer, whose limits it counts per address beside the plan's
// own identity, as httplimit.ClientAddress is; the interceptor hands the
// address to it, and outside the interceptor it returns "".
func ClientAddress(ctx context.Context, _ string) string {
	key, _ := ctx.Value(clientAddressKey{}).(string)
	return key
}

// clientAddressKey is where the interceptor puts a call's client address,
// for ClientAddress.
type clientAddressKey struct{}

// perIDs returns the id of each of c.per for a call, "" for an identity it
// does not have; prefix (the method and '|', for a method counted apart)
// comes first.
func (c *config) perIDs(ctx context.Context, fullMethod, prefix string) []string {
	addr := UnknownClient
	if a, ok := c.clientAddr(ctx); ok {
		addr = ClientKey(a, c.v6Bits)
	}
	ctx = context.WithValue(ctx, clientAddressKey{}, addr)
	ids := make([]string, len(c.per))
	for i, p := range c.per {
		if id := p.key(ctx, fullMethod); id != "" {
			ids[i] = prefix + p.name + "|" + id
		}
	}
	return ids
}

// identity returns the id a call is counted under: the first KeyFunc's
// answer that is not empty, or else the client address's key, ClientKey's
// (UnknownClient for a call without a usable address), so that one client
// is one count over HTTP and gRPC alike.
func (c *config) identity(ctx context.Context, fullMethod string) string {
	for _, fn := range c.keys {
		if id := fn(ctx, fullMethod); id != "" {
			return id
		}
	}
	a, ok := c.clientAddr(ctx)
	if !ok {
		return UnknownClient
	}
	return ClientKey(a, c.v6Bits)
}

// clientAddr returns the call's client address: the peer's, or, from a
// trusted peer under WithTrustedMetadata, the one the trusted metadata
// names, read as httplimit.ForwardedClient reads X-Forwarded-For. It never
// panics, whatever the metadata holds.
func (c *config) clientAddr(ctx context.Context) (netip.Addr, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p == nil {
		return netip.Addr{}, false
	}
	a, ok := fromNetAddr(p.Addr)
	if c.mdKey == "" {
		return a, ok
	}
	if !ok {
		// A Unix socket peer is a process on this host, as trusted as
		// loopback (a sidecar proxy); any other peer without an address is
		// no one to believe.
		if _, unix := p.Addr.(*net.UnixAddr); !unix {
			return netip.Addr{}, false
		}
	}
	return httplimit.ForwardedClient(a, metadata.ValueFromIncomingContext(ctx, c.mdKey), c.trusted)
}

// fromNetAddr returns the IP address of a connection's peer, IPv4-mapped
// IPv6 unmapped and without its zone: from a *net.TCPAddr, *net.UDPAddr or
// *net.IPAddr, or else by parsing its String. It reports false, with the
// zero Addr, for nil, for a peer that is not an IP address (a Unix socket,
// an in-memory pipe) and for the unspecified address.
func fromNetAddr(addr net.Addr) (netip.Addr, bool) {
	var a netip.Addr
	switch na := addr.(type) {
	case nil, *net.UnixAddr:
		return netip.Addr{}, false
	case *net.TCPAddr:
		if na == nil {
			return netip.Addr{}, false
		}
		a = na.AddrPort().Addr()
	case *net.UDPAddr:
		if na == nil {
			return netip.Addr{}, false
		}
		a = na.AddrPort().Addr()
	case *net.IPAddr:
		if na == nil {
			return netip.Addr{}, false
		}
		a, _ = netip.AddrFromSlice(na.IP)
	default:
		s := addr.String()
		if ap, err := netip.ParseAddrPort(s); err == nil {
			a = ap.Addr()
		} else {
			a, _ = netip.ParseAddr(s)
		}
	}
	a = a.Unmap().WithZone("")
	if !a.IsValid() || a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a, true
}
