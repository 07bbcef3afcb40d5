// Package clock provides a clock that moves only when told to, for tests
// that must place requests at exact milliseconds without waiting.
package clock

import (
	"sync"
	"time"
)

// Fake is a settable clock. Its Now method fits ratelimit.WithClock. A Fake
// is safe for simultaneous use by multiple goroutines.
type Fake struct {
	mu sync.Mutex
	t  time.Time
}

// NewFake returns a Fake that reads t until it is moved.
func NewFake(t time.Time) *Fake { return &Fake{t: t} }

// Now returns the clock's time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

// Set moves the clock to t, forwards or back.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = t
}

// Add moves the clock by d and returns the new time.
func (f *Fake) Add(d time.Duration) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = f.t.Add(d)
	return f.t
}
