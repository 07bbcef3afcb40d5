package otel

// defaultNearLimit is WithNearLimit's default: Envoy's near_limit ratio.
const defaultNearLimit = 0.8

// Option configures an Observer; pass options to NewObserver.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	nearLimit float64
}

// WithNearLimit sets the fraction of a limit's Rate at and above which an
// admitted request's Result counts in ratelimit.near_limit (default 0.8,
// Envoy's near_limit ratio): Count >= fraction × Rate. NewObserver rejects a
// fraction outside (0, 1].
func WithNearLimit(fraction float64) Option {
	return optionFunc(func(c *config) { c.nearLimit = fraction })
}
