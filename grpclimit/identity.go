package grpclimit

import (
	"context"
	"net"
	"net/netip"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/slidingwindow/ratelimit/httplimit"
)

// identity returns the id a call is counted under: WithKeyFunc's answer if
// it is not empty, or else the client address's key, httplimit.ClientKey's
// (httplimit.UnknownClient for a call without a usable address), so that
// one client is one count over HTTP and gRPC alike.
func (c *config) identity(ctx context.Context, fullMethod string) string {
	if c.keyFunc != nil {
		if id := c.keyFunc(ctx, fullMethod); id != "" {
			return id
		}
	}
	a, ok := c.clientAddr(ctx)
	if !ok {
		return httplimit.UnknownClient
	}
	return httplimit.ClientKey(a, c.v6Bits)
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
