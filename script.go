// The script that decides (sliding_window.lua, embedded: the only Lua), and
// a limit's arguments to it. The wire format, the requests and the decoding
// of replies, is internal/script's.

package ratelimit

import (
	_ "embed" // for the script source

	"github.com/slidingwindow/ratelimit/internal/script"
)

// slidingWindowSource is the one script that decides. Only this file speaks
// Lua: it knows the script's arguments and reply, sends the script by
// EVALSHA, and by EVAL when the server has lost it (restart, failover,
// SCRIPT FLUSH), which loads it again.
//
//go:embed sliding_window.lua
var slidingWindowSource string

// newLimitArgs returns the script's arguments for limit placed at p.
func newLimitArgs(limit Limit, p position) script.LimitArgs {
	if p.cal != 0 {
		// One key, counted in full, read until the period ends: from the
		// start of the second the clock is in, so that the requests of one
		// second have one TTL (a batch of them goes in the short form), at
		// most two seconds past the end.
		return script.LimitArgs{Rate: limit.Rate, Weight: 1, Window: 0, TTL: p.end() - floorDiv(p.i+p.e, 1000)*1000 + script.ExpiryMargin}
	}
	if p.subs == 0 {
		// Read until the end of the next window: two windows outlive that
		// from any moment in this one.
		return script.LimitArgs{Rate: limit.Rate, Weight: p.w - p.e, Window: p.w, TTL: 2*p.w + script.Margin(p.w)}
	}
	// A sub-window is read until subs sub-windows after its own have
	// passed; two more outlive that from any moment in it.
	return script.LimitArgs{Rate: limit.Rate, Weight: p.subs + 1, Window: 0, TTL: (p.subs+2)*p.w + script.Margin(p.subs*p.w)}
}
