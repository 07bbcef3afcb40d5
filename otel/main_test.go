package otel_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test left a goroutine behind, but for the
// library's lease sweeper, which ends by itself a second after the last
// leased decision (TestLeaseSource).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/slidingwindow/ratelimit.(*leaseTable).run"))
}
