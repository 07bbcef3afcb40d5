package denycache

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// Ids longer than MaxID are not cached.
func TestLongIDs(t *testing.T) {
	t.Parallel()
	c := New(10)
	long := strings.Repeat("x", MaxID+1)
	p := &plan.Plan{
		Spans:   []plan.Span{{ID: long, Rate: 1, Cost: 1, Pos: window.Locate(0, 1000, false, 0, nil), Seen: window.Counts{5}}},
		Replies: make([]script.Reply, 1),
	}
	c.Record(p, 0)
	require.Zero(t, c.Size())
	p.Spans[0].ID = "short"
	c.Record(p, 0)
	require.Equal(t, 1, c.Size(), "a denial of a short id is cached")
}
