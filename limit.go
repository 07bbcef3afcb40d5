// Limit: its constructors, String and ParseLimit, and the validation of
// limits, ids and costs (a decision's input, checkAll).

package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/internal/script"
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
func (l Limit) String() string {
	s := fmt.Sprintf("%d/%v", l.Rate, l.Window)
	if l.Calendar != 0 {
		s = fmt.Sprintf("%d/%v", l.Rate, l.Calendar)
		if name := zoneName(l.Location); name != "UTC" {
			s += "@" + name
		}
	}
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
// multiple of StrictSubWindows ms; for a Calendar limit, a Calendar outside
// Daily..Yearly, a Window, Strict, a Rate above 2^53, or a Location named
// "Local" or nothing; a Location without a Calendar. The error wraps ErrInvalidLimit. Check
// limits from configuration with it at start-up.
func (l Limit) Validate() error {
	if p := l.problem(); p != "" {
		return fmt.Errorf("%w: %s", ErrInvalidLimit, p)
	}
	return nil
}

// problem says what Validate rejects l for; "" for nothing.
func (l Limit) problem() string {
	if l.Rate < 1 {
		return fmt.Sprintf("rate %d is below 1", l.Rate)
	}
	if l.Calendar != 0 {
		return l.calendarProblem()
	}
	if l.Location != nil {
		return fmt.Sprintf("location %v without a Calendar period", l.Location)
	}
	if l.Window < time.Millisecond {
		return fmt.Sprintf("window %v is shorter than 1ms", l.Window)
	}
	if l.Window%time.Millisecond != 0 {
		return fmt.Sprintf("window %v is not a whole number of milliseconds", l.Window)
	}
	if w := l.Window.Milliseconds(); l.Rate > maxProduct/w {
		return fmt.Sprintf("rate %d per %v is too large (rate × window in ms must not exceed 2^53; at most %d per %v)",
			l.Rate, l.Window, maxProduct/w, l.Window)
	}
	if l.Strict && l.Window.Milliseconds()%StrictSubWindows != 0 {
		return fmt.Sprintf("strict window %v is not a multiple of %dms", l.Window, StrictSubWindows)
	}
	return ""
}

// periods are the names of calendar periods that ParseLimit reads.
var periods = map[string]Period{"daily": Daily, "weekly": Weekly, "monthly": Monthly, "yearly": Yearly}

// calendarWindow reports whether the window of a limit in ParseLimit's
// long form names a calendar period: "daily", or "daily@<zone>".
func calendarWindow(window string) bool {
	period, _, _ := strings.Cut(window, "@")
	_, ok := periods[period]
	return ok
}

// parseWindow reads the window of ParseLimit's long form: what
// time.ParseDuration reads, and as configuration is often written, a
// whole number of days first ("1d", "7d", "1d12h"), or a unit alone for
// one of it ("s", "m", "h", "d", "ms").
func parseWindow(s string) (time.Duration, error) {
	if s != "" && (s[0] < '0' || s[0] > '9') && s[0] != '.' && s[0] != '+' && s[0] != '-' {
		s = "1" + s // a unit alone: "s" is one second
	}
	days, rest, ok := strings.Cut(s, "d")
	if !ok {
		return time.ParseDuration(s)
	}
	n, err := strconv.ParseInt(days, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/int64(24*time.Hour) {
		return 0, fmt.Errorf("%q is not a whole number of days", days)
	}
	d := time.Duration(n) * 24 * time.Hour
	if rest == "" {
		return d, nil
	}
	more, err := time.ParseDuration(rest)
	if err != nil || more < 0 || more > math.MaxInt64-d {
		return 0, fmt.Errorf("%q after the days is not a duration", rest)
	}
	return d + more, nil
}

// ulule/limiter's short form names its window with one letter.
var shortWindows = map[string]time.Duration{"S": time.Second, "M": time.Minute, "H": time.Hour, "D": 24 * time.Hour}

// ParseLimit parses a limit from configuration as String prints it: a rate,
// "/", a window as time.ParseDuration reads it or a calendar period (daily,
// weekly, monthly or yearly, then optionally "@" and a zone that
// time.LoadLocation finds: "10000/daily@Europe/Berlin"), then any of the flags
// strict, shadow and leased, each at most once, in any order, separated by
// spaces: "100/1m0s", "100/1m", "10/1s strict shadow leased". The window
// may also start with a whole number of days, "1000/1d", "10/7d",
// "5/1d12h", or be a unit alone for one of it, "10/s", "1000/d" (a day of
// 24 hours, sliding; "daily" is the calendar day). It also reads
// ulule/limiter's short form, a rate, "-" and a window of S, M, H or D (a
// second, a minute, an hour, a day; in either case, as ulule reads it):
// "1000-H", which flags may follow too. String does not print Name, so
// ParseLimit leaves it empty: ParseLimit(l.String()) is l without its Name.
//
// The error wraps ErrInvalidLimit, quotes s and says what is wrong: no
// rate or window, a rate that is not a whole number or does not fit an
// int64, a window that ParseDuration rejects, an unknown or repeated flag,
// or a limit that Limit.Validate rejects.
func ParseLimit(s string) (Limit, error) {
	bad := func(format string, args ...any) (Limit, error) {
		return Limit{}, fmt.Errorf("%w %q: %s", ErrInvalidLimit, s, fmt.Sprintf(format, args...))
	}
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return bad("empty: want <rate>/<window> or <rate>-<S|M|H|D>, as in 100/1m")
	}
	var l Limit
	rate, window, long := strings.Cut(fields[0], "/")
	if !long {
		var short bool
		if rate, window, short = strings.Cut(fields[0], "-"); !short {
			return bad("no window: want <rate>/<window> or <rate>-<S|M|H|D>, as in 100/1m")
		}
	}
	r, err := strconv.ParseInt(rate, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return bad("rate %s does not fit an int64", rate)
	}
	if err != nil {
		return bad("rate %q is not a whole number", rate)
	}
	l.Rate = r
	if long && calendarWindow(window) {
		period, zone, _ := strings.Cut(window, "@")
		l.Calendar = periods[period]
		if zone != "" {
			loc, err := time.LoadLocation(zone)
			if err != nil {
				return bad("time zone %q: %v (a program that runs where the system has no zone database imports time/tzdata)", zone, err)
			}
			if loc != time.UTC {
				l.Location = loc
			}
		}
	} else if long {
		d, err := parseWindow(window)
		if err != nil {
			return bad("window %q is not a duration such as 1m, 500ms, 1d or s (at most about 292 years)", window)
		}
		l.Window = d
	} else {
		d, ok := shortWindows[strings.ToUpper(window)]
		if !ok {
			return bad("window %q is none of S, M, H and D", window)
		}
		l.Window = d
	}
	for _, f := range fields[1:] {
		var flag *bool
		switch f {
		case "strict":
			flag = &l.Strict
		case "shadow":
			flag = &l.Shadow
		case "leased":
			flag = &l.Leased
		default:
			return bad("unknown flag %q: want strict, shadow or leased", f)
		}
		if *flag {
			return bad("flag %q given twice", f)
		}
		*flag = true
	}
	if p := l.problem(); p != "" {
		return bad("%s", p)
	}
	return l, nil
}

// ValidateLimits reports what makes limits unusable together in one
// AllowAll or PeekAll, as those would: none at all, more than 16, a limit
// that Limit.Validate rejects, or two limits of the same Window and Strict
// (or Calendar and Location), which would share one count (named both). The error wraps
// ErrInvalidLimit. Check a plan from configuration with it at start-up;
// httplimit and grpclimit check theirs with it.
func ValidateLimits(limits []Limit) error {
	if err := checkLen(len(limits), "limits"); err != nil {
		return err
	}
	for i, limit := range limits {
		if err := limit.Validate(); err != nil {
			return err
		}
		for _, other := range limits[:i] {
			if sameCount(other, limit) {
				what := "window"
				if limit.Calendar != 0 {
					what = "period and zone"
				}
				return fmt.Errorf("%w: limits %v and %v have the same %s and would share one count", ErrInvalidLimit, other, limit, what)
			}
		}
	}
	return nil
}

// checkLen checks the length n of a call's list of what (limits, quotas):
// at least one, at most maxLimits.
func checkLen(n int, what string) error {
	if n == 0 {
		return fmt.Errorf("%w: no %s", ErrInvalidLimit, what)
	}
	if n > maxLimits {
		return fmt.Errorf("%w: %d %s, more than %d", ErrInvalidLimit, n, what, maxLimits)
	}
	return nil
}

// sameCount reports whether limits a and b of one id share one count:
// their windows are the same length and kind, or their calendar periods
// the same kind in the same zone (by name).
func sameCount(a, b Limit) bool {
	return a.Window == b.Window && a.Strict == b.Strict && a.Calendar == b.Calendar &&
		(a.Calendar == 0 || zoneName(a.Location) == zoneName(b.Location))
}

// validate reports what is wrong with one decision's input, before Redis is
// consulted. n is the cost; Peek passes 1.
func validate(id string, limit Limit, n int64) error {
	if id == "" {
		return fmt.Errorf("%w: id is empty", ErrInvalidID)
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("%w: cost %d is below 1", ErrInvalidCost, n)
	}
	if n > script.MaxCount {
		return fmt.Errorf("%w: cost %d is above 2^53, the most a count holds", ErrInvalidCost, n)
	}
	return nil
}

// check validates one limit's decision of id at cost n: the client, then
// what validate checks.
func (l *Limiter) check(id string, limit Limit, n int64) error {
	if l.t == nil {
		return ErrNilClient
	}
	return validate(id, limit, n)
}

// checkAll validates a decision's input before Redis is consulted.
func (l *Limiter) checkAll(id string, limits []Limit, n int64) error {
	if len(limits) == 0 {
		return ValidateLimits(limits)
	}
	if err := l.check(id, limits[0], n); err != nil { // the client, the id, the first limit, the cost
		return err
	}
	if len(limits) == 1 {
		return nil // checked in full
	}
	return ValidateLimits(limits)
}
