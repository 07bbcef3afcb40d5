package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// env returns a lookup of vars, name=value each.
func env(vars ...string) func(string) (string, bool) {
	m := map[string]string{}
	for _, v := range vars {
		name, value, _ := strings.Cut(v, "=")
		m[name] = value
	}
	return func(name string) (string, bool) { v, ok := m[name]; return v, ok }
}

// The reference's defaults, where the meaning is the same.
func TestDefaults(t *testing.T) {
	s, err := readSettings(env())
	require.NoError(t, err)
	require.Equal(t, 8081, s.grpcPort)
	require.Equal(t, 8080, s.port)
	require.Equal(t, "unix", s.redisSocketType)
	require.Equal(t, "/var/run/nutcracker/ratelimit.sock", s.redisURL)
	require.Equal(t, "/srv/runtime_data/current/config", s.configDir())
	require.Equal(t, ":9090", s.prometheusAddr)
	require.Equal(t, "/metrics", s.prometheusPath)
	require.Equal(t, 0.8, s.nearLimitRatio)
	require.Equal(t, "unavailable", s.failurePolicy)
	require.Equal(t, 100*time.Millisecond, s.timeout)
	require.Empty(t, s.notHonoured)
}

func TestSettingsErrors(t *testing.T) {
	for _, tc := range []struct{ v, says string }{
		{"GRPC_PORT=x", "GRPC_PORT"},
		{"REDIS_TYPE=ring", "REDIS_TYPE"},
		{"REDIS_SOCKET_TYPE=udp", "REDIS_SOCKET_TYPE"},
		{"SHADOW_MODE=maybe", "SHADOW_MODE"},
		{"NEAR_LIMIT_RATIO=2", "NEAR_LIMIT_RATIO"},
		{"RLS_FAILURE_POLICY=sometimes", "RLS_FAILURE_POLICY"},
		{"RLS_TIMEOUT=soon", "RLS_TIMEOUT"},
		{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT"},
	} {
		_, err := readSettings(env(tc.v))
		require.ErrorContains(t, err, tc.says, tc.v)
	}
	s, err := readSettings(env("REDIS_TYPE=cluster", "REDIS_PIPELINE_WINDOW=150us", "MERGE_DOMAIN_CONFIG=true", "REDIS_URL=a:1"))
	require.NoError(t, err, "REDIS_TYPE in any case")
	require.Equal(t, []string{"MERGE_DOMAIN_CONFIG", "REDIS_PIPELINE_WINDOW"}, s.notHonoured)
}
