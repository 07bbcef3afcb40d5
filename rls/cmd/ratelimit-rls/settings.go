// The service's settings, from the environment under envoyproxy/ratelimit's
// names and defaults, and ours beside them.

package main

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/rls"
)

// settings are what the environment says; see readSettings.
type settings struct {
	host, grpcHost          string
	port, grpcPort          int
	redisSocketType         string
	redisURL, redisType     string
	redisAuth               string
	redisTLS                bool
	redisTLSCert            string // REDIS_TLS_CLIENT_CERT, with redisTLSKey: mTLS to Redis
	redisTLSKey             string
	redisTLSCA              string // REDIS_TLS_CACERT: the CA Redis's certificate chains to
	redisTLSSkipHostname    bool   // REDIS_TLS_SKIP_HOSTNAME_VERIFICATION
	redisPoolSize           int
	cacheKeyPrefix          string
	runtimeRoot, runtimeSub string
	runtimeApp              string
	runtimeWatchRoot        bool
	runtimeIgnoreDotFiles   bool
	shadowMode              bool
	quotaMode               bool           // QUOTA_MODE
	dynamicMetadata         bool           // RESPONSE_DYNAMIC_METADATA
	calendarZone            *time.Location // ours: RLS_CALENDAR_ZONE
	calendarDomains         []string       // ours: RLS_CALENDAR_DOMAINS
	logLevel, logFormat     string
	headersEnabled          bool
	limitH, remainingH      string
	resetH                  string
	usePrometheus           bool
	prometheusAddr          string
	prometheusPath          string
	prometheusMapper        string // PROMETHEUS_MAPPER_YAML: not applied; see run
	grpcTLS                 bool
	grpcCert, grpcKey       string
	grpcClientCA            string
	grpcClientSAN           string
	nearLimitRatio          float64
	stopIncrementOverLimit  bool
	failurePolicy           string        // ours: RLS_FAILURE_POLICY
	timeout                 time.Duration // ours: RLS_TIMEOUT
	replicas                int           // ours: RLS_REPLICAS
	configPoll              time.Duration // ours: RLS_CONFIG_POLL
	configType              string        // FILE, or GRPC_XDS_SOTW: see xds.go
	forceStart              bool          // FORCE_START_WITHOUT_INITIAL_CONFIG
	healthyWithConfig       bool          // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
	mergeDomains            bool          // MERGE_DOMAIN_CONFIG
	cutover                 bool          // ours: REFERENCE_CUTOVER
	jitter                  time.Duration // EXPIRATION_JITTER_MAX_SECONDS: of the reference's counters, in cutover
	xds                     xdsSettings
	notHonoured             []string // the reference's variables set here that this service ignores

	tracing tracingSettings // TRACING_*: see tracing.go
	statsd  statsdSettings  // USE_STATSD and the rest: see statsd.go
}

// reference lists the variables of the reference's settings.go that this
// service does not read: one of them set is named at start-up. It reads
// the others (see readSettings and docs/envoy.md).
var reference = strings.Fields(`DEBUG_HOST DEBUG_PORT GRPC_UDS GRPC_MAX_CONNECTION_AGE GRPC_MAX_CONNECTION_AGE_GRACE USE_DOG_STATSD
USE_DOG_STATSD_MOGRIFIERS
DISABLE_STATS PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS
LOCAL_CACHE_SIZE_IN_BYTES BACKEND_TYPE
REDIS_PIPELINE_WINDOW
REDIS_PIPELINE_LIMIT REDIS_CLUSTER_PIPELINE_PARALLELISM REDIS_PERSECOND REDIS_PERSECOND_SOCKET_TYPE
REDIS_PERSECOND_TYPE REDIS_PERSECOND_URL REDIS_PERSECOND_POOL_SIZE REDIS_PERSECOND_AUTH
REDIS_PERSECOND_TLS REDIS_SENTINEL_AUTH REDIS_PERSECOND_SENTINEL_AUTH
REDIS_PERSECOND_PIPELINE_WINDOW REDIS_PERSECOND_PIPELINE_LIMIT
REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_TIMEOUT
REDIS_PERSECOND_TIMEOUT REDIS_POOL_ON_EMPTY_BEHAVIOR REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR
REDIS_STARTUP_INITIAL_INTERVAL REDIS_STARTUP_MAX_INTERVAL REDIS_STARTUP_MAX_ELAPSED_TIME
MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV MEMCACHE_SRV_REFRESH MEMCACHE_TLS
MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY MEMCACHE_TLS_CACERT
MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION`)

// followedWhenFalse are the reference's switches that this service
// follows when they are false: it sends no DogStatsD and reads one Redis.
// (USE_STATSD and TRACING_ENABLED it reads.)
var followedWhenFalse = map[string]bool{"USE_DOG_STATSD": true, "REDIS_PERSECOND": true}

// pairs reads a list such as "a=1,b=2" (sep "="), as the reference reads
// its node metadata and its extra headers: an entry without sep is
// skipped.
func pairs(list, sep string) map[string]string {
	m := map[string]string{}
	for _, entry := range strings.Split(list, ",") {
		if k, v, ok := strings.Cut(entry, sep); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

// readSettings reads the settings from env (os.LookupEnv), with the
// reference's defaults; a value that does not parse is an error naming
// the variable.
func readSettings(env func(string) (string, bool)) (*settings, error) {
	var errs []string
	str := func(name, def string) string {
		if v, ok := env(name); ok {
			return v
		}
		return def
	}
	num := func(name string, def int) int {
		v, ok := env(name)
		if !ok || v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Sprintf("%s=%q is not a number", name, v))
		}
		return n
	}
	flag := func(name string, def bool) bool {
		v, ok := env(name)
		if !ok || v == "" {
			return def
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s=%q is not true or false", name, v))
		}
		return b
	}
	dur := func(name string, def time.Duration) time.Duration {
		v, ok := env(name)
		if !ok || v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Sprintf("%s=%q is not a duration such as 100ms", name, v))
		}
		return d
	}
	s := &settings{
		host: str("HOST", "0.0.0.0"), port: num("PORT", 8080),
		grpcHost: str("GRPC_HOST", "0.0.0.0"), grpcPort: num("GRPC_PORT", 8081),
		redisSocketType: str("REDIS_SOCKET_TYPE", "unix"), redisType: str("REDIS_TYPE", "SINGLE"),
		redisURL: str("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"), redisPoolSize: num("REDIS_POOL_SIZE", 10),
		redisAuth: str("REDIS_AUTH", ""), redisTLS: flag("REDIS_TLS", false),
		redisTLSCert: str("REDIS_TLS_CLIENT_CERT", ""), redisTLSKey: str("REDIS_TLS_CLIENT_KEY", ""),
		redisTLSCA: str("REDIS_TLS_CACERT", ""), redisTLSSkipHostname: flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false),
		cacheKeyPrefix: str("CACHE_KEY_PREFIX", ""),
		runtimeRoot:    str("RUNTIME_ROOT", "/srv/runtime_data/current"), runtimeSub: str("RUNTIME_SUBDIRECTORY", ""),
		runtimeApp: str("RUNTIME_APPDIRECTORY", "config"), runtimeWatchRoot: flag("RUNTIME_WATCH_ROOT", true),
		runtimeIgnoreDotFiles: flag("RUNTIME_IGNOREDOTFILES", false),
		shadowMode:            flag("SHADOW_MODE", false),
		quotaMode:             flag("QUOTA_MODE", false),
		dynamicMetadata:       flag("RESPONSE_DYNAMIC_METADATA", false),
		logLevel:              str("LOG_LEVEL", "WARN"), logFormat: str("LOG_FORMAT", "text"),
		headersEnabled: flag("LIMIT_RESPONSE_HEADERS_ENABLED", false),
		limitH:         str("LIMIT_LIMIT_HEADER", "RateLimit-Limit"), remainingH: str("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
		resetH:        str("LIMIT_RESET_HEADER", "RateLimit-Reset"),
		usePrometheus: flag("USE_PROMETHEUS", false), prometheusAddr: str("PROMETHEUS_ADDR", ":9090"),
		prometheusPath: str("PROMETHEUS_PATH", "/metrics"), prometheusMapper: str("PROMETHEUS_MAPPER_YAML", ""),
		grpcTLS: flag("GRPC_SERVER_USE_TLS", false), grpcCert: str("GRPC_SERVER_TLS_CERT", ""),
		grpcKey: str("GRPC_SERVER_TLS_KEY", ""), grpcClientCA: str("GRPC_CLIENT_TLS_CACERT", str("GRPC_SERVER_TLS_CA_CERT", "")),
		grpcClientSAN:          str("GRPC_CLIENT_TLS_SAN", ""),
		stopIncrementOverLimit: flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false),
		failurePolicy:          strings.ToLower(str("RLS_FAILURE_POLICY", "unavailable")),
		timeout:                dur("RLS_TIMEOUT", 100*time.Millisecond),
		replicas:               num("RLS_REPLICAS", 1),
		configPoll:             dur("RLS_CONFIG_POLL", time.Second),
		configType:             strings.ToUpper(str("CONFIG_TYPE", "FILE")),
		forceStart:             flag("FORCE_START_WITHOUT_INITIAL_CONFIG", false),
		healthyWithConfig:      flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false),
		mergeDomains:           flag("MERGE_DOMAIN_CONFIG", false),
		cutover:                flag("REFERENCE_CUTOVER", false),
		jitter:                 time.Duration(num("EXPIRATION_JITTER_MAX_SECONDS", 300)) * time.Second,
		xds: xdsSettings{
			url: str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"), nodeID: str("CONFIG_GRPC_XDS_NODE_ID", "default"),
			nodeMetadata:   pairs(str("CONFIG_GRPC_XDS_NODE_METADATA", ""), "="),
			headers:        pairs(str("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ""), ":"),
			connectRetry:   dur("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", 3*time.Second),
			useTLS:         flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", false),
			clientCert:     str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ""),
			clientKey:      str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", ""),
			serverCA:       str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ""),
			serverSAN:      str("CONFIG_GRPC_XDS_SERVER_TLS_SAN", ""),
			backoffInitial: dur("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", 10*time.Second),
			backoffMax:     dur("XDS_CLIENT_BACKOFF_MAX_INTERVAL", 60*time.Second),
			backoffJitter:  flag("XDS_CLIENT_BACKOFF_JITTER", true),
			maxMsgSize:     num("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0),
		},
	}
	s.xds.backoffFactor = 0.5
	if v, ok := env("XDS_CLIENT_BACKOFF_RANDOM_FACTOR"); ok && v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r < 0 || math.IsInf(r, 0) {
			errs = append(errs, fmt.Sprintf("XDS_CLIENT_BACKOFF_RANDOM_FACTOR=%q is not a number of 0 or more", v))
		}
		s.xds.backoffFactor = r
	}
	// tracing and statsd: the reference's defaults, but for USE_STATSD
	// (docs/envoy.md says why)
	s.tracing = tracingSettings{enabled: flag("TRACING_ENABLED", false), serviceName: str("TRACING_SERVICE_NAME", "RateLimit"),
		namespace: str("TRACING_SERVICE_NAMESPACE", ""), instanceID: str("TRACING_SERVICE_INSTANCE_ID", ""),
		protocol: strings.ToLower(str("TRACING_EXPORTER_PROTOCOL", "http")), samplingRate: 1}
	if v, ok := env("TRACING_SAMPLING_RATE"); ok && v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(r) {
			errs = append(errs, fmt.Sprintf("TRACING_SAMPLING_RATE=%q is not a number", v))
		}
		s.tracing.samplingRate = r
	}
	if p := s.tracing.protocol; p != "http" && p != "grpc" && p != "" {
		errs = append(errs, fmt.Sprintf("TRACING_EXPORTER_PROTOCOL=%q is not http or grpc", p))
	}
	s.statsd = statsdSettings{enabled: flag("USE_STATSD", false), host: str("STATSD_HOST", "localhost"),
		port: num("STATSD_PORT", 8125), network: strings.ToLower(str("STATSD_PROTOCOL", "tcp")),
		tags: pairs(str("EXTRA_TAGS", ""), ":"), flushEvery: dur("STATS_FLUSH_INTERVAL", 10*time.Second)}
	if n := s.statsd.network; n != "tcp" && n != "udp" {
		errs = append(errs, fmt.Sprintf("STATSD_PROTOCOL=%q is not tcp or udp", n))
	}
	switch s.configType {
	case "FILE", "GRPC_XDS_SOTW":
	default:
		errs = append(errs, fmt.Sprintf("CONFIG_TYPE=%q is not FILE or GRPC_XDS_SOTW", s.configType))
	}
	if (s.redisTLSCert == "") != (s.redisTLSKey == "") {
		errs = append(errs, "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together")
	}
	if (s.xds.clientCert == "") != (s.xds.clientKey == "") {
		errs = append(errs, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together")
	}
	s.nearLimitRatio = 0.8
	if v, ok := env("NEAR_LIMIT_RATIO"); ok && v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r < 0 || r > 1 {
			errs = append(errs, fmt.Sprintf("NEAR_LIMIT_RATIO=%q is not a ratio between 0 and 1", v))
		}
		s.nearLimitRatio = r
	}
	switch strings.ToUpper(s.redisType) {
	case "SINGLE", "SENTINEL", "CLUSTER":
	default:
		errs = append(errs, fmt.Sprintf("REDIS_TYPE=%q is not SINGLE, SENTINEL or CLUSTER", s.redisType))
	}
	switch strings.ToLower(s.redisSocketType) {
	case "unix", "tcp":
	default:
		errs = append(errs, fmt.Sprintf("REDIS_SOCKET_TYPE=%q is not unix or tcp", s.redisSocketType))
	}
	switch s.failurePolicy {
	case "unavailable", "open", "closed", "local":
	default:
		errs = append(errs, fmt.Sprintf("RLS_FAILURE_POLICY=%q is not unavailable, open, closed or local", s.failurePolicy))
	}
	if zone := str("RLS_CALENDAR_ZONE", ""); zone != "" {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			errs = append(errs, fmt.Sprintf("RLS_CALENDAR_ZONE=%q is not a time zone such as Europe/Berlin or UTC: %v", zone, err))
		}
		s.calendarZone = loc
		for _, d := range strings.Split(str("RLS_CALENDAR_DOMAINS", ""), ",") {
			if d = strings.TrimSpace(d); d != "" {
				s.calendarDomains = append(s.calendarDomains, d)
			}
		}
	} else if str("RLS_CALENDAR_DOMAINS", "") != "" {
		errs = append(errs, "RLS_CALENDAR_DOMAINS needs RLS_CALENDAR_ZONE")
	}
	if s.grpcTLS && (s.grpcCert == "" || s.grpcKey == "") {
		errs = append(errs, "GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
	}
	for _, name := range reference {
		v, ok := env(name)
		if on, err := strconv.ParseBool(v); ok && v != "" && !(followedWhenFalse[name] && err == nil && !on) {
			s.notHonoured = append(s.notHonoured, name)
		}
	}
	if v, ok := env("EXPIRATION_JITTER_MAX_SECONDS"); ok && v != "" && !s.cutover {
		s.notHonoured = append(s.notHonoured, "EXPIRATION_JITTER_MAX_SECONDS") // it spreads the expiry of the reference's counters only
	}
	slices.Sort(s.notHonoured)
	if len(errs) > 0 {
		return nil, fmt.Errorf("ratelimit-rls: %s", strings.Join(errs, "; "))
	}
	return s, nil
}

// configDir is where the configuration files are, as the reference finds
// them: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
func (s *settings) configDir() string {
	return filepath.Join(s.runtimeRoot, s.runtimeSub, s.runtimeApp)
}

// loader returns how a configuration loads: with MERGE_DOMAIN_CONFIG, a
// domain's descriptors may be split over several files (or resources);
// with RLS_CALENDAR_ZONE, the units of a day and up of the domains
// RLS_CALENDAR_DOMAINS names (all when empty) are calendar periods there.
func (s *settings) loader() func([]rls.File) (*rls.Config, error) {
	load := rls.LoadConfig
	if s.mergeDomains {
		load = rls.LoadConfigMerged
	}
	if s.calendarZone == nil {
		return load
	}
	return func(files []rls.File) (*rls.Config, error) {
		c, err := load(files)
		if err != nil {
			return nil, err
		}
		return c.WithCalendar(s.calendarZone, s.calendarDomains...), nil
	}
}
