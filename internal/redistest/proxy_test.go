package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Each value is read whole, and only it: the byte after it is left.
func TestReadValue(t *testing.T) {
	for _, v := range []string{
		"+OK\r\n", "-ERR no\r\n", ":-12\r\n", "$3\r\nfoo\r\n", "$0\r\n\r\n", "$-1\r\n", "*-1\r\n",
		"$4\r\na\r\nb\r\n", // CRLF inside a bulk string
		"*3\r\n:1\r\n:0\r\n:0\r\n",
		"*2\r\n*1\r\n$1\r\nx\r\n*0\r\n",
		"_\r\n", "#t\r\n", ",3.14\r\n", ",inf\r\n", "(3492890328409238509324850943850943825024385\r\n",
		"!21\r\nSYNTAX invalid syntax\r\n", "=15\r\ntxt:Some string\r\n",
		"%2\r\n+first\r\n:1\r\n+second\r\n*2\r\n:2\r\n:3\r\n",
		"~2\r\n+a\r\n+b\r\n",
		"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n*2\r\n:2039123\r\n:9543892\r\n",
		">3\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n_\r\n",
	} {
		var buf bytes.Buffer
		r := bufio.NewReader(strings.NewReader(v + ":7\r\n"))
		push, err := readValue(r, &buf, 0)
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if buf.String() != v {
			t.Fatalf("read %q, want %q", buf.String(), v)
		}
		if want := v[0] == '>'; push != want {
			t.Fatalf("%q: push %v, want %v", v, push, want)
		}
		rest, _ := io.ReadAll(r)
		if string(rest) != ":7\r\n" {
			t.Fatalf("%q: left %q", v, rest)
		}
	}
	for _, bad := range []string{"?x\r\n", "$x\r\n", "*99999999999\r\n", "$5\r\nab", "\r\n"} {
		var buf bytes.Buffer
		if _, err := readValue(bufio.NewReader(strings.NewReader(bad)), &buf, 0); err == nil {
			t.Fatalf("%q: no error", bad)
		}
	}
}

func TestProxy(t *testing.T) {
	s := Start(t)
	p := StartProxy(t, s.Addr)
	ctx := context.Background()
	direct := s.Client(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := p.Commands("set"); got != 1 {
		t.Fatalf("forwarded %d SETs, want 1", got)
	}

	t.Run("DropNextReply", func(t *testing.T) {
		p.DropNextReply("INCR")
		err := c.Incr(ctx, "n").Err()
		if !errors.Is(err, io.EOF) {
			t.Fatalf("INCR with its reply lost: %v, want EOF", err)
		}
		if n, _ := direct.Get(ctx, "n").Int(); n != 1 {
			t.Fatalf("n = %d on the server, want 1: the INCR ran", n)
		}
		if n, err := c.Incr(ctx, "n").Result(); err != nil || n != 2 {
			t.Fatalf("next INCR: %d, %v; want 2", n, err)
		}
	})

	t.Run("HangResume", func(t *testing.T) {
		p.Hang()
		defer p.Resume() // also when the test fails first
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		hc := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		defer hc.Close()
		if err := hc.Ping(short).Err(); err == nil {
			t.Fatalf("PING while hung: %v, want a deadline", err)
		}
		p.Resume()
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after Resume: %v", err)
		}
	})

	t.Run("CutAll", func(t *testing.T) {
		raw, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		if _, err := raw.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(raw)
		if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
			t.Fatalf("PING: %q, %v", line, err)
		}
		p.CutAll()
		if _, err := r.ReadByte(); err == nil {
			t.Fatal("a cut connection is still open")
		}
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING on a new connection: %v", err)
		}
	})
}
