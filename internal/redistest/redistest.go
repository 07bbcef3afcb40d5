// Package redistest starts real Redis server processes on loopback for tests:
// a single server, a Redis Cluster with or without replicas, a proxy that
// breaks the network at chosen points, a listener that never answers and a
// fake that sends replies no real server would.
// Each server belongs to the test that started it and stops when that test
// ends.
//
// The server program is redis-server unless RATELIMIT_REDIS_SERVER names
// another one, and the CLI that creates clusters is redis-cli unless
// RATELIMIT_REDIS_CLI names another: with
// RATELIMIT_REDIS_SERVER=valkey-server RATELIMIT_REDIS_CLI=valkey-cli the
// same tests run against Valkey. A name without a slash is looked up on the
// PATH.
//
// Without the program, the tests that need it skip with the reason, unless
// RATELIMIT_REQUIRE_REDIS=1 is set (as .ci/run sets it): then they fail, so
// that CI cannot pass by skipping them.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// TB is what the functions here need of a test: a testing.TB has it, and so
// has the stand-in SharedCluster starts its cluster with, whose cleanups
// wait for StopShared.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	TempDir() string
	Cleanup(func())
}

// shared is the cluster SharedCluster starts, once for a test binary.
var shared struct {
	mu    sync.Mutex
	addrs []string
	err   string   // why it could not start, for every later caller
	stops []func() // its cleanups, for StopShared
	dirs  []string // its temporary directories
}

// SharedCluster returns the addresses of a Redis Cluster of 3 masters, with
// no replicas, that every test of the binary calling it shares: started by
// the first caller, stopped by StopShared, which the binary's TestMain calls
// after the tests. Starting a cluster takes seconds; sharing one makes a
// package of many cluster tests fast. A test using it must keep to keys of
// its own (a prefix of its own) and leave the nodes as they are: no FLUSHALL,
// no CONFIG SET, no killing a node (those start a cluster of their own).
func SharedCluster(t TB) []string {
	t.Helper()
	// Without the programs every caller skips, not only the first.
	Require(t, "redis-server")
	Require(t, "redis-cli")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.err != "" {
		t.Fatalf("redistest: the shared cluster did not start: %s", shared.err)
	}
	if shared.addrs == nil {
		st := &sharedTB{t}
		shared.err = "its start failed the test that started it"
		shared.addrs = StartCluster(st, 3)
		shared.err = ""
	}
	return shared.addrs
}

// StopShared stops the cluster SharedCluster started, if it did.
func StopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	for i := len(shared.stops) - 1; i >= 0; i-- {
		shared.stops[i]()
	}
	for _, dir := range shared.dirs {
		_ = os.RemoveAll(dir)
	}
	shared.addrs, shared.stops, shared.dirs = nil, nil, nil
}

// sharedTB is the test that starts the shared cluster, but for its
// cleanups and temporary directories, which outlive it until StopShared.
type sharedTB struct{ TB }

func (s *sharedTB) Cleanup(fn func()) { shared.stops = append(shared.stops, fn) }

func (s *sharedTB) TempDir() string {
	dir, err := os.MkdirTemp("", "redistest-shared-")
	if err != nil {
		s.Fatalf("redistest: %v", err)
	}
	shared.dirs = append(shared.dirs, dir)
	return dir
}

// startTimeout bounds the wait for a server, or a cluster, to come up.
const startTimeout = 20 * time.Second

// ServerProgram returns the server program that Start and the cluster
// functions run: $RATELIMIT_REDIS_SERVER, or redis-server when it is unset
// or empty. Tests name it in their messages.
func ServerProgram() string {
	return programFromEnv("RATELIMIT_REDIS_SERVER", "redis-server")
}

// CLIProgram returns the CLI that creates clusters:
// $RATELIMIT_REDIS_CLI, or redis-cli when it is unset or empty.
func CLIProgram() string {
	return programFromEnv("RATELIMIT_REDIS_CLI", "redis-cli")
}

func programFromEnv(name, def string) string {
	if p := os.Getenv(name); p != "" {
		return p
	}
	return def
}

// Require returns the path of the named program, skipping t with a printed
// reason when it is not installed, or failing t when RATELIMIT_REQUIRE_REDIS=1.
// The names redis-server and redis-cli stand for ServerProgram and
// CLIProgram, so that callers written for Redis run whatever the
// environment chose; any other name is looked up as it is.
func Require(t TB, program string) string {
	t.Helper()
	switch program {
	case "redis-server":
		program = ServerProgram()
	case "redis-cli":
		program = CLIProgram()
	}
	path, err := exec.LookPath(program)
	if err == nil {
		return path
	}
	if os.Getenv("RATELIMIT_REQUIRE_REDIS") == "1" {
		t.Fatalf("%v, and RATELIMIT_REQUIRE_REDIS=1 says this run needs it", err)
	}
	t.Skipf("skipping: %v; apt-get install redis-server redis-tools, or name other programs "+
		"in RATELIMIT_REDIS_SERVER and RATELIMIT_REDIS_CLI; .ci/run installs them", err)
	return ""
}

// Server is a server process (ServerProgram) listening on a loopback port.
type Server struct {
	// Addr is the server's host:port.
	Addr string
	cmd  *exec.Cmd
}

// Start starts ServerProgram with no persistence on a free loopback port,
// waits until it answers PING, and stops it when t ends. Extra arguments
// are passed to the server as they are, say "--cluster-enabled", "yes".
func Start(t TB, args ...string) *Server {
	t.Helper()
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))}
	t.Cleanup(s.Stop) // first, so that a server that never answers is stopped too
	s.launch(t, args)
	return s
}

// launch starts ServerProgram on s.Addr's port and waits until it answers.
func (s *Server) launch(t TB, args []string) {
	t.Helper()
	bin := Require(t, ServerProgram())
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
	s.cmd = exec.Command(bin, argv...)
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	if err := waitFor(func(ctx context.Context) error {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		defer c.Close()
		return c.Ping(ctx).Err()
	}); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
		t.Fatalf("%s on %s did not answer: %v\n%s", bin, s.Addr, err, log)
	}
}

// Stop kills the server with SIGKILL and waits for it to exit: the process
// gets no chance to save, to answer clients or to tell its replicas or its
// cluster, as in a crash or a power loss. It may be called more than once;
// tests call it to simulate an outage.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Kill() // SIGKILL on Unix
	_ = s.cmd.Wait()
}

// PID returns the process id of the server, 0 if it is not running.
func (s *Server) PID() int {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Client returns a client of s that t closes when it ends.
func (s *Server) Client(t TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Silent returns the address of a listener that accepts connections and
// reads from them but never answers: a Redis that hangs.
func Silent(t TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		close(done)
		_ = ln.Close()
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReader(conn)
				go func() { <-done; _ = conn.Close() }()
				for {
					if _, err := r.ReadByte(); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// freePort returns a loopback port that is free, and whose cluster bus port
// (port+10000) is free too.
func freePort(t TB) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		_ = bus.Close()
		return port
	}
	t.Fatal("no free loopback port pair found")
	return 0
}

// waitFor calls probe until it succeeds or startTimeout passes, pausing
// between tries: it waits for another process, not for time to pass.
func waitFor(probe func(context.Context) error) error {
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := probe(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Fake returns the address of a server that speaks just enough of the Redis
// protocol to test a client against replies no real Redis would send: it
// answers every command whose name is in replies with the raw RESP text
// given for it, and every other command with an error.
func Fake(t TB, replies map[string]string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go serveFake(conn, replies)
		}
	}()
	return ln.Addr().String()
}

func serveFake(conn net.Conn, replies map[string]string) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		reply, ok := replies[strings.ToLower(args[0])]
		if !ok {
			reply = "-ERR unknown command '" + args[0] + "'\r\n"
		}
		if _, err := conn.Write([]byte(reply)); err != nil {
			return
		}
	}
}

// readCommand reads one command: an array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil || n < 1 || n > 1<<20 {
		return nil, fmt.Errorf("bad command header %q", line)
	}
	args := make([]string, n)
	for i := range args {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil || size < 0 || size > 1<<28 {
			return nil, fmt.Errorf("bad bulk header %q", line)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}
