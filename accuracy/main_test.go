package main

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"go.uber.org/goleak"
)

// TestMain fails the run if a test left a goroutine behind (the leased
// replays close their Limiters, which ends their lease sweepers).
//
// go-redis's logger is silenced: a Redis that goes away makes it log every
// failed dial, lines that would bury a failing test's FAIL lines.
func TestMain(m *testing.M) {
	redis.SetLogger(&logging.VoidLogger{})
	goleak.VerifyTestMain(m)
}
