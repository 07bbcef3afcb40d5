package script_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit/internal/keys"
	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// TestLuaVersions runs both scripts, as the library sends them, under
// Lua 5.4 (Dragonfly's) and Lua 5.1 (Redis's and Valkey's) with
// testdata/redis_stub.lua standing in for the engine, and on a real
// redis-server: a randomized trace of decisions, looks, charges, leases,
// give-backs, batches (on one server, and on a Cluster master across
// slots), foreign keys and concurrency slots, whose replies must be the
// same step by step and whose keys the same at the end. The stand-in also
// fails a script that touches a key it did not declare, or declared keys
// of several Cluster slots, as the strictest engines do.
//
// It needs lua5.4, lua5.1 and redis-server, and skips with the reason
// without them, unless RATELIMIT_REQUIRE_LUA=1 (as .ci/run sets it) says
// the run needs the Lua interpreters.
func TestLuaVersions(t *testing.T) {
	lua54, lua51 := requireLua(t, "lua5.4"), requireLua(t, "lua5.1")
	rdb := redistest.Start(t).Client(t)
	redis.SetLogger(quietLogger{})

	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RATELIMIT_LUA_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("RATELIMIT_LUA_SEED: %v", err)
		}
	}
	t.Logf("seed %d (RATELIMIT_LUA_SEED=%d repeats this trace)", seed, seed)

	h := &harness{t: t, rdb: rdb, ctx: context.Background(),
		luas: []*luaEngine{startLua(t, lua54), startLua(t, lua51)}}
	h.load()
	tr := newTrace(rand.New(rand.NewPCG(seed, seed>>7)))
	start := time.Now()
	steps := 1500
	for i := 0; i < steps; i++ {
		tr.step(h)
		if t.Failed() {
			t.Fatalf("step %d of seed %d: the engines differ (above)", i, seed)
		}
	}
	h.compareKeys()
	t.Logf("%d steps, %d script calls (%d short form, %d cross-slot batches, %d concurrency), %d keys at the end, in %v; Redis's clock moved at most %d ms within a call",
		steps, h.calls, h.short, h.cross, h.nslots, h.nkeys, time.Since(start).Round(time.Millisecond), h.span)
	if h.short == 0 || h.cross == 0 || h.nslots == 0 || h.long == 0 {
		t.Errorf("the trace missed a form: %d short, %d long, %d cross-slot, %d concurrency calls", h.short, h.long, h.cross, h.nslots)
	}
}

// TestLuaStubSlots checks the stand-in's Cluster hash slots against Redis's
// documented ones (CLUSTER KEYSLOT), hash tags and an empty tag too.
func TestLuaStubSlots(t *testing.T) {
	for _, program := range []string{"lua5.4", "lua5.1"} {
		t.Run(program, func(t *testing.T) {
			e := startLua(t, requireLua(t, program))
			for key, want := range map[string]int64{"somekey": 11058, "foo{hash_tag}": 2515, "{hash_tag}bar": 2515,
				"123456789": 12739, "{}ab": 13004, "x{a}{b}": 15495} {
				got, err := e.do("S", key)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("slot of %q: %v, want %d", key, got, want)
				}
			}
		})
	}
}

// TestLuaStubRefuses checks that the stand-in refuses what the strictest
// engines refuse, so that TestLuaVersions would see a script do it.
func TestLuaStubRefuses(t *testing.T) {
	const get = "return redis.call('GET', KEYS[1] .. (ARGV[1] or ''))"
	cases := []struct {
		name, src, cluster string
		args               []string
		refused            bool
	}{
		{"declared", get, "1", []string{"1", "{a}x"}, false},
		{"undeclared", get, "0", []string{"1", "{a}x", "y"}, true},
		{"declared of two slots on a Cluster", get, "1", []string{"2", "{a}x", "{b}x"}, true},
		{"declared of two slots on one server", get, "0", []string{"2", "{a}x", "{b}x"}, false},
		{"another slot than the declared", "return redis.call('GET', ARGV[1])", "1", []string{"1", "{a}x", "{b}x"}, true},
		{"another slot, allow-cross-slot-keys", "#!lua flags=allow-cross-slot-keys\nreturn redis.call('GET', ARGV[1])", "1", []string{"1", "{a}x", "{b}x"}, false},
		{"one command across slots, allow-cross-slot-keys", "#!lua flags=allow-cross-slot-keys\nreturn redis.call('MGET', KEYS[1], ARGV[1])", "1", []string{"1", "{a}x", "{b}x"}, true},
	}
	for _, program := range []string{"lua5.4", "lua5.1"} {
		e := startLua(t, requireLua(t, program))
		for _, c := range cases {
			n, err := e.do("L", c.src)
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.do(fmt.Sprintf("E %d %s %d", n, c.cluster, len(c.args)), c.args...)
			if err != nil {
				t.Fatal(err)
			}
			if _, refused := got.(stubError); refused != c.refused {
				t.Errorf("%s, %s: replied %s, want refused %v", program, c.name, render(got), c.refused)
			}
		}
	}
}

// requireLua returns the path of program, or skips t without it.
func requireLua(t *testing.T, program string) string {
	t.Helper()
	path, err := exec.LookPath(program)
	if err == nil {
		return path
	}
	if os.Getenv("RATELIMIT_REQUIRE_LUA") == "1" {
		t.Fatalf("%v, and RATELIMIT_REQUIRE_LUA=1 says this run needs it", err)
	}
	t.Skipf("skipping: %v; apt-get install lua5.4 lua5.1 (.ci/run installs them)", err)
	return ""
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// luaEngine is one process of testdata/redis_stub.lua.
type luaEngine struct {
	name string
	in   *bufio.Writer
	out  *bufio.Reader
}

// startLua starts the stand-in under the interpreter at path, ended with t.
func startLua(t *testing.T, path string) *luaEngine {
	cmd := exec.Command(path, "testdata/redis_stub.lua")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	return &luaEngine{name: path[strings.LastIndexByte(path, '/')+1:], in: bufio.NewWriter(stdin), out: bufio.NewReader(stdout)}
}

// do sends a request of header and strs and returns its reply.
func (e *luaEngine) do(header string, strs ...string) (any, error) {
	e.in.WriteString(header)
	e.in.WriteByte('\n')
	for _, s := range strs {
		fmt.Fprintf(e.in, "%d\n%s\n", len(s), s)
	}
	if err := e.in.Flush(); err != nil {
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	v, err := e.read()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	return v, nil
}

// stubError, stubFloat are replies of the stand-in that compare unequal to
// every reply of Redis: an error, and a number that is no integer.
type (
	stubError string
	stubFloat string
)

// read decodes a reply of the stand-in (see its header).
func (e *luaEngine) read() (any, error) {
	line, err := e.out.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if line == "" {
		return nil, errors.New("an empty reply line")
	}
	body := line[1:]
	switch line[0] {
	case 'i':
		return strconv.ParseInt(body, 10, 64)
	case 'f':
		return stubFloat(body), nil
	case 'n':
		return nil, nil
	case 's', 'e', 'o':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, err
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(e.out, b); err != nil {
			return nil, err
		}
		if line[0] == 'e' {
			return stubError(b), nil
		}
		return string(b), nil
	case 'a':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, err
		}
		vals := make([]any, n)
		for i := range vals {
			if vals[i], err = e.read(); err != nil {
				return nil, err
			}
		}
		return vals, nil
	}
	return nil, fmt.Errorf("a reply line %q", line)
}

// harness sends each call to every engine and compares what they reply.
type harness struct {
	t    *testing.T
	ctx  context.Context
	rdb  *redis.Client
	luas []*luaEngine

	decider, crossSlot, conc *script.Script
	ids                      map[*script.Script]int // each script's number in the stand-ins

	now                                      int64 // Redis's clock before the call under way, ms
	span                                     int64 // the most Redis's clock moved within a call, ms
	calls, short, long, cross, nslots, nkeys int
}

// load loads the three scripts the library sends into the stand-ins: the
// decider, the same declared allow-cross-slot-keys, and concurrency.lua.
func (h *harness) load() {
	h.decider = script.NewScript(script.Source, false)
	h.crossSlot = script.NewScript(script.Source, true)
	h.conc = script.NewScript(script.ConcurrencySource, false)
	h.ids = map[*script.Script]int{}
	for _, sc := range []*script.Script{h.decider, h.crossSlot, h.conc} {
		for _, e := range h.luas {
			v, err := e.do("L", sc.Src.(string))
			if err != nil {
				h.t.Fatal(err)
			}
			n, ok := v.(int64)
			if !ok {
				h.t.Fatalf("%s: loading a script: %v", e.name, v)
			}
			h.ids[sc] = int(n)
		}
	}
}

// clock sets every stand-in's clock to Redis's, read now.
func (h *harness) clock() {
	tm, err := h.rdb.Time(h.ctx).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	h.now = tm.UnixMilli()
	for _, e := range h.luas {
		if _, err := e.do(fmt.Sprintf("T %d %d", tm.Unix(), tm.Nanosecond()/1000)); err != nil {
			h.t.Fatal(err)
		}
	}
}

// elapsed notes how far Redis's clock moved since clock.
func (h *harness) elapsed() {
	tm, err := h.rdb.Time(h.ctx).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	h.span = max(h.span, tm.UnixMilli()-h.now)
}

// eval sends args, a command the library built ("evalsha", the SHA, then
// EVAL's arguments), for sc to every engine, as on a Cluster when cluster
// is set, and returns each engine's reply, Redis's first.
func (h *harness) eval(sc *script.Script, args []any, cluster bool) ([]any, []string) {
	h.t.Helper()
	h.calls++
	strs := make([]string, len(args)-2)
	for i, a := range args[2:] {
		strs[i] = argString(h.t, a)
	}
	h.clock()
	cmd := append([]any{"eval", sc.Src}, args[2:]...)
	got, err := h.rdb.Do(h.ctx, cmd...).Result()
	h.elapsed()
	if err != nil && err != redis.Nil {
		h.t.Fatalf("redis-server: %v\ncall %q", err, strs)
	}
	replies := []any{got}
	c := "0"
	if cluster {
		c = "1"
	}
	for _, e := range h.luas {
		v, err := e.do(fmt.Sprintf("E %d %s %d", h.ids[sc], c, len(strs)), strs...)
		if err != nil {
			h.t.Fatal(err)
		}
		replies = append(replies, v)
	}
	return replies, strs
}

// argString returns a command argument as go-redis sends it: the library's
// arguments are strings and int64s, many of them pointers into a request.
func argString(t *testing.T, a any) string {
	switch a := a.(type) {
	case string:
		return a
	case *string:
		return *a
	case int64:
		return strconv.FormatInt(a, 10)
	case *int64:
		return strconv.FormatInt(*a, 10)
	case int:
		return strconv.Itoa(a)
	}
	t.Fatalf("an argument of type %T", a)
	return ""
}

// same fails the test unless every engine's reply renders as Redis's.
func (h *harness) same(what string, replies []any, strs []string) {
	h.t.Helper()
	want := render(replies[0])
	for i, e := range h.luas {
		if got := render(replies[i+1]); got != want {
			h.t.Errorf("%s: %s replied %s, redis-server %s\ncall: %q", what, e.name, got, want, strs)
		}
	}
}

// render writes a reply so that equal replies render alike: an error or a
// float of the stand-in never equals a reply of Redis.
func render(v any) string {
	switch v := v.(type) {
	case nil:
		return "nil"
	case int64:
		return strconv.FormatInt(v, 10)
	case string:
		return strconv.Quote(v)
	case stubError:
		return "error(" + string(v) + ")"
	case stubFloat:
		return "float(" + string(v) + ")"
	case []any:
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = render(x)
		}
		return "[" + strings.Join(s, " ") + "]"
	}
	return fmt.Sprintf("%T(%v)", v, v)
}

// decide sends reqs in one call as the transport does (internal/transport,
// call.go): on a Cluster master as a cross-slot batch when cross is set.
func (h *harness) decide(reqs []*script.Request, cluster, cross bool) {
	h.t.Helper()
	sc := h.decider
	if cross {
		sc = h.crossSlot
		h.cross++
	}
	short := script.ShortCall(reqs, sc.Cross)
	if short {
		h.short++
	} else {
		h.long++
	}
	replies, strs := h.eval(sc, script.AppendCall(nil, sc, reqs, sc.Cross, short), cluster)
	h.same(fmt.Sprintf("a call of %d requests (short %v, cluster %v, cross %v)", len(reqs), short, cluster, cross), replies, strs)
}

// slot sends r, a concurrency request. Its replies hold a wait in ms, which
// Redis reckons from its clock at the call, somewhat after the stand-ins'
// (see compareKeys): only that may differ, by at most how far Redis's
// clock moved within a call.
func (h *harness) slot(r *script.Request) {
	h.t.Helper()
	h.nslots++
	replies, _ := h.eval(h.conc, script.AppendConcurrency(nil, h.conc, r), true)
	for i, v := range replies {
		if vals, ok := v.([]any); !ok || len(vals) != 3 {
			h.t.Fatalf("a concurrency reply %s", render(v))
		}
		// the Lua 5.4 and 5.1 stand-ins share a clock: they agree exactly
		if i > 1 && render(v) != render(replies[1]) {
			h.t.Errorf("concurrency %+v: %s replied %s, %s %s", *r.Concurrency, h.luas[i-1].name, render(v), h.luas[0].name, render(replies[1]))
		}
	}
	rv, lv := replies[0].([]any), replies[1].([]any)
	if render(rv[:2]) != render(lv[:2]) {
		h.t.Errorf("concurrency %+v: redis-server replied %s, the stand-ins %s", *r.Concurrency, render(rv), render(lv))
		return
	}
	rw, _ := rv[2].(int64)
	lw, _ := lv[2].(int64)
	if d := rw - lw; d < -h.span || d > h.span {
		h.t.Errorf("concurrency %+v: redis-server waits %d ms, the stand-ins %d: more apart than Redis's clock moved in a call (%d ms)",
			*r.Concurrency, rw, lw, h.span)
	}
}

// foreign makes key hold what no count is, on every engine: a string, or
// a list.
func (h *harness) foreign(key string, list bool) {
	kind := "s"
	var err error
	if list {
		kind = "l"
		if err = h.rdb.Del(h.ctx, key).Err(); err == nil {
			err = h.rdb.RPush(h.ctx, key, "x").Err()
		}
	} else {
		err = h.rdb.Set(h.ctx, key, "not a count", 0).Err()
	}
	if err != nil {
		h.t.Fatal(err)
	}
	for _, e := range h.luas {
		if _, err := e.do("F "+kind, key); err != nil {
			h.t.Fatal(err)
		}
	}
}

// storedKey is a key as an engine holds it at the end.
type storedKey struct {
	name, kind string
	value      []string // a string's, a list's items, a zset's members and scores
	expireAt   int64    // ms, or -1
}

// compareKeys compares every key the engines hold: names, types and
// values the same; scores and expiry times, which Redis reckons from its
// clock during a call and the stand-ins from Redis's clock just before,
// as much later in Redis as that clock moved within a call at most.
func (h *harness) compareKeys() {
	h.t.Helper()
	want := h.redisKeys()
	h.nkeys = len(want)
	for _, e := range h.luas {
		v, err := e.do("D")
		if err != nil {
			h.t.Fatal(err)
		}
		got := stubKeys(h.t, v)
		if len(got) != len(want) {
			h.t.Errorf("%s holds %d keys, redis-server %d", e.name, len(got), len(want))
		}
		for i := range min(len(got), len(want)) {
			g, w := got[i], want[i]
			if g.name != w.name || g.kind != w.kind || len(g.value) != len(w.value) {
				h.t.Errorf("%s holds %+v where redis-server holds %+v", e.name, g, w)
				continue
			}
			for j := range g.value {
				if g.value[j] == w.value[j] {
					continue
				}
				gs, err1 := strconv.ParseInt(g.value[j], 10, 64)
				ws, err2 := strconv.ParseInt(w.value[j], 10, 64)
				if w.kind != "zset" || j%2 == 0 || err1 != nil || err2 != nil || ws < gs || ws-gs > h.span {
					h.t.Errorf("%s holds %+v where redis-server holds %+v", e.name, g, w)
				}
			}
			if d := w.expireAt - g.expireAt; (g.expireAt == -1) != (w.expireAt == -1) || d < 0 || d > h.span {
				h.t.Errorf("%s expires %s at %d, redis-server at %d (Redis's clock moved at most %d ms in a call)",
					e.name, g.name, g.expireAt, w.expireAt, h.span)
			}
		}
	}
}

// redisKeys returns every key of the server, in name order.
func (h *harness) redisKeys() []storedKey {
	names, err := h.rdb.Keys(h.ctx, "*").Result()
	if err != nil {
		h.t.Fatal(err)
	}
	slices.Sort(names)
	var all []storedKey
	for _, name := range names {
		k := storedKey{name: name}
		if k.kind, err = h.rdb.Type(h.ctx, name).Result(); err != nil {
			h.t.Fatal(err)
		}
		switch k.kind {
		case "string":
			var s string
			s, err = h.rdb.Get(h.ctx, name).Result()
			k.value = []string{s}
		case "list":
			k.value, err = h.rdb.LRange(h.ctx, name, 0, -1).Result()
		case "zset":
			var zs []redis.Z
			zs, err = h.rdb.ZRangeWithScores(h.ctx, name, 0, -1).Result()
			for _, z := range zs {
				k.value = append(k.value, z.Member.(string), strconv.FormatFloat(z.Score, 'f', -1, 64))
			}
		default:
			h.t.Fatalf("redis-server holds %s of type %s", name, k.kind)
		}
		if err != nil {
			h.t.Fatal(err)
		}
		at, err := h.rdb.PExpireTime(h.ctx, name).Result()
		if err != nil {
			h.t.Fatal(err)
		}
		k.expireAt = at.Milliseconds()
		if at < 0 {
			k.expireAt = -1
		}
		all = append(all, k)
	}
	return all
}

// stubKeys decodes the stand-in's dump.
func stubKeys(t *testing.T, v any) []storedKey {
	t.Helper()
	rows, ok := v.([]any)
	if !ok {
		t.Fatalf("a dump %s", render(v))
	}
	var all []storedKey
	for _, r := range rows {
		f, ok := r.([]any)
		if !ok || len(f) != 4 {
			t.Fatalf("a dump row %s", render(r))
		}
		name, _ := f[0].(string)
		kind, _ := f[1].(string)
		at, _ := f[3].(int64)
		k := storedKey{name: name, kind: kind, expireAt: at}
		switch x := f[2].(type) {
		case string:
			k.value = []string{x}
		case []any:
			for _, s := range x {
				str, _ := s.(string)
				k.value = append(k.value, str)
			}
		}
		all = append(all, k)
	}
	return all
}

// A trace of calls, on a clock of its own (the limits' windows) apart from
// Redis's (the keys' TTLs and the slots' leases), which no key outlives
// within a test: every window is a minute or more, every lease 10 minutes.

// limitKind is one limit a trace's requests may ask.
type limitKind struct {
	rate, window int64 // window in ms
	strict       bool
	period       window.Period
}

// traceLimits are the limits a trace asks, no two of one window's length
// and kind: the library keeps one count for those (the root's sameCount).
var traceLimits = []limitKind{
	{rate: 5, window: 60_000},
	{rate: 12, window: 120_000},
	{rate: 3, window: 3_600_000},                 // a charge can take its count far past the rate
	{rate: 1 << 31, window: 4_000_000},           // counts past 2^26, which the short form does not pack
	{rate: 7, window: 600_000, strict: true},     // 10 sub-windows of a minute
	{rate: 20, window: 86_400_000, strict: true}, //
	{rate: 10, period: window.Daily},             // a calendar period: one key
	{rate: 1 << 36, window: 100_000},             // rate × window near 2^53
}

type trace struct {
	r      *rand.Rand
	k      keys.Keys
	t      int64    // the trace's clock, Unix ms
	ids    []string // a few ids, so that keys repeat
	used   []string // keys the trace has sent
	tokens map[string][]string
	nextID int
}

func newTrace(r *rand.Rand) *trace {
	// an hour or two into a UTC day, which the trace does not leave (a
	// calendar key's TTL runs to its day's end)
	day := 19_700 + r.Int64N(1000)
	return &trace{r: r, k: keys.New("lua"), t: day*86_400_000 + 3_600_000 + r.Int64N(3_600_000),
		ids: []string{"a", "b", "c", "{d}", "e%f"}, tokens: map[string][]string{}}
}

// limit returns the arguments and keys of limit l for id at the trace's
// clock, as the library makes them.
func (tr *trace) limit(id string, l limitKind) (script.LimitArgs, []string) {
	p := window.Locate(tr.t, l.window, l.strict, l.period, time.UTC)
	ks := tr.k.Append(nil, id, p)
	tr.used = append(tr.used, ks...)
	return script.Args(l.rate, p), ks
}

// request returns a request of id against some limits.
func (tr *trace) request(id string, limits []limitKind) *script.Request {
	r := &script.Request{Cost: 1 + tr.r.Int64N(3)}
	switch x := tr.r.IntN(20); {
	case x < 2:
		r.Cost = 0 // a look
	case x < 4:
		r.Mode = script.ModeCountDenied
	case x < 7:
		r.Mode = script.ModeLease
	case x < 10:
		r.Mode = script.ModeCharge
		if tr.r.IntN(3) == 0 {
			r.Cost = script.MaxCount - tr.r.Int64N(4)
		}
	case x < 12: // a give-back of each limit's current key
		var ks []string
		for _, l := range limits {
			_, lk := tr.limit(id, l)
			ks = append(ks, lk[0])
		}
		return script.GiveBack(1+tr.r.Int64N(4), ks...)
	}
	for _, l := range limits {
		a, ks := tr.limit(id, l)
		if r.Mode == script.ModeLease {
			a.Need, a.Most = r.Cost, r.Cost
			if tr.r.IntN(2) == 0 {
				a.Need, a.Most = tr.r.Int64N(2)*r.Cost, r.Cost+tr.r.Int64N(5)
			}
		}
		r.Limits = append(r.Limits, a)
		r.Keys = append(r.Keys, ks...)
	}
	r.NLimits = uint16(len(r.Limits))
	return r
}

// someLimits returns one to three distinct limits.
func (tr *trace) someLimits() []limitKind {
	n := 1 + tr.r.IntN(3)
	perm := tr.r.Perm(len(traceLimits))
	out := make([]limitKind, n)
	for i := range out {
		out[i] = traceLimits[perm[i]]
	}
	return out
}

// step makes one call, or makes a key foreign.
func (tr *trace) step(h *harness) {
	if tr.r.IntN(4) == 0 {
		tr.t += tr.r.Int64N(90_000) // windows roll: previous counts weigh
	}
	id := tr.ids[tr.r.IntN(len(tr.ids))]
	switch x := tr.r.IntN(100); {
	case x < 3 && len(tr.used) > 0: // a key another program wrote
		h.foreign(tr.used[tr.r.IntN(len(tr.used))], tr.r.IntN(2) == 0)
	case x < 15:
		tr.slot(h, id)
	case x < 40: // one decision, as on a single server or a Cluster
		h.decide([]*script.Request{tr.request(id, tr.someLimits())}, tr.r.IntN(2) == 0, false)
	case x < 55: // a batch of the common decision: the short form's
		l := []limitKind{traceLimits[tr.r.IntN(len(traceLimits))]}
		perm := tr.r.Perm(len(tr.ids))
		var reqs []*script.Request
		for _, j := range perm[:2+tr.r.IntN(len(perm)-1)] {
			a, ks := tr.limit(tr.ids[j], l[0])
			reqs = append(reqs, &script.Request{Cost: tr.r.Int64N(3), Keys: ks, Limits: []script.LimitArgs{a}, NLimits: 1})
		}
		h.decide(reqs, false, false)
	case x < 70: // a decision of several requests of one id (shadow limits), as on a Cluster
		reqs := []*script.Request{tr.request(id, tr.someLimits()), tr.request(id, tr.someLimits())}
		h.decide(reqs, true, false)
	case x < 85: // a batch on a single server: any ids, keys may repeat
		var reqs []*script.Request
		for range 2 + tr.r.IntN(5) {
			reqs = append(reqs, tr.request(tr.ids[tr.r.IntN(len(tr.ids))], tr.someLimits()))
		}
		h.decide(reqs, false, false)
	default: // a batch on a Cluster master: keys of several slots
		var reqs []*script.Request
		for range 2 + tr.r.IntN(5) {
			reqs = append(reqs, tr.request(tr.ids[tr.r.IntN(len(tr.ids))], tr.someLimits()))
		}
		h.decide(reqs, true, true)
	}
}

// slot acquires, extends or releases a concurrency slot of id.
func (tr *trace) slot(h *harness, id string) {
	key := tr.k.Slots(id, "jobs")
	held := tr.tokens[id]
	lease := time.Duration(10+tr.r.IntN(20)) * time.Minute
	switch x := tr.r.IntN(3); {
	case x == 0 || len(held) == 0:
		tr.nextID++
		tok := fmt.Sprintf("t%d", tr.nextID)
		tr.tokens[id] = append(held, tok)
		h.slot(script.Slot(key, "a", tok, 1+tr.r.Int64N(3), lease))
	case x == 1:
		h.slot(script.Slot(key, "e", held[tr.r.IntN(len(held))], 0, lease))
	default:
		j := tr.r.IntN(len(held))
		h.slot(script.Slot(key, "r", held[j], 0, 0))
		tr.tokens[id] = slices.Delete(held, j, j+1)
	}
}
