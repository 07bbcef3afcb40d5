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
// waits for that refill. When the refill's call fails (here the proxy cuts
// its connection), the decision waiting for it goes to the failure policy
// with that error at once: no call of its own, which would have added its
// own timeout to the wait. At a1b8502 it made that call (two script calls
// here).
func TestLeaseWaiterTakesRefillFailure(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	var calls scriptCalls
	client := newClient(t, &redis.Options{Addr: proxy.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	client.AddHook(&calls)
	l := ratelimit.New(client, ratelimit.WithPrefix(t.Name()), ratelimit.WithTimeout(time.Minute))
	t.Cleanup(func() { ratelimit.DropLeases(l) })
	limit := ratelimit.PerMinute(2000) // leases of up to 100
	limit.Leased = true
	ctx := context.Background()
	allow := func(ctx context.Context) ratelimit.Result {
		t.Helper()
		r, err := l.Allow(ctx, "hot", limit)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		return r
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
	proxy.Delay(time.Hour) // the refill's reply waits
	refilled := make(chan ratelimit.Result, 1)
	go func() { refilled <- allow(ctx) }()
	require.Eventually(t, func() bool { return proxy.Commands("evalsha") > sent }, 10*time.Second, time.Millisecond, "the refill is on the wire")
	waiter := &askedCtx{Context: ctx, asked: make(chan struct{})}
	waited := make(chan ratelimit.Result, 1)
	go func() { waited <- allow(waiter) }()
	<-waiter.asked // it waits for the refill
	proxy.CutAll()

	require.True(t, (<-refilled).Degraded, "the refill's call failed: the failure policy decided")
	require.True(t, (<-waited).Degraded, "so did the decision that waited for it")
	require.Equal(t, before+1, calls.n.Load(), "script calls: the refill's alone")
}
