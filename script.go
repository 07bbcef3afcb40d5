// The script's wire format (requests, arguments, replies) and its call
// through go-redis (EVALSHA, NOSCRIPT, TRYAGAIN).

package ratelimit

import (
	"context"
	"crypto/sha1"
	_ "embed" // for the script source
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/window"
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

// request is what one request asks of the script: a cost against one or
// more limits, all of which must admit it. It is only read once it is
// handed to the transport, and a call's arguments point into it rather
// than box copies of its numbers.
type request struct {
	cost    int64 // 0 looks without counting; below 0 gives back (see giveBack)
	mode    int64 // modeCount, modeCountDenied or modeLease
	nlimits int64
	keys    []string    // every limit's keys, in order
	limits  []limitArgs // one per limit
}

// A request's mode, as the script takes it.
const (
	modeCount       = 0 // an allowed request is counted
	modeCountDenied = 1 // a denied one too, up to each limit's rate (WithCountDenied)
	modeLease       = 2 // each limit counts what it leases: see limitArgs
	modeCharge      = 3 // every limit counts the cost, whatever its counts (Charge)
)

// limitArgs are one limit's arguments to the script: see
// sliding_window.lua. In a request of modeLease, need and most say what the
// limit counts: it admits the request if need fits (need 0: always), and
// then counts granted(need, most, rate, usage); a limit that is not leased has
// both at the request's cost.
type limitArgs struct {
	rate, weight, window, ttl int64
	need, most                int64
}

// granted returns what the script counts for a limit of modeLease that
// admitted need at usage: at most most, at least need, and beyond need at
// most half of what the rate leaves.
func granted(need, most, rate, usage int64) int64 {
	return min(most, max(need, (rate-usage)/2))
}

// giveBack returns a request that lowers each of keys by n, never below 0,
// and creates nothing: see sliding_window.lua.
func giveBack(n int64, keys ...string) *request {
	r := &request{cost: -n, nlimits: int64(len(keys)), keys: keys, limits: make([]limitArgs, len(keys))}
	for i := range r.limits {
		r.limits[i].weight = 1
	}
	return r
}

// expiryMargin, in ms, is how long at most a key outlives the last window
// that reads it, beyond what its TTL needs by the clock that placed it:
// for a decision that reaches Redis a while after it read its clock, and
// for clocks a little apart. It is at most the limit's Window, so that
// short windows keep few keys.
const expiryMargin = 1000

// margin returns expiryMargin for a limit whose Window is window ms.
func margin(window int64) int64 { return min(window, expiryMargin) }

// newLimitArgs returns the script's arguments for limit placed at p.
func newLimitArgs(limit Limit, p position) limitArgs {
	if p.subs == 0 {
		// Read until the end of the next window: two windows outlive that
		// from any moment in this one.
		return limitArgs{rate: limit.Rate, weight: p.w - p.e, window: p.w, ttl: 2*p.w + margin(p.w)}
	}
	// A sub-window is read until subs sub-windows after its own have
	// passed; two more outlive that from any moment in it.
	return limitArgs{rate: limit.Rate, weight: p.subs + 1, window: 0, ttl: (p.subs+2)*p.w + margin(p.subs*p.w)}
}

// nkeys returns how many keys, and counts, the limit has.
func (a *limitArgs) nkeys() int {
	if a.window > 0 {
		return 2
	}
	return int(a.weight)
}

// estimate returns the usage the script decides on for counts c of the
// limit, current first.
func (a *limitArgs) estimate(c []int64) int64 {
	if a.window > 0 {
		return window.Estimate(c[0], c[1], a.window, a.window-a.weight)
	}
	return window.StrictCount(c)
}

// reply is the script's answer to one request, decoded and checked. It is a
// value of its own: nothing in it points into a request or a caller's
// memory.
type reply struct {
	allowed bool
	counts  []int64 // every limit's counts before the request, in key order
	err     error   // not nil: the request was not decided (ErrBadReply)
}

// callArgs appends the EVALSHA command of sc for reqs to args: the
// arguments point into reqs, which must not change until the call is done.
// Requests that each ask one sliding limit, the same for all, with keys
// that do not repeat and denials not counted (the common decision, and a
// batch of them) go in the script's short form, when short says so (see
// shortCall). Otherwise the first request's keys are declared as KEYS; with
// cross set (a batch on a Cluster master, whose requests' keys are in
// several slots) the others go in ARGV, where Redis does not check that
// they share a slot.
func callArgs(args []any, sc *script, reqs []*request, cross, short bool) []any {
	if short {
		args = append(args, "evalsha", sc.sha, intArg(2*len(reqs)))
		for _, r := range reqs {
			args = append(args, &r.keys[0], &r.keys[1])
		}
		a := &reqs[0].limits[0]
		args = append(args, &a.rate, &a.window, &a.ttl)
		for _, r := range reqs {
			args = append(args, &r.cost, &r.limits[0].weight)
		}
		return args
	}
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
	args = append(args, intArg(len(reqs)), intArg(extra), smallInts[0])
	if repeats(reqs) {
		args[len(args)-1] = smallInts[1]
	}
	if extra > 0 {
		for _, r := range reqs[1:] {
			for k := range r.keys {
				args = append(args, &r.keys[k])
			}
		}
	}
	for _, r := range reqs {
		args = append(args, &r.cost, &r.nlimits, smallInts[r.mode])
		for i := range r.limits {
			a := &r.limits[i]
			args = append(args, &a.rate, &a.weight, &a.window, &a.ttl)
			if r.mode == modeLease {
				args = append(args, &a.need, &a.most)
			}
		}
	}
	return args
}

// keySeed hashes keys for repeats.
var keySeed = maphash.MakeSeed()

// repeats reports whether a key appears in more than one of reqs (a
// request's own keys never repeat: its limits' windows differ), so that the
// script must show each request the counts the ones before it wrote; a
// batch of distinct ids spares it that table. Two keys whose 64-bit hashes
// collide count as a repeat, which costs the script a little, never a
// wrong count.
func repeats(reqs []*request) bool {
	if len(reqs) < 2 {
		return false
	}
	n := 0
	for _, r := range reqs {
		n += len(r.keys)
	}
	var small [256]uint64
	set := small[:]
	for len(set) < 2*n {
		set = make([]uint64, 2*len(set))
	}
	mask := uint64(len(set) - 1)
	for _, r := range reqs {
		for _, k := range r.keys {
			h := maphash.String(keySeed, k) | 1 // 0 marks an empty slot
			for j := h & mask; ; j = (j + 1) & mask {
				if set[j] == 0 {
					set[j] = h
					break
				}
				if set[j] == h {
					return true
				}
			}
		}
	}
	return false
}

// callLen returns the length of the command callArgs makes for reqs.
func callLen(reqs []*request, short bool) int {
	if short {
		return 6 + 4*len(reqs)
	}
	n := 6
	for _, r := range reqs {
		_, values := r.callSize()
		n += values
	}
	return n
}

// shortCall reports whether a call of reqs goes in the script's short form:
// each request asks one sliding limit, the same limit for all, with a cost
// of 0 or more (no give-back) and its denial not counted; in a call of
// several, no key repeats (the short form does not show a request what the
// ones before it wrote), and the keys are declared, so are of one slot.
func shortCall(reqs []*request, cross bool) bool {
	for _, r := range reqs {
		if len(r.limits) != 1 || r.mode != modeCount || r.cost < 0 {
			return false
		}
		a, first := &r.limits[0], &reqs[0].limits[0]
		if a.window <= 0 || a.rate != first.rate || a.window != first.window || a.ttl != first.ttl {
			return false
		}
	}
	// The script tells the forms apart by ARGV[3], the long form's 0 or 1
	// and the short form's TTL: see sliding_window.lua (newLimitArgs makes
	// none below 3 ms).
	return reqs[0].limits[0].ttl > 1 && (len(reqs) == 1 || !cross && !repeats(reqs))
}

// callSize returns what a request adds to a call: its keys, and its keys and
// arguments together.
func (r *request) callSize() (keys, values int) {
	perLimit := 4
	if r.mode == modeLease {
		perLimit = 6
	}
	return len(r.keys), len(r.keys) + 3 + perLimit*len(r.limits)
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
// request's reply in out, which has one place per request. A reply of the
// wrong length fails the whole call; a request whose counts are wrong fails
// alone, in its reply's err. The counts of out point into vals.
func decodeReply(vals []int64, reqs []*request, out []reply) error {
	want := 0
	for _, r := range reqs {
		want += 1 + len(r.keys)
	}
	if len(vals) != want {
		return fmt.Errorf("%w: %d values for %d requests, want %d", ErrBadReply, len(vals), len(reqs), want)
	}
	for i, r := range reqs {
		rep := reply{allowed: vals[0] == 1, counts: vals[1 : 1+len(r.keys) : 1+len(r.keys)]}
		refused := vals[0] == refusedCharge && r.mode == modeCharge
		if vals[0] != 0 && vals[0] != 1 && !refused {
			rep.err = fmt.Errorf("%w: allowed flag %d", ErrBadReply, vals[0])
		}
		vals = vals[1+len(r.keys):]
		c := rep.counts
		for j := range r.limits {
			a := &r.limits[j]
			n := a.nkeys()
			for _, v := range c[:n] {
				if v < 0 && rep.err == nil {
					rep.err = fmt.Errorf("%w: a key of limit %v holds no count", ErrBadReply, a.limit())
				}
			}
			// The script allows only what fits; a reply that says
			// otherwise was not written by it.
			need := r.cost
			switch r.mode {
			case modeLease:
				need = a.need
			case modeCharge:
				need = 0 // a charge fits whatever the counts
			}
			if rep.err == nil && rep.allowed && need > 0 && a.estimate(c[:n]) > a.rate-need {
				rep.err = fmt.Errorf("%w: allowed at counts %v above rate %d", ErrBadReply, c[:n], a.rate)
			}
			if rep.err == nil && refused && c[0] > maxCount-r.cost {
				rep.err = fmt.Errorf("%w: charge %d would take the count of limit %v past 2^53 (it holds %d): nothing was counted",
					ErrInvalidCost, r.cost, a.limit(), c[0])
			}
			c = c[n:]
		}
		if rep.err == nil && refused {
			// The script refuses only what would not fit.
			rep.err = fmt.Errorf("%w: a charge of %d refused at counts %v", ErrBadReply, r.cost, rep.counts)
		}
		out[i] = rep
	}
	return nil
}

// maxCount is the most a key holds and still holds a count: the script
// reads counts as Lua numbers (IEEE doubles), exact up to 2^53, and refuses
// a charge (refusedCharge) that would take a key past it; AllowN and every
// other decision refuse a cost above it before Redis is asked.
const maxCount = 1 << 53

// refusedCharge is the flag of the script's reply to a charge that it
// refused: some limit's current count would have gone past maxCount.
const refusedCharge = 2

// limit returns the limit (Rate, Window and Strict) the arguments were made
// from, for messages.
func (a *limitArgs) limit() Limit {
	if a.window > 0 {
		return Limit{Rate: a.rate, Window: time.Duration(a.window) * time.Millisecond}
	}
	subs := a.weight - 1 // see newLimitArgs: ttl = (subs+2)×sub + margin(subs×sub)
	sub := a.ttl / (2*subs + 2)
	if subs*sub > expiryMargin || (2*subs+2)*sub != a.ttl {
		sub = (a.ttl - expiryMargin) / (subs + 2)
	}
	return Limit{Rate: a.rate, Window: time.Duration(subs*sub) * time.Millisecond, Strict: true}
}

// noRetry and noRetryInts mark the script's command as one go-redis must
// not send again once it may have reached the server. go-redis retries a
// command whose reply was lost (an EOF, a reset), but the script may have
// run and counted the request: a second run would count it twice. A lost
// reply becomes a failure for the policy to decide instead. Each holds a
// pointer and nothing else, so that a Cmder of one allocates nothing.
type (
	noRetry     struct{ *redis.Cmd }
	noRetryInts struct{ *redis.IntSliceCmd }
)

// NoRetry tells go-redis not to send the command twice.
func (noRetry) NoRetry() bool { return true }

// NoRetry tells go-redis not to send the command twice.
func (noRetryInts) NoRetry() bool { return true }

// eval sends args, an EVALSHA command of sc with its SHA at args[1], and
// EVAL with the source if the server does not have the script. A NOSCRIPT
// reply means the script did not run, so sending it again cannot count
// twice; so does TRYAGAIN, which eval sends again after a pause (see
// tryAgain). It returns the reply's integers in the long form's layout.
// short is the number of requests of a call in the short form, whose reply
// packs each request in one integer when it can (0 for the long form):
// their flags and counts are unpacked.
func eval(ctx context.Context, c redis.UniversalClient, sc *script, args []any, short int) ([]int64, error) {
	cmd := newScriptCmd(ctx, args, short)
	err := c.Process(ctx, cmd)
	for try := 0; err != nil; try++ {
		if redis.HasErrorPrefix(err, "NOSCRIPT") && args[0] == "evalsha" {
			args[0], args[1] = "eval", sc.src
		} else if !tryAgain(ctx, sc, err, try) {
			break
		}
		cmd = newScriptCmd(ctx, args, short)
		err = c.Process(ctx, cmd)
	}
	if err != nil {
		return nil, classify(err)
	}
	if cmd, ok := cmd.(noRetryInts); ok {
		if short > 1 && len(cmd.Val()) == short {
			return unpackAll(cmd.Val())
		}
		return cmd.Val(), nil
	}
	return unpack(cmd.(noRetry).Val())
}

// Pauses before a script call answered TRYAGAIN goes again: the first, then
// twice as long each time, up to the last. A slot's keys stay split between
// two masters while MIGRATE moves them, a round trip per pipeline of keys
// (10 with redis-cli's default), and a decision whose keys are not all on
// one master is answered TRYAGAIN until they are, or until the slot is the
// target's: milliseconds.
const (
	firstTryAgainPause = 2 * time.Millisecond
	lastTryAgainPause  = 16 * time.Millisecond
	// tryAgainFor bounds the pauses of a call whose ctx has no deadline
	// (a Limiter WithTimeout(0), or a batch of such decisions): the
	// default timeout.
	tryAgainFor = defaultTimeout
)

// tryAgain reports whether a script call of sc that failed with err, try
// times sent again already, goes again, after it has paused for as long as
// try says. Only TRYAGAIN goes again, and only on a call of one slot's keys:
// it is the one reply of the kind that says the script did not run
// (Redis answers it before running a command whose keys a resharding has
// split between two masters) and ends within the Limiter's timeout.
// MOVED and ASK the Cluster client follows itself; it also sends a command
// again on READONLY, from a replica that was its master. LOADING, BUSY,
// MASTERDOWN, CLUSTERDOWN (a master failed, and the cluster waits for the
// node timeout and a vote) last seconds: sent again, a decision would wait
// out its whole timeout for the same reply. A cross-slot batch goes on its
// master's own client, which follows no redirect: refused with TRYAGAIN,
// it goes again at once, each of its decisions alone through the Cluster
// client (batch.go), and each of those calls comes here.
//
// The pause is at most half of what is left until ctx's deadline, so that
// the call sent after it has time to be answered, and there is none once
// that half is below firstTryAgainPause; with no deadline, the pauses add
// up to at most tryAgainFor. It returns false once ctx is done.
func tryAgain(ctx context.Context, sc *script, err error, try int) bool {
	if sc == crossSlotDecider || !redis.HasErrorPrefix(err, "TRYAGAIN") {
		return false
	}
	pause := min(firstTryAgainPause<<min(try, 8), lastTryAgainPause)
	if d, ok := ctx.Deadline(); ok {
		pause = min(pause, time.Until(d)/2)
	} else if time.Duration(try)*lastTryAgainPause >= tryAgainFor {
		// No pause is longer than the last, so the try pauses so far
		// took at most try times it.
		return false
	}
	if pause < firstTryAgainPause {
		return false // too close to the deadline for a pause and a call
	}
	timer := time.NewTimer(pause)
	defer timer.Stop()
	select {
	case <-timer.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// newScriptCmd returns the command of a script call of args: for one short
// request, one that takes an integer or a list; otherwise one that takes a
// list of integers. Neither is sent twice.
func newScriptCmd(ctx context.Context, args []any, short int) redis.Cmder {
	if short == 1 {
		cmd := redis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		return noRetry{cmd}
	}
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return noRetryInts{cmd}
}

// packedCount is the bound of each count a short-form reply packs in one
// integer: (current * packedCount + previous) * 2 + allowed.
const packedCount = 1 << 26

// unpacked appends the flag and the two counts packed in v to vals.
func unpacked(vals []int64, v int64) ([]int64, error) {
	if v < 0 || v >= 2*packedCount*packedCount {
		return nil, fmt.Errorf("%w: %d", ErrBadReply, v)
	}
	return append(vals, v&1, (v>>1)/packedCount, (v>>1)%packedCount), nil
}

// unpackAll returns the integers packed in a short-form reply to a call of
// several requests, one integer per request.
func unpackAll(packed []int64) ([]int64, error) {
	vals := make([]int64, 0, 3*len(packed))
	for _, v := range packed {
		var err error
		if vals, err = unpacked(vals, v); err != nil {
			return nil, err
		}
	}
	return vals, nil
}

// unpack returns the integers of a short-form reply to one request, which
// is one integer or the long form's list.
func unpack(v any) ([]int64, error) {
	switch v := v.(type) {
	case int64:
		return unpacked(make([]int64, 0, 3), v)
	case []any:
		vals := make([]int64, len(v))
		for i, x := range v {
			n, ok := x.(int64)
			if !ok {
				return nil, fmt.Errorf("%w: %v", ErrBadReply, v)
			}
			vals[i] = n
		}
		return vals, nil
	}
	return nil, fmt.Errorf("%w: a %T where a number or a list was due", ErrBadReply, v)
}

// errNoScripting says that the server does not run Lua scripts at all.
var errNoScripting = errors.New("the server does not run Lua scripts (EVALSHA and EVAL are unknown commands), which every decision needs")

// classify marks the errors of a reply that go-redis read but could not take
// as an array of integers (a nil, a string, a status: the reply was of the
// wrong shape), and the error of a server without scripting; every other
// error (the server's, the network's, the pool's) passes as it is.
func classify(err error) error {
	var numErr *strconv.NumError
	var redisErr redis.Error
	switch {
	case errors.Is(err, redis.Nil) || errors.As(err, &numErr) || strings.HasPrefix(err.Error(), "redis: can't parse"):
		return fmt.Errorf("%w: %w", ErrBadReply, err)
	case errors.As(err, &redisErr) && unknownScripting(strings.ToLower(redisErr.Error())):
		return fmt.Errorf("%w: %w", errNoScripting, err)
	}
	return err
}

// unknownScripting reports whether a server's error message, in lower case,
// says that it does not know EVALSHA or EVAL.
func unknownScripting(msg string) bool {
	return strings.Contains(msg, "unknown command") && (strings.Contains(msg, "'evalsha'") || strings.Contains(msg, "'eval'"))
}
