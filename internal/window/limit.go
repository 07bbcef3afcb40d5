// What makes a limit unusable.

package window

import (
	"fmt"
	"time"
)

// Limit is what a limit is, as the root's Limit has it but for its Name:
// its Rate per Window, Strict or not, or per calendar Period in Loc; Shadow
// and Leased or not.
type Limit struct {
	Rate                   int64
	Window                 time.Duration
	Strict, Shadow, Leased bool
	Period                 Period
	Loc                    *time.Location
}

// String returns l as the root's Limit.String says.
func (l Limit) String() string {
	s := fmt.Sprintf("%d/%v", l.Rate, l.Window)
	if l.Period != 0 {
		s = fmt.Sprintf("%d/%v", l.Rate, l.Period)
		if name := ZoneName(l.Loc); name != "UTC" {
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

// MaxProduct bounds Rate × Window (in milliseconds). The script weighs the
// previous window's count in Lua numbers (IEEE doubles), and every integer
// product up to 2^53 is exact there; beyond it the estimate could be off by
// one. It bounds a calendar limit's Rate, which one count holds.
const MaxProduct = 1 << 53

// String returns "daily", "weekly", "monthly" or "yearly", or "Period(n)"
// for another value.
func (p Period) String() string {
	if name := p.Name(); name != "" {
		return name
	}
	return fmt.Sprintf("Period(%d)", uint8(p))
}

// Problem says what makes l unusable: see the root's Limit.Validate; ""
// for nothing.
func (l Limit) Problem() string {
	switch {
	case l.Rate < 1:
		return fmt.Sprintf("rate %d is below 1", l.Rate)
	case l.Period != 0:
		return l.periodProblem()
	case l.Loc != nil:
		return fmt.Sprintf("location %v without a Calendar period", l.Loc)
	case l.Window < time.Millisecond:
		return fmt.Sprintf("window %v is shorter than 1ms", l.Window)
	case l.Window%time.Millisecond != 0:
		return fmt.Sprintf("window %v is not a whole number of milliseconds", l.Window)
	case l.Rate > MaxProduct/l.Window.Milliseconds():
		w := l.Window.Milliseconds()
		return fmt.Sprintf("rate %d per %v is too large (rate × window in ms must not exceed 2^53; at most %d per %v)",
			l.Rate, l.Window, MaxProduct/w, l.Window)
	case l.Strict && l.Window.Milliseconds()%SubWindows != 0:
		return fmt.Sprintf("strict window %v is not a multiple of %dms", l.Window, SubWindows)
	}
	return ""
}

// periodProblem says what makes a calendar limit unusable; "" for nothing.
func (l Limit) periodProblem() string {
	switch {
	case !l.Period.Valid():
		return fmt.Sprintf("calendar %v is none of Daily, Weekly, Monthly and Yearly", l.Period)
	case l.Window != 0:
		return fmt.Sprintf("calendar %v with a window of %v: a calendar limit has no Window", l.Period, l.Window)
	case l.Strict:
		return fmt.Sprintf("calendar %v with Strict: a period is already a hard bound within itself", l.Period)
	case l.Loc != nil && (l.Loc.String() == "Local" || l.Loc.String() == ""):
		// time.Local is each machine's own zone, named "Local" on all of
		// them: servers whose zones differ would share keys and disagree
		// on where periods start.
		return fmt.Sprintf("calendar location %q: name the zone (time.LoadLocation(\"Europe/Berlin\"), time.FixedZone(\"UTC+1\", 3600)), "+
			"so that every server counts in the same one", l.Loc.String())
	case l.Loc != nil && !OffsetNamed(l.Loc):
		// Its keys name the offset, which another server would read.
		return fmt.Sprintf("calendar location %q is not the offset from UTC its name says", l.Loc.String())
	case l.Rate > MaxProduct:
		return fmt.Sprintf("rate %d is above 2^53, the most a count holds", l.Rate)
	}
	return ""
}
