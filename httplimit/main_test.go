package httplimit_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/slidingwindow/ratelimit"
)

// TestMain fails the run if a test left a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
