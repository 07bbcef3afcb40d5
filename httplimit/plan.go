package httplimit

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/slidingwindow/ratelimit"
)

// policy is one limit of a plan, resolved: its Limit carries the explicit
// name (Policy.Name or Limit.Name, if any) and the Shadow flag, and its name
// is already quoted for the IETF headers.
type policy struct {
	name   string // given, or derived from the limit
	quoted string
	limit  ratelimit.Limit
}

// plan is the policies one request is decided against, in the order the
// headers list them, and their limits as AllowAll takes them. A plan is
// never changed once built, so that requests can share it.
type plan struct {
	policies []policy
	limits   []ratelimit.Limit
}

// resolve turns p into a policy: a zero Limit stands for base's limit (and
// its name, unless p has one), p.Name becomes the Limit's Name, and
// p.Shadow sets the Limit's Shadow.
func resolve(p Policy, base *policy) policy {
	if p.Limit == (ratelimit.Limit{}) && base != nil {
		p.Limit = base.limit
	}
	limit := p.Limit
	if p.Name != "" {
		limit.Name = p.Name
	}
	limit.Shadow = limit.Shadow || p.Shadow
	name := limit.Name
	if name == "" {
		name = policyName(limit)
	}
	return policy{name: name, quoted: sfString(name), limit: limit}
}

// newPlan returns the plan of policies.
func newPlan(policies []policy) *plan {
	pl := &plan{policies: policies, limits: make([]ratelimit.Limit, len(policies))}
	for i, p := range policies {
		pl.limits[i] = p.limit
	}
	return pl
}

// check reports what makes the plan unusable, as New would: an invalid
// limit, more than ratelimit.MaxLimits policies, two policies that would
// share one count (the same Window and Strict), and two policies of the
// same name, which the headers could not tell apart. Each error names the
// policies at fault.
func (pl *plan) check() []error {
	var errs []error
	if n := len(pl.policies); n > ratelimit.MaxLimits {
		errs = append(errs, fmt.Errorf("httplimit: %w: %d policies, more than ratelimit.MaxLimits (%d)",
			ratelimit.ErrInvalidLimit, n, ratelimit.MaxLimits))
	}
	for i, p := range pl.policies {
		if err := p.limit.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("httplimit: policy %s: %w", strconv.Quote(p.name), err))
		}
		for _, q := range pl.policies[:i] {
			if q.limit.Window == p.limit.Window && q.limit.Strict == p.limit.Strict {
				errs = append(errs, fmt.Errorf("httplimit: %w: policies %s (%v) and %s (%v) have the same window and would share one count; "+
					"give one another window, or count it under another identity (WithRoute) or Limiter",
					ratelimit.ErrInvalidLimit, strconv.Quote(q.name), q.limit, strconv.Quote(p.name), p.limit))
			}
			if q.quoted == p.quoted { // the same once sent
				errs = append(errs, fmt.Errorf("httplimit: two policies are named %s (%v and %v); the headers could not tell them apart",
					strconv.Quote(p.name), q.limit, p.limit))
			}
		}
	}
	return errs
}

// base returns the policy of the limit given to Middleware.
func (m *middleware) base() *policy { return &m.static.policies[0] }

// planFor returns the plan r is decided against: WithPlanFunc's, or the
// policy WithLimitFunc chooses with WithPolicies' beside it, or the plan
// New built. A plan made for this request is checked as New checks the
// static one; the error is the first problem found.
func (m *middleware) planFor(r *http.Request) (*plan, error) {
	c := &m.cfg
	var policies []policy
	switch {
	case c.plan != nil:
		chosen := c.plan(r)
		if len(chosen) == 0 {
			return m.static, nil
		}
		policies = make([]policy, len(chosen))
		for i, p := range chosen {
			policies[i] = resolve(p, m.base())
		}
	case c.policy != nil:
		chosen := c.policy(r)
		if chosen == (Policy{}) {
			return m.static, nil
		}
		policies = make([]policy, 0, len(m.static.policies))
		policies = append(policies, resolve(chosen, m.base()))
		policies = append(policies, m.static.policies[1:]...)
	default:
		return m.static, nil
	}
	pl := newPlan(policies)
	if errs := pl.check(); len(errs) > 0 {
		return pl, errs[0]
	}
	return pl, nil
}

// wouldDeny reports that shadow mode let res through although its limit
// would have denied the request: a shadowed policy that alone would have
// denied it, or, under ratelimit.WithShadow, an enforced policy that denied
// the decision.
func wouldDeny(res ratelimit.Result) bool { return res.Shadowed }

// binding returns the Result FromContext reports (see there).
func binding(results []ratelimit.Result) ratelimit.Result {
	plain := true
	for _, res := range results {
		if res.Limit.Shadow || res.Shadowed {
			plain = false
			break
		}
	}
	if plain {
		return ratelimit.Binding(results)
	}
	ranked := make([]ratelimit.Result, 0, len(results))
	for _, res := range results {
		if !res.Limit.Shadow {
			ranked = append(ranked, res)
		}
	}
	if len(ranked) == 0 {
		ranked = append(ranked, results...)
	}
	denied := false
	for _, res := range ranked {
		denied = denied || !res.Allowed || wouldDeny(res)
	}
	if !denied {
		return ratelimit.Binding(ranked)
	}
	chosen := make([]ratelimit.Result, len(ranked))
	for i, res := range ranked {
		res.Allowed = false
		chosen[i] = res
	}
	b := ratelimit.Binding(chosen)
	// The limits of one decision differ (in Window or Strict), so the
	// Limit finds the Result Binding chose.
	for _, res := range ranked {
		if res.Limit == b.Limit {
			return res
		}
	}
	return b
}

// shown returns the policies and Results the rate-limit headers describe:
// all but the shadowed policies', and but those shadow mode let through.
// Both are empty when nothing is to be shown.
func shown(pl *plan, results []ratelimit.Result) ([]policy, []ratelimit.Result) {
	for _, res := range results {
		if !res.Limit.Shadow && res.Shadowed {
			return nil, nil // ratelimit.WithShadow let a denial through
		}
	}
	all := true
	for _, res := range results {
		if res.Limit.Shadow || res.Shadowed {
			all = false
			break
		}
	}
	if all {
		return pl.policies, results
	}
	var ps []policy
	var rs []ratelimit.Result
	for i, res := range results {
		if !res.Limit.Shadow && !res.Shadowed {
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
