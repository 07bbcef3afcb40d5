package redistest

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Restart starts a new, empty redis-server on the port of s, which must have
// been stopped, with the arguments given, waits until it answers PING, and
// makes s stand for it: s.Stop and the end of the test stop the new process.
// Clients of s reconnect to it as to a server that came back after a crash
// with nothing saved. Call it from the goroutine that owns s.
func (s *Server) Restart(t testing.TB, args ...string) {
	t.Helper()
	if s.cmd.ProcessState == nil {
		t.Fatalf("redistest: Restart of %s, which is still running", s.Addr)
	}
	bin := Require(t, "redis-server")
	_, port, err := net.SplitHostPort(s.Addr)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	dir := t.TempDir()
	argv := append([]string{
		"--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"),
	}, args...)
	cmd := exec.Command(bin, argv...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("restart redis-server: %v", err)
	}
	s.cmd = cmd
	if err := waitFor(func(ctx context.Context) error {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		defer c.Close()
		return c.Ping(ctx).Err()
	}); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
		t.Fatalf("redis-server restarted on %s did not answer: %v\n%s", s.Addr, err, log)
	}
}
