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
// Lua: it knows the script's arguments and reply, sends the script by
// EVALSHA, and by EVAL when the server has lost it (restart, failover,
// SCRIPT FLUSH), which loads it again.
//
//go:embed sliding_window.lua
var slidingWindowSource string

// script is the source and SHA-1 of a script, as command arguments boxed
// once.
type script struct {
	sha, src any
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{sha: hex.EncodeToString(sum[:]), src: src}
}

var (
	// decider is the script for the keys of one slot: one decision, or a
	// batch on a single Redis.
	decider = newScript(slidingWindowSource)
	// crossSlotDecider is the same script declared with
	// allow-cross-slot-keys (Redis 7), for a batch of decisions whose keys
	// are in several slots of one Redis Cluster master.
	crossSlotDecider = newScript("#!lua flags=allow-cross-slot-keys\n" + slidingWindowSource)
)

// ErrBadReply is wrapped by the error returned when the script's reply does
// not have the shape the Limiter expects, say because another program wrote
// a value that is not a count under one of its keys.
var ErrBadReply = errors.New("ratelimit: unexpected reply from Redis")

// request is one request's part of a script call: a cost against one or more
// limits, all of which must admit it. Its numbers are fields so that the
// call's arguments can point to them rather than box copies.
type request struct {
	cost        int64 // 0 looks without counting
	countDenied int64 // 1: a denied request is counted too (WithCountDenied)
	nlimits     int64
	spans       []span
	keys        []string // every span's keys, in order

	allowed bool  // the script's decision, once decoded
	err     error // set when the reply for this request is not a decision
	probe   bool  // the circuit breaker's probe rides in this request
}

// span is one limit of one request: where the clock stands in its windows,
// its arguments to the script, and the counts the script saw.
type span struct {
	at    int // index of the limit in the caller's list
	limit Limit
	pos   position
	// The script's arguments: see sliding_window.lua.
	rate, weight, window, ttl int64
	seen                      counts
}

// newSpan places limit, at index at of the caller's list, at Unix ms now.
func newSpan(at int, limit Limit, now int64) span {
	p := locate(now, limit)
	s := span{at: at, limit: limit, pos: p, rate: limit.Rate}
	if p.subs == 0 {
		s.weight, s.window, s.ttl = p.w-p.e, p.w, 2*p.w
	} else {
		// A sub-window is read until subs sub-windows after its own have
		// passed; two more outlive that from any moment in it.
		s.weight, s.window, s.ttl = p.subs+1, 0, (p.subs+2)*p.w
	}
	return s
}

// callArgs appends the EVALSHA command of sc for reqs to args: the
// arguments point into reqs, which must not move until the call is done. The
// first request's keys are declared as KEYS; with cross set (a batch on a
// Cluster master, whose requests' keys are in several slots) the others go
// in ARGV, where Redis does not check that they share a slot.
func callArgs(args []any, sc *script, reqs []*request, cross bool) []any {
	declared := 0
	for i, r := range reqs {
		if i == 0 || !cross {
			declared += len(r.keys)
		}
	}
	args = append(args, "evalsha", sc.sha, intArg(declared))
	extra := 0
	for i, r := range reqs {
		if i > 0 && cross {
			extra += len(r.keys)
			continue
		}
		for k := range r.keys {
			args = append(args, &r.keys[k])
		}
	}
	args = append(args, intArg(len(reqs)), intArg(extra))
	if extra > 0 {
		for _, r := range reqs[1:] {
			for k := range r.keys {
				args = append(args, &r.keys[k])
			}
		}
	}
	for _, r := range reqs {
		args = append(args, &r.cost, &r.nlimits, &r.countDenied)
		for i := range r.spans {
			s := &r.spans[i]
			args = append(args, &s.rate, &s.weight, &s.window, &s.ttl)
		}
	}
	return args
}

// smallInts are the numbers a call's header most often holds, as command
// arguments boxed once: a string made at each call would be boxed, and
// allocated, at each call.
var smallInts = func() (a [256]any) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// intArg returns n as a command argument.
func intArg(n int) any {
	if n >= 0 && n < len(smallInts) {
		return smallInts[n]
	}
	return strconv.Itoa(n)
}

// decodeReply checks the script's reply to a call for reqs and stores each
// request's decision and each span's counts. A reply of the wrong length
// fails the whole call; a request whose counts are wrong fails alone, in
// its err.
func decodeReply(vals []int64, reqs []*request) error {
	want := 0
	for _, r := range reqs {
		want += 1 + len(r.keys)
	}
	if len(vals) != want {
		return fmt.Errorf("%w: %d values for %d requests, want %d", ErrBadReply, len(vals), len(reqs), want)
	}
	for _, r := range reqs {
		r.allowed, r.err = vals[0] == 1, nil
		if vals[0] != 0 && vals[0] != 1 {
			r.err = fmt.Errorf("%w: allowed flag %d", ErrBadReply, vals[0])
		}
		vals = vals[1:]
		for i := range r.spans {
			s := &r.spans[i]
			n := s.pos.keys()
			for k, c := range vals[:n] {
				if c < 0 && r.err == nil {
					r.err = fmt.Errorf("%w: a key of limit %v holds no count", ErrBadReply, s.limit)
				}
				s.seen[k] = c
			}
			vals = vals[n:]
		}
		if r.err == nil && r.allowed {
			// The script allows only what fits; a reply that says
			// otherwise was not written by it.
			r.err = r.fits()
		}
	}
	return nil
}

// fits reports an error unless every span's counts admit the request's cost.
func (r *request) fits() error {
	for i := range r.spans {
		s := &r.spans[i]
		if s.pos.estimate(&s.seen) > s.limit.Rate-r.cost {
			return fmt.Errorf("%w: allowed at counts %v above rate %d", ErrBadReply, s.seen[:s.pos.keys()], s.limit.Rate)
		}
	}
	return nil
}

// noRetry marks the script's command as one go-redis must not send again
// once it may have reached the server. go-redis retries a command whose
// reply was lost (an EOF, a reset), but the script may have run and counted
// the request: a second run would count it twice. A lost reply becomes a
// failure for the policy to decide instead.
type noRetry struct{ *redis.IntSliceCmd }

// NoRetry tells go-redis not to send the command twice.
func (noRetry) NoRetry() bool { return true }

// eval sends args, an EVALSHA command of sc with its SHA at args[1], and
// EVAL with the source if the server does not have the script. A NOSCRIPT
// reply means the script did not run, so sending it again cannot count
// twice.
func eval(ctx context.Context, c redis.UniversalClient, sc *script, args []any) ([]int64, error) {
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	err := c.Process(ctx, noRetry{cmd})
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", sc.src
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
