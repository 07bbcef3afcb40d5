package grpclimit

import (
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/slidingwindow/ratelimit"
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
	// HeaderLimit is the binding limit's rate: the limit with the least
	// remaining on an allowed call, the one that denied on a denied call.
	HeaderLimit = "ratelimit-limit"
	// HeaderRemaining is what is left of the binding limit's rate after
	// this call.
	HeaderRemaining = "ratelimit-remaining"
	// HeaderReset is in whole seconds, rounded up: until the binding
	// limit's count is 0 on an allowed call, until the call would pass on a
	// denied one; absent on a denial that can never pass.
	HeaderReset = "ratelimit-reset"
	// HeaderPolicy has one value per enforced limit the call is decided
	// against, in the order given: `"<name>";q=<rate>;w=<window in seconds, rounded up>`,
	// as draft-ietf-httpapi-ratelimit-headers writes RateLimit-Policy. The
	// name is Limit.Name, or one derived from the limit ("100-per-60s").
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

// policy is a limit with what the headers say about it, worked out once.
type policy struct {
	limit  ratelimit.Limit
	name   string // as the client sees it
	quoted string // name as a Structured Fields String
	header string // its HeaderPolicy value
}

func newPolicy(limit ratelimit.Limit) policy {
	name := limit.Name
	if name == "" {
		name = policyName(limit)
	}
	q := sfString(name)
	return policy{
		limit:  limit,
		name:   name,
		quoted: q,
		header: q + ";q=" + strconv.FormatInt(limit.Rate, 10) + ";w=" + strconv.FormatInt(seconds(limit.Window), 10),
	}
}

// policyName returns the name the headers give limit when it has none:
// "100-per-60s", or "10-per-500ms" for a window that is not a whole number
// of seconds, as httplimit names it.
func policyName(limit ratelimit.Limit) string {
	rate := strconv.FormatInt(limit.Rate, 10)
	if limit.Window%time.Second == 0 {
		return rate + "-per-" + strconv.FormatInt(int64(limit.Window/time.Second), 10) + "s"
	}
	return rate + "-per-" + strconv.FormatInt(limit.Window.Milliseconds(), 10) + "ms"
}

// sfString returns name as a Structured Fields String (RFC 9651 §3.3.3):
// quoted, with '"' and '\' escaped and any byte outside printable ASCII,
// which neither a String nor a metadata value can hold, replaced with '_'.
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

// resetSeconds is the reset the headers report, as httplimit reports it: on
// a denial that can pass later, the wait until it would (at least 1s, so
// that it agrees with retry-after); otherwise the wait until the count is 0.
func resetSeconds(res ratelimit.Result) int64 {
	if !res.Allowed && res.RetryAfter > 0 {
		return max(1, seconds(res.RetryAfter))
	}
	return seconds(res.ResetAfter)
}

// neverPasses reports a denial no wait turns into a pass: the cost is above
// the limit's rate. Any reset sent with it would invite a retry that fails.
func neverPasses(res ratelimit.Result) bool {
	return !res.Allowed && res.RetryAfter < 0
}

// headerMD returns the response header metadata of a decision: bind is the
// binding Result, results those of set's enforced limits. A Degraded
// decision says nothing true about counts, so it gets only HeaderLimit and
// HeaderPolicy; a denial that can never pass gets nothing that names a time
// to retry at.
func headerMD(set *policySet, results []ratelimit.Result, bind ratelimit.Result) metadata.MD {
	md := metadata.MD{
		HeaderLimit:  {strconv.FormatInt(bind.Limit.Rate, 10)},
		HeaderPolicy: set.policyValues,
	}
	if bind.Degraded {
		return md
	}
	md[HeaderRemaining] = []string{strconv.FormatInt(bind.Remaining, 10)}
	never := neverPasses(bind)
	values := make([]string, 0, len(set.enforced))
	for _, i := range set.enforced {
		v := set.policies[i].quoted + ";r=" + strconv.FormatInt(results[i].Remaining, 10)
		if !never {
			v += ";t=" + strconv.FormatInt(resetSeconds(results[i]), 10)
		}
		values = append(values, v)
	}
	md[HeaderRateLimit] = values
	if never {
		return md
	}
	reset := strconv.FormatInt(resetSeconds(bind), 10)
	md[HeaderReset] = []string{reset}
	if !bind.Allowed && bind.RetryAfter > 0 {
		md[HeaderRetryAfter] = []string{reset}
	}
	return md
}
