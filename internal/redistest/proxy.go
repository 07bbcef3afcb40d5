package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on a loopback port in front of one Redis server, for
// tests that need to break the network at an exact point of the protocol:
// lose one reply after the server has run the command, stop all traffic, or
// cut every connection. It reads the protocol (RESP2 and RESP3) only to know
// where each command and each reply ends; the bytes pass as they are.
//
// A Proxy is safe for simultaneous use by multiple goroutines. It belongs to
// the test that started it and stops when that test ends.
type Proxy struct {
	// Addr is the proxy's host:port: give it to clients instead of the
	// server's.
	Addr   string
	target string
	ln     net.Listener

	mu       sync.Mutex
	conns    map[*proxyConn]struct{}
	drops    map[string]int // command name -> replies still to lose
	commands map[string]int // command name -> how many were forwarded
	resume   chan struct{}  // nil while traffic flows; closed by Resume
	closed   bool
}

// StartProxy starts a Proxy in front of the server at target, usually a
// Server's Addr, and stops it when t ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	p := &Proxy{
		Addr: ln.Addr().String(), target: target, ln: ln,
		conns: map[*proxyConn]struct{}{}, drops: map[string]int{}, commands: map[string]int{},
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.accept(&wg) })
	t.Cleanup(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		_ = ln.Close()
		p.CutAll()
		p.Resume()
		wg.Wait()
	})
	return p
}

// DropNextReply makes the proxy lose the reply to the next command named
// name (case-insensitive, say "evalsha"): the command reaches the server,
// the proxy reads the server's whole reply, then closes the client's
// connection without sending it. The client sees the connection end after
// the server ran the command. Each call loses one more reply.
func (p *Proxy) DropNextReply(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drops[strings.ToLower(name)]++
}

// Commands returns how many commands named name (case-insensitive) the
// proxy has forwarded to the server.
func (p *Proxy) Commands(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.commands[strings.ToLower(name)]
}

// Hang stops forwarding in both directions, on every connection, new ones
// included, until Resume. Connections stay open: the server looks alive and
// silent.
func (p *Proxy) Hang() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume == nil {
		p.resume = make(chan struct{})
	}
}

// Resume lets traffic flow again after Hang, with what was held back first.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
}

// CutAll closes every connection through the proxy, on both sides. New
// connections are accepted as before.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// gate returns a channel that is closed once traffic may flow.
func (p *Proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume != nil {
		return p.resume
	}
	return flowing
}

var flowing = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (p *Proxy) accept(wg *sync.WaitGroup) {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &proxyConn{p: p, client: client, server: server, done: make(chan struct{}), pending: make(chan bool, 1<<16)}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close()
			return
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		wg.Go(c.forwardCommands)
		wg.Go(c.forwardReplies)
	}
}

// proxyConn is one client connection and the proxy's own connection to the
// server that it is paired with.
type proxyConn struct {
	p              *Proxy
	client, server net.Conn
	done           chan struct{} // closed by close
	once           sync.Once
	// pending holds, for each command forwarded and not yet answered,
	// whether its reply is to be lost. Replies come in command order.
	pending chan bool
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.done)
		_ = c.client.Close()
		_ = c.server.Close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// wait blocks while the proxy hangs; false if the connection closed first.
func (c *proxyConn) wait() bool {
	select {
	case <-c.p.gate():
		return true
	case <-c.done:
		return false
	}
}

func (c *proxyConn) forwardCommands() {
	defer c.close()
	r := bufio.NewReader(c.client)
	var buf bytes.Buffer
	for {
		buf.Reset()
		name, err := readCommandRaw(r, &buf)
		if err != nil || !c.wait() {
			return
		}
		c.p.mu.Lock()
		drop := c.p.drops[name] > 0
		if drop {
			c.p.drops[name]--
		}
		c.p.commands[name]++
		c.p.mu.Unlock()
		select {
		case c.pending <- drop: // before the command leaves, so before its reply can come
		default:
			return // far more commands in flight than any test sends
		}
		if _, err := c.server.Write(buf.Bytes()); err != nil {
			return
		}
	}
}

func (c *proxyConn) forwardReplies() {
	defer c.close()
	r := bufio.NewReader(c.server)
	var buf bytes.Buffer
	for {
		buf.Reset()
		push, err := readValue(r, &buf, 0)
		if err != nil || !c.wait() {
			return
		}
		if !push { // a push answers no command
			var drop bool
			select {
			case drop = <-c.pending:
			default: // a reply to no command: pass it on
			}
			if drop {
				return // the server ran the command; its reply is lost with the connection
			}
		}
		if _, err := c.client.Write(buf.Bytes()); err != nil {
			return
		}
	}
}

// maxSize bounds a length or count the proxy accepts, against a stream that
// is not RESP.
const maxSize = 1 << 28

// readCommandRaw reads one command, an array of bulk strings, into buf and
// returns its name in lower case. Inline commands (a bare line) pass too.
func readCommandRaw(r *bufio.Reader, buf *bytes.Buffer) (string, error) {
	line, err := readLine(r, buf)
	if err != nil {
		return "", err
	}
	if len(line) == 0 || line[0] != '*' {
		name, _, _ := strings.Cut(strings.TrimSpace(string(line)), " ")
		return strings.ToLower(name), nil
	}
	n, err := size(line)
	if err != nil {
		return "", err
	}
	var name string
	for i := range n {
		start := buf.Len()
		if _, err := readValue(r, buf, 1); err != nil {
			return "", err
		}
		if i == 0 {
			name = strings.ToLower(bulkText(buf.Bytes()[start:]))
		}
	}
	return name, nil
}

// bulkText returns the text of one raw bulk string, "" for anything else.
func bulkText(raw []byte) string {
	if len(raw) == 0 || raw[0] != '$' {
		return ""
	}
	_, rest, ok := bytes.Cut(raw, []byte("\r\n"))
	if !ok {
		return ""
	}
	return string(bytes.TrimSuffix(rest, []byte("\r\n")))
}

// readValue reads one RESP2 or RESP3 value, with any attribute before it,
// into buf, and reports whether it is a push. depth bounds nesting.
func readValue(r *bufio.Reader, buf *bytes.Buffer, depth int) (push bool, err error) {
	if depth > 64 {
		return false, errors.New("redistest: reply nested too deep")
	}
	line, err := readLine(r, buf)
	if err != nil {
		return false, err
	}
	if len(line) == 0 {
		return false, errors.New("redistest: empty line where a value starts")
	}
	kind := line[0] // line points into r's buffer: read it before r moves on
	switch kind {
	case '+', '-', ':', '_', '#', ',', '(':
		return false, nil
	case '$', '=', '!': // bulk string, verbatim string, bulk error
		n, err := size(line)
		if err != nil || n < 0 {
			return false, err
		}
		_, err = io.CopyN(buf, r, int64(n)+2)
		return false, err
	case '*', '~', '>': // array, set, push
		n, err := size(line)
		if err != nil {
			return false, err
		}
		for range n {
			if _, err := readValue(r, buf, depth+1); err != nil {
				return false, err
			}
		}
		return kind == '>', nil
	case '%', '|': // map, attribute: n pairs
		n, err := size(line)
		if err != nil {
			return false, err
		}
		for range 2 * n {
			if _, err := readValue(r, buf, depth+1); err != nil {
				return false, err
			}
		}
		if kind == '|' { // an attribute comes before the value it describes
			return readValue(r, buf, depth+1)
		}
		return false, nil
	}
	return false, fmt.Errorf("redistest: unknown RESP type %q", kind)
}

// readLine reads one line ending in CRLF into buf and returns it without
// the CRLF.
func readLine(r *bufio.Reader, buf *bytes.Buffer) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("redistest: line too long")
		}
		return nil, err
	}
	buf.Write(line)
	return bytes.TrimSuffix(line[:len(line)-1], []byte("\r")), nil
}

// size parses the length or count after a line's type byte: -1 (a RESP2
// null) or 0..maxSize. Streamed aggregates ("?") are not supported: Redis
// does not send them.
func size(line []byte) (int, error) {
	n, err := strconv.Atoi(string(line[1:]))
	if err != nil || n < -1 || n > maxSize {
		return 0, fmt.Errorf("redistest: bad length in %q", line)
	}
	return n, nil
}
