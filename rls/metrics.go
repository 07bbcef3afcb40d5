// The service's Prometheus metrics: the reference's per-rule hit counters,
// the calls' latency and errors, and the configuration's loads.

package rls

import (
	"math"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit"
)

// Metrics are a Server's Prometheus metrics, named as the reference's
// default statsd-to-Prometheus mapping names them:
// ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}
// by domain, key1 and key2 (the rule's key, or with detailed_metric the
// request's values: its first two parts after the domain, cleaned as the
// reference cleans stat names), in hits;
// ratelimit_service_response_time_seconds; ratelimit_service_should_rate_limit_error
// by err_type (the gRPC code); ratelimit_service_global_shadow_mode; and
// ratelimit_service_config_load_{success,error}. With SetStatsd, they are
// counted for a statsd server too, under the reference's statsd names.
type Metrics struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode *prometheus.CounterVec
	responseTime                                             prometheus.Histogram
	errors                                                   *prometheus.CounterVec
	globalShadow, loadSuccess, loadError                     prometheus.Counter
	prometheus                                               bool // registered: the rules' counters are kept
	statsd                                                   *Statsd
}

// NewMetrics returns Metrics registered with reg; with reg nil, Metrics
// for SetStatsd alone.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	rule := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + name, Help: help}, []string{"domain", "key1", "key2"})
	}
	m := &Metrics{
		totalHits:   rule("total_hits", "Hits of a rule's descriptors."),
		overLimit:   rule("over_limit", "Hits over a rule's limit."),
		nearLimit:   rule("near_limit", "Hits past the near-limit share of a rule's limit, and under it."),
		withinLimit: rule("within_limit", "Hits within a rule's limit."),
		shadowMode:  rule("shadow_mode", "Hits over a shadow_mode rule's limit, let through."),
		responseTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ratelimit_service_response_time_seconds",
			Help: "Time to answer ShouldRateLimit.", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_should_rate_limit_error",
			Help: "Calls of ShouldRateLimit answered with an error, by gRPC code."}, []string{"err_type"}),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_global_shadow_mode",
			Help: "Requests over a limit that SHADOW_MODE answered OK."}),
		loadSuccess: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_success", Help: "Configurations loaded."}),
		loadError:   prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_error", Help: "Configurations that failed to load."}),
		prometheus:  reg != nil,
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.totalHits, m.overLimit, m.nearLimit, m.withinLimit, m.shadowMode,
		m.responseTime, m.errors, m.globalShadow, m.loadSuccess, m.loadError} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// SetStatsd has m count into s too. It is called before m is used.
func (m *Metrics) SetStatsd(s *Statsd) {
	m.statsd = s
	m.globalShadow = alsoCount{m.globalShadow, &s.globalShadow}
}

// alsoCount is a Prometheus counter whose Inc also counts in a statsd one.
type alsoCount struct {
	prometheus.Counter
	statsd *atomic.Uint64
}

func (c alsoCount) Inc() { c.Counter.Inc(); c.statsd.Add(1) }

// ConfigLoaded counts a load of the configuration that failed with err, or
// succeeded.
func (m *Metrics) ConfigLoaded(err error) {
	if err != nil {
		m.loadError.Inc()
	} else {
		m.loadSuccess.Inc()
	}
	if s := m.statsd; s != nil && err != nil {
		s.loadError.Add(1)
	} else if s != nil {
		s.loadSuccess.Add(1)
	}
}

// call records a call that took d and ended with err.
func (m *Metrics) call(d time.Duration, err error) {
	m.responseTime.Observe(d.Seconds())
	if err != nil {
		m.errors.WithLabelValues(status.Code(err).String()).Inc()
	}
	if s := m.statsd; s != nil {
		s.call(d, err != nil, err != nil && !serviceError(err))
	}
}

// serviceError reports whether err is what the reference counts as a
// service_error, not a redis_error: a request it refuses, or no
// configuration loaded.
func serviceError(err error) bool {
	st := status.Convert(err)
	return st.Code() == codes.InvalidArgument || st.Code() == codes.Unavailable && strings.HasSuffix(st.Message(), "no rate limit configuration loaded")
}

// hits counts d's hits as the reference does: within or over the limit,
// near_limit for those past ratio of it, and shadow_mode for those over a
// shadow rule's.
func (m *Metrics) hits(domain string, d descriptor, quotas []ratelimit.Quota, results []ratelimit.Result, ratio float64) {
	r := d.match.Rule
	if r.Unlimited {
		return
	}
	// counts by statTotal..statShadow; set: counted, if only 0, as the
	// Prometheus series it makes
	var counts [len(ruleStatNames)]float64
	var set [len(ruleStatNames)]bool
	count := func(stat int, n float64) { counts[stat], set[stat] = n, true }
	h := float64(d.hits)
	count(statTotal, h)
	limit := float64(r.RequestsPerUnit)
	near := math.Floor(float64(float32(limit) * float32(ratio))) // in float32, as the reference
	var before, after float64
	overLimit := d.hits > 0
	if d.quota >= 0 {
		res := results[d.quota]
		var counted bool
		counted, overLimit, _ = d.view(quotas, results)
		// the count before and after this descriptor's hits, as its
		// quota counted them in order (see descriptor.upTo)
		before = float64(res.Count + d.upTo - d.hits)
		if counted && !res.Degraded {
			before -= float64(quotas[d.quota].Cost)
		}
		after = before + h
	}
	switch {
	case !overLimit:
		count(statWithin, h)
		if after > near {
			count(statNear, min(h, after-max(near, before)))
		}
	default:
		overBy := h
		if before < limit {
			overBy = after - limit
			count(statNear, limit-max(near, before))
		}
		count(statOver, overBy)
		if r.Shadow {
			count(statShadow, overBy)
		}
	}
	if m.prometheus {
		labels := metricLabels(domain, d.match.MetricKey)
		for i, c := range [...]*prometheus.CounterVec{m.totalHits, m.overLimit, m.nearLimit, m.withinLimit, m.shadowMode} {
			if set[i] {
				c.WithLabelValues(labels...).Add(counts[i])
			}
		}
	}
	if s := m.statsd; s != nil {
		s.rule(d.match.MetricKey, &counts, &set)
	}
}

// ipv4 finds the IPv4 addresses in a metric's key, whose dots the
// reference's SanitizeStatName replaces.
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// metricLabels returns the domain, key1 and key2 labels of a rule's metric
// key (domain.key1.key2...), as the reference's default mapping makes them
// of its stat name: ':' and '|' made '_', an IPv4 address's dots too, and
// what follows key2 dropped.
func metricLabels(domain, key string) []string {
	key = strings.NewReplacer(":", "_", "|", "_").Replace(strings.TrimPrefix(key, domain+"."))
	key = ipv4.ReplaceAllStringFunc(key, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
	parts := strings.SplitN(key, ".", 3)
	labels := []string{domain, parts[0], ""}
	if len(parts) > 1 {
		labels[2] = parts[1]
	}
	return labels
}
