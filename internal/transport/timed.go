// Socket deadlines for a client that does not stop at its ctx deadline
// (go-redis's default): the Limiter's calls go through a copy of the client
// whose read and write timeouts are the Limiter's, so that a call is bounded
// on its caller's goroutine, with no goroutine to watch it.

package transport

import (
	"context"
	"runtime"
	"sync"
	"weak"

	"github.com/redis/go-redis/v9"
)

// routeKey is the key under which a call's context holds the copy of the
// client, with the Limiter's timeouts (Client.WithTimeout), that the
// client's routing hook sends it through: a key, so that the hook finds
// the copy through a context an earlier hook wrapped the call's in (a
// trace's span, say).
type routeKey struct{}

// viaCtx is a call's context that the routing hook sends through a copy.
type viaCtx struct {
	context.Context
	timed *redis.Client
}

// Value is the copy for routeKey, else ctx's.
func (c *viaCtx) Value(key any) any {
	if key == (routeKey{}) {
		return c.timed
	}
	return c.Context.Value(key)
}

// routed returns ctx, the context of one of t's calls, as the routing hook
// of t's client sends it through t.timed; ctx itself when t has no copy,
// or when it is a tickCtx of t's, which knows t.timed. The first routed
// call installs the hook (see routeHook).
func (t *Transport) routed(ctx context.Context) context.Context {
	if t.timed == nil {
		return ctx
	}
	t.hooked.Do(func() { hookRoutes(t.client.(*redis.Client)) })
	if _, ok := ctx.(*tickCtx); ok {
		return ctx
	}
	return &viaCtx{Context: ctx, timed: t.timed}
}

// routeHook sends a command whose context holds a copy of the client
// (routeKey) through that copy: after the hooks added to the client before
// it, which see the Limiter's commands, and in place of those added after,
// which do not. A copy made with Client.WithTimeout has no hooks of its own
// (go-redis v9.23; TestCopiesHaveNoHooks holds it to that, as a copy with
// this hook would send to itself): a command sent to it directly would
// pass none. Every other command goes on as it came.
type routeHook struct{}

func (routeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (routeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if via, _ := ctx.Value(routeKey{}).(*redis.Client); via != nil {
			return via.Process(ctx, cmd)
		}
		return next(ctx, cmd)
	}
}

func (routeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// hooked holds the clients that have the routing hook, weakly: one hook per
// client, whatever the number of its Limiters.
var hooked sync.Map // weak.Pointer[redis.Client] -> struct{}

// hookRoutes installs the routing hook on c, once.
func hookRoutes(c *redis.Client) {
	key := weak.Make(c)
	if _, loaded := hooked.LoadOrStore(key, struct{}{}); loaded {
		return
	}
	c.AddHook(routeHook{})
	runtime.AddCleanup(c, func(k weak.Pointer[redis.Client]) { hooked.Delete(k) }, key)
}
