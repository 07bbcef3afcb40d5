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

// A routed context is the context of a call the client's routing hook
// sends through via, when via is not nil: a copy of the client with the
// Limiter's timeouts (Client.WithTimeout), which shares its connections.
type routed interface {
	via() *redis.Client
}

// viaCtx is a call's context that the routing hook sends through a copy.
type viaCtx struct {
	context.Context
	timed *redis.Client
}

func (c *viaCtx) via() *redis.Client { return c.timed }

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

// routeHook sends a command whose context is routed through that context's
// copy of the client: after the hooks added to the client before it, which
// see the Limiter's commands, and in place of those added after, which do
// not. A copy made with Client.WithTimeout has no hooks of its own
// (go-redis v9.23), so that a command sent to it directly would pass none.
// Every other command goes on as it came.
type routeHook struct{}

func (routeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (routeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if r, ok := ctx.(routed); ok {
			if via := r.via(); via != nil {
				return via.Process(ctx, cmd)
			}
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
