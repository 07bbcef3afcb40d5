package ratelimit

import (
	"fmt"
	"time"

	"github.com/slidingwindow/ratelimit/internal/window"
)

// Limit is a number of requests (or cost units) allowed in any sliding
// window of a given length.
//
// Limits of the same Window (and the same Strict) on one id share one
// count: Allow(ctx, "u1", PerMinute(100)) and Allow(ctx, "u1",
// PerMinute(10)) add to the same keys. That is right for a client moving
// between tiers, and wrong for two budgets of one user, such as two
// endpoints: give each budget its own id ("u1:search", "u1:export") or its
// own Limiter with WithPrefix. Name does not change the key.
type Limit struct {
	// Rate is how many requests, or cost units, any Window may hold; at
	// least 1.
	Rate int64
	// Window is the window's length: a whole number of milliseconds, at least
	// 1ms. Rate × Window in ms may not exceed 2^53 (about 9×10^15), so that
	// the script's arithmetic stays exact.
	Window time.Duration
	// Name labels the limit for observers and for the policy names of
	// httplimit's headers. It is optional, and does not change which count
	// the limit uses.
	Name string
	// Strict makes the limit a hard bound: no span of Window ever admits
	// more than Rate, even against a client that packs the end of a window.
	// The window is cut into StrictSubWindows sub-windows, and the oldest
	// sub-window that still overlaps the last Window is counted in full; a
	// client at a steady rate near the limit is therefore denied somewhat
	// sooner (up to 1/StrictSubWindows of the Rate). Window must be a
	// multiple of StrictSubWindows milliseconds. A strict limit keeps
	// StrictSubWindows+1 small keys per id instead of 2, apart from the
	// keys of a sliding limit of the same Window.
	Strict bool
	// Shadow tries the limit without enforcing it: it is decided and counted
	// exactly as if it were enforced on its own, but it never denies. A
	// Result whose limit would have denied has Shadowed set. Use it to see
	// what a new limit would do before turning it on.
	Shadow bool

	// Leased decides this limit in the process, from quota the Limiter leases
	// from Redis in chunks: a chunk is counted in Redis when it is taken, as if
	// its requests had been admitted then, so no server admits what the shared
	// count has not already counted. For hot ids (a global limit, a large
	// tenant); a limit per user gains nothing from it.
	//
	// A lease serves only the window it was counted in (for a strict limit,
	// its sub-window); what is left of it then is given back, at the latest
	// with the next decision on the id, or within about a second when the id
	// goes quiet. A server asks for more while its leases run out and for
	// less when they expire unused, never more than Rate/20 at once, and
	// Redis cuts a lease to half of what the limit has left (or to what the
	// request needs, if that is more), so that near the limit leases shrink
	// to single requests. Count and Remaining of a decision made from a lease
	// are the shared count as of this process's last lease plus what this
	// process used of it since. A lease held serves while Redis is down. A
	// request with a Leased limit is not counted when denied, even under
	// WithCountDenied. See docs/leases.md.
	Leased bool
}

// StrictSubWindows is the number of sub-windows a Strict limit's Window is
// cut into.
const StrictSubWindows = 10

// The script's Go model cuts windows the same way.
var _ = [1]struct{}{}[StrictSubWindows-window.SubWindows]

// PerSecond returns a Limit of rate requests in any one second.
func PerSecond(rate int64) Limit { return Limit{Rate: rate, Window: time.Second} }

// PerMinute returns a Limit of rate requests in any one minute.
func PerMinute(rate int64) Limit { return Limit{Rate: rate, Window: time.Minute} }

// PerHour returns a Limit of rate requests in any one hour.
func PerHour(rate int64) Limit { return Limit{Rate: rate, Window: time.Hour} }

// PerDay returns a Limit of rate requests in any one day (24 hours).
func PerDay(rate int64) Limit { return Limit{Rate: rate, Window: 24 * time.Hour} }

// String returns the limit as "100/1m0s", with " strict", " shadow" or
// " leased" after it for each it is.
func (l Limit) String() string {
	s := fmt.Sprintf("%d/%v", l.Rate, l.Window)
	if l.Strict {
		s += " strict"
	}
	if l.Shadow {
		s += " shadow"
	}
	if l.Leased {
		s += " leased"
	}
	return s
}

// maxProduct bounds Rate × Window (in milliseconds). The script weighs the
// previous window's count in Lua numbers (IEEE doubles), and every integer
// product up to 2^53 is exact there; beyond it the estimate could be off by one.
const maxProduct = 1 << 53

// Validate reports what makes l unusable, as every method of a Limiter would:
// a Rate below 1, a Window below 1ms or not a whole number of milliseconds,
// a Rate × Window (in ms) above 2^53, or a Strict Window that is not a
// multiple of StrictSubWindows ms. The error wraps ErrInvalidLimit. Check
// limits from configuration with it at start-up.
func (l Limit) Validate() error {
	if l.Rate < 1 {
		return fmt.Errorf("%w: rate %d is below 1", ErrInvalidLimit, l.Rate)
	}
	if l.Window < time.Millisecond {
		return fmt.Errorf("%w: window %v is shorter than 1ms", ErrInvalidLimit, l.Window)
	}
	if l.Window%time.Millisecond != 0 {
		return fmt.Errorf("%w: window %v is not a whole number of milliseconds", ErrInvalidLimit, l.Window)
	}
	if w := l.Window.Milliseconds(); l.Rate > maxProduct/w {
		return fmt.Errorf("%w: rate %d per %v is too large (rate × window in ms must not exceed 2^53; at most %d per %v)",
			ErrInvalidLimit, l.Rate, l.Window, maxProduct/w, l.Window)
	}
	if l.Strict && l.Window.Milliseconds()%StrictSubWindows != 0 {
		return fmt.Errorf("%w: strict window %v is not a multiple of %dms", ErrInvalidLimit, l.Window, StrictSubWindows)
	}
	return nil
}

// ValidateLimits reports what makes limits unusable together in one
// AllowAll or PeekAll, as those would: none at all, more than 16, a limit
// that Limit.Validate rejects, or two limits of the same Window and Strict,
// which would share one count (named both). The error wraps
// ErrInvalidLimit. Check a plan from configuration with it at start-up;
// httplimit and grpclimit check theirs with it.
func ValidateLimits(limits []Limit) error {
	if len(limits) == 0 {
		return fmt.Errorf("%w: no limits", ErrInvalidLimit)
	}
	if len(limits) > maxLimits {
		return fmt.Errorf("%w: %d limits, more than %d", ErrInvalidLimit, len(limits), maxLimits)
	}
	for i, limit := range limits {
		if err := limit.Validate(); err != nil {
			return err
		}
		for _, other := range limits[:i] {
			if other.Window == limit.Window && other.Strict == limit.Strict {
				return fmt.Errorf("%w: limits %v and %v have the same window and would share one count", ErrInvalidLimit, other, limit)
			}
		}
	}
	return nil
}
