package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
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

func TestProxyDelay(t *testing.T) {
	s := Start(t)
	p := StartProxy(t, s.Addr)
	ctx := context.Background()
	direct := s.Client(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, ReadTimeout: time.Minute, PoolSize: 1})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(ctx).Err(); err != nil { // the handshake, at full speed
		t.Fatal(err)
	}
	const d = 200 * time.Millisecond
	p.Delay(d)
	defer p.Delay(0)

	t.Run("NoEarlier", func(t *testing.T) {
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		got := time.Now()
		sent := p.Sent("ping")
		if late := got.Sub(sent[len(sent)-1]); late < d {
			t.Fatalf("the reply came %v after its command went to the server, want %v or more", late, d)
		}
	})

	t.Run("PipelineInOrder", func(t *testing.T) {
		key := "redistest:" + t.Name()
		const n = 20
		pipe := c.Pipeline()
		incrs := make([]*redis.IntCmd, n)
		for i := range incrs {
			incrs[i] = pipe.Incr(ctx, key)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		end := time.Now()
		for i, incr := range incrs {
			if got := incr.Val(); got != int64(i+1) {
				t.Fatalf("reply %d is %d, want %d: the replies came out of order", i, got, i+1)
			}
		}
		sent := p.Sent("incr")
		if len(sent) != n {
			t.Fatalf("Sent has %d INCRs, want %d", len(sent), n)
		}
		if late := end.Sub(sent[n-1]); late < d {
			t.Fatalf("the last reply came %v after its command went to the server, want %v or more", late, d)
		}
		// Each reply is held from when the proxy read it, not from when
		// the one before it went on: the delays do not add up.
		if took := end.Sub(sent[0]); took >= n*d {
			t.Fatalf("the pipeline of %d took %v: the delays of %v added up", n, took, d)
		}
	})

	t.Run("ServerRunsAtOnce", func(t *testing.T) {
		p.Delay(time.Hour)
		defer p.Delay(d)
		raw, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		key := "redistest:" + t.Name()
		if _, err := fmt.Fprintf(raw, "*2\r\n$4\r\nINCR\r\n$%d\r\n%s\r\n", len(key), key); err != nil {
			t.Fatal(err)
		}
		if err := waitFor(func(ctx context.Context) error {
			n, err := direct.Get(ctx, key).Int()
			if err == nil && n != 1 {
				err = fmt.Errorf("%s = %d, want 1", key, n)
			}
			return err
		}); err != nil {
			t.Fatalf("the server did not run the INCR whose reply is held: %v", err)
		}
		r := bufio.NewReader(raw)
		_ = raw.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if b, err := r.ReadByte(); err == nil {
			t.Fatalf("read %q of a reply held for an hour", b)
		}
		p.Delay(0) // lets it go now
		_ = raw.SetReadDeadline(time.Now().Add(time.Minute))
		if line, err := r.ReadString('\n'); err != nil || line != ":1\r\n" {
			t.Fatalf("after Delay(0): %q, %v; want the held reply :1", line, err)
		}
	})
}

func TestProxySent(t *testing.T) {
	s := Start(t)
	p := StartProxy(t, s.Addr)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(ctx).Err(); err != nil { // the handshake, before the first moment
		t.Fatal(err)
	}
	key := "redistest:" + t.Name()

	before := time.Now()
	if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c.Get(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
	}
	after := time.Now()

	sets, gets := p.Sent("set"), p.Sent("GET")
	if len(sets) != 1 || len(gets) != 2 {
		t.Fatalf("Sent has %d SETs and %d GETs, want 1 and 2", len(sets), len(gets))
	}
	if got := p.Commands("get"); got != len(gets) {
		t.Fatalf("Commands(get) = %d, Sent(get) has %d", got, len(gets))
	}
	times := append(sets, gets...)
	for i, at := range times {
		if at.Before(before) || at.After(after) {
			t.Fatalf("command %d sent at %v, outside the %v to %v it ran in", i, at, before, after)
		}
		if i > 0 && at.Before(times[i-1]) {
			t.Fatalf("command %d sent at %v, before command %d at %v", i, at, i-1, times[i-1])
		}
	}
	if got := p.Sent("del"); len(got) != 0 {
		t.Fatalf("Sent(del) = %v, want none", got)
	}
}

// Stopping the proxy ends all its goroutines, a reply held by Delay
// included.
func TestProxyStops(t *testing.T) {
	s := Start(t)
	ignore := goleak.IgnoreCurrent()
	t.Run("proxy", func(t *testing.T) {
		p := StartProxy(t, s.Addr)
		p.Delay(time.Hour)
		raw, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = raw.Close() })
		if _, err := raw.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
			t.Fatal(err)
		}
		if err := waitFor(func(context.Context) error {
			if len(p.Sent("ping")) == 0 {
				return errors.New("the PING did not go through")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
	goleak.VerifyNone(t, ignore)
}

// Answer replaces the replies of the commands it picks, in their place
// among the others of a pipeline, and the server never runs them.
func TestProxyAnswer(t *testing.T) {
	s := Start(t)
	p := StartProxy(t, s.Addr)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	p.Answer(func(args []string) string {
		if strings.EqualFold(args[0], "incr") && args[1] == "answered" {
			return "NOSCRIPT No matching script."
		}
		return ""
	})
	pipe := c.Pipeline()
	first := pipe.Incr(ctx, "passed")
	answered := pipe.Incr(ctx, "answered")
	last := pipe.Incr(ctx, "passed")
	_, _ = pipe.Exec(ctx)
	if first.Val() != 1 || last.Val() != 2 || first.Err() != nil || last.Err() != nil {
		t.Fatalf("the commands passed: %v, %v; want 1 and 2", first, last)
	}
	if err := answered.Err(); err == nil || err.Error() != "NOSCRIPT No matching script." {
		t.Fatalf("the command answered: %v, want the answer", err)
	}
	if n, err := s.Client(t).Exists(ctx, "answered").Result(); err != nil || n != 0 {
		t.Fatalf("the answered INCR reached the server: EXISTS %d, %v", n, err)
	}
	if got := p.Commands("incr"); got != 3 {
		t.Fatalf("counted %d INCRs, want 3", got)
	}
	p.Answer(nil)
	if n, err := c.Incr(ctx, "answered").Result(); err != nil || n != 1 {
		t.Fatalf("after Answer(nil): %d, %v; want 1", n, err)
	}
}
