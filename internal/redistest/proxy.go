// A proxy between a client and a server that counts and times the commands
// it forwards, and can delay, hang, drop a reply or cut every connection.

package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Proxy is a TCP proxy on a loopback port in front of one Redis server, for
// tests that need to break the network at an exact point of the protocol:
// lose one reply after the server has run the command, make replies late,
// stop all traffic, or cut every connection. It records when each command
// went through. It reads the protocol (RESP2 and RESP3) only to know
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
	drops    map[string]int         // command name -> replies still to lose
	commands map[string]int         // command name -> how many were forwarded
	sent     map[string][]time.Time // command name -> when each was forwarded
	resume   chan struct{}          // nil while traffic flows; closed by Resume
	delay    time.Duration          // how long each reply is held
	delayed  chan struct{}          // closed, and replaced, when delay changes
	answer   func(args []string) string
	closed   bool
}

// StartProxy starts a Proxy in front of the server at target, usually a
// Server's Addr, and stops it when t ends.
func StartProxy(t TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	p := &Proxy{
		Addr: ln.Addr().String(), target: target, ln: ln,
		conns: map[*proxyConn]struct{}{}, drops: map[string]int{}, commands: map[string]int{},
		sent: map[string][]time.Time{}, delayed: make(chan struct{}),
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

// Answer has the proxy answer commands itself: fn is given each command's
// arguments (its name first, as the client spelled it) before it is
// forwarded, and returns "" to let it pass, or the text of an error reply
// ("NOSCRIPT No matching script.") that the client gets in place of the
// server's. The server then never sees the command: the proxy sends it a
// PING instead, whose reply it replaces, so that replies keep their order.
// A command answered so counts in Commands and Sent all the same. fn is
// called from the proxy's goroutines, one per connection, perhaps at once.
// Answer(nil) forwards every command again.
func (p *Proxy) Answer(fn func(args []string) string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answer = fn
}

// Commands returns how many commands named name (case-insensitive) the
// proxy has forwarded to the server.
func (p *Proxy) Commands(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.commands[strings.ToLower(name)]
}

// Sent returns the times at which the proxy forwarded each command named
// name (case-insensitive) to the server, oldest first, taken just before it
// wrote the command: a command stamped after a moment reached the server
// after it, and by the time a client has a command's reply, Sent has the
// command. A test counts with it the commands that reached the server after
// some event.
func (p *Proxy) Sent(name string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sent[strings.ToLower(name)])
}

// Delay holds every reply from the server for d after the proxy read it
// before passing it on, as a slow network or a slow reply path would:
// commands still reach the server at once, and it runs them at once; only
// their replies come late. Replies keep their order on each connection, so
// a reply held longer holds back those behind it; replies read together
// wait together, not one after another. A lost reply (DropNextReply) and
// the end of the server's side close the client's connection when their
// turn comes. A reply waits for the delay in force while it waits:
// Delay(0) stops delaying and lets the replies already held go at once.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
	close(p.delayed)
	p.delayed = make(chan struct{})
}

// currentDelay returns the delay in force and a channel that is closed when
// it changes.
func (p *Proxy) currentDelay() (time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay, p.delayed
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
		c := &proxyConn{
			p: p, client: client, server: server, done: make(chan struct{}),
			pending: make(chan pendingReply, 1<<16), ready: make(chan struct{}, 1),
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close()
			return
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		wg.Go(c.forwardCommands)
		wg.Go(c.readReplies)
		wg.Go(c.writeReplies)
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
	// what becomes of its reply. Replies come in command order.
	pending chan pendingReply

	// held is the queue of what readReplies has read from the server and
	// writeReplies has yet to pass on; ready has a value when it may have
	// grown. One queue per connection keeps the replies in order.
	heldMu sync.Mutex
	held   []heldReply
	ready  chan struct{}
}

// pendingReply is what becomes of the reply to a command forwarded: lost
// (drop), replaced by answer, or passed on.
type pendingReply struct {
	drop   bool
	answer []byte // a raw error reply, from Answer
}

// ping is the command sent to the server in place of one Answer answers.
var ping = []byte("*1\r\n$4\r\nPING\r\n")

// heldReply is one reply on its way to the client.
type heldReply struct {
	raw  []byte
	read time.Time // when the proxy had read it whole
	// end closes the connection in its place: the reply is to be lost,
	// or the server's side has ended.
	end bool
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
		answer := c.p.answer
		c.p.mu.Unlock()
		var reply pendingReply
		if answer != nil {
			if text := answer(commandArgs(buf.Bytes())); text != "" {
				reply.answer = []byte("-" + text + "\r\n")
			}
		}
		c.p.mu.Lock()
		reply.drop = c.p.drops[name] > 0 && reply.answer == nil
		if reply.drop {
			c.p.drops[name]--
		}
		c.p.commands[name]++
		// Before the write, so that no reply can reach the client before
		// its command is in Sent.
		c.p.sent[name] = append(c.p.sent[name], time.Now())
		c.p.mu.Unlock()
		select {
		case c.pending <- reply: // before the command leaves, so before its reply can come
		default:
			return // far more commands in flight than any test sends
		}
		out := buf.Bytes()
		if reply.answer != nil {
			out = ping
		}
		if _, err := c.server.Write(out); err != nil {
			return
		}
	}
}

// readReplies reads each reply from the server as soon as it comes, so that
// its delay counts from then, and queues it for writeReplies. It closes no
// connection itself: the end it queues does, after the replies before it.
func (c *proxyConn) readReplies() {
	r := bufio.NewReader(c.server)
	for {
		var buf bytes.Buffer
		push, err := readValue(r, &buf, 0)
		read := time.Now()
		if err != nil {
			c.hold(heldReply{read: read, end: true})
			return
		}
		if !push { // a push answers no command
			var reply pendingReply
			select {
			case reply = <-c.pending:
			default: // a reply to no command: pass it on
			}
			if reply.drop { // the server ran the command; its reply is lost with the connection
				c.hold(heldReply{read: read, end: true})
				return
			}
			if reply.answer != nil { // the PING's reply: the answer goes in its place
				c.hold(heldReply{raw: reply.answer, read: read})
				continue
			}
		}
		c.hold(heldReply{raw: buf.Bytes(), read: read})
	}
}

// hold queues h for writeReplies.
func (c *proxyConn) hold(h heldReply) {
	c.heldMu.Lock()
	c.held = append(c.held, h)
	c.heldMu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default: // writeReplies has a wake-up coming already
	}
}

// next returns the oldest queued reply, waiting for one; false once the
// connection is closed.
func (c *proxyConn) next() (heldReply, bool) {
	for {
		c.heldMu.Lock()
		if len(c.held) > 0 {
			h := c.held[0]
			c.held[0] = heldReply{} // let its bytes go
			c.held = c.held[1:]
			c.heldMu.Unlock()
			return h, true
		}
		c.heldMu.Unlock()
		select {
		case <-c.ready:
		case <-c.done:
			return heldReply{}, false
		}
	}
}

// writeReplies passes the queued replies on to the client in order, each
// once the delay has passed since it was read and while traffic flows.
func (c *proxyConn) writeReplies() {
	defer c.close()
	var timer *time.Timer // made on the first wait, then reused
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		h, ok := c.next()
		if !ok {
			return
		}
		for {
			d, changed := c.p.currentDelay()
			wait := time.Until(h.read.Add(d))
			if wait <= 0 {
				break
			}
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-timer.C:
			case <-changed: // Delay again: wait for the new delay instead
			case <-c.done:
				return
			}
		}
		if h.end || !c.wait() {
			return
		}
		if _, err := c.client.Write(h.raw); err != nil {
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

// commandArgs returns the arguments of raw, one command as readCommandRaw
// read it: the bulk strings of an array, or an inline command's words.
func commandArgs(raw []byte) []string {
	r := bufio.NewReader(bytes.NewReader(raw))
	var buf bytes.Buffer
	line, err := readLine(r, &buf)
	if err != nil || len(line) == 0 || line[0] != '*' {
		return strings.Fields(string(line))
	}
	n, err := size(line)
	if err != nil {
		return nil
	}
	args := make([]string, 0, n)
	for range n {
		buf.Reset()
		if _, err := readValue(r, &buf, 1); err != nil {
			return args
		}
		args = append(args, bulkText(buf.Bytes()))
	}
	return args
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
