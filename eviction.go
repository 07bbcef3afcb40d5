package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrEvictionPolicy is wrapped by a warning the error handler gets, with an
// empty id, when the Limiter reads that a Redis server it uses has a memory
// limit and a maxmemory-policy other than noeviction: under memory pressure
// such a server deletes live counts, silently, and the limits they held
// then admit more than their rates. Decisions go on as usual. The Limiter
// looks the policy up with CONFIG GET after its first successful call to
// each server it knows by address: each master of a Redis Cluster, the one
// server of a *redis.Client (of a failover client, the master at that
// first call; of a Ring, one shard). Where CONFIG is disabled or not
// granted it says nothing.
var ErrEvictionPolicy = errors.New("ratelimit: Redis may evict live counts")

// evictionCheckTimeout bounds the look-up, which no decision waits for.
const evictionCheckTimeout = time.Second

// checkEviction looks up srv's memory limit and eviction policy and warns
// if the policy can evict live counts: every key the Limiter writes has a
// TTL, so the volatile-* policies evict them as surely as the allkeys-*.
func (t *transport) checkEviction(srv *server) {
	ctx, cancel := context.WithTimeout(context.Background(), evictionCheckTimeout)
	defer cancel()
	get := func(ctx context.Context) (map[string]string, error) {
		return srv.client.ConfigGet(ctx, "maxmemory*").Result()
	}
	var cfg map[string]string
	var err error
	if t.ctxAware {
		cfg, err = get(ctx)
	} else {
		cfg, err = watch(ctx, get)
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
