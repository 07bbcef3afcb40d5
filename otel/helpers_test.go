package otel_test

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
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// fakeClock is a clock that moves only when told to. Its Now fits
// ratelimit.WithClock; it is safe for simultaneous use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeRedis returns the address of a server that speaks just enough of the
// Redis protocol to send replies no real Redis would: it answers every
// command whose lower-case name is in replies with the raw RESP text given
// for it, and any other with an error. It stops when t ends.
func fakeRedis(t testing.TB, replies map[string]string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() { serveFake(conn, replies) })
		}
	})
	return ln.Addr().String()
}

func serveFake(conn net.Conn, replies map[string]string) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		name, err := readCommand(r)
		if err != nil {
			return
		}
		reply, ok := replies[strings.ToLower(name)]
		if !ok {
			reply = "-ERR unknown command '" + name + "'\r\n"
		}
		if _, err := io.WriteString(conn, reply); err != nil {
			return
		}
	}
}

// readCommand reads one command, an array of bulk strings, and returns its
// name.
func readCommand(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil || n < 1 || n > 1<<20 {
		return "", fmt.Errorf("bad command header %q", line)
	}
	var name string
	for i := range n {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil || size < 0 || size > 1<<28 {
			return "", fmt.Errorf("bad bulk header %q", line)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		if i == 0 {
			name = string(buf[:size])
		}
	}
	return name, nil
}

// startRedisServer starts redis-server (or $RATELIMIT_REDIS_SERVER) with no
// persistence on a free loopback port, waits until it answers, and stops
// it when b ends. Without the program it skips b, unless
// RATELIMIT_REQUIRE_REDIS=1 says the run needs it.
func startRedisServer(b testing.TB) string {
	b.Helper()
	program := os.Getenv("RATELIMIT_REDIS_SERVER")
	if program == "" {
		program = "redis-server"
	}
	bin, err := exec.LookPath(program)
	if err != nil {
		if os.Getenv("RATELIMIT_REQUIRE_REDIS") == "1" {
			b.Fatalf("%v, and RATELIMIT_REQUIRE_REDIS=1 says this run needs it", err)
		}
		b.Skipf("skipping: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	dir := b.TempDir()
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", bin, err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := client.Ping(ctx).Err()
		cancel()
		if err == nil {
			return addr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			b.Fatalf("%s on %s did not answer: %v\n%s", bin, addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
