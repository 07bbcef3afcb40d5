// Package testredis starts real Redis (or Valkey) servers on loopback for
// the tests of the rls module: one server, or a Redis Cluster of three
// masters. The program is redis-server unless RATELIMIT_REDIS_SERVER names
// another (valkey-server), and redis-cli unless RATELIMIT_REDIS_CLI does.
// Without the program a test skips, saying why, unless
// RATELIMIT_REQUIRE_REDIS=1 (as .ci/run sets it): then it fails.
package testredis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Program returns the server program and the CLI, skipping t (or failing
// it under RATELIMIT_REQUIRE_REDIS=1) when the server is not installed.
func Program(t testing.TB) (server, cli string) {
	t.Helper()
	server, cli = os.Getenv("RATELIMIT_REDIS_SERVER"), os.Getenv("RATELIMIT_REDIS_CLI")
	if server == "" {
		server = "redis-server"
	}
	if cli == "" {
		cli = "redis-cli"
	}
	if _, err := exec.LookPath(server); err != nil {
		if os.Getenv("RATELIMIT_REQUIRE_REDIS") == "1" {
			t.Fatalf("%s is not installed, and RATELIMIT_REQUIRE_REDIS=1", server)
		}
		t.Skipf("%s is not installed: apt-get install redis-server to run this test", server)
	}
	return server, cli
}

// FreePort returns a loopback port nothing listens on now.
//
// It picks below Linux's ephemeral range (32768 and up), where the kernel
// also takes the source ports of outgoing connections: a port freed there
// was seen taken by a connection before the process it was meant for
// could bind it, with many tests at once (the reference then exits with
// "address already in use"). Here only another FreePort can take it. The
// port 10,000 above it, a Cluster node's bus port, is free too, and below
// that range as well (a Cluster node of valkey-server whose bus port fell
// in that range once did not start).
func FreePort(t testing.TB) int {
	t.Helper()
	for range 1000 {
		port := 20000 + rand.IntN(2700)
		if free(port) && free(port+10000) {
			return port
		}
	}
	t.Fatal("no free port between 20000 and 22700 with its bus port free")
	return 0
}

// free reports whether port can be bound on loopback now.
func free(port int) bool {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// Server is a server this package started.
type Server struct {
	Addr string
	cmd  *exec.Cmd
}

// Start starts a server with args on a free port, waits until it answers
// PING, and stops it when t ends.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	program, _ := Program(t)
	port := FreePort(t)
	dir := t.TempDir()
	all := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}, args...)
	cmd := exec.Command(program, all...)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	t.Cleanup(s.Stop)
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s did not answer PING", program, s.Addr)
		}
		time.Sleep(20 * time.Millisecond) // a process starting, not time passing
	}
	return s
}

// Stop kills the server; it may be called again.
func (s *Server) Stop() {
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// StartCluster starts a Redis Cluster of three masters and returns their
// addresses once every node reports cluster_state:ok.
func StartCluster(t testing.TB) []string {
	t.Helper()
	_, cli := Program(t)
	var addrs []string
	for range 3 {
		conf := filepath.Join(t.TempDir(), "nodes.conf")
		s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", conf, "--cluster-node-timeout", "2000")
		addrs = append(addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s --cluster create: %v\n%s", cli, err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster of %v is not ok: %v %v", addrs, info, err)
			}
			time.Sleep(50 * time.Millisecond) // the cluster settling
		}
		_ = c.Close()
	}
	return addrs
}

// StartSentinel starts a Sentinel on a free port that monitors master
// under name, and returns its address once it answers for name's master.
func StartSentinel(t testing.TB, name string, master *Server) string {
	t.Helper()
	program, _ := Program(t)
	port := FreePort(t)
	dir := t.TempDir()
	host, mport, _ := net.SplitHostPort(master.Addr)
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\n", port, dir, name, host, mport)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(program, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	t.Cleanup(s.Stop)
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer sc.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		addr, err := sc.GetMasterAddrByName(context.Background(), name).Result()
		if err == nil && len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == master.Addr {
			return s.Addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Sentinel on %s does not know %s: %v %v", s.Addr, name, addr, err)
		}
		time.Sleep(20 * time.Millisecond) // the Sentinel starting
	}
}
