package transport

import (
	"os"
	"testing"

	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// TestMain runs the package's tests, then stops the Redis Cluster they
// share.
func TestMain(m *testing.M) {
	code := m.Run()
	redistest.StopShared()
	os.Exit(code)
}
