// The quota service's settings (RLS_QUOTA_*), read beside the others.

package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/rls"
)

// quotaOptions reads the RLS_QUOTA_* settings from env: durations in whole
// seconds, such as 10s, but for RLS_QUOTA_MESSAGE_DELAY (1ms to 1s); a value that does not parse is an error naming the
// variable.
func quotaOptions(env func(string) (string, bool)) ([]rls.QuotaOption, error) {
	var opts []rls.QuotaOption
	var errs []string
	for _, d := range []struct {
		name string
		opt  func(time.Duration) rls.QuotaOption
	}{
		{"RLS_QUOTA_TTL", rls.WithQuotaTTL},
		{"RLS_QUOTA_FILL_INTERVAL", rls.WithQuotaFillInterval},
		{"RLS_QUOTA_REPORT_INTERVAL", rls.WithQuotaReportInterval},
		{"RLS_QUOTA_ABANDON_AFTER", rls.WithQuotaAbandonAfter},
	} {
		v, ok := env(d.name)
		if !ok || v == "" {
			continue
		}
		t, err := time.ParseDuration(v)
		if err != nil || t < time.Second || t%time.Second != 0 {
			errs = append(errs, fmt.Sprintf("%s=%q is not a whole number of seconds such as 10s", d.name, v))
			continue
		}
		opts = append(opts, d.opt(t))
	}
	if v, ok := env("RLS_QUOTA_MESSAGE_DELAY"); ok && v != "" {
		// the longest a message takes either way: not whole seconds, as a
		// loopback's is far less than one
		t, err := time.ParseDuration(v)
		if err != nil || t < time.Millisecond || t > time.Second {
			errs = append(errs, fmt.Sprintf("RLS_QUOTA_MESSAGE_DELAY=%q is not a duration from 1ms to 1s such as 200ms", v))
		} else {
			opts = append(opts, rls.WithQuotaMessageDelay(t))
		}
	}
	if v, ok := env("RLS_QUOTA_MAX_BUCKETS"); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Sprintf("RLS_QUOTA_MAX_BUCKETS=%q is not a number of 1 or more", v))
		}
		opts = append(opts, rls.WithQuotaMaxBuckets(n))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("ratelimit-rls: %s", strings.Join(errs, "; "))
	}
	return opts, nil
}
