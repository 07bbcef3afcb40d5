package otel_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"go.uber.org/goleak"
)

// TestMain fails the run if a test left a goroutine behind: each test's
// Limiter is closed in its cleanup.
//
// go-redis's logger is silenced: a Redis that goes away makes it log every
// failed dial, lines that would bury a failing test's FAIL lines.
func TestMain(m *testing.M) {
	redis.SetLogger(&logging.VoidLogger{})
	goleak.VerifyTestMain(m)
}
