package grpclimit

import (
	"strconv"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// Response header metadata keys. They carry what httplimit's HTTP headers
// carry, under the lower-case names gRPC metadata uses; the interceptors
// send them with grpc.SetHeader, so a client reads them with the
// grpc.Header call option (or ClientStream.Header), on allowed and denied
// calls alike. Where httplimit joins several policies in one header with
// ", ", each is a value of its own here. Shadow limits (Limit.Shadow), and
// decisions that ratelimit.WithShadow let through, send none of them, so
// that clients see nothing of a trial.
const (
	// HeaderLimit is the binding limit's rate: the one ratelimit.Binding
	// picks among the enforced limits, the least remaining on an allowed
	// call, the longest wait on a denied one.
	HeaderLimit = "ratelimit-limit"
	// HeaderRemaining is what is left of the binding limit's rate after
	// this call.
	HeaderRemaining = "ratelimit-remaining"
	// HeaderReset is in whole seconds, rounded up (ResetSeconds):
	// until the binding limit's count is 0 on an allowed call, until the
	// call would pass on a denied one; absent on a denial that can never
	// pass.
	HeaderReset = "ratelimit-reset"
	// HeaderPolicy has one value per enforced limit the call is decided
	// against, in the order given: `"<name>";q=<rate>;w=<window in seconds, rounded up>`,
	// as draft-ietf-httpapi-ratelimit-headers writes RateLimit-Policy. The
	// name is PolicyName's: Limit.Name, or one derived from the
	// limit ("100-per-60s").
	HeaderPolicy = "ratelimit-policy"
	// HeaderRateLimit has one value per limit, in the same order:
	// `"<name>";r=<remaining>;t=<as HeaderReset, for that limit>`, as the
	// draft writes RateLimit; no t on a denial that can never pass.
	HeaderRateLimit = "ratelimit"
	// HeaderRetryAfter is sent on a denial that a retry can pass: the
	// seconds of HeaderReset, at least 1. The exact wait, to the
	// millisecond, is the status's google.rpc.RetryInfo detail.
	HeaderRetryAfter = "retry-after"
)

// PolicyName returns limit's name as the ratelimit-policy and ratelimit
// metadata send it, quotes included: "burst" for a Limit named burst, and
// for one with no Name a name derived from it, "100-per-60s". It is
// httplimit.PolicyName, here so that a gRPC client or server need not
// import httplimit: both name a limit the same way.
func PolicyName(limit ratelimit.Limit) string { return httplimit.PolicyName(limit) }

// ResetSeconds returns the seconds the metadata names as res's reset
// (HeaderReset, the ratelimit values' t, and HeaderRetryAfter on a denial):
// whole seconds, rounded up; on a denial that a retry can pass, the wait
// until it would, at least 1; otherwise the wait until the count is 0. It
// is httplimit.ResetSeconds, here so that a gRPC server need not import
// httplimit.
func ResetSeconds(res ratelimit.Result) int64 { return httplimit.ResetSeconds(res) }

// headerMD returns the response header metadata of a decision against pl
// whose Results are results and binding Result bind; nil when the metadata
// shows nothing of it (httplimit.Plan.Shown). A Degraded decision says
// nothing true about counts, so it gets only HeaderLimit and HeaderPolicy;
// a denial that can never pass gets nothing that names a time to retry at.
func headerMD(pl *httplimit.Plan, results []ratelimit.Result, bind ratelimit.Result, now time.Time) metadata.MD {
	if !pl.Shown(results) {
		return nil
	}
	md := metadata.MD{
		HeaderLimit:  {strconv.FormatInt(bind.Limit.Rate, 10)},
		HeaderPolicy: pl.PoliciesAt(now),
	}
	if bind.Degraded {
		return md
	}
	md[HeaderRemaining] = []string{strconv.FormatInt(bind.Remaining, 10)}
	md[HeaderRateLimit] = pl.RateLimits(results)
	if !bind.Allowed && bind.RetryAfter == ratelimit.InfDuration {
		return md // no wait makes it pass: no reset to name
	}
	reset := strconv.FormatInt(ResetSeconds(bind), 10)
	md[HeaderReset] = []string{reset}
	if !bind.Allowed && bind.RetryAfter > 0 {
		md[HeaderRetryAfter] = []string{reset}
	}
	return md
}

// slotName is a concurrency limit's name in the metadata: its Name, or
// "<Max>-concurrent".
func slotName(c ratelimit.Concurrency) string {
	if c.Name != "" {
		return c.Name
	}
	return strconv.FormatInt(c.Max, 10) + "-concurrent"
}

// slotMD adds what slot says to md (made anew if nil): the concurrency
// limit's ratelimit-policy item, qu="concurrent-requests", and its
// ratelimit item; for a full limit, which then binds, ratelimit-limit,
// ratelimit-remaining, ratelimit-reset and retry-after. A Degraded slot
// adds its policy only, as httplimit's headers do.
func slotMD(md metadata.MD, slot ratelimit.Slot) metadata.MD {
	if md == nil {
		md = metadata.MD{}
	}
	q := PolicyName(ratelimit.Limit{Name: slotName(slot.Concurrency)})
	md[HeaderPolicy] = append(append([]string(nil), md[HeaderPolicy]...), q+";q="+strconv.FormatInt(slot.Concurrency.Max, 10)+`;qu="concurrent-requests"`)
	if slot.Degraded {
		return md
	}
	secs := int64(slot.RetryAfter / time.Second) // rounded up without adding, which could wrap
	if slot.RetryAfter%time.Second != 0 {
		secs++
	}
	wait := strconv.FormatInt(max(1, secs), 10)
	item := q + ";r=" + strconv.FormatInt(slot.Remaining, 10)
	if !slot.Acquired {
		item += ";t=" + wait
		md[HeaderLimit] = []string{strconv.FormatInt(slot.Concurrency.Max, 10)}
		md[HeaderRemaining] = []string{"0"}
		md[HeaderReset] = []string{wait}
		md[HeaderRetryAfter] = []string{wait}
	}
	md[HeaderRateLimit] = append(append([]string(nil), md[HeaderRateLimit]...), item)
	return md
}
