package local

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/plan"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// A flood of distinct ids never grows FailLocal's table past its bound.
func TestBounded(t *testing.T) {
	t.Parallel()
	local := New(1)
	now := time.Now().UnixMilli()
	for i := range 2 * MaxEntries {
		p := &plan.Plan{
			Spans:   []plan.Span{{ID: strconv.Itoa(i), Rate: 10, Cost: 1, Pos: window.Locate(now, 1000, false, 0, nil)}},
			Replies: make([]script.Reply, 1),
		}
		local.Decide(p)
		require.True(t, p.Replies[0].Allowed)
	}
	require.LessOrEqual(t, local.Size(), MaxEntries)
}

// Ids longer than maxID are kept under a stand-in of bounded length that
// no short id can equal.
func TestLongIDs(t *testing.T) {
	t.Parallel()
	local := New(1)
	long := strings.Repeat("x", maxID+1)
	a, b := local.key(long+"a"), local.key(long+"b")
	require.Len(t, a, maxID+1)
	require.NotEqual(t, a, b)
	require.Equal(t, "short", local.key("short"))
}
