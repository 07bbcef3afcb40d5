// Package headers holds what httplimit and grpclimit say alike about a
// decision in their headers and metadata: a policy's name, Structured
// Fields strings, and the seconds a client is told to wait.
package headers

import (
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit"
)

// PolicyName returns the name the headers give limit when none was chosen:
// "100-per-60s", or "10-per-500ms" for a window that is not a whole number
// of seconds.
func PolicyName(limit ratelimit.Limit) string {
	rate := strconv.FormatInt(limit.Rate, 10)
	if limit.Window%time.Second == 0 {
		return rate + "-per-" + strconv.FormatInt(int64(limit.Window/time.Second), 10) + "s"
	}
	return rate + "-per-" + strconv.FormatInt(limit.Window.Milliseconds(), 10) + "ms"
}

// SFString returns name as a Structured Fields String (RFC 9651 §3.3.3):
// quoted, with '"' and '\' escaped and any byte outside printable ASCII,
// which neither a String nor a gRPC metadata value can hold, replaced with
// '_'.
func SFString(name string) string {
	var b strings.Builder
	b.Grow(len(name) + 2)
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Seconds returns d in whole seconds, rounded up; 0 for d <= 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ResetSeconds is the "reset" every header reports, in whole seconds rounded
// up. On a denial that can pass later it is the wait until it would: the
// IETF draft asks that RateLimit's t and Retry-After name the same moment,
// and a client told to wait for the whole window to drain (up to two
// windows in a sliding window) would wait longer than it has to. Otherwise
// it is the wait until the count is 0, when the whole quota is back. A
// denial that can never pass has no such moment and sends no reset (see
// NeverPasses).
func ResetSeconds(res ratelimit.Result) int64 {
	if !res.Allowed && res.RetryAfter > 0 {
		return max(1, Seconds(res.RetryAfter))
	}
	return Seconds(res.ResetAfter)
}

// NeverPasses reports a denial that no wait can turn into a pass: its cost
// is above the limit's rate. Any reset sent with it, even the time until the
// count is 0, would tell a client to retry, and it would retry forever.
func NeverPasses(res ratelimit.Result) bool {
	return !res.Allowed && res.RetryAfter < 0
}
