// Package script is the wire format of the script that decides
// (sliding_window.lua, beside it): the requests a decision
// makes, the arguments of their call, and the decoding and checking of its
// reply. It knows no Limiter and no connection: the transport sends what
// it builds.
package script

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/internal/window"
)

// ErrBadReply is the root's ErrBadReply: a reply not of the shape the
// requests asked for.
var ErrBadReply = errors.New("ratelimit: unexpected reply from Redis")

// ErrInvalidCost is the root's ErrInvalidCost: here, a charge the script
// refused because it would take a count past MaxCount.
var ErrInvalidCost = errors.New("ratelimit: invalid cost")

// Script is the source and SHA-1 of a script, as command arguments boxed
// once, whether it was declared for keys of several slots, and whether it
// has a shebang line at all.
type Script struct {
	SHA, Src any
	// Cross marks the script declared with allow-cross-slot-keys (Redis
	// 7), for a batch of decisions whose keys are in several slots of one
	// Redis Cluster master.
	Cross bool
	// Header is the script's first line, "#!lua flags=…", or "" for a
	// script without one.
	Header string
}

// NewScript returns the script of src, declared with flags (the
// engine's: see the root's WithScriptFlags) and, with cross,
// allow-cross-slot-keys: one shebang line of them all, "#!lua
// flags=a,b", or none without any.
func NewScript(src string, cross bool, flags ...string) *Script {
	if cross {
		flags = append(flags[:len(flags):len(flags)], "allow-cross-slot-keys")
	}
	sc := &Script{Cross: cross}
	if len(flags) > 0 {
		sc.Header = "#!lua flags=" + strings.Join(flags, ",")
		src = sc.Header + "\n" + src
	}
	sum := sha1.Sum([]byte(src))
	sc.SHA, sc.Src = hex.EncodeToString(sum[:]), src
	return sc
}

// ValidFlag reports whether flag can stand in a shebang line's list of
// flags: a word of letters, digits, '-' and '_'. Whether the server knows
// it, only the server can tell.
func ValidFlag(flag string) bool {
	for _, r := range flag {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return flag != ""
}

// Request is what one request asks of the script: a cost against one or
// more limits, all of which must admit it. It is only read once it is
// handed to the transport, and a call's arguments point into it rather
// than box copies of its numbers.
type Request struct {
	Cost   int64       // 0 looks without counting; below 0 gives back (see GiveBack)
	Keys   []string    // every limit's keys, in order
	Limits []LimitArgs // one per limit
	// Concurrency is a KindConcurrency request's; nil for the others.
	Concurrency *Concurrency
	// The small fields last, in one word: a decision of one limit sends
	// its request in one allocation of a size class (see the root's
	// oneRequest), which another word would take to the next.
	NLimits uint16 // len(Limits); at most 16 but for a give-back's
	Mode    uint8  // ModeCount, ModeCountDenied, ModeLease or ModeCharge
	Kind    Kind   // the command that carries it: KindWindow unless set
}

// A request's mode, as the script takes it.
const (
	ModeCount       = 0 // an allowed request is counted
	ModeCountDenied = 1 // a denied one too, up to each limit's rate (WithCountDenied)
	ModeLease       = 2 // each limit counts what it leases: see LimitArgs
	ModeCharge      = 3 // every limit counts the cost, whatever its counts (Charge)
)

// LimitArgs are one limit's arguments to the script: see
// sliding_window.lua. In a request of ModeLease, Need and Most say what the
// limit counts: it admits the request if Need fits (0: always), and
// then counts Granted(Need, Most, Rate, usage); a limit that is not leased has
// both at the request's cost.
type LimitArgs struct {
	Rate, Weight, Window, TTL int64
	Need, Most                int64
}

// Granted returns what the script counts for a limit of ModeLease that
// admitted need at usage: at most most, at least need, and beyond need at
// most half of what the rate leaves.
func Granted(need, most, rate, usage int64) int64 {
	return min(most, max(need, (rate-usage)/2))
}

// GiveBack returns a request that lowers each of keys by n, never below 0,
// and creates nothing: see sliding_window.lua.
func GiveBack(n int64, keys ...string) *Request {
	r := &Request{Cost: -n, NLimits: uint16(len(keys)), Keys: keys, Limits: make([]LimitArgs, len(keys))}
	for i := range r.Limits {
		r.Limits[i].Weight = 1
	}
	return r
}

// ExpiryMargin, in ms, is how long at most a key outlives the last window
// that reads it, beyond what its TTL needs by the clock that placed it:
// for a decision that reaches Redis a while after it read its clock, and
// for clocks a little apart. It is at most the limit's Window, so that
// short windows keep few keys.
const ExpiryMargin = 1000

// Margin returns expiryMargin for a limit whose Window is window ms.
func Margin(window int64) int64 { return min(window, ExpiryMargin) }

// NKeys returns how many keys, and counts, the limit has.
func (a *LimitArgs) NKeys() int {
	if a.Window > 0 {
		return 2
	}
	return int(a.Weight)
}

// Estimate returns the usage the script decides on for counts c of the
// limit, current first.
func (a *LimitArgs) Estimate(c []int64) int64 {
	if a.Window > 0 {
		return window.Estimate(c[0], c[1], a.Window, a.Window-a.Weight)
	}
	return window.StrictCount(c)
}

// Reply is the script's answer to one request, decoded and checked. It is a
// value of its own: nothing in it points into a request or a caller's
// memory.
type Reply struct {
	Allowed bool
	Counts  []int64 // every limit's counts before the request, in key order
	Err     error   // not nil: the request was not decided (ErrBadReply)
}

// AppendCall appends the EVALSHA command of sc for reqs to args: the
// arguments point into reqs, which must not change until the call is done.
// Requests that each ask one sliding limit, the same for all, with keys
// that do not repeat and denials not counted (the common decision, and a
// batch of them) go in the script's short form, when short says so (see
// ShortCall). Otherwise the first request's keys are declared as KEYS; with
// cross set (a batch on a Cluster master, whose requests' keys are in
// several slots) the others go in ARGV, where Redis does not check that
// they share a slot.
func AppendCall(args []any, sc *Script, reqs []*Request, cross, short bool) []any {
	if short {
		args = append(args, "evalsha", sc.SHA, intArg(len(reqs[0].Keys)*len(reqs)))
		for _, r := range reqs {
			for k := range r.Keys {
				args = append(args, &r.Keys[k])
			}
		}
		a := &reqs[0].Limits[0]
		args = append(args, &a.Rate, &a.Window, &a.TTL)
		for _, r := range reqs {
			args = append(args, &r.Cost, &r.Limits[0].Weight)
		}
		return args
	}
	declared := 0
	for i, r := range reqs {
		if i == 0 || !cross {
			declared += len(r.Keys)
		}
	}
	args = append(args, "evalsha", sc.SHA, intArg(declared))
	extra := 0
	for i, r := range reqs {
		if i > 0 && cross {
			extra += len(r.Keys)
			continue
		}
		for k := range r.Keys {
			args = append(args, &r.Keys[k])
		}
	}
	args = append(args, intArg(len(reqs)), intArg(extra), smallInts[0])
	if Repeats(reqs) {
		args[len(args)-1] = smallInts[1]
	}
	if extra > 0 {
		for _, r := range reqs[1:] {
			for k := range r.Keys {
				args = append(args, &r.Keys[k])
			}
		}
	}
	for _, r := range reqs {
		args = append(args, &r.Cost, intArg(int(r.NLimits)), smallInts[r.Mode])
		for i := range r.Limits {
			a := &r.Limits[i]
			args = append(args, &a.Rate, &a.Weight, &a.Window, &a.TTL)
			if r.Mode == ModeLease {
				args = append(args, &a.Need, &a.Most)
			}
		}
	}
	return args
}

// keySeed hashes keys for repeats.
var keySeed = maphash.MakeSeed()

// Repeats reports whether a key appears in more than one of reqs (a
// request's own keys never repeat: its limits' windows differ), so that the
// script must show each request the counts the ones before it wrote; a
// batch of distinct ids spares it that table. Two keys whose 64-bit hashes
// collide count as a repeat, which costs the script a little, never a
// wrong count.
func Repeats(reqs []*Request) bool {
	if len(reqs) < 2 {
		return false
	}
	n := 0
	for _, r := range reqs {
		n += len(r.Keys)
	}
	var small [256]uint64
	set := small[:]
	for len(set) < 2*n {
		set = make([]uint64, 2*len(set))
	}
	mask := uint64(len(set) - 1)
	for _, r := range reqs {
		for _, k := range r.Keys {
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

// CallLen returns the length of the command callArgs makes for reqs.
func CallLen(reqs []*Request, short bool) int {
	if short {
		return 6 + (2+len(reqs[0].Keys))*len(reqs)
	}
	n := 6
	for _, r := range reqs {
		_, values := r.CallSize()
		n += values
	}
	return n
}

// ShortCall reports whether a call of reqs goes in the script's short form:
// each request asks one sliding limit, or one calendar period (one key,
// counted in full), the same limit for all, with a cost
// of 0 or more (no give-back) and its denial not counted; in a call of
// several, no key repeats (the short form does not show a request what the
// ones before it wrote), and the keys are declared, so are of one slot.
func ShortCall(reqs []*Request, cross bool) bool {
	for _, r := range reqs {
		if len(r.Limits) != 1 || r.Mode != ModeCount || r.Cost < 0 {
			return false
		}
		a, first := &r.Limits[0], &reqs[0].Limits[0]
		oneKey := a.Window == 0 && a.Weight == 1 // a calendar period's
		if a.Window <= 0 && !oneKey || a.Rate != first.Rate || a.Window != first.Window || a.TTL != first.TTL {
			return false
		}
	}
	// The script tells the forms apart by ARGV[3], the long form's 0 or 1
	// and the short form's TTL: see sliding_window.lua (newLimitArgs makes
	// none below 3 ms).
	return reqs[0].Limits[0].TTL > 1 && (len(reqs) == 1 || !cross && !Repeats(reqs))
}

// CallSize returns what a request adds to a call: its keys, and its keys and
// arguments together.
func (r *Request) CallSize() (keys, values int) {
	perLimit := 4
	if r.Mode == ModeLease {
		perLimit = 6
	}
	return len(r.Keys), len(r.Keys) + 3 + perLimit*len(r.Limits)
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

// Decode checks the script's reply to a call for reqs and stores each
// request's reply in out, which has one place per request. A reply of the
// wrong length fails the whole call; a request whose counts are wrong fails
// alone, in its reply's err. The counts of out point into vals.
func Decode(vals []int64, reqs []*Request, out []Reply) error {
	want := 0
	for _, r := range reqs {
		want += 1 + len(r.Keys)
	}
	if len(vals) != want {
		return fmt.Errorf("%w: %d values for %d requests, want %d", ErrBadReply, len(vals), len(reqs), want)
	}
	for i, r := range reqs {
		rep := Reply{Allowed: vals[0] == 1, Counts: vals[1 : 1+len(r.Keys) : 1+len(r.Keys)]}
		refused := vals[0] == RefusedCharge && r.Mode == ModeCharge
		if vals[0] != 0 && vals[0] != 1 && !refused {
			rep.Err = fmt.Errorf("%w: allowed flag %d", ErrBadReply, vals[0])
		}
		vals = vals[1+len(r.Keys):]
		c := rep.Counts
		for j := range r.Limits {
			a := &r.Limits[j]
			n := a.NKeys()
			for _, v := range c[:n] {
				if v < 0 && rep.Err == nil {
					rep.Err = fmt.Errorf("%w: a key of limit %v holds no count", ErrBadReply, a)
				}
			}
			// The script allows only what fits; a reply that says
			// otherwise was not written by it.
			need := r.Cost
			switch r.Mode {
			case ModeLease:
				need = a.Need
			case ModeCharge:
				need = 0 // a charge fits whatever the counts
			}
			if rep.Err == nil && rep.Allowed && need > 0 && a.Estimate(c[:n]) > a.Rate-need {
				rep.Err = fmt.Errorf("%w: allowed at counts %v above rate %d", ErrBadReply, c[:n], a.Rate)
			}
			if rep.Err == nil && refused && c[0] > MaxCount-r.Cost {
				rep.Err = fmt.Errorf("%w: charge %d would take the count of limit %v past 2^53 (it holds %d): nothing was counted",
					ErrInvalidCost, r.Cost, a, c[0])
			}
			c = c[n:]
		}
		if rep.Err == nil && refused {
			// The script refuses only what would not fit.
			rep.Err = fmt.Errorf("%w: a charge of %d refused at counts %v", ErrBadReply, r.Cost, rep.Counts)
		}
		out[i] = rep
	}
	return nil
}

// MaxCount is the most a key holds and still holds a count: the script
// reads counts as Lua numbers (IEEE doubles), exact up to 2^53, and refuses
// a charge (refusedCharge) that would take a key past it; AllowN and every
// other decision refuse a cost above it before Redis is asked.
const MaxCount = 1 << 53

// RefusedCharge is the flag of the script's reply to a charge that it
// refused: some limit's current count would have gone past maxCount.
const RefusedCharge = 2

// String names the limit (Rate, Window and Strict) the arguments were made
// from, for messages, as the root's Limit.String does: "10/1s", "10/1s
// strict"; "10/period" for a calendar limit's.
func (a *LimitArgs) String() string {
	if a.Window > 0 {
		return fmt.Sprintf("%d/%v", a.Rate, time.Duration(a.Window)*time.Millisecond)
	}
	if a.Weight == 1 {
		return fmt.Sprintf("%d/period", a.Rate)
	}
	subs := a.Weight - 1 // see the root's newLimitArgs: TTL = (subs+2)×sub + Margin(subs×sub)
	sub := a.TTL / (2*subs + 2)
	if subs*sub > ExpiryMargin || (2*subs+2)*sub != a.TTL {
		sub = (a.TTL - ExpiryMargin) / (subs + 2)
	}
	return fmt.Sprintf("%d/%v strict", a.Rate, time.Duration(subs*sub)*time.Millisecond)
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

// UnpackAll returns the integers packed in a short-form reply to a call of
// several requests, one integer per request.
func UnpackAll(packed []int64) ([]int64, error) {
	vals := make([]int64, 0, 3*len(packed))
	for _, v := range packed {
		var err error
		if vals, err = unpacked(vals, v); err != nil {
			return nil, err
		}
	}
	return vals, nil
}

// OneKey returns vals, the integers of a short-form reply in the layout of
// two keys per request, for requests of one key each (calendar periods),
// whose second count the script reports as 0: it drops it.
func OneKey(vals []int64) ([]int64, error) {
	if len(vals)%3 != 0 {
		return nil, fmt.Errorf("%w: %d values for requests of one key", ErrBadReply, len(vals))
	}
	out := vals[:0]
	for i := 0; i < len(vals); i += 3 {
		if vals[i+2] != 0 {
			return nil, fmt.Errorf("%w: a second count %d for a request of one key", ErrBadReply, vals[i+2])
		}
		out = append(out, vals[i], vals[i+1])
	}
	return out, nil
}

// Unpack returns the integers of a short-form reply to one request, which
// is one integer or the long form's list.
func Unpack(v any) ([]int64, error) {
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
