package transport

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// countingHook counts the commands it sees, and may wrap their ctx, as a
// tracing hook does with its span.
type countingHook struct {
	n    atomic.Int64
	wrap bool
}

type hookKey struct{}

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		if h.wrap {
			ctx = context.WithValue(ctx, hookKey{}, "span")
		}
		return next(ctx, cmd)
	}
}

func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A copy of a client made with Client.WithTimeout has none of its hooks
// (go-redis v9.23): the routing hook relies on it, as a copy that had it
// would send the Limiter's commands to itself for ever. A go-redis that
// copies hooks fails here first.
func TestCopiesHaveNoHooks(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	var h countingHook
	c.AddHook(&h)
	require.NoError(t, c.WithTimeout(time.Second).Ping(context.Background()).Err())
	require.Zero(t, h.n.Load())
	require.NoError(t, c.Ping(context.Background()).Err())
	require.Equal(t, int64(1), h.n.Load())
}

// On go-redis's default client a call is bounded by its socket's deadlines
// (the copy with the Limiter's timeout), on its caller's goroutine, and
// the hooks the client had at the first call see it: a hook that wraps the
// call's ctx, as a tracing one does, neither hides the copy (a server that
// never answers, with the client's ReadTimeout 10 s: the call ends about
// the timeout) nor is passed over.
func TestRoutedThroughHooks(t *testing.T) {
	addr := redistest.Silent(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 10 * time.Second, MaxRetries: -1})
	h := &countingHook{wrap: true}
	c.AddHook(h)
	tr := newTestTransport(t, c, func(cfg *Config) { cfg.Timeout = 100 * time.Millisecond; cfg.BreakerFailures = 0 })
	require.NotNil(t, tr.timed, "go-redis's default client gets socket deadlines")
	begin := time.Now()
	err := tr.Do(context.Background(), []*script.Request{oneRequest("a", 10)}, make([]script.Reply, 1))
	took := time.Since(begin)
	require.ErrorContains(t, err, "no reply within 100ms")
	require.Less(t, took, 5*time.Second, "the Limiter's timeout, not the client's ReadTimeout")
	require.Equal(t, int64(1), h.n.Load(), "the hook saw the call")
	require.False(t, tr.work.Busy(), "on the caller's goroutine: no goroutine of the transport's")
}
