package otel

// MaxPolicies is maxPolicies, for the tests of package otel_test.
const MaxPolicies = maxPolicies
