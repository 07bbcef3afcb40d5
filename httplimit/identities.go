// A decision under several identities (WithLimitsPer): the plan of a
// further identity, and the decision, refunds and charges identity by
// identity. grpclimit's WithLimitsPer is built of the same parts, so that
// the twins cannot drift.

package httplimit

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/slidingwindow/ratelimit"
)

// Identity is one identity a decision counts under and the limits counted
// under it: a plan's identity, or a further one's (WithLimitsPer).
type Identity struct {
	ID     string
	Limits []ratelimit.Limit
}

// Identities are the identities of one decision, the plan's first: what
// the middleware and grpclimit's interceptors decide, refund and charge a
// request under. Their Results are in their order, and each one's in the
// order of its Limits.
type Identities []Identity

// NewPlanPer returns the plan of a further identity named name, as
// WithLimitsPer counts it (grpclimit's too): limits each with a Name
// keeps it, and each with none is named name, or with several limits name
// and its derived name ("per-ip-100-per-60s"). A name that is empty or
// holds '|' (which ends it in the ids counted) is an error, as is a plan
// NewPlan refuses. The error does not name the package: its caller does.
func NewPlanPer(name string, limits ...ratelimit.Limit) (*Plan, error) {
	switch {
	case name == "":
		return nil, errors.New("WithLimitsPer: the identity has no name")
	case strings.Contains(name, "|"):
		return nil, fmt.Errorf("WithLimitsPer(%q): the name holds '|', which ends it in the ids counted", name)
	}
	named := append([]ratelimit.Limit(nil), limits...)
	for i := range named {
		if named[i].Name != "" || named[i] == (ratelimit.Limit{}) {
			continue
		}
		derived := strings.Trim(PolicyName(named[i]), `"`) // a derived name needs no escape
		named[i].Name = name
		if len(named) > 1 {
			named[i].Name += "-" + derived
		}
	}
	pl, err := NewPlan(named...)
	if err != nil {
		return nil, fmt.Errorf("WithLimitsPer(%q): %w", name, err)
	}
	return pl, nil
}

// Allow decides one request of cost against the limits of every identity
// at once: for one identity the Limiter's AllowAll, for several its
// AllowMany, all or nothing (a cost below 1 is then ErrInvalidCost, as
// AllowAll's is). Leased limits are decided from the leases of their
// identity's id.
func (ids Identities) Allow(ctx context.Context, l *ratelimit.Limiter, cost int64) ([]ratelimit.Result, error) {
	if len(ids) == 1 {
		return l.AllowAll(ctx, ids[0].ID, ids[0].Limits, cost)
	}
	if cost < 1 { // AllowMany would take a Cost of 0 as a look, counting nothing
		return ids.Results(), fmt.Errorf("%w: cost %d is below 1", ratelimit.ErrInvalidCost, cost)
	}
	var qs []ratelimit.Quota
	for _, id := range ids {
		for _, limit := range id.Limits {
			qs = append(qs, ratelimit.Quota{ID: id.ID, Limit: limit, Cost: cost})
		}
	}
	return l.AllowMany(ctx, qs)
}

// Results returns one Result per limit of each identity, zero but for its
// Limit: what Allow returns with an error before anything is decided.
func (ids Identities) Results() []ratelimit.Result {
	var results []ratelimit.Result
	for _, id := range ids {
		for _, limit := range id.Limits {
			results = append(results, ratelimit.Result{Limit: limit})
		}
	}
	return results
}

// Refund gives back cost under every identity, whose Results (Allow's) are
// results. It is owed even if the client left, within l's timeout; a
// refund of what was not counted (shadow mode let a denial through, the
// failure policy decided) is an error that is no failure, and is not
// reported.
func (ids Identities) Refund(ctx context.Context, l *ratelimit.Limiter, results []ratelimit.Result, cost int64) {
	ctx = context.WithoutCancel(ctx)
	at := 0
	for _, id := range ids {
		_ = l.Refund(ctx, id.ID, results[at:at+len(id.Limits)], cost)
		at += len(id.Limits)
	}
}

// Charge charges n under every identity, whatever their counts: work done,
// owed even if the client left, within l's timeout.
func (ids Identities) Charge(ctx context.Context, l *ratelimit.Limiter, n int64) error {
	var errs []error
	for _, id := range ids {
		if _, err := l.Charge(context.WithoutCancel(ctx), id.ID, id.Limits, n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
