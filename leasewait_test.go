package ratelimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// askedCtx is a ctx that tells, by closing asked, the first time anyone
// asks for its Done channel: the decision below does so first when it
// waits for its lease's refill.
type askedCtx struct {
	context.Context
	once  sync.Once
	asked chan struct{}
}

func (c *askedCtx) Done() <-chan struct{} {
	c.once.Do(func() { close(c.asked) })
	return c.Context.Done()
}

// A decision that finds its lease short while the refill is in flight
// waits for that refill and is served from what it brings: one script
// call for both, where at cb892fe the second made a call of its own (two).
// On redis-server behind a proxy that holds the refill's reply until the
// second decision waits.
func TestLeaseWaiterServedByRefill(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	var calls scriptCalls
	client := newClient(t, &redis.Options{Addr: proxy.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	client.AddHook(&calls)
	var sources sources
	l := ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(time.Minute), ratelimit.WithObserver(&sources))
	t.Cleanup(func() { ratelimit.DropLeases(l) })
	limit := ratelimit.PerHour(200_000) // leases of up to 10,000
	limit.Leased = true
	ctx := context.Background()
	allow := func(ctx context.Context) {
		t.Helper()
		r, err := l.Allow(ctx, "hot", limit)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	// Grow the lease until a refill leaves units in it, then use them up:
	// the next decision refills, and the one after it finds the lease
	// short with a refill in flight that may serve it.
	for l.Stats().LeasedUnits == 0 {
		allow(ctx)
	}
	for l.Stats().LeasedUnits > 0 {
		allow(ctx)
	}

	before, sent := calls.n.Load(), proxy.Commands("evalsha")
	sources.take()
	proxy.Delay(time.Hour) // the refill's reply waits
	refilled := make(chan struct{})
	go func() { allow(ctx); close(refilled) }()
	require.Eventually(t, func() bool { return proxy.Commands("evalsha") > sent }, 10*time.Second, time.Millisecond, "the refill is on the wire")
	waiter := &askedCtx{Context: ctx, asked: make(chan struct{})}
	waited := make(chan struct{})
	go func() { allow(waiter); close(waited) }()
	<-waiter.asked // it waits for the refill
	proxy.Delay(0)
	<-refilled
	<-waited

	require.Equal(t, before+1, calls.n.Load(), "script calls: the refill's alone")
	require.ElementsMatch(t, []ratelimit.Source{ratelimit.SourceRedis, ratelimit.SourceLease}, sources.take())
}
