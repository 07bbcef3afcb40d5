package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/slidingwindow/ratelimit"
)

// Plan is a checked plan: the limits a request is decided against, all at
// once, in the order the headers list them, with what the rate-limit
// headers say of each worked out once. New builds the default plan, and
// each plan WithPlanFunc returns, as NewPlan does; call NewPlan to check a
// server's plans (its tiers') at start-up. grpclimit decides and describes
// its calls with Plans too, so that a plan has one rule over HTTP and gRPC.
//
// A Plan is never changed once built: it is safe for simultaneous use by
// multiple goroutines.
type Plan struct {
	limits   []ratelimit.Limit
	names    []string // PolicyName of each limit, quoted once
	enforced []int    // the indexes of the limits that can deny: all but Shadow ones
	policies []string // the RateLimit-Policy item of each enforced limit; a Calendar limit's without its w
	calendar bool     // some enforced limit is a Calendar one: its w is its period's, found at each decision
}

// NewPlan returns the plan of limits, in that order, or the error that
// says what makes it unusable: what ratelimit.ValidateLimits rejects (no
// limit, more than 16, an invalid limit, two that would share one count),
// a zero Limit, which stands for no limit (a plan lists every limit it
// holds), and two limits of the same name (see PolicyName), which the
// headers could not tell apart. The error wraps ratelimit.ErrInvalidLimit.
// limits is copied.
func NewPlan(limits ...ratelimit.Limit) (*Plan, error) {
	pl := newPlan(append([]ratelimit.Limit(nil), limits...))
	if err := pl.check(); err != nil {
		return nil, err
	}
	return pl, nil
}

// newPlan returns the plan of limits, which it keeps, unchecked.
func newPlan(limits []ratelimit.Limit) *Plan {
	pl := &Plan{limits: limits, names: make([]string, len(limits))}
	for i, limit := range limits {
		pl.names[i] = PolicyName(limit)
		if !limit.Shadow {
			pl.enforced = append(pl.enforced, i)
			item := pl.names[i] + ";q=" + strconv.FormatInt(limit.Rate, 10)
			if limit.Calendar == 0 {
				item += ";w=" + strconv.FormatInt(seconds(limit.Window), 10)
			} else {
				pl.calendar = true
			}
			pl.policies = append(pl.policies, item)
		}
	}
	return pl
}

// check reports what NewPlan rejects pl for. A plan of one limit is "it".
func (pl *Plan) check() error {
	for i, limit := range pl.limits {
		switch {
		case limit != (ratelimit.Limit{}):
		case len(pl.limits) == 1:
			return fmt.Errorf("%w: it is the zero Limit", ratelimit.ErrInvalidLimit)
		default:
			return fmt.Errorf("%w: limit number %d is the zero Limit; "+
				"a plan lists every limit it holds, and no value stands for another", ratelimit.ErrInvalidLimit, i+1)
		}
	}
	if err := ratelimit.ValidateLimits(pl.limits); err != nil {
		return err
	}
	for i, name := range pl.names {
		for j, other := range pl.names[:i] {
			if other == name { // the same once sent
				return fmt.Errorf("%w: two limits are named %s (%v and %v); the rate-limit headers could not tell them apart",
					ratelimit.ErrInvalidLimit, name, pl.limits[j], pl.limits[i])
			}
		}
	}
	return nil
}

// Limits returns the plan's limits, in order: those to decide a request
// against with ratelimit.Limiter.AllowAll. The slice is the caller's own.
func (pl *Plan) Limits() []ratelimit.Limit {
	return append([]ratelimit.Limit(nil), pl.limits...)
}

// Join returns the plan of pl's limits followed by those of each of more,
// for the headers of a decision counted under several identities, each
// with its plan (WithLimitsPer; grpclimit's too): RateLimit-Policy and
// RateLimit list them all, in that order, for the Results of all of them
// in that order. Limits of different plans may share a window, as they
// count under different ids, so the joined plan is for headers only, not
// for one AllowAll. Its names must be distinct, or the headers could not
// tell them apart: the error says which, and wraps
// ratelimit.ErrInvalidLimit.
func (pl *Plan) Join(more ...*Plan) (*Plan, error) {
	var limits []ratelimit.Limit
	for _, p := range append([]*Plan{pl}, more...) {
		if p != nil { // a nil Plan holds no limit
			limits = append(limits, p.limits...)
		}
	}
	all := newPlan(limits)
	for i, name := range all.names {
		for j, other := range all.names[:i] {
			if other == name {
				return nil, fmt.Errorf("%w: two limits are named %s (%v and %v); the rate-limit headers could not tell them apart",
					ratelimit.ErrInvalidLimit, name, all.limits[j], all.limits[i])
			}
		}
	}
	return all, nil
}

// Shown reports whether the rate-limit headers describe a decision against
// the plan whose Results are results (one per limit, in order, as
// AllowAll returns them). They describe its enforced limits (those not
// Shadow), unless there are none, or ratelimit.WithShadow let through a
// denial of one: its counts describe a denial the client never got.
func (pl *Plan) Shown(results []ratelimit.Result) bool {
	for _, i := range pl.enforced {
		if results[i].Shadowed {
			return false
		}
	}
	return len(pl.enforced) > 0
}

// Policies returns the items of RateLimit-Policy (grpclimit's
// ratelimit-policy values), one for each enforced limit, in order:
// `"<name>";q=<rate>;w=<window in seconds, rounded up>`, the name as
// PolicyName gives it; for a Calendar limit, w is the length of its period
// that holds the current time, as PoliciesAt(time.Now()) gives it. The
// slice is the caller's own.
func (pl *Plan) Policies() []string {
	if pl.calendar {
		return pl.PoliciesAt(time.Now())
	}
	return append([]string(nil), pl.policies...)
}

// PoliciesAt returns the items of Policies as they stand at now: each
// Calendar limit's w is the length of its period that holds now (a day of
// a DST change lasts 23 or 25 hours, a month 28 to 31 days). The
// middleware and grpclimit's interceptors send them at the time of the
// Limiter's clock (ratelimit.Limiter.Now). The slice is the caller's own.
func (pl *Plan) PoliciesAt(now time.Time) []string {
	items := append([]string(nil), pl.policies...)
	if !pl.calendar {
		return items
	}
	for k, i := range pl.enforced {
		if limit := pl.limits[i]; limit.Calendar != 0 {
			start, end := limit.Calendar.Bounds(now, limit.Location)
			items[k] += ";w=" + strconv.FormatInt(seconds(end.Sub(start)), 10)
		}
	}
	return items
}

// RateLimits returns the items of RateLimit (grpclimit's ratelimit values)
// for a decision against the plan whose Results are results, one for each
// enforced limit, in order: `"<name>";r=<remaining>;t=<seconds>`, and no t
// on a denial that can never pass, which no wait lets through.
//
// t follows the IETF draft's latest text, where it is the window within
// which the client may use no more than r, not when the quota resets: on
// an allowed response it is the seconds, rounded up, until r next grows
// (ratelimit.Result.RefillAfter), the longest window of which that is
// true, and never longer than the client must wait for more; a sliding
// window's r grows as soon as the previous window's weight drops by one
// request, long before its count is 0 (a daily limit used steadily shows a
// t of seconds, not a day and more). On a denial it is the wait until the
// request would pass, as Retry-After says, and for a limit that admitted a
// request another denied, the seconds until its count is 0 (ResetSeconds):
// it counted nothing to refill. It returns none when the headers show nothing of
// the decision (see Shown) or nothing of its counts: a Degraded decision,
// which Redis did not make.
func (pl *Plan) RateLimits(results []ratelimit.Result) []string {
	binding := ratelimit.Binding(results)
	if binding.Degraded || !pl.Shown(results) {
		return nil
	}
	never := neverPasses(binding)
	items := make([]string, len(pl.enforced))
	for k, i := range pl.enforced {
		items[k] = pl.names[i] + ";r=" + strconv.FormatInt(results[i].Remaining, 10)
		if !never {
			items[k] += ";t=" + strconv.FormatInt(windowSeconds(results[i]), 10)
		}
	}
	return items
}

// windowSeconds returns RateLimit's t for res (see RateLimits): the
// seconds until its remaining grows, for a Result that counted its request,
// else ResetSeconds.
func windowSeconds(res ratelimit.Result) int64 {
	if res.Allowed && res.RefillAfter() > 0 {
		return seconds(res.RefillAfter())
	}
	return ResetSeconds(res)
}

// defaultPlan returns the default plan, the limit given to New followed
// by WithLimits' extra, or the error naming the argument at fault: a limit
// invalid alone, else the plan they make together.
func defaultPlan(limit ratelimit.Limit, extra []ratelimit.Limit) (*Plan, error) {
	where := "New's limit"
	for i, l := range append([]ratelimit.Limit{limit}, extra...) {
		if _, err := NewPlan(l); err != nil {
			return nil, fmt.Errorf("httplimit: %s: %w", where, err)
		}
		where = fmt.Sprintf("WithLimits' limit number %d", i+1)
	}
	pl, err := NewPlan(append([]ratelimit.Limit{limit}, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("httplimit: New with WithLimits: %w", err)
	}
	return pl, nil
}

// planFor returns the plan r is decided against: the one WithPlanFunc
// returns for it, checked by NewPlan, or the default plan (the limit given
// to New and WithLimits') when there is no plan function or it returns no
// limit. For a plan NewPlan rejects, it returns what AllowAll returns with
// an error, one Result per limit, zero but for its Limit, and the error.
func (m *middleware) planFor(r *http.Request) (*Plan, []ratelimit.Result, error) {
	if m.cfg.plan == nil {
		return m.static, nil, nil
	}
	limits := m.cfg.plan(r)
	if len(limits) == 0 {
		return m.static, nil, nil
	}
	pl, err := NewPlan(limits...)
	if err != nil {
		results := make([]ratelimit.Result, len(limits))
		for i, limit := range limits {
			results[i].Limit = limit
		}
		return nil, results, fmt.Errorf("httplimit: WithPlanFunc's plan: %w", err)
	}
	return pl, nil, nil
}
