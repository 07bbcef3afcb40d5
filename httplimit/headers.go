package httplimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit"
)

// Header names, in the canonical form net/http sends them in (header names
// are case-insensitive: X-Ratelimit-Limit is X-RateLimit-Limit). With
// several limits, RateLimit-Policy and RateLimit list each enforced limit,
// in the plan's order, and the X-RateLimit headers and Retry-After describe
// the binding one (FromContext's Result). Shadow limits, and decisions that
// shadow mode let through, send none of them.
const (
	// HeaderLimit is the binding limit's rate.
	HeaderLimit = "X-Ratelimit-Limit"
	// HeaderRemaining is what is left of the binding limit's rate after this
	// request.
	HeaderRemaining = "X-Ratelimit-Remaining"
	// HeaderReset is in whole seconds, rounded up (ResetSeconds): until the
	// binding limit's count is 0 on an allowed response, until the request
	// would pass on a 429; absent on a 429 that can never pass.
	HeaderReset = "X-Ratelimit-Reset"
	// HeaderPolicy is `"<name>";q=<rate>;w=<window in seconds, rounded up>`
	// for each enforced limit, separated by ", ", the name as PolicyName
	// gives it; a Calendar limit's w is the length of the period the
	// decision fell in (see Plan.PoliciesAt), and its t in HeaderRateLimit
	// the seconds to that period's end.
	HeaderPolicy = "Ratelimit-Policy"
	// HeaderRateLimit is `"<name>";r=<remaining>;t=<seconds>` for each
	// enforced limit, separated by ", ": on a 429, t is HeaderReset's for
	// that limit's own count or wait, and there is none on a 429 that can
	// never pass; on an allowed response, the seconds until r next grows
	// (ratelimit.Result.RefillAfter), so that a client spending r within t
	// is never told to wait longer than it must (see Plan.RateLimits).
	HeaderRateLimit = "Ratelimit"
	// HeaderRetryAfter is sent on a 429 that a retry can pass: the seconds
	// of HeaderReset, at least 1.
	HeaderRetryAfter = "Retry-After"
)

// PolicyName returns limit's name as RateLimit-Policy and RateLimit send
// it, a Structured Fields String (RFC 9651), quotes included: "burst" for a
// Limit named burst, and for one with no Name a name derived from it,
// "100-per-60s", or "10-per-500ms" for a window that is not a whole number
// of seconds, "10000-per-day" or "1000-per-month@Europe/Berlin" for a
// Calendar limit. '"' and '\' are escaped, and bytes outside printable ASCII
// (which neither a String nor a gRPC metadata value can hold) are sent as
// '_'. Use it to find a limit's items in those headers; grpclimit's
// ratelimit-policy and ratelimit metadata name limits the same way.
func PolicyName(limit ratelimit.Limit) string {
	name := limit.Name
	if name == "" {
		name = derivedName(limit)
	}
	return sfString(name)
}

// ResetSeconds returns the seconds the headers name as res's reset:
// X-RateLimit-Reset, Retry-After on a denial, and RateLimit's t but on an
// allowed response (see Plan.RateLimits). They are whole seconds, rounded
// up. On a denial that a retry can pass it is the
// wait until it would, at least 1: the IETF draft asks that t and
// Retry-After name the same moment, and a client told to wait until the
// window drains (up to two windows, in a sliding window) would wait longer
// than it has to. Otherwise it is the wait until the count is 0, when the
// whole quota is back. A denial that can never pass (RetryAfter is
// ratelimit.InfDuration) has no such moment, and the headers send no reset
// for it; ResetSeconds gives the wait until its count is 0. grpclimit's
// metadata carries the same seconds.
func ResetSeconds(res ratelimit.Result) int64 {
	if !res.Allowed && res.RetryAfter > 0 && res.RetryAfter != ratelimit.InfDuration {
		return max(1, seconds(res.RetryAfter))
	}
	return seconds(res.ResetAfter)
}

// derivedName is the name of a limit that has none: "100-per-60s", or
// "10-per-500ms" for a window that is not a whole number of seconds; for a
// Calendar limit "10000-per-day" in UTC, "1000-per-month@Europe/Berlin" in
// another zone.
func derivedName(limit ratelimit.Limit) string {
	rate := strconv.FormatInt(limit.Rate, 10)
	if limit.Calendar != 0 {
		unit := map[ratelimit.Period]string{ratelimit.Daily: "day", ratelimit.Weekly: "week", ratelimit.Monthly: "month", ratelimit.Yearly: "year"}[limit.Calendar]
		name := rate + "-per-" + unit
		if zone := limit.Location.String(); zone != "UTC" {
			name += "@" + zone
		}
		return name
	}
	if limit.Window%time.Second == 0 {
		return rate + "-per-" + strconv.FormatInt(int64(limit.Window/time.Second), 10) + "s"
	}
	return rate + "-per-" + strconv.FormatInt(limit.Window.Milliseconds(), 10) + "ms"
}

// sfString returns name as a Structured Fields String (RFC 9651 §3.3.3):
// quoted, with '"' and '\' escaped and any byte outside printable ASCII
// replaced with '_'.
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

// seconds returns d in whole seconds, rounded up; 0 for d <= 0. It rounds
// without adding, which would wrap for d near math.MaxInt64.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// neverPasses reports a denial that no wait can turn into a pass: its cost
// is above the limit's rate. Any reset sent with it, even the time until the
// count is 0, would tell a client to retry, and it would retry forever.
func neverPasses(res ratelimit.Result) bool {
	return !res.Allowed && res.RetryAfter == ratelimit.InfDuration
}

// setPolicyHeaders sets the headers that describe the policies and need no
// count: X-RateLimit-Limit, the binding limit's rate, and RateLimit-Policy,
// with the periods of its Calendar limits at now.
func setPolicyHeaders(h http.Header, set HeaderSet, pl *Plan, binding ratelimit.Result, now func() time.Time) {
	if set&XRateLimitHeaders != 0 {
		h.Set(HeaderLimit, strconv.FormatInt(binding.Limit.Rate, 10))
	}
	if set&IETFHeaders != 0 {
		policies := pl.policies
		if pl.calendar {
			policies = pl.PoliciesAt(now())
		}
		h.Set(HeaderPolicy, strings.Join(policies, ", "))
	}
}

// setHeaders sets every header a decision against pl gives, whose Results
// are results and binding Result binding; none if the headers show nothing
// of it (Plan.Shown). The X-RateLimit headers and Retry-After describe the
// binding Result. A Degraded decision says nothing about the counts, so it
// gets only the policy headers: no made-up Remaining or Reset. A denial
// that can never pass, because some limit's rate is below the cost, gets
// Limit, Remaining and the policies, and nothing that names a time to retry
// at: no Reset, no t for any policy, no Retry-After.
func setHeaders(h http.Header, set HeaderSet, pl *Plan, results []ratelimit.Result, binding ratelimit.Result, now func() time.Time) {
	if !pl.Shown(results) {
		return
	}
	setPolicyHeaders(h, set, pl, binding, now)
	if binding.Degraded {
		return
	}
	// Binding ranks a denial that never passes above any other.
	never := neverPasses(binding)
	if set&XRateLimitHeaders != 0 {
		h.Set(HeaderRemaining, strconv.FormatInt(binding.Remaining, 10))
		if !never {
			h.Set(HeaderReset, strconv.FormatInt(ResetSeconds(binding), 10))
		}
	}
	if set&IETFHeaders != 0 {
		h.Set(HeaderRateLimit, strings.Join(pl.RateLimits(results), ", "))
	}
	if !binding.Allowed && binding.RetryAfter > 0 && !never {
		h.Set(HeaderRetryAfter, strconv.FormatInt(ResetSeconds(binding), 10))
	}
}

// slotPolicy returns the concurrency limit's item of RateLimit-Policy:
// its name, as PolicyName gives a limit's ("<Max>-concurrent" for none),
// its Max and qu="concurrent-requests".
func slotPolicy(c ratelimit.Concurrency) (name, item string) {
	name = c.Name
	if name == "" {
		name = strconv.FormatInt(c.Max, 10) + "-concurrent"
	}
	name = sfString(name)
	return name, name + ";q=" + strconv.FormatInt(c.Max, 10) + `;qu="concurrent-requests"`
}

// setSlotHeaders adds what slot says to the headers a decision set: the
// concurrency limit's items in RateLimit-Policy and RateLimit; and for a
// full limit, Retry-After and the X-RateLimit headers of the concurrency
// limit, which is then the binding one. A Degraded slot adds its policy
// only.
func setSlotHeaders(h http.Header, set HeaderSet, slot ratelimit.Slot) {
	name, item := slotPolicy(slot.Concurrency)
	wait := max(1, seconds(slot.RetryAfter))
	if set&IETFHeaders != 0 {
		appendItem(h, HeaderPolicy, item)
		if !slot.Degraded {
			rl := name + ";r=" + strconv.FormatInt(slot.Remaining, 10)
			if !slot.Acquired {
				rl += ";t=" + strconv.FormatInt(wait, 10)
			}
			appendItem(h, HeaderRateLimit, rl)
		}
	}
	if slot.Acquired || slot.Degraded {
		return
	}
	if set&XRateLimitHeaders != 0 {
		h.Set(HeaderLimit, strconv.FormatInt(slot.Concurrency.Max, 10))
		h.Set(HeaderRemaining, "0")
		h.Set(HeaderReset, strconv.FormatInt(wait, 10))
	}
	h.Set(HeaderRetryAfter, strconv.FormatInt(wait, 10))
}

// appendItem appends item to the list header name holds, if any.
func appendItem(h http.Header, name, item string) {
	if v := h.Get(name); v != "" {
		item = v + ", " + item
	}
	h.Set(name, item)
}
