// The scripts themselves, embedded, and a limit's arguments to the one that
// decides.

package script

import (
	_ "embed" // for the scripts' sources

	"github.com/slidingwindow/ratelimit/internal/window"
)

// Source is sliding_window.lua, the one script that decides: every
// decision, look, charge and give-back.
//
//go:embed sliding_window.lua
var Source string

// ConcurrencySource is concurrency.lua, the script of concurrency slots:
// acquire, extend, release.
//
//go:embed concurrency.lua
var ConcurrencySource string

// Args returns the script's arguments for a limit of rate placed at p.
func Args(rate int64, p window.Position) LimitArgs {
	switch {
	case p.Period != 0:
		// One key, counted in full, read until the period ends: from the
		// start of the second the clock is in, so that the requests of one
		// second have one TTL (a batch of them goes in the short form), at
		// most two seconds past the end.
		return LimitArgs{Rate: rate, Weight: 1, Window: 0, TTL: p.End() - floorSecond(p.I+p.E) + ExpiryMargin}
	case p.Subs == 0:
		// Read until the end of the next window: two windows outlive that
		// from any moment in this one.
		return LimitArgs{Rate: rate, Weight: p.W - p.E, Window: p.W, TTL: 2*p.W + Margin(p.W)}
	}
	// A sub-window is read until subs sub-windows after its own have
	// passed; two more outlive that from any moment in it.
	return LimitArgs{Rate: rate, Weight: p.Subs + 1, Window: 0, TTL: (p.Subs+2)*p.W + Margin(p.Subs*p.W)}
}

// floorSecond returns Unix ms t rounded down to its second.
func floorSecond(t int64) int64 {
	s := t / 1000
	if t%1000 < 0 {
		s--
	}
	return s * 1000
}
