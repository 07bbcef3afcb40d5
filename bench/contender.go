// Package bench compares github.com/slidingwindow/ratelimit with other Redis
// rate limiters for Go, and with bare EVALSHA calls of the scripts that no
// library can beat, on one redis-server in one run.
//
// It is its own module so that users of the library never download the
// others. The command in cmd/bench runs one contender per process and makes
// the table; run.sh drives it. A Go benchmark (compare_test.go) is another way
// in: REDIS_ADDR=127.0.0.1:6379 go test -bench . ./...
//
// A contender is one entry in the list in contenders.go: a name and a
// constructor returning a Decider.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
)

// Decider makes one rate-limit decision for id, counting it if allowed.
// Implementations must be safe for simultaneous use by multiple goroutines.
// A Decider that also implements io.Closer is closed when the run ends.
type Decider interface {
	Allow(ctx context.Context, id string) (allowed bool, err error)
}

// DeciderFunc adapts a function to the Decider interface.
type DeciderFunc func(ctx context.Context, id string) (bool, error)

// Allow calls f(ctx, id).
func (f DeciderFunc) Allow(ctx context.Context, id string) (bool, error) { return f(ctx, id) }

var _ Decider = DeciderFunc(nil)

// Env is what a contender's constructor is given.
type Env struct {
	// Client is the harness's client, shared by every goroutine of the run
	// and closed by the harness. It is made from Options.
	Client *redis.Client
	// Options are the options Client was made with; a contender that needs
	// a differently configured client makes its own from a copy, and closes it
	// in its Decider's Close.
	Options redis.Options
	// Limit is the limit every decision is made against: Rate requests in any
	// Window. Each contender expresses it in its own terms (a GCRA's burst is
	// Rate, a fixed window is Window long).
	Limit ratelimit.Limit
	// Now is the clock that places requests in windows, for contenders that
	// read the time in Go (those marked Clocked); never nil. The memory
	// measurement moves it by one Window to make each client active in two
	// consecutive windows.
	Now func() time.Time
}

// Contender is one rate limiter under comparison.
type Contender struct {
	// Name is how the command line, the JSON and the table call it.
	Name string
	// About is one line for the table's legend.
	About string
	// Clocked reports whether the contender places requests in windows by
	// Env.Now rather than by the server's clock or not at all.
	Clocked bool
	// Offline reports that the contender never talks to Redis (the no-op
	// that measures the harness itself); its decisions are not checked.
	Offline bool
	// New makes the contender's Decider for env. It may talk to Redis (to
	// load a script, say) before returning.
	New func(ctx context.Context, env Env) (Decider, error)
}

// Lookup returns the registered contender called name.
func Lookup(name string) (Contender, error) {
	for _, c := range Contenders() {
		if c.Name == name {
			return c, nil
		}
	}
	return Contender{}, fmt.Errorf("bench: no contender %q (have: %v)", name, Names())
}

// Names returns the names of the registered contenders, in order.
func Names() []string {
	var names []string
	for _, c := range Contenders() {
		names = append(names, c.Name)
	}
	return names
}

// closeDecider closes d if it is an io.Closer.
func closeDecider(d Decider) error {
	if c, ok := d.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// closers pairs a Decider with what must be closed after it.
type closers struct {
	Decider
	close []io.Closer
}

// Close closes everything, last first, and returns the errors joined.
func (c closers) Close() error {
	var errs []error
	for i := len(c.close) - 1; i >= 0; i-- {
		errs = append(errs, c.close[i].Close())
	}
	return errors.Join(errs...)
}
