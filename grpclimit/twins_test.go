package grpclimit_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/grpclimit"
	"github.com/slidingwindow/ratelimit/httplimit"
)

// grpclimit's ClientKey, PolicyName and ResetSeconds are httplimit's: one
// client is one count, and one limit one name, over HTTP and gRPC alike.
func TestTwinsShareKeysAndNames(t *testing.T) {
	require.Equal(t, httplimit.UnknownClient, grpclimit.UnknownClient)
	for _, a := range []string{"203.0.113.7", "::ffff:203.0.113.7", "2001:db8:1:2:3:4:5:6", "fe80::1%eth0", "::"} {
		addr := netip.MustParseAddr(a)
		for _, bits := range []int{0, 48, 64, 128, 129} {
			require.Equal(t, httplimit.ClientKey(addr, bits), grpclimit.ClientKey(addr, bits), "%s /%d", a, bits)
		}
	}
	for _, limit := range []ratelimit.Limit{
		{Name: "burst", Rate: 5, Window: time.Second},
		ratelimit.PerMinute(100),
		{Rate: 10, Window: 500 * time.Millisecond},
		{Name: `a "quoted" name`, Rate: 1, Window: time.Hour},
	} {
		require.Equal(t, httplimit.PolicyName(limit), grpclimit.PolicyName(limit))
	}
	for _, res := range []ratelimit.Result{
		{Allowed: true, ResetAfter: 1500 * time.Millisecond},
		{RetryAfter: 200 * time.Millisecond, ResetAfter: time.Minute},
		{RetryAfter: -1, ResetAfter: time.Minute},
	} {
		require.Equal(t, httplimit.ResetSeconds(res), grpclimit.ResetSeconds(res))
	}
}
