// The dial errors of a client's servers, to name in a timeout's error.

package transport

import (
	"context"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
)

// dialErrors remembers the last error a client met when dialing each
// Redis address, so that a decision which ran out of time can say why:
// go-redis retries a refused dial in the background (DialerRetries, 5 by
// default) while the command waits, and the command itself only sees its
// deadline. An address's error is forgotten when a dial to it succeeds, so
// that a server serving again is not blamed on its old outage; on a Cluster
// a timeout quotes the dial errors of its own master only.
//
// One recorder serves every Limiter of a client: it is installed as a
// go-redis dial hook once per client, and forgotten when the client is
// garbage collected.
type dialErrors struct {
	last   atomic.Pointer[dialError] // of any address
	byAddr sync.Map                  // address -> *dialError
	nodes  sync.Map                  // weak.Pointer[redis.Client] of a hooked node -> struct{}
}

type dialError struct {
	err  error
	at   time.Time
	addr string
}

// dialMemory is how long a dial error stays worth reporting.
const dialMemory = 10 * time.Second

// recent returns the last dial error to addr, or to any address for an
// empty addr, if it is younger than dialMemory and no dial to that address
// has succeeded since.
func (d *dialErrors) recent(addr string) error {
	if d == nil {
		return nil
	}
	var e *dialError
	if addr == "" {
		e = d.last.Load()
	} else if v, ok := d.byAddr.Load(addr); ok {
		e = v.(*dialError)
	}
	if e == nil || time.Since(e.at) > dialMemory {
		return nil
	}
	return e.err
}

// DialHook records each dial's outcome.
func (d *dialErrors) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			e := &dialError{err: err, at: time.Now(), addr: addr}
			d.last.Store(e)
			d.byAddr.Store(addr, e)
			return conn, err
		}
		if _, ok := d.byAddr.Load(addr); ok {
			d.byAddr.Delete(addr)
		}
		if e := d.last.Load(); e != nil && e.addr == addr {
			d.last.CompareAndSwap(e, nil)
		}
		return conn, err
	}
}

// ProcessHook adds nothing to a command's path.
func (d *dialErrors) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook adds nothing to a pipeline's path.
func (d *dialErrors) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// recorders holds one dialErrors per client, keyed by a weak pointer so
// that it does not keep the client alive.
var recorders sync.Map // weak.Pointer[T] for the client's type T -> *dialErrors

// dialRecorder returns the recorder of client, installing it on first use;
// nil for a client type it cannot hook. A Cluster or Ring client dials
// through the clients of its nodes, whose hooks are their own: the recorder
// goes on each node as go-redis makes it, and on the nodes made before it
// when the transport first routes to them (hookNode).
func dialRecorder(client redis.UniversalClient) *dialErrors {
	switch c := client.(type) {
	case *redis.Client:
		return recorderFor(c, func(d *dialErrors) { c.AddHook(d) })
	case *redis.ClusterClient:
		return recorderFor(c, func(d *dialErrors) { c.OnNewNode(d.hookNode) })
	case *redis.Ring:
		return recorderFor(c, func(d *dialErrors) { c.OnNewNode(d.hookNode) })
	}
	return nil
}

func recorderFor[T any](c *T, install func(*dialErrors)) *dialErrors {
	key := weak.Make(c)
	if d, ok := recorders.Load(key); ok {
		return d.(*dialErrors)
	}
	d := &dialErrors{}
	if actual, loaded := recorders.LoadOrStore(key, d); loaded {
		return actual.(*dialErrors)
	}
	install(d)
	runtime.AddCleanup(c, func(k weak.Pointer[T]) { recorders.Delete(k) }, key)
	return d
}

// hookNode installs d on the client of a Cluster or Ring node, once.
func (d *dialErrors) hookNode(node *redis.Client) {
	if d == nil {
		return
	}
	key := weak.Make(node)
	if _, loaded := d.nodes.LoadOrStore(key, struct{}{}); loaded {
		return
	}
	node.AddHook(d)
	runtime.AddCleanup(node, func(k weak.Pointer[redis.Client]) { d.nodes.Delete(k) }, key)
}
