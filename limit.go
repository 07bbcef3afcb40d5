// Limit: its constructors, String and ParseLimit (its validation is
// check.go's).

package ratelimit

import (
	"time"

	"github.com/slidingwindow/ratelimit/internal/window"
)

// Limit is a number of requests (or cost units) allowed in any sliding
// window of a given length, or with Calendar in each calendar period (a
// day, an ISO week, a month, a year of a time zone).
//
// Limits of the same Window (and the same Strict) on one id share one
// count: Allow(ctx, "u1", PerMinute(100)) and Allow(ctx, "u1",
// PerMinute(10)) add to the same keys. That is right for a client moving
// between tiers, and wrong for two budgets of one user, such as two
// endpoints: give each budget its own id ("u1:search", "u1:export") or its
// own Limiter with WithPrefix. Name does not change the key. Calendar
// limits of the same Calendar and Location (told apart by its name) share
// one count likewise.
type Limit struct {
	// Rate is how many requests, or cost units, any Window may hold; at
	// least 1.
	Rate int64
	// Window is the window's length: a whole number of milliseconds, at least
	// 1ms. Rate × Window in ms may not exceed 2^53 (about 9×10^15), so that
	// the script's arithmetic stays exact. A Calendar limit has none (0).
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
	// goes quiet. A server asks for more while its leases run out, one
	// request at a time (others it may serve wait for it: see WithTimeout),
	// and for less when they expire unused, never more than Rate/20 at once, and
	// Redis cuts a lease to half of what the limit has left (or to what the
	// request needs, if that is more), so that near the limit leases shrink
	// to single requests. Count and Remaining of a decision made from a lease
	// are the shared count as of this process's last lease plus what this
	// process used of it since. A lease held serves while Redis is down. A
	// request with a Leased limit is not counted when denied, even under
	// WithCountDenied. See docs/leases.md.
	Leased bool

	// Calendar, when not zero, makes the limit Rate per calendar period
	// instead of per sliding Window: a request of cost n is allowed while
	// the period's count plus n is at most Rate, and the count starts again
	// at 0 when the next period starts, at local midnight of Location (a
	// day of a DST change lasts 23 or 25 hours; where a zone skips
	// midnight, the day starts when its clocks jump). Within a period it
	// is exact; across a boundary a client may use up one period's Rate at
	// its end and the next one's at its start. Window must be 0, and
	// Strict false. The period comes from the Limiter's clock. See
	// docs/design.md.
	Calendar Period // not zero: Rate per calendar period instead of per sliding Window
	// Location is the time zone of Calendar's periods; nil means UTC. It
	// must have a name that every server loads the same
	// (time.LoadLocation("Europe/Berlin")): time.Local, named "Local"
	// everywhere, is refused. Locations are told apart by name.
	Location *time.Location // the time zone of Calendar's periods; nil means UTC
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
// " leased" after it for each it is; a calendar limit as "10000/daily" in
// UTC, "10000/monthly@Europe/Berlin" in another zone. ParseLimit reads it
// back.
func (l Limit) String() string { return l.window().String() }

// window returns l in internal/window's terms.
func (l *Limit) window() window.Limit {
	return window.Limit{Rate: l.Rate, Window: l.Window, Strict: l.Strict, Shadow: l.Shadow, Leased: l.Leased,
		Period: window.Period(l.Calendar), Loc: l.Location}
}

// resultsOf returns one Result per limit, zero but for its Limit.
func resultsOf(limits []Limit) []Result {
	out := make([]Result, len(limits))
	for i, limit := range limits {
		out[i].Limit = limit
	}
	return out
}

// setLimits gives each of out its limit.
func setLimits(out []Result, limits []Limit) {
	for i, limit := range limits {
		out[i].Limit = limit
	}
}
