package grpclimit

import (
	"context"
	"net"
	"net/netip"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/slidingwindow/ratelimit/internal/clientaddr"
)

// UnknownClient is the key of every call whose client address cannot be
// had: no peer, a peer that is not an IP address (an in-memory or Unix
// socket connection), or, under WithTrustedMetadata, an entry that a
// trusted proxy wrote and that is not an address. All such calls share
// this one count, so a client cannot escape its limit by sending garbage.
// It is httplimit.UnknownClient: one client without an address is one
// count over HTTP and gRPC alike.
const UnknownClient = "ip:unknown"

// DefaultIPv6Prefix is how many leading bits of an IPv6 client address
// make its key unless WithIPv6Prefix says otherwise, as in httplimit: a /64
// is the smallest network an ISP hands out, and a host picks any address
// inside it freely.
const DefaultIPv6Prefix = 64

// identity returns the id a call is counted under: WithKeyFunc's answer if
// it is not empty, or else the client address's key.
func (c *config) identity(ctx context.Context, fullMethod string) string {
	if c.keyFunc != nil {
		if id := c.keyFunc(ctx, fullMethod); id != "" {
			return id
		}
	}
	a, ok := c.clientAddr(ctx)
	if !ok {
		return UnknownClient
	}
	return clientaddr.Key(a, c.v6Bits)
}

// clientAddr returns the call's client address: the peer's, or, from a
// trusted peer under WithTrustedMetadata, the one the trusted metadata
// names. It never panics, whatever the metadata holds.
func (c *config) clientAddr(ctx context.Context) (netip.Addr, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p == nil {
		return netip.Addr{}, false
	}
	a, ok := clientaddr.FromNetAddr(p.Addr)
	if c.mdKey == "" {
		return a, ok
	}
	if ok && !clientaddr.Contains(c.trusted, a) {
		return a, true
	}
	if !ok {
		// A Unix socket peer is a process on this host, as trusted as
		// loopback (a sidecar proxy); any other peer without an address is
		// no one to believe.
		if _, unix := p.Addr.(*net.UnixAddr); !unix {
			return netip.Addr{}, false
		}
	}
	return clientaddr.Walk(metadata.ValueFromIncomingContext(ctx, c.mdKey), a, c.trusted, clientaddr.Parse)
}
