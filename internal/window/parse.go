// The window of a limit as configuration writes it (the root's
// ParseLimit), and zones named by their offset from UTC.

package window

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// periods are the names of calendar periods that ParseLimit reads.
var periods = map[string]Period{"daily": Daily, "weekly": Weekly, "monthly": Monthly, "yearly": Yearly}

// shortWindows are the windows of ulule/limiter's short form: one letter.
var shortWindows = map[string]time.Duration{"S": time.Second, "M": time.Minute, "H": time.Hour, "D": 24 * time.Hour}

// ParseLimit reads s as the root's ParseLimit says. When it cannot,
// problem says why, and Problem what the limit it read has wrong.
func ParseLimit(s string) (l Limit, problem string) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return l, "empty: want <rate>/<window> or <rate>-<S|M|H|D>, as in 100/1m"
	}
	rate, win, long := strings.Cut(fields[0], "/")
	if !long {
		var short bool
		if rate, win, short = strings.Cut(fields[0], "-"); !short {
			return l, "no window: want <rate>/<window> or <rate>-<S|M|H|D>, as in 100/1m"
		}
	}
	r, err := strconv.ParseInt(rate, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return l, fmt.Sprintf("rate %s does not fit an int64", rate)
	}
	if err != nil {
		return l, fmt.Sprintf("rate %q is not a whole number", rate)
	}
	l.Rate = r
	if l.Window, l.Period, l.Loc, problem = Parse(win, !long); problem != "" {
		return l, problem
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
			return l, fmt.Sprintf("unknown flag %q: want strict, shadow or leased", f)
		}
		if *flag {
			return l, fmt.Sprintf("flag %q given twice", f)
		}
		*flag = true
	}
	return l, l.Problem()
}

// Parse reads the window of a limit in ParseLimit's long form ("1m",
// "1d12h", "s", "daily", "monthly@Europe/Berlin", "daily@UTC+1") or, when
// short, in ulule's ("H"): a duration, or a calendar period and its zone
// (nil for UTC). When it cannot, problem says why.
func Parse(s string, short bool) (d time.Duration, p Period, loc *time.Location, problem string) {
	if short {
		d, ok := shortWindows[strings.ToUpper(s)]
		if !ok {
			return 0, 0, nil, fmt.Sprintf("window %q is none of S, M, H and D", s)
		}
		return d, 0, nil, ""
	}
	name, zone, _ := strings.Cut(s, "@")
	if p, ok := periods[name]; ok {
		if zone == "" {
			return 0, p, nil, ""
		}
		loc, err := time.LoadLocation(zone)
		if off, fixed := FixedOffset(zone); err != nil && fixed {
			loc, err = time.FixedZone(zone, off), nil
		}
		if err != nil {
			return 0, 0, nil, fmt.Sprintf("time zone %q: %v (a program that runs where the system has no zone database imports time/tzdata)", zone, err)
		}
		if loc == time.UTC {
			loc = nil
		}
		return 0, p, loc, ""
	}
	d, err := parseDuration(s)
	if err != nil {
		if hint, ok := unitWords[strings.TrimSuffix(strings.ToLower(s), "s")]; ok {
			return 0, 0, nil, fmt.Sprintf("window %q is not a duration: %s", s, hint)
		}
		return 0, 0, nil, fmt.Sprintf("window %q is not a duration such as 1m, 500ms, 1d or s (at most about 292 years)", s)
	}
	return d, 0, nil, ""
}

// unitWords says, for a unit written as a word, what is written instead.
var unitWords = map[string]string{
	"sec": `write "s" or "1s" for a sliding second`, "second": `write "s" or "1s" for a sliding second`,
	"min": `write "m" or "1m" for a sliding minute`, "minute": `write "m" or "1m" for a sliding minute`,
	"hour":  `write "h" or "1h" for a sliding hour`,
	"day":   `write "daily" for calendar days (from midnight; "daily@Europe/Berlin" in a zone), or "d" or "1d" for a sliding 24 hours`,
	"week":  `write "weekly" for calendar weeks (from Monday; "weekly@Europe/Berlin" in a zone), or "7d" for a sliding 7 days`,
	"month": `write "monthly" for calendar months (from the 1st; "monthly@Europe/Berlin" in a zone), or "30d" for a sliding 30 days`,
	"year":  `write "yearly" for calendar years (from January 1st; "yearly@Europe/Berlin" in a zone), or "365d" for a sliding 365 days`,
}

// parseDuration reads what time.ParseDuration reads, and as configuration
// is often written, a whole number of days first ("1d", "7d", "1d12h"), or
// a unit alone for one of it ("s", "m", "h", "d", "ms").
func parseDuration(s string) (time.Duration, error) {
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

// FixedOffset reads the name of a zone of a fixed offset from UTC, as the
// root advises to name one ("UTC+1", "UTC-05:30", "UTC+0530"): its offset
// in seconds, and whether it is such a name.
func FixedOffset(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "UTC")
	if !ok || len(rest) < 2 || rest[0] != '+' && rest[0] != '-' {
		return 0, false
	}
	hours, minutes, colon := strings.Cut(rest[1:], ":")
	if !colon && len(hours) == 4 {
		hours, minutes = hours[:2], hours[2:]
	}
	h, okH := digits(hours)
	m, okM := digits(minutes)
	if !okH || hours == "" || !okM || (colon || minutes != "") && len(minutes) != 2 || h > 14 || m > 59 {
		return 0, false
	}
	off := h*3600 + m*60
	if rest[0] == '-' {
		off = -off
	}
	return off, true
}

// digits returns the number s spells in at most two decimal digits; 0 for
// none.
func digits(s string) (int, bool) {
	if len(s) > 2 {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = 10*n + int(c-'0')
	}
	return n, true
}

// OffsetNamed reports whether loc, if its name is an offset from UTC
// (FixedOffset), is that offset; a zone of any other name is.
func OffsetNamed(loc *time.Location) bool {
	off, ok := FixedOffset(loc.String())
	if !ok {
		return true
	}
	_, at := time.Unix(0, 0).In(loc).Zone()
	_, now := time.Now().In(loc).Zone()
	return at == off && now == off
}
