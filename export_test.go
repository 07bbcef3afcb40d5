package ratelimit

// MaxLimits is maxLimits, for the tests of package ratelimit_test.
const MaxLimits = maxLimits

// The defaults the tests of package ratelimit_test check against.
const (
	DefaultBatch = defaultBatch
	MaxIDLength  = maxIDLength
)
