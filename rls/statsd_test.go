package rls

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
)

// statsdLines returns what s writes, by line, and the number of Writes.
func statsdLines(t *testing.T, s *Statsd) (lines []string, writes int) {
	t.Helper()
	w := &packets{}
	_, err := s.WriteTo(w)
	require.NoError(t, err)
	for _, p := range w.p {
		require.LessOrEqual(t, len(p), packetSize)
		require.True(t, strings.HasSuffix(p, "\n"), "a packet of whole lines: %q", p)
		lines = append(lines, strings.Split(strings.TrimSuffix(p, "\n"), "\n")...)
	}
	return lines, len(w.p)
}

// packets records each Write.
type packets struct{ p []string }

func (w *packets) Write(b []byte) (int, error) { w.p = append(w.p, string(b)); return len(b), nil }

// The statsd lines of a few calls: the reference's names, counters summed
// since the last flush, a response time a call; nothing counted, nothing
// written.
func TestStatsd(t *testing.T) {
	m, err := NewMetrics(nil)
	require.NoError(t, err)
	sd := NewStatsd(map[string]string{"env": "prod.eu", "zone": "a:b"})
	m.SetStatsd(sd)
	f := newFixture(t, WithMetrics(m))
	for range 3 {
		f.ask(t, 0, desc("user", "ann"))
	}
	for range 2 {
		f.ask(t, 0, desc("trial", "x"))
	}
	_, err = f.s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{})
	require.Error(t, err)
	m.ConfigLoaded(nil)

	lines, _ := statsdLines(t, sd)
	t.Logf("statsd lines:\n%s", strings.Join(lines, "\n"))
	tags := ".__env=prod_eu.__zone=a_b"
	var times int
	var counters []string
	for _, l := range lines {
		if strings.HasPrefix(l, "ratelimit_server.ShouldRateLimit.response_time"+tags+":") && strings.HasSuffix(l, "|ms") {
			times++
		} else {
			counters = append(counters, l)
		}
	}
	require.Equal(t, 6, times, "a response time a call")
	require.ElementsMatch(t, []string{
		"ratelimit.service.rate_limit.api.user.total_hits" + tags + ":3|c",
		"ratelimit.service.rate_limit.api.user.within_limit" + tags + ":2|c",
		"ratelimit.service.rate_limit.api.user.near_limit" + tags + ":1|c",
		"ratelimit.service.rate_limit.api.user.over_limit" + tags + ":1|c",
		"ratelimit.service.rate_limit.api.trial.total_hits" + tags + ":2|c",
		"ratelimit.service.rate_limit.api.trial.within_limit" + tags + ":1|c",
		"ratelimit.service.rate_limit.api.trial.near_limit" + tags + ":1|c",
		"ratelimit.service.rate_limit.api.trial.over_limit" + tags + ":1|c",
		"ratelimit.service.rate_limit.api.trial.shadow_mode" + tags + ":1|c",
		"ratelimit.service.call.should_rate_limit.service_error" + tags + ":1|c",
		"ratelimit.service.config_load_success" + tags + ":1|c",
		"ratelimit_server.ShouldRateLimit.total_requests" + tags + ":6|c",
	}, counters)

	lines, writes := statsdLines(t, sd)
	require.Empty(t, lines)
	require.Zero(t, writes)
	require.Empty(t, sd.rules, "a rule idle for a flush is dropped")
	f.ask(t, 0, desc("user", "ann"))
	lines, _ = statsdLines(t, sd)
	require.Contains(t, lines, "ratelimit.service.rate_limit.api.user.over_limit"+tags+":1|c", "and counts again")
}

// A key's ':', '|' and control characters, and an IPv4 address's dots, do
// not reach a statsd line, as the reference's SanitizeStatName.
func TestStatsdSanitizes(t *testing.T) {
	sd := NewStatsd(nil)
	counts, set := [len(ruleStatNames)]float64{statTotal: 2}, [len(ruleStatNames)]bool{statTotal: true}
	sd.rule("api.remote_address_10.0.0.1.path_/a:b|c\nd", &counts, &set)
	lines, _ := statsdLines(t, sd)
	require.Equal(t, []string{"ratelimit.service.rate_limit.api.remote_address_10_0_0_1.path_/a_b_c_d.total_hits:2|c"}, lines)
}

// Past 1000 calls a flush, the response times are a sample, each with its
// rate; the lines go out in packets of whole lines that fit a datagram.
func TestStatsdSamplesTimes(t *testing.T) {
	sd := NewStatsd(nil)
	for i := range 2500 {
		sd.call(time.Duration(i)*time.Microsecond, i%2 == 0, true)
	}
	lines, writes := statsdLines(t, sd)
	var times int
	for _, l := range lines {
		if strings.HasPrefix(l, statResponseTime+":") {
			require.True(t, strings.HasSuffix(l, "|ms|@0.4"), l)
			times++
		}
	}
	require.Equal(t, maxTimes, times)
	require.Greater(t, writes, 1)
	require.Contains(t, lines, statRedisError+":1250|c")
	require.Contains(t, lines, statTotalRequests+":2500|c")
}

// A line longer than a packet goes alone, whole.
func TestStatsdLongLine(t *testing.T) {
	long := strings.Repeat("x", 2000)
	w := &packets{}
	_, err := writePackets(w, []byte("a:1|c\n"+long+":1|c\nb:1|c\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"a:1|c\n", long + ":1|c\n", "b:1|c\n"}, w.p)
	var buf bytes.Buffer
	_, err = writePackets(&buf, nil)
	require.NoError(t, err)
	require.Zero(t, buf.Len())
}
