package main

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

// USE_STATSD=true: the reference's stat names reach a statsd server, over
// TCP (the reference's gostats sink) or UDP (STATSD_PROTOCOL=udp), summed
// over the flushes that carried them.
func TestStatsd(t *testing.T) {
	redisSrv := testredis.Start(t)
	for _, network := range []string{"tcp", "udp"} {
		t.Run(network, func(t *testing.T) {
			received := &syncBuffer{}
			var addr net.Addr
			if network == "udp" {
				pc, err := net.ListenPacket("udp", "127.0.0.1:0")
				require.NoError(t, err)
				t.Cleanup(func() { _ = pc.Close() })
				addr = pc.LocalAddr()
				go func() {
					buf := make([]byte, 65536)
					for {
						n, _, err := pc.ReadFrom(buf)
						if err != nil {
							return
						}
						_, _ = received.Write(buf[:n])
					}
				}()
			} else {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				t.Cleanup(func() { _ = ln.Close() })
				addr = ln.Addr()
				go func() {
					for {
						conn, err := ln.Accept()
						if err != nil {
							return
						}
						go func() { _, _ = io.Copy(received, conn); _ = conn.Close() }()
					}
				}()
			}
			s := start(t, "REDIS_URL="+redisSrv.Addr, "USE_STATSD=true", "STATSD_HOST=127.0.0.1",
				"STATSD_PORT="+portOf(addr), "STATSD_PROTOCOL="+network, "STATS_FLUSH_INTERVAL=50ms", "EXTRA_TAGS=cluster:eu.1")
			require.NotContains(t, s.log.String(), "not honoured")
			c := s.client(t)
			user := "ann-" + network
			for range 3 {
				_, err := ask(context.Background(), c, desc("user", user))
				require.NoError(t, err)
			}
			const tags = ".__cluster=eu_1"
			rule := func(stat string) string { return "ratelimit.service.rate_limit.api.user." + stat + tags }
			waitFor(t, "the calls' stats", func() bool {
				sums, times := statsdSums(received.String())
				return sums[rule("total_hits")] == 3 && sums[rule("over_limit")] == 1 && times >= 3 &&
					sums["ratelimit_server.ShouldRateLimit.total_requests"+tags] >= 3
			})
			sums, _ := statsdSums(received.String())
			require.Equal(t, uint64(2), sums[rule("within_limit")])
			require.Equal(t, uint64(1), sums[rule("near_limit")])
			require.NotZero(t, sums["ratelimit.service.config_load_success"+tags])
			t.Logf("received:\n%s", received)
		})
	}
}

// statsdSums returns the counters of statsd lines, summed by name, and how
// many timer lines there are.
func statsdSums(lines string) (map[string]uint64, int) {
	sums := map[string]uint64{}
	times := 0
	for _, l := range strings.Split(lines, "\n") {
		name, rest, ok := strings.Cut(l, ":")
		switch {
		case !ok:
		case strings.HasSuffix(rest, "|c"):
			n, err := strconv.ParseUint(strings.TrimSuffix(rest, "|c"), 10, 64)
			if err == nil {
				sums[name] += n
			}
		case strings.Contains(rest, "|ms"):
			times++
		}
	}
	return sums, times
}

// portOf returns addr's port.
func portOf(addr net.Addr) string {
	_, port, _ := net.SplitHostPort(addr.String())
	return port
}
