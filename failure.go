// The failure policies' decisions.

package ratelimit

import (
	"context"
	"errors"
	"time"

	"github.com/slidingwindow/ratelimit/internal/plan"
)

// onFailure reports a Redis error of id's call to the error handler, and
// returns what the failure policy makes of it, unless it decides in this
// process (FailLocal): whether it allows, and the error the caller gets.
func (l *Limiter) onFailure(ctx context.Context, id string, redisErr error) (allowed bool, err error) {
	l.onError(ctx, id, redisErr)
	if errors.Is(redisErr, ErrMisconfigured) { // no policy: it answers every call so, and an allow hides it
		return false, redisErr
	}
	if l.policy == FailClosed {
		return false, wrap("ratelimit: Redis could not decide (FailClosed)", ErrUnavailable, redisErr)
	}
	return true, nil
}

// fail turns an error from Redis into a decision of p (a decision or a
// look) by the failure policy: every limit alike, or under FailLocal each
// against its share in this process, all or nothing.
func (l *Limiter) fail(ctx context.Context, id string, o *op, p *plan.Plan, outs []plan.Out, out []Result, took time.Duration, redisErr error) error {
	allowed, err := l.onFailure(ctx, id, redisErr)
	var refused uint32
	if l.policy == FailLocal && err == nil {
		l.local.Decide(p)
		allowed, refused = p.Derive(false, outs)
		l.fill(out, outs, p)
	}
	return l.degrade(ctx, id, o, out, allowed, refused, took, redisErr, err)
}

// failMany is fail for p, an AllowMany's: under FailLocal each quota
// against its share, all or nothing.
func (l *Limiter) failMany(ctx context.Context, id string, o *op, p *plan.Plan, outs []plan.Out, out []Result, took time.Duration, redisErr error) error {
	allowed, err := l.onFailure(ctx, id, redisErr)
	var refused uint32
	if l.policy == FailLocal && err == nil {
		l.local.DecideMany(p)
		allowed, refused = p.DeriveMany(outs)
		l.fill(out, outs, p)
	}
	return l.degrade(ctx, id, o, out, allowed, refused, took, redisErr, err)
}

// degrade marks out, the Results of a decision the failure policy made,
// Degraded, with nothing to refund; unless FailLocal counted them, they
// say allowed, with all of each Rate left, or not; out through finish.
func (l *Limiter) degrade(ctx context.Context, id string, o *op, out []Result, allowed bool, refused uint32, took time.Duration, redisErr, err error) error {
	for i := range out {
		r := &out[i]
		if l.policy != FailLocal {
			*r = Result{Allowed: allowed, Limit: r.Limit}
			if allowed {
				r.Remaining = r.Limit.Rate
			}
		}
		r.Degraded, r.receipt = true, receipt{} // counted here, if at all, not in Redis
	}
	return l.finish(ctx, id, o, out, allowed, refused, SourcePolicy, took, redisErr, err)
}
