package transport

import (
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"

	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// TestMain silences go-redis's logger (a Redis that goes away makes it log
// every failed dial, lines that would bury a failing test's FAIL lines),
// runs the package's tests, then stops the Redis Cluster they share.
func TestMain(m *testing.M) {
	redis.SetLogger(&logging.VoidLogger{})
	code := m.Run()
	redistest.StopShared()
	os.Exit(code)
}
