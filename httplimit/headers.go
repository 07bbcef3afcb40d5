package httplimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit"
)

// Header names, in the canonical form net/http sends them in (header names
// are case-insensitive: X-Ratelimit-Limit is X-RateLimit-Limit).
const (
	// HeaderLimit is the limit's rate.
	HeaderLimit = "X-Ratelimit-Limit"
	// HeaderRemaining is what is left of the rate after this request.
	HeaderRemaining = "X-Ratelimit-Remaining"
	// HeaderReset is in whole seconds, rounded up: until the count is 0 on an
	// allowed response, until the request would pass on a 429; absent on a
	// 429 that can never pass.
	HeaderReset = "X-Ratelimit-Reset"
	// HeaderPolicy is `"<name>";q=<rate>;w=<window in seconds, rounded up>`.
	HeaderPolicy = "Ratelimit-Policy"
	// HeaderRateLimit is `"<name>";r=<remaining>;t=<as HeaderReset>`, with no
	// t on a 429 that can never pass.
	HeaderRateLimit = "Ratelimit"
	// HeaderRetryAfter is sent on a 429 that a retry can pass: the seconds
	// of HeaderReset, at least 1.
	HeaderRetryAfter = "Retry-After"
)

// policyName returns the name the IETF headers give limit when none was
// chosen: "100-per-60s", or "10-per-500ms" for a window that is not a whole
// number of seconds.
func policyName(limit ratelimit.Limit) string {
	rate := strconv.FormatInt(limit.Rate, 10)
	if limit.Window%time.Second == 0 {
		return rate + "-per-" + strconv.FormatInt(int64(limit.Window/time.Second), 10) + "s"
	}
	return rate + "-per-" + strconv.FormatInt(limit.Window.Milliseconds(), 10) + "ms"
}

// sfString returns name as a Structured Fields String (RFC 9651 §3.3.3):
// quoted, with '"' and '\' escaped and any byte outside printable ASCII,
// which a String cannot hold, replaced with '_'.
func sfString(name string) string {
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

// seconds returns d in whole seconds, rounded up; 0 for d <= 0.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// resetSeconds is the "reset" every header reports, in whole seconds rounded
// up. On a denial that can pass later it is the wait until it would: the
// draft asks that RateLimit's t and Retry-After name the same moment, and a
// client told to wait for the whole window to drain (up to two windows in a
// sliding window) would wait longer than it has to. Otherwise it is the wait
// until the count is 0, when the whole quota is back. A denial that can never
// pass has no such moment and sends no reset (see neverPasses).
func resetSeconds(res ratelimit.Result) int64 {
	if !res.Allowed && res.RetryAfter > 0 {
		return max(1, seconds(res.RetryAfter))
	}
	return seconds(res.ResetAfter)
}

// neverPasses reports a denial that no wait can turn into a pass: its cost
// is above the limit's rate. Any reset sent with it, even the time until the
// count is 0, would tell a client to retry, and it would retry forever.
func neverPasses(res ratelimit.Result) bool {
	return !res.Allowed && res.RetryAfter < 0
}

// setPolicyHeaders sets the headers that describe the limit and need no
// count: X-RateLimit-Limit and RateLimit-Policy.
func setPolicyHeaders(h http.Header, set HeaderSet, p *policy) {
	if set&XRateLimitHeaders != 0 {
		h.Set(HeaderLimit, strconv.FormatInt(p.limit.Rate, 10))
	}
	if set&IETFHeaders != 0 {
		h.Set(HeaderPolicy, p.quoted+";q="+strconv.FormatInt(p.limit.Rate, 10)+
			";w="+strconv.FormatInt(seconds(p.limit.Window), 10))
	}
}

// setHeaders sets every header a decision gives. A Degraded result says
// nothing about the count, so it gets only the policy headers: no made-up
// Remaining or Reset. A denial that can never pass gets Limit, Remaining and
// the policy, and nothing that names a time to retry at: no Reset, no t, no
// Retry-After.
func setHeaders(h http.Header, set HeaderSet, p *policy, res ratelimit.Result) {
	setPolicyHeaders(h, set, p)
	if res.Degraded {
		return
	}
	remaining := strconv.FormatInt(res.Remaining, 10)
	if neverPasses(res) {
		if set&XRateLimitHeaders != 0 {
			h.Set(HeaderRemaining, remaining)
		}
		if set&IETFHeaders != 0 {
			h.Set(HeaderRateLimit, p.quoted+";r="+remaining)
		}
		return
	}
	reset := strconv.FormatInt(resetSeconds(res), 10)
	if set&XRateLimitHeaders != 0 {
		h.Set(HeaderRemaining, remaining)
		h.Set(HeaderReset, reset)
	}
	if set&IETFHeaders != 0 {
		h.Set(HeaderRateLimit, p.quoted+";r="+remaining+";t="+reset)
	}
	if !res.Allowed && res.RetryAfter > 0 {
		h.Set(HeaderRetryAfter, reset)
	}
}
