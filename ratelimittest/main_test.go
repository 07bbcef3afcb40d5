package ratelimittest_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test, or the Example, left a goroutine
// behind: New's cleanup must stop the Limiter, the client and the Redis.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// asTest runs f as a test runs, for an Example, which has no *testing.T: f
// gets a t whose Cleanup functions run, last first, when f returns, and
// whose Errorf and Fatalf print (failing the Example, whose output then
// differs); Fatalf also ends f, as t.FailNow does.
func asTest(f func(t testing.TB)) {
	t := &exampleT{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(t)
	}()
	<-done
	t.mu.Lock()
	cleanups := t.cleanups
	t.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
}

// exampleT is the t of asTest. Its testing.TB is nil: only the methods
// below may be called, which are those New calls.
type exampleT struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

func (t *exampleT) Helper() {}

func (t *exampleT) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *exampleT) Logf(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func (t *exampleT) Errorf(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func (t *exampleT) Fatalf(format string, args ...any) {
	fmt.Printf(format+"\n", args...)
	runtime.Goexit()
}
