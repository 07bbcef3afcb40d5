package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// The Limiter warns once, through its error handler, when a server it uses
// has a memory limit and a policy that evicts live counts; it says nothing
// for noeviction, for no memory limit, and where CONFIG is not granted.
func TestEvictionPolicyWarning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	for _, tc := range []struct {
		maxmemory, policy string
		user              bool // an ACL user without CONFIG
		warns             bool
	}{
		{"20mb", "allkeys-lru", false, true},
		{"20mb", "volatile-ttl", false, true},
		{"20mb", "allkeys-random", false, true},
		{"20mb", "noeviction", false, false},
		{"0", "allkeys-lru", false, false},
		{"20mb", "allkeys-lru", true, false},
	} {
		t.Run(tc.maxmemory+"/"+tc.policy+map[bool]string{true: "/ACL user", false: ""}[tc.user], func(t *testing.T) {
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory", tc.maxmemory).Err())
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err())
			opt := &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}
			if tc.user {
				require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "noconfig", "reset", "on", ">pw", "~*", "+@all", "-config").Err())
				opt.Username, opt.Password = "noconfig", "pw"
			}
			client := redis.NewClient(opt)
			t.Cleanup(func() { _ = client.Close() })
			// Connected first: the look-up's own bound (evictionCheckTimeout,
			// 1 s) then covers one CONFIG GET, not a dial and handshake too
			// on a loaded machine.
			require.NoError(t, client.Ping(ctx).Err())
			var warned []error
			l := New(client)
			l.t.CheckEviction(func(err error) { warned = append(warned, err) }) // what the first call starts, here on the test's goroutine
			if !tc.warns {
				require.Empty(t, warned)
				return
			}
			require.Len(t, warned, 1)
			require.ErrorIs(t, warned[0], ErrEvictionPolicy)
			require.ErrorContains(t, warned[0], tc.policy)
			require.ErrorContains(t, warned[0], srv.Addr)
		})
	}
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "0").Err())
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())

	// Through a Limiter: the first decision starts the look-up, and the
	// handler hears once, with no id. The timeout is long: on a loaded
	// machine the first decision (a dial, NOSCRIPT, then EVAL) can outlast
	// the default 100 ms and go to the failure policy, which is not what
	// this test is about.
	evicting := redistest.Start(t, "--maxmemory", "20mb", "--maxmemory-policy", "allkeys-lru")
	client := evicting.Client(t)
	heard := make(chan error, 10)
	l := New(client, WithTimeout(time.Minute), WithErrorHandler(func(_ context.Context, id string, err error) {
		if id == "" {
			heard <- err
		}
	}))
	for range 5 {
		res, err := l.Allow(ctx, "id", PerMinute(100))
		require.NoError(t, err)
		require.False(t, res.Degraded, "the warning changes no decision")
	}
	select {
	case err := <-heard:
		require.ErrorIs(t, err, ErrEvictionPolicy)
	case <-time.After(10 * time.Second): // waits for the look-up's goroutine, not for time to pass
		t.Fatal("no warning for allkeys-lru")
	}
	require.Empty(t, heard, "one warning per server")
}

// The default error handler logs an eviction warning even when it has just
// logged an error, and says what it is.
func TestDefaultHandlerLogsEvictionWarning(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	h := newLogHandler(time.Now)
	h.handle(context.Background(), "id", errors.New("a Redis failure"))
	h.handle(context.Background(), "", ErrEvictionPolicy)
	require.Contains(t, buf.String(), "a Redis failure")
	require.Contains(t, buf.String(), "ratelimit: Redis may evict live counts")
}

// The default error handler logs one line when Redis fails, then at most
// one every 10 seconds of real time, whatever clock WithClock set, saying
// how many errors it left out, and never the id.
func TestDefaultErrorHandlerIsQuiet(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	frozen := time.Unix(1_700_000_000, 0) // a test's clock that stands still
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	l := New(client, WithClock(func() time.Time { return frozen }))
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	l.onError = newLogHandler(clk.Now).handle // New's, on a real clock the test moves
	allow := func(times int) {
		for range times {
			res, err := l.Allow(context.Background(), "id", PerSecond(10))
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
