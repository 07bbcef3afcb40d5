package ratelimit

import (
	"context"
	"crypto/sha1"
	_ "embed" // for the script source
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// slidingWindowSource is the one script that decides. Only this file speaks
// Lua: it sends the script by EVALSHA, and by EVAL when the server has lost
// it (restart, failover, SCRIPT FLUSH), which loads it again.
//
//go:embed sliding_window.lua
var slidingWindowSource string

// The script's SHA-1 and source as command arguments, boxed once.
var (
	shaArg    any = scriptSHA(slidingWindowSource)
	sourceArg any = slidingWindowSource
)

func scriptSHA(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// ErrBadReply is wrapped by the error returned when the script's reply does
// not have the shape the Limiter expects, say because another program wrote
// a value that is not a count under one of its keys.
var ErrBadReply = errors.New("ratelimit: unexpected reply from Redis")

// request is one request's part of a script call, against one limit.
type request struct {
	cur, prev                string // keys of the current and previous windows
	cost, rate, window, left int64  // cost 0 looks without writing
}

// counts is what the script saw for one limit, before a request.
type counts struct {
	cur, prev int64
}

// oneCall holds the arguments of an EVALSHA for one request. Arguments point
// into it rather than holding copies, so that a decision allocates them
// once, not once each.
type oneCall struct {
	req  request
	args [10]any
}

// runOne runs the script for one request and decodes its reply: whether the
// request was allowed (and so counted) and the counts it saw.
func runOne(ctx context.Context, c redis.UniversalClient, req request) (bool, counts, error) {
	call := &oneCall{req: req}
	r := &call.req
	call.args = [10]any{"evalsha", shaArg, "2", &r.cur, &r.prev, &r.cost, "1", &r.rate, &r.window, &r.left}
	vals, err := eval(ctx, c, call.args[:])
	if err != nil {
		return false, counts{}, err
	}
	if len(vals) != 3 {
		return false, counts{}, fmt.Errorf("%w: %d values, want 3", ErrBadReply, len(vals))
	}
	return decode(vals)
}

// decode checks one request's part of a reply: {allowed, cur, prev}.
func decode(vals []int64) (bool, counts, error) {
	if vals[0] != 0 && vals[0] != 1 {
		return false, counts{}, fmt.Errorf("%w: allowed flag %d", ErrBadReply, vals[0])
	}
	if vals[1] < 0 || vals[2] < 0 {
		return false, counts{}, fmt.Errorf("%w: negative count (%d, %d)", ErrBadReply, vals[1], vals[2])
	}
	return vals[0] == 1, counts{cur: vals[1], prev: vals[2]}, nil
}

// noRetry marks the script's command as one go-redis must not send again
// once it may have reached the server. go-redis retries a command whose
// reply was lost (an EOF, a reset), but the script may have run and counted
// the request: a second run would count it twice. A lost reply becomes a
// failure for the policy to decide instead.
type noRetry struct{ *redis.IntSliceCmd }

// NoRetry tells go-redis not to send the command twice.
func (noRetry) NoRetry() bool { return true }

// eval sends args, an EVALSHA command with its SHA at args[1], and EVAL with
// the source if the server does not have the script. A NOSCRIPT reply means
// the script did not run, so sending it again cannot count twice.
func eval(ctx context.Context, c redis.UniversalClient, args []any) ([]int64, error) {
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	err := c.Process(ctx, noRetry{cmd})
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", sourceArg
		cmd = redis.NewIntSliceCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		err = c.Process(ctx, noRetry{cmd})
	}
	if err != nil {
		return nil, classify(err)
	}
	return cmd.Val(), nil
}

// classify marks the errors of a reply that go-redis read but could not take
// as an array of integers: a nil, a string, a status. They say the reply was
// of the wrong shape; every other error (the server's, the network's, the
// pool's) passes as it is.
func classify(err error) error {
	var numErr *strconv.NumError
	if errors.Is(err, redis.Nil) || errors.As(err, &numErr) || strings.HasPrefix(err.Error(), "redis: can't parse") {
		return fmt.Errorf("%w: %w", ErrBadReply, err)
	}
	return err
}
