package ratelimit

import (
	"context"
	_ "embed" // for the script source
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed sliding_window.lua
var slidingWindowSource string

// slidingWindow is the one script that decides; Run sends it by EVALSHA and
// falls back to EVAL when the server has lost it (restart, failover, SCRIPT
// FLUSH), which loads it again.
var slidingWindow = redis.NewScript(slidingWindowSource)

// ErrBadReply is wrapped by the error returned when the script's reply does
// not have the shape the Limiter expects, say because another program wrote
// a value that is not a count under one of its keys.
var ErrBadReply = errors.New("ratelimit: unexpected reply from Redis")

// counts is what the script saw for one limit, before this request.
type counts struct {
	cur, prev int64
}

// runScript runs the script for one limit and decodes its reply: whether the
// request was allowed (and so written) and the counts seen before it. cost 0
// looks without writing.
func runScript(ctx context.Context, c redis.Scripter, cur, prev string, limit Limit, left, cost int64) (bool, counts, error) {
	cmd := slidingWindow.Run(ctx, c, []string{cur, prev},
		cost, limit.Rate, limit.Window.Milliseconds(), left)
	if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return false, counts{}, err
	}
	vals, err := cmd.Int64Slice()
	if err != nil {
		return false, counts{}, fmt.Errorf("%w: %v", ErrBadReply, err)
	}
	return decodeReply(vals)
}

// decodeReply checks the shape of the script's reply, {allowed, cur, prev}.
func decodeReply(vals []int64) (bool, counts, error) {
	if len(vals) != 3 {
		return false, counts{}, fmt.Errorf("%w: %d values, want 3", ErrBadReply, len(vals))
	}
	if vals[0] != 0 && vals[0] != 1 {
		return false, counts{}, fmt.Errorf("%w: allowed flag %d", ErrBadReply, vals[0])
	}
	if vals[1] < 0 || vals[2] < 0 {
		return false, counts{}, fmt.Errorf("%w: negative count (%d, %d)", ErrBadReply, vals[1], vals[2])
	}
	return vals[0] == 1, counts{cur: vals[1], prev: vals[2]}, nil
}
