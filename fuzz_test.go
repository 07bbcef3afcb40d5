package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/keys"
	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/window"
)

// fuzzEscape spells out the documented escaping of ids and prefixes in
// keys: '%', '{' and '}' as %25, %7B and %7D, every other byte as it is.
var fuzzEscape = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// fuzzUnescape undoes fuzzEscape.
var fuzzUnescape = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")

// fuzzHashTag returns what Redis Cluster hashes of key: the bytes between
// the first '{' and the first '}' after it, and whether there is such a
// non-empty tag.
func fuzzHashTag(key string) (string, bool) {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return "", false
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return "", false
	}
	return key[open+1 : open+1+end], true
}

// FuzzKeys checks the keys of a decision against the documented rule
//
//	<prefix>:{<id>}:<window in ms>:<index>
//
// with prefix and id escaped: both keys hash to one Cluster slot by a tag
// that is the escaped id, the id can be read back from the key, and no two
// (prefix, id) pairs share a key.
func FuzzKeys(f *testing.F) {
	for _, s := range []struct {
		id, prefix, id2, prefix2 string
		w, i                     int64
	}{
		{"user", "ratelimit", "user2", "ratelimit", 1000, 1_700_002_800},
		{"a}", "p", "a%7D", "p", 60_000, 0},
		{"{a}", "", "%7Ba%7D", "", 1, -1},
		{"}{", "x{", "}{", "x%7B", 3_600_000, math.MaxInt64},
		{"%", "%", "%25", "%", 7, 1},
		{"a:1000:5", "p:{q}", "a", "p:{q}:1000:5", 1000, 5},
		{"ünï\x00", "\xff", "ünï", "\xff\x00", math.MaxInt64, -math.MaxInt64},
	} {
		f.Add(s.id, s.prefix, s.id2, s.prefix2, s.w, s.i)
	}
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // New does not dial
	f.Cleanup(func() { _ = client.Close() })
	f.Fuzz(func(t *testing.T, id, prefix, id2, prefix2 string, w, i int64) {
		if id == "" || id2 == "" || w < 1 || i == math.MinInt64 {
			t.Skip("not a decision's input: ids are non-empty, windows at least 1ms, and the index has a previous one")
		}
		if len(id) > keys.MaxID || len(id2) > keys.MaxID {
			t.Skip("ids longer than maxIDLength are keyed by a digest: see the LongIDKeys semantic test")
		}
		keys := New(client, WithPrefix(prefix)).keys.Append(nil, id, window.Position{W: w, I: i})
		cur, prev := keys[0], keys[1]

		head := fuzzEscape.Replace(prefix) + ":{" + fuzzEscape.Replace(id) + "}:" + strconv.FormatInt(w, 10) + ":"
		if want := head + strconv.FormatInt(i, 10); cur != want {
			t.Fatalf("current key %q, want %q", cur, want)
		}
		if want := head + strconv.FormatInt(i-1, 10); prev != want {
			t.Fatalf("previous key %q, want %q", prev, want)
		}
		tag, ok := fuzzHashTag(cur)
		if !ok || tag != fuzzEscape.Replace(id) {
			t.Fatalf("hash tag of %q is %q (%v), want the escaped id %q", cur, tag, ok, fuzzEscape.Replace(id))
		}
		if got := fuzzUnescape.Replace(tag); got != id {
			t.Fatalf("id read back from %q is %q, want %q", cur, got, id)
		}
		if prevTag, _ := fuzzHashTag(prev); prevTag != tag {
			t.Fatalf("keys %q and %q have tags %q and %q: two slots", cur, prev, tag, prevTag)
		}

		other := New(client, WithPrefix(prefix2)).keys.Append(nil, id2, window.Position{W: w, I: i})[0]
		if same := id == id2 && prefix == prefix2; same != (cur == other) {
			t.Fatalf("(%q, %q) and (%q, %q): keys %q and %q", prefix, id, prefix2, id2, cur, other)
		}
	})
}

// FuzzDecode checks the one function that judges the script's reply: any
// three integers give a decision or ErrBadReply, never a panic, and a
// decision only for a flag of 0 or 1 and counts that are not negative.
func FuzzDecode(f *testing.F) {
	f.Add(int64(1), int64(0), int64(0))
	f.Add(int64(0), int64(10), int64(5))
	f.Add(int64(7), int64(0), int64(0))
	f.Add(int64(1), int64(-1), int64(0))
	f.Add(int64(-1), int64(math.MaxInt64), int64(math.MinInt64))
	limit := Limit{Rate: math.MaxInt64 / 1000, Window: time.Second}
	f.Fuzz(func(t *testing.T, flag, cur, prev int64) {
		r := &script.Request{Cost: 1, NLimits: 1, Keys: []string{"a", "b"}, Limits: []script.LimitArgs{script.Args(limit.Rate, locate(0, &limit))}}
		out := make([]script.Reply, 1)
		err := script.Decode([]int64{flag, cur, prev}, []*script.Request{r}, out)
		if err != nil {
			t.Fatalf("decodeReply of three values: %v", err)
		}
		rep := out[0]
		valid := (flag == 0 || flag == 1) && cur >= 0 && prev >= 0 && (flag == 0 || cur <= limit.Rate-1-prev)
		switch {
		case valid && rep.Err != nil:
			t.Fatalf("decode(%d, %d, %d): %v", flag, cur, prev, rep.Err)
		case !valid && !errors.Is(rep.Err, ErrBadReply):
			t.Fatalf("decode(%d, %d, %d) = %v, %v, %v; want ErrBadReply", flag, cur, prev, rep.Allowed, rep.Counts, rep.Err)
		case valid && (rep.Allowed != (flag == 1) || !slices.Equal(rep.Counts, []int64{cur, prev})):
			t.Fatalf("decode(%d, %d, %d) = %v, %v", flag, cur, prev, rep.Allowed, rep.Counts)
		}
		if err := script.Decode([]int64{flag, cur}, []*script.Request{r}, out); !errors.Is(err, ErrBadReply) {
			t.Fatalf("a reply of two values: %v, want ErrBadReply", err)
		}
	})
}

// FuzzScriptReply sends arbitrary bytes as the script's reply, from a fake
// server, to a Limiter under each policy. Whatever the bytes, the Limiter
// does not panic and answers within its timeout; an exact reply of three
// valid integers is a decision, and a reply that is not one is decided by
// the policy: Degraded under both, with a nil error under FailOpen and
// ErrUnavailable under FailClosed.
func FuzzScriptReply(f *testing.F) {
	for _, seed := range []string{
		"*3\r\n:1\r\n:0\r\n:0\r\n",
		"*3\r\n:0\r\n:10\r\n:3\r\n",
		"*3\r\n:2\r\n:0\r\n:0\r\n",
		"*3\r\n:1\r\n:-4\r\n:0\r\n",
		"*2\r\n:1\r\n:0\r\n",
		"*3\r\n$1\r\n1\r\n$1\r\n0\r\n$1\r\n0\r\n",
		"*3\r\n*0\r\n:0\r\n:0\r\n",
		"*-1\r\n",
		"$-1\r\n",
		"_\r\n",
		"+OK\r\n",
		"-BUSY Redis is busy running a script\r\n",
		"~3\r\n:1\r\n:0\r\n:0\r\n",
		">3\r\n:1\r\n:0\r\n:0\r\n",
		"|1\r\n+a\r\n+b\r\n*3\r\n:1\r\n:0\r\n:0\r\n",
		"*3\r\n:1\r\n:0\r\n",
		"*3\r\n:1\r\n:99999999999999999999\r\n:0\r\n",
		"",
	} {
		f.Add([]byte(seed))
	}
	const timeout = 20 * time.Millisecond
	limit := Limit{Rate: 10, Window: time.Second}
	f.Fuzz(func(t *testing.T, reply []byte) {
		if fuzzHugeLength(reply) {
			t.Skip("go-redis allocates an announced length before reading it: a huge one is out of any Limiter's hands")
		}
		addr := redistest.Fake(t, map[string]string{"evalsha": string(reply), "eval": string(reply)})
		// decide makes one decision under policy, checks what holds of
		// any decision, and reports whether Redis's part ended in the
		// timeout.
		decide := func(policy FailurePolicy) (res Result, timedOut bool) {
			var redisErr error
			client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
			l := New(client, WithFailurePolicy(policy), WithTimeout(timeout),
				WithClock(clock.NewFake(time.UnixMilli(1_700_002_800_000)).Now),
				WithErrorHandler(func(_ context.Context, _ string, err error) { redisErr = err }))
			begin := time.Now()
			res, err := l.Allow(context.Background(), "id", limit)
			took := time.Since(begin)
			_ = client.Close()
			// The fake server answers at once; only a reply go-redis waits
			// to complete runs into the timeout. The margin is for a
			// loaded machine under -race.
			if took > timeout+2*time.Second {
				t.Fatalf("%v: %v for a decision with a %v timeout", policy, took, timeout)
			}
			switch {
			case policy == FailOpen && err != nil:
				t.Fatalf("FailOpen returned %v", err)
			case policy == FailClosed && res.Degraded != (err != nil):
				t.Fatalf("FailClosed: degraded %v with error %v", res.Degraded, err)
			case err != nil && !errors.Is(err, ErrUnavailable):
				t.Fatalf("FailClosed: %v does not wrap ErrUnavailable", err)
			case res.Degraded && policy == FailOpen && !res.Allowed:
				t.Fatalf("FailOpen denied: %+v", res)
			case !res.Degraded && (res.Count < 0 || res.Remaining != max(0, limit.Rate-res.Count) || res.Allowed && res.RetryAfter != 0):
				t.Fatalf("%v: inconsistent decision %+v", policy, res)
			}
			return Public(res), redisErr != nil && fuzzTimeout(redisErr) // two Limiters: their Results differ in what Refund needs
		}
		flag, cur, prev, canonical := fuzzCanonical(reply)
		// The clock starts a window, so the estimate is cur + prev, and the
		// script allows a request only if it fits the rate.
		fits := prev <= limit.Rate-1 && cur <= limit.Rate-1-prev
		valid := canonical && (flag == 0 || flag == 1 && fits) && cur >= 0 && prev >= 0
		policies := []FailurePolicy{FailOpen, FailClosed}
		results := make([]Result, len(policies))
		timedOut := make([]bool, len(policies))
		for i, policy := range policies {
			results[i], timedOut[i] = decide(policy)
		}
		// A complete reply can miss a 20ms deadline on a loaded machine; one
		// that never completes always does. While a timeout alone keeps a
		// decision from being compared, with the other policy's or with
		// what a valid reply says, it is made again.
		for i, policy := range policies {
			other := results[1-i]
			for try := 0; try < 20 && timedOut[i] && (valid || !other.Degraded); try++ {
				results[i], timedOut[i] = decide(policy)
			}
		}
		decided := map[FailurePolicy]Result{}
		for i, policy := range policies {
			if !results[i].Degraded {
				decided[policy] = results[i]
			}
		}
		if len(decided) == 1 || len(decided) == 2 && decided[FailOpen] != decided[FailClosed] {
			t.Fatalf("the same reply decided differently by policy: %+v", decided)
		}
		if canonical {
			if res, ok := decided[FailOpen]; valid != ok || ok && res.Allowed != (flag == 1) {
				t.Fatalf("reply %q: decision %+v (made: %v)", reply, res, ok)
			}
		}
	})
}

// fuzzTimeout reports whether err says that a reply did not come in time.
func fuzzTimeout(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout()
}

// fuzzCanonical reads reply as exactly "*3" and three RESP integers, and
// nothing more.
func fuzzCanonical(reply []byte) (flag, cur, prev int64, ok bool) {
	if _, err := fmt.Sscanf(string(reply), "*3\r\n:%d\r\n:%d\r\n:%d\r\n", &flag, &cur, &prev); err != nil {
		return 0, 0, 0, false
	}
	return flag, cur, prev, string(reply) == fmt.Sprintf("*3\r\n:%d\r\n:%d\r\n:%d\r\n", flag, cur, prev)
}

// fuzzHugeLength reports whether a line of reply announces a length or count
// above 1<<16.
func fuzzHugeLength(reply []byte) bool {
	for line := range bytes.SplitSeq(reply, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) < 2 || !bytes.ContainsAny(line[:1], "$*%~>=!|") {
			continue
		}
		n, err := strconv.ParseInt(string(line[1:]), 10, 64)
		if err == nil && n > 1<<16 || errors.Is(err, strconv.ErrRange) {
			return true
		}
	}
	return false
}

// FuzzParseLimit checks ParseLimit on any string: it never panics, what it
// accepts is a valid limit with no Name that String prints back to a string
// ParseLimit reads as the same limit, and what it refuses wraps
// ErrInvalidLimit and quotes the input. Limits built from the fields
// String prints round-trip: ParseLimit(l.String()) is l.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{
		"10/1m0s", "10/1s strict shadow leased", "10/1s leased shadow", "1000-H", "5-d strict",
		"", "10", "x/1s", "10/", "10/-1s", "0/1s", "10/1s bogus", "10-X", "99999999999999999999/1s",
		"9007199254740992/1ms", "1/2562047h47m16.854s", "10/1.5s", "3/+1s",
		"1000/1d", "10/s", "5/1d12h", "10/daily", "7/monthly@Europe/Berlin", "7/weekly@UTC", "1/yearly@Nowhere",
	} {
		f.Add(s, int64(10), int64(1000), false, false, false)
	}
	f.Add("", int64(1), int64(1), true, true, true)
	f.Add("", int64(1), int64(math.MaxInt64/int64(time.Millisecond)), true, false, true)
	f.Fuzz(func(t *testing.T, s string, rate, ms int64, strict, shadow, leased bool) {
		l, err := ParseLimit(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidLimit) || !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("ParseLimit(%q): %v: not ErrInvalidLimit quoting the input", s, err)
			}
			if l != (Limit{}) {
				t.Fatalf("ParseLimit(%q) = %v with an error", s, l)
			}
		} else {
			if err := l.Validate(); err != nil || l.Name != "" {
				t.Fatalf("ParseLimit(%q) = %+v: %v", s, l, err)
			}
			// a zone is loaded again: the same by name, not by pointer
			again, err := ParseLimit(l.String())
			if err == nil && window.ZoneName(again.Location) == window.ZoneName(l.Location) {
				again.Location = l.Location
			}
			if err != nil || again != l {
				t.Fatalf("ParseLimit(%q) = %v, whose String %q reads as %+v, %v", s, l, l.String(), again, err)
			}
		}

		if ms < 1 || ms > math.MaxInt64/int64(time.Millisecond) {
			return
		}
		built := Limit{Rate: rate, Window: time.Duration(ms) * time.Millisecond, Strict: strict, Shadow: shadow, Leased: leased}
		if built.Validate() != nil {
			return
		}
		if got, err := ParseLimit(built.String()); err != nil || got != built {
			t.Fatalf("ParseLimit(%q) = %+v, %v; want %+v", built.String(), got, err, built)
		}
	})
}
