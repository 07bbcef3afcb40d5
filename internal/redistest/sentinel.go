// Replicas, Sentinels watching a master, and the wait for a promotion.

package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartReplica starts a server (ServerProgram) that replicates master, and
// waits until both report the link between them up and the master lists it
// online. It stops when t ends.
func StartReplica(t TB, master *Server, args ...string) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	r := Start(t, append([]string{"--replicaof", host, port, "--repl-diskless-sync", "no"}, args...)...)
	rc := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer rc.Close()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, MaxRetries: -1})
	defer mc.Close()
	if err := waitFor(func(ctx context.Context) error {
		repl, err := replicationInfo(ctx, rc)
		if err != nil {
			return err
		}
		if repl["master_link_status"] != "up" {
			return fmt.Errorf("%s: link to %s is %q", r.Addr, master.Addr, repl["master_link_status"])
		}
		mrepl, err := replicationInfo(ctx, mc)
		if err != nil {
			return err
		}
		if !onlineReplicas(mrepl)[r.Addr] {
			return fmt.Errorf("%s does not list %s online yet", master.Addr, r.Addr)
		}
		return nil
	}); err != nil {
		t.Fatalf("redistest: replica of %s did not come up: %v", master.Addr, err)
	}
	return r
}

// StartSentinel starts a Redis Sentinel (ServerProgram --sentinel) on a free
// loopback port that monitors master under name, with a quorum of 1 and
// downAfter as its down-after-milliseconds, and waits until it knows of
// want replicas of it, so that a failover finds one to promote. It stops
// when t ends.
func StartSentinel(t TB, name string, master *Server, downAfter time.Duration, want int) *Server {
	t.Helper()
	bin := Require(t, ServerProgram())
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))}
	t.Cleanup(s.Stop)
	host, mport, _ := net.SplitHostPort(master.Addr)
	_, port, _ := net.SplitHostPort(s.Addr)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %s\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 10000\n",
		port, dir, filepath.Join(dir, "sentinel.log"), name, host, mport, name, downAfter.Milliseconds(), name)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s.cmd = exec.Command(bin, conf, "--sentinel")
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("redistest: start sentinel: %v", err)
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer sc.Close()
	if err := waitFor(func(ctx context.Context) error {
		replicas, err := sc.Replicas(ctx, name).Result()
		if err != nil {
			return err
		}
		if len(replicas) < want {
			return fmt.Errorf("sentinel knows %d replicas of %s, want %d", len(replicas), name, want)
		}
		return nil
	}); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
		t.Fatalf("redistest: sentinel on %s did not come up: %v\n%s", s.Addr, err, log)
	}
	return s
}

// WaitMaster polls server until it reports role:master, and returns the
// time it first saw that; it fails t after timeout.
func WaitMaster(t TB, server *Server, timeout time.Duration) time.Time {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: server.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		repl, err := replicationInfo(ctx, c)
		seen := time.Now()
		cancel()
		if err == nil && repl["role"] == "master" {
			return seen
		}
		if seen.After(deadline) {
			t.Fatalf("redistest: %s did not become a master within %v: role %q, %v", server.Addr, timeout, repl["role"], err)
		}
		time.Sleep(pollInterval) // the server is another process: poll it
	}
}
