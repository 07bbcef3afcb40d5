package ratelimit_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// handled records what the error handler was called with.
type handled struct {
	mu   sync.Mutex
	ids  []string
	errs []error
}

func (h *handled) handle(_ context.Context, id string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids = append(h.ids, id)
	h.errs = append(h.errs, err)
}

// wantPolicy checks a decision made by the failure policy, and that the
// handler saw the Redis error.
func wantPolicy(t *testing.T, policy ratelimit.FailurePolicy, limit ratelimit.Limit, res ratelimit.Result, err error, h *handled) {
	t.Helper()
	switch policy {
	case ratelimit.FailOpen:
		require.NoError(t, err)
		require.Equal(t, ratelimit.Result{Allowed: true, Limit: limit, Remaining: limit.Rate, Degraded: true}, res)
	case ratelimit.FailClosed:
		require.ErrorIs(t, err, ratelimit.ErrUnavailable)
		require.Equal(t, ratelimit.Result{Allowed: false, Limit: limit, Degraded: true}, res)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, []string{"id"}, h.ids)
	require.Error(t, h.errs[0])
	if err != nil {
		require.ErrorIs(t, err, h.errs[0], "the returned error wraps the Redis error")
	}
}

var policies = []ratelimit.FailurePolicy{ratelimit.FailOpen, ratelimit.FailClosed}

func TestRedisDown(t *testing.T) {
	for _, policy := range policies {
		t.Run(policy.String(), func(t *testing.T) {
			mr := miniredis.RunT(t)
			client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { _ = client.Close() })
			mr.Close()
			h := &handled{}
			l := ratelimit.New(client, ratelimit.WithFailurePolicy(policy), ratelimit.WithErrorHandler(h.handle))
			limit := ratelimit.PerSecond(10)
			res, err := l.Allow(context.Background(), "id", limit)
			wantPolicy(t, policy, limit, res, err, h)
		})
	}
}

// A Redis that accepts connections and never answers holds a decision no
// longer than the timeout (plus scheduling slack), whether or not the client
// watches ctx deadlines itself. Without the Limiter's own watch, the default
// client would wait its 3s ReadTimeout, and retry.
func TestRedisHangs(t *testing.T) {
	const timeout = 50 * time.Millisecond
	const slack = 150 * time.Millisecond
	addr := redistest.Silent(t)
	for _, ctxAware := range []bool{false, true} {
		for _, policy := range policies {
			name := policy.String() + "/ContextTimeoutEnabled=" + map[bool]string{false: "false", true: "true"}[ctxAware]
			t.Run(name, func(t *testing.T) {
				client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: ctxAware})
				t.Cleanup(func() { _ = client.Close() })
				h := &handled{}
				l := ratelimit.New(client, ratelimit.WithFailurePolicy(policy),
					ratelimit.WithErrorHandler(h.handle), ratelimit.WithTimeout(timeout))
				limit := ratelimit.PerSecond(10)
				start := time.Now()
				res, err := l.Allow(context.Background(), "id", limit)
				elapsed := time.Since(start)
				wantPolicy(t, policy, limit, res, err, h)
				require.ErrorIs(t, h.errs[0], context.DeadlineExceeded)
				require.GreaterOrEqual(t, elapsed, timeout)
				require.Less(t, elapsed, timeout+slack)
			})
		}
	}
}

// A caller that gives up is not a Redis failure: its own error comes back,
// with no decision and nothing for the error handler.
func TestCallerContextDone(t *testing.T) {
	addr := redistest.Silent(t)
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	h := &handled{}
	l := ratelimit.New(client, ratelimit.WithErrorHandler(h.handle), ratelimit.WithTimeout(time.Minute))
	limit := ratelimit.PerSecond(10)

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := l.Allow(canceled, "id", limit)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, ratelimit.Result{Limit: limit}, res)

	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	res, err = l.Allow(short, "id", limit)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, ratelimit.Result{Limit: limit}, res)
	require.Empty(t, h.ids)
}

// Redis errors that are not about the network, and replies of the wrong
// shape, are failures too: decided by the policy, never a panic. Stored
// values that are not counts reach the script on miniredis; replies no real
// Redis would send come from a fake server.
func TestBadReplies(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stored string // a value stored under the current window's key
		reply  string // the raw RESP reply a fake server gives the script
		want   error  // what the error handler's error wraps, if known
		says   string // what its message contains
	}{
		{name: "not a number stored", stored: "abc", want: ratelimit.ErrBadReply, says: "holds no count"},
		{name: "negative count stored", stored: "-5", want: ratelimit.ErrBadReply, says: "holds no count"},
		{name: "fraction stored", stored: "1.5", want: ratelimit.ErrBadReply, says: "holds no count"},
		{name: "status, not a list", reply: "+OK\r\n", want: ratelimit.ErrBadReply},
		{name: "list too short", reply: "*1\r\n:1\r\n", want: ratelimit.ErrBadReply, says: "1 values for 1 requests, want 3"},
		{name: "list too long", reply: "*4\r\n:1\r\n:0\r\n:0\r\n:0\r\n", want: ratelimit.ErrBadReply},
		{name: "list of words", reply: "*3\r\n$3\r\nyes\r\n$2\r\nno\r\n$5\r\nmaybe\r\n", want: ratelimit.ErrBadReply},
		{name: "nested list", reply: "*3\r\n*0\r\n:0\r\n:0\r\n", want: ratelimit.ErrBadReply},
		{name: "flag out of range", reply: "*3\r\n:7\r\n:0\r\n:0\r\n", want: ratelimit.ErrBadReply, says: "allowed flag 7"},
		{name: "negative count", reply: "*3\r\n:1\r\n:-1\r\n:0\r\n", want: ratelimit.ErrBadReply},
		{name: "nil", reply: "*-1\r\n", want: ratelimit.ErrBadReply},
		{name: "busy", reply: "-BUSY Redis is busy running a script\r\n", says: "BUSY"},
		{name: "loading", reply: "-LOADING Redis is loading the dataset in memory\r\n", says: "LOADING"},
		{name: "readonly", reply: "-READONLY You can't write against a read only replica.\r\n", says: "READONLY"},
		{name: "masterdown", reply: "-MASTERDOWN Link with MASTER is down\r\n", says: "MASTERDOWN"},
	} {
		for _, policy := range policies {
			t.Run(tc.name+"/"+policy.String(), func(t *testing.T) {
				e := miniredisEnv(t)
				if tc.stored != "" {
					require.NoError(t, e.client.Set(context.Background(), e.key("id", time.Second, e.windowIndex(time.Second)), tc.stored, 0).Err())
				}
				if tc.reply != "" {
					addr := redistest.Fake(t, map[string]string{"evalsha": tc.reply, "eval": tc.reply})
					e.client = redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
				}
				h := &handled{}
				l := e.limiter(ratelimit.WithFailurePolicy(policy), ratelimit.WithErrorHandler(h.handle))
				limit := ratelimit.PerSecond(10)
				res, err := l.Allow(context.Background(), "id", limit)
				wantPolicy(t, policy, limit, res, err, h)
				if tc.want != nil {
					require.ErrorIs(t, h.errs[0], tc.want)
				}
				require.ErrorContains(t, h.errs[0], tc.says)
			})
		}
	}
}

// The default error handler logs one line when Redis fails, then at most
// one every 10 seconds, saying how many errors it left out.
func TestDefaultErrorHandlerIsQuiet(t *testing.T) {
	var buf bytes.Buffer
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))

	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	mr.Close()
	clk := clock.NewFake(epoch)
	l := ratelimit.New(client, ratelimit.WithClock(clk.Now))
	allow := func(times int) {
		for range times {
			res, err := l.Allow(context.Background(), "id", ratelimit.PerSecond(10))
			require.NoError(t, err)
			require.True(t, res.Degraded)
		}
	}
	allow(100)
	require.Equal(t, 1, strings.Count(buf.String(), "\n"), buf.String())
	require.Contains(t, buf.String(), "errors_not_logged=0")

	clk.Add(9 * time.Second)
	allow(50)
	require.Equal(t, 1, strings.Count(buf.String(), "\n"), "a second line before 10s passed")

	clk.Add(time.Second)
	allow(1)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2)
	require.Contains(t, lines[1], "errors_not_logged=149")
	require.NotContains(t, buf.String(), "id=id", "ids can be secrets and are not logged")
}
