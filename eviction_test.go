package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
// has a memory limit and a policy that evicts live counts: the first
// decision starts the look-up, and the handler hears once, with no id.
// Which policies warn, and that a server without CONFIG stays silent, is
// internal/transport's TestEvictionPolicyWarning.
func TestEvictionPolicyWarning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	evicting := redistest.Start(t, "--maxmemory", "20mb", "--maxmemory-policy", "allkeys-lru")
	client := evicting.Client(t)
	heard := make(chan error, 10)
	l := New(client, WithTimeout(time.Minute), // a loaded machine must not turn a decision into a policy one
		WithErrorHandler(func(_ context.Context, id string, err error) {
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
	h.Handle(context.Background(), "id", errors.New("a Redis failure"))
	h.Handle(context.Background(), "", ErrEvictionPolicy)
	require.Contains(t, buf.String(), "a Redis failure")
	require.Contains(t, buf.String(), `msg="ratelimit: Redis may evict live counts"`)

	// a server that refuses the scripts is not an outage the failure policy decided
	buf.Reset()
	h = newLogHandler(time.Now)
	h.Handle(context.Background(), "", fmt.Errorf("%w: NOPERM", ErrMisconfigured))
	require.Contains(t, buf.String(), "every call fails until it is reconfigured")
	require.NotContains(t, buf.String(), "the failure policy decided")
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
	l.onError = newLogHandler(clk.Now).Handle // New's, on a real clock the test moves
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
