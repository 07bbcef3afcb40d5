package rls

import (
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

// TestMain silences go-redis's logger: a Redis that goes away makes it log
// every failed dial, lines that would bury a failing test's FAIL lines.
func TestMain(m *testing.M) {
	redis.SetLogger(&logging.VoidLogger{})
	os.Exit(m.Run())
}
