package httplimit

import (
	"fmt"
	"net/http"

	"github.com/slidingwindow/ratelimit"
)

// policy is one limit of a plan, with its name quoted once for the IETF
// headers.
type policy struct {
	quoted string // PolicyName(limit)
	limit  ratelimit.Limit
}

// plan is the limits one request is decided against, in the order the
// headers list them, and their policies. A plan is never changed once
// built, so that requests can share it.
type plan struct {
	policies []policy
	limits   []ratelimit.Limit
}

// newPlan returns the plan of limits, which it keeps.
func newPlan(limits []ratelimit.Limit) *plan {
	pl := &plan{policies: make([]policy, len(limits)), limits: limits}
	for i, limit := range limits {
		pl.policies[i] = policy{quoted: PolicyName(limit), limit: limit}
	}
	return pl
}

// check reports what makes the plan unusable, as AllowAll would
// (ratelimit.ValidateLimits: no limit, more than 16, an invalid limit, two
// that would share one count), and two limits of the same name, which the
// headers could not tell apart. where names the option or function the
// plan came from; the error wraps ratelimit.ErrInvalidLimit.
func (pl *plan) check(where string) error {
	for i, limit := range pl.limits {
		if limit == (ratelimit.Limit{}) {
			return fmt.Errorf("httplimit: %s: %w: limit number %d is the zero Limit; "+
				"a plan lists every limit it holds, the one given to New included", where, ratelimit.ErrInvalidLimit, i+1)
		}
	}
	if err := ratelimit.ValidateLimits(pl.limits); err != nil {
		return fmt.Errorf("httplimit: %s: %w", where, err)
	}
	for i, p := range pl.policies {
		for _, q := range pl.policies[:i] {
			if q.quoted == p.quoted { // the same once sent
				return fmt.Errorf("httplimit: %s: %w: two limits are named %s (%v and %v); the headers could not tell them apart",
					where, ratelimit.ErrInvalidLimit, p.quoted, q.limit, p.limit)
			}
		}
	}
	return nil
}

// checkDefault reports what makes the default plan unusable, as check
// does, naming the argument at fault: the limit given to New (the plan's
// first), one of WithLimits' (the rest), or, when each limit is valid
// alone, the plan they make together.
func checkDefault(pl *plan) error {
	for i, limit := range pl.limits {
		where := "New's limit"
		if i > 0 {
			where = fmt.Sprintf("WithLimits' limit number %d", i)
		}
		if limit == (ratelimit.Limit{}) {
			return fmt.Errorf("httplimit: %s: %w: it is the zero Limit", where, ratelimit.ErrInvalidLimit)
		}
		if err := limit.Validate(); err != nil {
			return fmt.Errorf("httplimit: %s: %w", where, err)
		}
	}
	if len(pl.limits) == 1 {
		return pl.check("New")
	}
	return pl.check("New with WithLimits")
}

// planFor returns the plan r is decided against: the one WithPlanFunc
// returns for it, checked as New checks the default one, or the default
// plan (the limit given to New and WithLimits') when there is no plan
// function or it returns no limit.
func (m *middleware) planFor(r *http.Request) (*plan, error) {
	if m.cfg.plan == nil {
		return m.static, nil
	}
	limits := m.cfg.plan(r)
	if len(limits) == 0 {
		return m.static, nil
	}
	pl := newPlan(append([]ratelimit.Limit(nil), limits...))
	return pl, pl.check("WithPlanFunc's plan")
}

// shown returns the policies and Results the rate-limit headers describe:
// the enforced ones, unless ratelimit.WithShadow let a denial through, when
// none is. Both are empty when nothing is to be shown.
func shown(pl *plan, results []ratelimit.Result) ([]policy, []ratelimit.Result) {
	all := true
	for _, res := range results {
		if res.Limit.Shadow {
			all = false
		} else if res.Shadowed {
			return nil, nil // ratelimit.WithShadow let a denial through
		}
	}
	if all {
		return pl.policies, results
	}
	var ps []policy
	var rs []ratelimit.Result
	for i, res := range results {
		if !res.Limit.Shadow {
			ps = append(ps, pl.policies[i])
			rs = append(rs, res)
		}
	}
	return ps, rs
}

// errPlanResults returns, for a plan the middleware refused before asking
// the limiter, what AllowAll returns with an error: one Result per limit,
// zero but for its Limit.
func errPlanResults(pl *plan) []ratelimit.Result {
	results := make([]ratelimit.Result, len(pl.limits))
	for i, limit := range pl.limits {
		results[i].Limit = limit
	}
	return results
}
