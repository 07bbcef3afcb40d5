// Package identity is what httplimit and grpclimit share of a decision
// under several identities (their WithLimitsPer): the limits of a further
// identity as the headers name them, the option's checks, and a decision's
// quotas, refunds and charges, identity by identity. One copy, so that the
// twins cannot drift.
package identity

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/slidingwindow/ratelimit"
)

// Part is one identity of a decision and the limits counted under it.
type Part struct {
	ID     string
	Limits []ratelimit.Limit
}

// Check returns what is wrong with a further identity named name, whose
// KeyFunc is nil when keyNil, beside those named taken; nil for nothing.
// The error does not name the package: its caller does.
func Check(name string, keyNil bool, taken []string) error {
	switch {
	case name == "":
		return errors.New("WithLimitsPer: the identity has no name")
	case keyNil:
		return fmt.Errorf("WithLimitsPer(%q): the KeyFunc is nil (ClientAddress for the client's address)", name)
	case strings.Contains(name, "|"):
		return fmt.Errorf("WithLimitsPer(%q): the name holds '|', which ends it in the ids counted", name)
	}
	for _, t := range taken {
		if t == name {
			return fmt.Errorf("WithLimitsPer(%q) given twice", name)
		}
	}
	return nil
}

// Named returns a copy of limits as a further identity named name counts
// them: not Leased (AllowMany decides in Redis), and each with no Name
// named name, or with several limits name and its derived name
// ("per-ip-100-per-60s"), which policyName (the headers' quoted name of a
// limit) gives.
func Named(name string, limits []ratelimit.Limit, policyName func(ratelimit.Limit) string) []ratelimit.Limit {
	out := append([]ratelimit.Limit(nil), limits...)
	for i := range out {
		out[i].Leased = false
		if out[i].Name != "" || out[i] == (ratelimit.Limit{}) {
			continue
		}
		derived := strings.Trim(policyName(out[i]), `"`) // a derived name needs no escape
		out[i].Name = name
		if len(out) > 1 {
			out[i].Name += "-" + derived
		}
	}
	return out
}

// Quotas returns the quotas of a decision of parts at cost, for AllowMany,
// which leases nothing: Leased is dropped.
func Quotas(parts []Part, cost int64) []ratelimit.Quota {
	var qs []ratelimit.Quota
	for _, p := range parts {
		for _, limit := range p.Limits {
			limit.Leased = false
			qs = append(qs, ratelimit.Quota{ID: p.ID, Limit: limit, Cost: cost})
		}
	}
	return qs
}

// Unset returns what AllowAll returns with an error for parts' limits: one
// Result per limit, zero but for its Limit.
func Unset(parts []Part) []ratelimit.Result {
	var results []ratelimit.Result
	for _, p := range parts {
		for _, limit := range p.Limits {
			results = append(results, ratelimit.Result{Limit: limit})
		}
	}
	return results
}

// Refund gives back cost under every identity of parts, whose Results are
// results in the same order. It is owed even if the client left, within
// l's timeout; a refund of what was not counted (shadow mode let a denial
// through, the failure policy decided) is an error that is no failure, and
// is not reported.
func Refund(ctx context.Context, l *ratelimit.Limiter, parts []Part, results []ratelimit.Result, cost int64) {
	ctx = context.WithoutCancel(ctx)
	at := 0
	for _, p := range parts {
		_ = l.Refund(ctx, p.ID, results[at:at+len(p.Limits)], cost)
		at += len(p.Limits)
	}
}

// Charge charges n under every identity of parts, whatever their counts:
// work done, owed even if the client left, within l's timeout.
func Charge(ctx context.Context, l *ratelimit.Limiter, parts []Part, n int64) error {
	var errs []error
	for _, p := range parts {
		if _, err := l.Charge(context.WithoutCancel(ctx), p.ID, p.Limits, n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
