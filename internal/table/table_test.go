package table

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/window"
)

// A flood of distinct ids never grows the table past its bound.
func TestBounded(t *testing.T) {
	t.Parallel()
	table := New(64)
	for i := range 10_000 {
		table.Update("id-"+strconv.Itoa(i), window.Position{W: 1000}, func(Entry, bool) (Entry, bool) {
			return Entry{I: 1, Counts: window.Counts{1}}, true
		})
	}
	require.LessOrEqual(t, table.Size(), 64)
	require.Positive(t, table.Size())
}
