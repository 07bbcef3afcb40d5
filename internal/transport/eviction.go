// The one look at each server's eviction policy (ErrEvictionPolicy).

package transport

import (
	"context"
	"fmt"
	"time"
)

// evictionCheckTimeout bounds the look-up, which no decision waits for.
const evictionCheckTimeout = time.Second

// checkEviction looks up srv's memory limit and eviction policy and warns
// if the policy can evict live counts: every key the Limiter writes has a
// TTL, so the volatile-* policies evict them as surely as the allkeys-*.
func (t *Transport) checkEviction(srv *server) {
	ctx, cancel := context.WithTimeout(context.Background(), evictionCheckTimeout)
	defer cancel()
	get := func(ctx context.Context) (map[string]string, error) {
		return srv.client.ConfigGet(ctx, "maxmemory*").Result()
	}
	var cfg map[string]string
	var err error
	if t.ctxAware || t.timed != nil && srv == t.one {
		cfg, err = get(t.routed(ctx)) // bounded by the client, or its socket's deadlines
	} else {
		cfg, err = Watch(ctx, t.work, get)
	}
	if err != nil {
		return // best effort: managed services often disable CONFIG
	}
	policy, limit := cfg["maxmemory-policy"], cfg["maxmemory"]
	if policy == "" || policy == "noeviction" || limit == "" || limit == "0" {
		return
	}
	t.warn(fmt.Errorf("%w: %s has maxmemory %s bytes and maxmemory-policy %s, which deletes live counts under memory pressure, "+
		"and then admits more than the limits allow; use noeviction, or a Redis of its own sized for its clients (docs/failure-modes.md)",
		ErrEvictionPolicy, srv.name, limit, policy))
}
