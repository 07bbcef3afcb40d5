package grpclimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/slidingwindow/ratelimit"
)

// A monthly quota in New York, an hour before December: the metadata
// carries the month as httplimit's headers do (w its length, t the
// seconds to its end), and a denial's RetryInfo is the exact wait until
// December.
func TestCalendarMetadata(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	e := newEnv(t, ratelimit.PerPeriod(2, ratelimit.Monthly, ny), nil)
	e.clock.Add(time.Date(2026, 11, 30, 23, 0, 0, 0, ny).Sub(e.clock.Now()))
	conn := e.dial(client)
	require.Equal(t, []codes.Code{codes.OK, codes.OK}, callCodes(t, conn, "A", 2))
	denied := call(t, conn, "A")
	require.Equal(t, codes.ResourceExhausted, denied.code)
	require.Equal(t, time.Hour, *denied.retry)
	require.Equal(t, metadata.MD{
		"ratelimit-limit":     {"2"},
		"ratelimit-remaining": {"0"},
		"ratelimit-reset":     {"3600"},
		"ratelimit-policy":    {`"2-per-month@America/New_York";q=2;w=2595600`}, // 30 days and the hour of November 1
		"ratelimit":           {`"2-per-month@America/New_York";r=0;t=3600`},
		"retry-after":         {"3600"},
	}, rateHeaders(denied.header))
	e.clock.Add(time.Hour)
	require.Equal(t, codes.OK, call(t, conn, "A").code)
}
