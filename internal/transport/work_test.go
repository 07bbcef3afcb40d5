package transport

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/script"
)

// Each Transport counts its own goroutines, whatever another does at once
// (their watched calls share one pool), and its group empties with nothing of
// its own running.
func TestEachTransportCountsItsGoroutines(t *testing.T) {
	var trs [2]*Transport
	for i := range trs {
		mr := miniredis.RunT(t)
		// go-redis's default client: each call with a deadline is watched
		// from a goroutine of its own.
		trs[i] = newTestTransport(t, redis.NewClient(&redis.Options{Addr: mr.Addr()}), func(c *Config) { c.MaxBatch = 1 })
	}
	var wg sync.WaitGroup
	for g := range 8 {
		tr := trs[g%2]
		wg.Go(func() {
			for i := range 200 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				out := make([]script.Reply, 1)
				err := tr.Do(ctx, []*script.Request{oneRequest(fmt.Sprint("id", g, i), 1000)}, out)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i, tr := range trs {
		require.NoError(t, tr.work.Wait(context.Background()), "transport %d", i)
		require.False(t, tr.work.Busy(), "transport %d: nothing counted runs", i)
	}
}
