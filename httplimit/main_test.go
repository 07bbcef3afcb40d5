package httplimit_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test left a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
