// Tasks that repeat on timers, counted in a Group while they run, and
// stopped all at once.

package group

import (
	"sync"
	"time"
)

// Repeats holds the tasks started with Every that have not stopped. The
// zero Repeats is ready, and safe for simultaneous use.
type Repeats struct {
	mu     sync.Mutex
	timers map[*Repeat]struct{}
	closed bool
}

// Repeat is one task of Every.
type Repeat struct {
	rs      *Repeats
	g       *Group
	f       func() bool
	every   time.Duration
	next    time.Time // when the next run is due
	timer   *time.Timer
	stopped bool // guarded by rs.mu
}

// Every runs f every every, counted in g while it runs, until f returns
// false, Stop stops it, or Close stops them all. Each run is due every
// after the one before was due, however long that one took (at once if
// that has passed). After Close it starts nothing.
func (rs *Repeats) Every(g *Group, every time.Duration, f func() bool) *Repeat {
	r := &Repeat{rs: rs, g: g, f: f, every: every}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.closed {
		r.stopped = true
		return r
	}
	if rs.timers == nil {
		rs.timers = map[*Repeat]struct{}{}
	}
	rs.timers[r] = struct{}{}
	r.next = time.Now().Add(every)
	r.timer = time.AfterFunc(every, r.run)
	return r
}

// run runs r's task once, counted in its Group, which its owner waits for,
// and arms the next run, unless r stopped.
func (r *Repeat) run() {
	rs := r.rs
	rs.mu.Lock()
	if r.stopped {
		rs.mu.Unlock()
		return
	}
	r.g.Add()
	defer r.g.Done()
	r.next = r.next.Add(r.every)
	rs.mu.Unlock()
	if !r.f() {
		r.Stop()
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !r.stopped {
		r.timer.Reset(max(0, time.Until(r.next)))
	}
}

// Stop ends r: no run starts after it (one under way goes on).
func (r *Repeat) Stop() {
	rs := r.rs
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r.stopped = true
	if r.timer != nil {
		r.timer.Stop()
	}
	delete(rs.timers, r)
}

// Close stops every task, and any started after.
func (rs *Repeats) Close() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.closed = true
	for r := range rs.timers {
		r.stopped = true
		r.timer.Stop()
	}
	rs.timers = nil
}
