// The quota service's Prometheus metrics.

package rls

import "github.com/prometheus/client_golang/prometheus"

// QuotaMetrics are a QuotaServer's Prometheus metrics:
// ratelimit_service_quota_streams and ratelimit_service_quota_buckets (open
// now), ratelimit_service_quota_reports_total (buckets' usage reports),
// ratelimit_service_quota_assignments_total by action (token_bucket,
// allow_all, deny_all, abandon), ratelimit_service_quota_tokens_leased_total
// (tokens counted in Redis for assignments),
// ratelimit_service_quota_tokens_given_back_total and
// ratelimit_service_quota_buckets_abandoned_total.
type QuotaMetrics struct {
	streams, buckets                      prometheus.Gauge
	reports, leased, givenBack, abandoned prometheus.Counter
	assignments                           *prometheus.CounterVec
}

// NewQuotaMetrics returns QuotaMetrics registered with reg.
func NewQuotaMetrics(reg prometheus.Registerer) (*QuotaMetrics, error) {
	const p = "ratelimit_service_quota_"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: p + name, Help: help})
	}
	m := &QuotaMetrics{
		streams:     prometheus.NewGauge(prometheus.GaugeOpts{Name: p + "streams", Help: "Quota streams open."}),
		buckets:     prometheus.NewGauge(prometheus.GaugeOpts{Name: p + "buckets", Help: "Buckets of the open quota streams."}),
		reports:     counter("reports_total", "Usage reports of buckets."),
		leased:      counter("tokens_leased_total", "Tokens counted in Redis for quota assignments."),
		givenBack:   counter("tokens_given_back_total", "Tokens that reports showed unused, given back."),
		abandoned:   counter("buckets_abandoned_total", "Buckets abandoned, unreported for RLS_QUOTA_ABANDON_AFTER."),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{Name: p + "assignments_total", Help: "Bucket actions sent, by action."}, []string{"action"}),
	}
	for _, c := range []prometheus.Collector{m.streams, m.buckets, m.reports, m.leased, m.givenBack, m.abandoned, m.assignments} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
