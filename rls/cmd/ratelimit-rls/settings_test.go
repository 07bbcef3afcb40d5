package main

import (
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/rls"
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
		{"CONFIG_TYPE=REST", "CONFIG_TYPE"},
		{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR=-1", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR"},
		{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=3", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"},
		{"QUOTA_MODE=sometimes", "QUOTA_MODE"},
		{"RLS_CALENDAR_ZONE=Mars/Olympus", "RLS_CALENDAR_ZONE"},
		{"RLS_CALENDAR_DOMAINS=api", "RLS_CALENDAR_DOMAINS needs RLS_CALENDAR_ZONE"},
	} {
		_, err := readSettings(env(tc.v))
		require.ErrorContains(t, err, tc.says, tc.v)
	}
	s, err := readSettings(env("REDIS_TYPE=cluster", "REDIS_PIPELINE_WINDOW=150us", "LOCAL_CACHE_SIZE_IN_BYTES=1000", "REDIS_URL=a:1"))
	require.NoError(t, err, "REDIS_TYPE in any case")
	require.Equal(t, []string{"LOCAL_CACHE_SIZE_IN_BYTES", "REDIS_PIPELINE_WINDOW"}, s.notHonoured)

	// a switch whose false this service follows is honoured set to false
	s, err = readSettings(env("USE_STATSD=false", "TRACING_ENABLED=false", "USE_DOG_STATSD=true"))
	require.NoError(t, err)
	require.Equal(t, []string{"USE_DOG_STATSD"}, s.notHonoured)
}

// The reference's QUOTA_MODE and RESPONSE_DYNAMIC_METADATA are read (no
// longer named as ignored); calendar periods for the domains named.
func TestQuotaAndCalendarSettings(t *testing.T) {
	s, err := readSettings(env("QUOTA_MODE=true", "RESPONSE_DYNAMIC_METADATA=true",
		"RLS_CALENDAR_ZONE=Europe/Berlin", "RLS_CALENDAR_DOMAINS= default/eg/http ,api,"))
	require.NoError(t, err)
	require.True(t, s.quotaMode)
	require.True(t, s.dynamicMetadata)
	require.Empty(t, s.notHonoured)
	require.Equal(t, "Europe/Berlin", s.calendarZone.String())
	require.Equal(t, []string{"default/eg/http", "api"}, s.calendarDomains)
	c, err := s.loader()([]rls.File{{Name: "a.yaml", Data: []byte("domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 9}\n")}})
	require.NoError(t, err)
	require.Equal(t, "9/monthly@Europe/Berlin", c.Match("api", &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}).Rule.Limit.String())
}

// The xDS settings, with the reference's defaults and Envoy Gateway's
// values; Envoy Gateway's name of the client CA.
func TestXDSSettings(t *testing.T) {
	s, err := readSettings(env())
	require.NoError(t, err)
	require.Equal(t, "FILE", s.configType)
	require.Equal(t, xdsSettings{url: "localhost:18000", nodeID: "default", nodeMetadata: map[string]string{}, headers: map[string]string{},
		connectRetry: 3 * time.Second, backoffInitial: 10 * time.Second, backoffMax: time.Minute, backoffFactor: 0.5, backoffJitter: true}, s.xds)

	s, err = readSettings(env("CONFIG_TYPE=grpc_xds_sotw", "CONFIG_GRPC_XDS_SERVER_URL=envoy-gateway:18001",
		"CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit", "CONFIG_GRPC_XDS_NODE_METADATA=a=1,b=x=y,c",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=k:v", "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt"))
	require.NoError(t, err)
	require.Equal(t, "GRPC_XDS_SOTW", s.configType)
	require.True(t, s.forceStart)
	require.Equal(t, map[string]string{"a": "1", "b": "x=y"}, s.xds.nodeMetadata)
	require.Equal(t, map[string]string{"k": "v"}, s.xds.headers)
	require.Equal(t, "/certs/ca.crt", s.grpcClientCA, "Envoy Gateway's GRPC_SERVER_TLS_CA_CERT verifies clients")
	require.Empty(t, s.notHonoured)
}

// REFERENCE_CUTOVER, and the jitter of the reference's counters it writes.
func TestCutoverSettings(t *testing.T) {
	s, err := readSettings(env())
	require.NoError(t, err)
	require.False(t, s.cutover)
	require.Equal(t, 300*time.Second, s.jitter, "the reference's default")

	s, err = readSettings(env("REFERENCE_CUTOVER=true", "EXPIRATION_JITTER_MAX_SECONDS=10", "CACHE_KEY_PREFIX=rl:"))
	require.NoError(t, err)
	require.True(t, s.cutover)
	require.Equal(t, 10*time.Second, s.jitter)
	require.Equal(t, "rl:", s.cacheKeyPrefix)
	require.Empty(t, s.notHonoured)

	s, err = readSettings(env("EXPIRATION_JITTER_MAX_SECONDS=10"))
	require.NoError(t, err)
	require.Equal(t, []string{"EXPIRATION_JITTER_MAX_SECONDS"}, s.notHonoured, "it applies to the reference's counters only")

	_, err = readSettings(env("REFERENCE_CUTOVER=soon"))
	require.ErrorContains(t, err, "REFERENCE_CUTOVER")
}
