package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

func TestPerDay(t *testing.T) {
	require.Equal(t, ratelimit.Limit{Rate: 10_000, Window: 24 * time.Hour}, ratelimit.PerDay(10_000))
	require.NoError(t, ratelimit.PerDay(10_000).Validate())
	require.Equal(t, "10000/24h0m0s", ratelimit.PerDay(10_000).String())
}
