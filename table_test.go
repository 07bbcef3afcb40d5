package ratelimit

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/stretchr/testify/require"
)

// A flood of distinct ids never grows the in-process tables past their
// bound.
func TestWindowTableBounded(t *testing.T) {
	t.Parallel()
	table := newWindowTable(64)
	for i := range 10_000 {
		table.update("id-"+strconv.Itoa(i), position{w: 1000}, func(windowEntry, bool) (windowEntry, bool) {
			return windowEntry{i: 1, counts: counts{1}}, true
		})
	}
	require.LessOrEqual(t, table.size(), 64)
	require.Positive(t, table.size())

	local := newLocalWindows(1)
	l := &Limiter{keyPrefix: keyPrefixFor("t")}
	for i := range 2 * maxLocalEntries {
		d := &decision{cost: 1, limits: []Limit{PerSecond(10)}, results: make([]Result, 1)}
		l.build(d, "id", time.Now().UnixMilli())
		local.decide(strconv.Itoa(i), d)
		require.True(t, d.allowed)
	}
	require.LessOrEqual(t, local.table.size(), maxLocalEntries)
}

// Ids longer than maxCachedID are not cached by the deny cache, and are
// kept by FailLocal under a stand-in of bounded length that no short id can
// equal.
func TestLongIDs(t *testing.T) {
	t.Parallel()
	c := newDenyCache(10)
	long := strings.Repeat("x", maxCachedID+1)
	d := &decision{cost: 1, limits: []Limit{PerSecond(1)}}
	(&Limiter{keyPrefix: keyPrefixFor("t")}).build(d, long, 0)
	d.spans[0].seen = counts{5}
	d.replies[0] = script.Reply{}
	c.record(long, d)
	require.Zero(t, c.table.size())

	local := newLocalWindows(1)
	a, b := local.key(long+"a"), local.key(long+"b")
	require.Len(t, a, maxCachedID+1)
	require.NotEqual(t, a, b)
	require.Equal(t, "short", local.key("short"))
}
