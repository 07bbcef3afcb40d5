package httplimit

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/headers"
)

// Header names, in the canonical form net/http sends them in (header names
// are case-insensitive: X-Ratelimit-Limit is X-RateLimit-Limit). With
// several policies, RateLimit-Policy and RateLimit list each enforced
// policy, in the plan's order, and the X-RateLimit headers and Retry-After
// describe the binding one (FromContext's Result). Shadowed policies, and
// decisions that shadow mode let through, send none of them.
const (
	// HeaderLimit is the binding limit's rate.
	HeaderLimit = "X-Ratelimit-Limit"
	// HeaderRemaining is what is left of the binding limit's rate after this
	// request.
	HeaderRemaining = "X-Ratelimit-Remaining"
	// HeaderReset is in whole seconds, rounded up: until the binding limit's
	// count is 0 on an allowed response, until the request would pass on a
	// 429; absent on a 429 that can never pass.
	HeaderReset = "X-Ratelimit-Reset"
	// HeaderPolicy is `"<name>";q=<rate>;w=<window in seconds, rounded up>`
	// for each policy, separated by ", ".
	HeaderPolicy = "Ratelimit-Policy"
	// HeaderRateLimit is `"<name>";r=<remaining>;t=<as HeaderReset>` for
	// each policy, separated by ", ", with t for that policy's own count
	// or wait, and no t at all on a 429 that can never pass.
	HeaderRateLimit = "Ratelimit"
	// HeaderRetryAfter is sent on a 429 that a retry can pass: the seconds
	// of HeaderReset, at least 1.
	HeaderRetryAfter = "Retry-After"
)

// The header arithmetic httplimit and grpclimit share.
var (
	policyName   = headers.PolicyName
	sfString     = headers.SFString
	seconds      = headers.Seconds
	resetSeconds = headers.ResetSeconds
	neverPasses  = headers.NeverPasses
)

// setPolicyHeaders sets the headers that describe the policies and need no
// count: X-RateLimit-Limit, the binding limit's rate, and RateLimit-Policy.
func setPolicyHeaders(h http.Header, set HeaderSet, ps []policy, binding ratelimit.Result) {
	if set&XRateLimitHeaders != 0 {
		h.Set(HeaderLimit, strconv.FormatInt(binding.Limit.Rate, 10))
	}
	if set&IETFHeaders != 0 {
		var b strings.Builder
		for i, p := range ps {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(p.quoted)
			b.WriteString(";q=")
			b.WriteString(strconv.FormatInt(p.limit.Rate, 10))
			b.WriteString(";w=")
			b.WriteString(strconv.FormatInt(seconds(p.limit.Window), 10))
		}
		h.Set(HeaderPolicy, b.String())
	}
}

// setHeaders sets every header a decision gives, for the policies ps and
// their Results rs (those shown: see shown); none if there are none. The
// X-RateLimit headers and Retry-After describe the binding Result. A
// Degraded decision says nothing about the counts, so it gets only the
// policy headers: no made-up Remaining or Reset. A denial that can never
// pass, because some limit's rate is below the cost, gets Limit, Remaining
// and the policies, and nothing that names a time to retry at: no Reset, no
// t for any policy, no Retry-After.
func setHeaders(h http.Header, set HeaderSet, ps []policy, rs []ratelimit.Result) {
	if len(rs) == 0 {
		return
	}
	binding := ratelimit.Binding(rs)
	setPolicyHeaders(h, set, ps, binding)
	if binding.Degraded {
		return
	}
	// Binding ranks a denial that never passes above any other.
	never := neverPasses(binding)
	if set&XRateLimitHeaders != 0 {
		h.Set(HeaderRemaining, strconv.FormatInt(binding.Remaining, 10))
		if !never {
			h.Set(HeaderReset, strconv.FormatInt(resetSeconds(binding), 10))
		}
	}
	if set&IETFHeaders != 0 {
		var b strings.Builder
		for i, res := range rs {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(ps[i].quoted)
			b.WriteString(";r=")
			b.WriteString(strconv.FormatInt(res.Remaining, 10))
			if !never {
				b.WriteString(";t=")
				b.WriteString(strconv.FormatInt(resetSeconds(res), 10))
			}
		}
		h.Set(HeaderRateLimit, b.String())
	}
	if !binding.Allowed && binding.RetryAfter > 0 {
		h.Set(HeaderRetryAfter, strconv.FormatInt(resetSeconds(binding), 10))
	}
}
