//go:build race

package ratelimit_test

// raceEnabled reports a -race build, whose tests run several times slower:
// TestMain then runs no more parallel tests than there are cores.
const raceEnabled = true
