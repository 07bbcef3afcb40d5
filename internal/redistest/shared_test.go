package redistest

import (
	"fmt"
	"runtime"
	"testing"
)

// skipTB records how a call ended: a skip or a failure stops its
// goroutine, as the testing package's do.
type skipTB struct {
	TB
	skipped, failed string
}

func (s *skipTB) Skipf(format string, args ...any) {
	s.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (s *skipTB) Fatalf(format string, args ...any) {
	s.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (s *skipTB) Fatal(args ...any) { s.Fatalf("%s", fmt.Sprint(args...)) }

func (s *skipTB) Helper() {}

// Without a server program, every test that asks for the shared cluster
// skips, not only the first: go test ./... passes on a machine without
// Redis.
func TestSharedClusterSkipsWithoutServer(t *testing.T) {
	t.Setenv("RATELIMIT_REDIS_SERVER", "no-such-redis-server")
	t.Setenv("RATELIMIT_REQUIRE_REDIS", "")
	for call := range 3 {
		tb := &skipTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			SharedCluster(tb)
		}()
		<-done
		if tb.failed != "" || tb.skipped == "" {
			t.Fatalf("call %d: failed %q, skipped %q; want a skip", call+1, tb.failed, tb.skipped)
		}
	}
}
