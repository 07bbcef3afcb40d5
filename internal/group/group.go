// Package group counts goroutines, and tasks that run on a caller's, so
// that one can wait for all of them to end: what a Limiter's Close waits
// for.
package group

import (
	"context"
	"sync"
	"sync/atomic"
)

// Group counts what has started and not ended. Unlike a sync.WaitGroup,
// an Add may come at any time, even while Wait waits: a decision under
// way when its Limiter closes still sends its batch. The zero Group is
// empty and ready.
type Group struct {
	n    atomic.Int64
	mu   sync.Mutex    // guards idle
	idle chan struct{} // closed when n falls to 0; nil when no one waits
}

// Go runs f in a goroutine of its own, counted until it returns.
func (g *Group) Go(f func()) {
	g.n.Add(1)
	go func() {
		defer g.Done()
		f()
	}()
}

// Add counts one more task, which Done ends.
func (g *Group) Add() { g.n.Add(1) }

// Done ends one counted task. It inlines: a Limiter counts every call.
func (g *Group) Done() {
	if g.n.Add(-1) == 0 {
		g.idled()
	}
}

// idled wakes whoever waits for the count to fall to 0, which it just did.
func (g *Group) idled() {
	g.mu.Lock()
	if g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
	g.mu.Unlock()
}

// Busy reports whether something counted runs.
func (g *Group) Busy() bool { return g.n.Load() != 0 }

// Wait returns once nothing counted runs, or ctx's error if ctx is done
// first.
func (g *Group) Wait(ctx context.Context) error {
	for {
		g.mu.Lock()
		if g.n.Load() == 0 {
			g.mu.Unlock()
			return nil
		}
		if g.idle == nil {
			g.idle = make(chan struct{})
		}
		idle := g.idle
		g.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
