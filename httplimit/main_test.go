package httplimit_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"go.uber.org/goleak"

	"github.com/slidingwindow/ratelimit"
)

// TestMain fails the run if a test left a goroutine behind. go-redis's
// logger is silenced: a Redis that goes away makes it log every failed
// dial, lines that would bury a failing test's FAIL lines.
func TestMain(m *testing.M) {
	redis.SetLogger(&logging.VoidLogger{})
	goleak.VerifyTestMain(m)
}

// public returns what of r a test can write down: its exported fields, not
// what it carries for Limiter.Refund.
func public(rs ...ratelimit.Result) []ratelimit.Result {
	out := make([]ratelimit.Result, len(rs))
	for i, r := range rs {
		out[i] = ratelimit.Result{Allowed: r.Allowed, Count: r.Count, Limit: r.Limit, Remaining: r.Remaining,
			RetryAfter: r.RetryAfter, ResetAfter: r.ResetAfter, Degraded: r.Degraded, Shadowed: r.Shadowed}
	}
	return out
}
