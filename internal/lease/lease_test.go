package lease

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// newTable returns a table whose sweeper never runs and which sends
// nothing: the tests drive Take and Settle by hand.
func newTable(t *testing.T) *Table {
	return New(Config{
		Send:   func(context.Context, []*script.Request, []script.Reply) error { t.Fatal("sent"); return nil },
		Report: func(context.Context, string, error) {},
		Now:    func() int64 { return 0 },
		Go:     func(func()) {},
		Manual: true,
	})
}

// Requests that find a lease short while its refill is in flight ask
// Redis for their need alone: one refill at a time, so that a process
// never holds more than Cap(rate) unused, whatever the number of requests
// in flight. Each used to take a lease of its own.
func TestOneRefillAtATime(t *testing.T) {
	tb := newTable(t)
	const rate = 2000 // Cap 100
	pos := window.Locate(0, 60_000, false, 0, nil)
	ask := func() Ask { return Ask{ID: "hot", Rate: rate, N: 1, Pos: pos, Key: "k"} }
	grow := func(n int) { // leases double while they run out: 1, 2, 4, ...
		for range n {
			asks, grants := []Ask{ask()}, make([]Grant, 1)
			tb.Take(asks, grants, false)
			tb.Settle(asks, grants, []Answer{{Allowed: true}})
			for {
				asks, grants := []Ask{ask()}, make([]Grant, 1)
				tb.Take(asks, grants, false)
				if !grants[0].Local {
					tb.Settle(asks, grants, []Answer{{Allowed: true}})
					break
				}
				tb.Settle(asks, grants, []Answer{{Allowed: true}})
			}
		}
	}
	grow(8)
	_, units := tb.Held()
	require.LessOrEqual(t, units, Cap(rate))
	// Eight requests find the lease empty at once.
	var asks [8][]Ask
	var grants [8][]Grant
	refills := 0
	for i := range asks {
		asks[i], grants[i] = []Ask{ask()}, make([]Grant, 1)
		for {
			tb.Take(asks[i], grants[i], false)
			if !grants[i][0].Local {
				break
			}
			tb.Settle(asks[i], grants[i], []Answer{{Allowed: true}}) // what was left goes first
		}
		if grants[i][0].Most > grants[i][0].Need {
			refills++
		}
	}
	require.Equal(t, 1, refills, "one refill in flight")
	for i := range asks { // Redis grants all they asked
		tb.Settle(asks[i], grants[i], []Answer{{Allowed: true}})
	}
	_, units = tb.Held()
	require.LessOrEqual(t, units, Cap(rate), "unused after the refill lands")
	require.Positive(t, units)
}

// A refill's room leaves out what requests took and have not settled: a
// request that took the lease's last units and may give them back counts
// against the refill.
func TestRefillRoomCountsWhatIsTaken(t *testing.T) {
	tb := newTable(t)
	const rate = 200 // Cap 10
	pos := window.Locate(0, 60_000, false, 0, nil)
	e := tb.entry("hot", pos)
	*e = lease{rate: rate, at: pos, key: "k", left: 6, size: 10}
	taker := []Ask{{ID: "hot", Rate: rate, N: 6, Pos: pos, Key: "k"}}
	takerGrant := make([]Grant, 1)
	tb.Take(taker, takerGrant, false) // all 6, decided here, but held by a request still in flight
	require.True(t, takerGrant[0].Local)
	refill := []Ask{{ID: "hot", Rate: rate, N: 1, Pos: pos, Key: "k"}}
	refillGrant := make([]Grant, 1)
	tb.Take(refill, refillGrant, false)
	require.Equal(t, int64(1), refillGrant[0].Need)
	require.Equal(t, int64(4), refillGrant[0].Most-refillGrant[0].Need, "Cap 10 less the 6 taken")
	tb.Settle(refill, refillGrant, []Answer{{Allowed: true}}) // 3 leased beyond the need (Redis grants half of what is left)
	tb.Settle(taker, takerGrant, []Answer{{Allowed: false}})  // the taker's 6 come back
	_, units := tb.Held()
	require.LessOrEqual(t, units, Cap(rate))
}
