package rls

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
)

// desc returns a descriptor of key, value pairs.
func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func load(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := LoadConfig([]File{{Name: "config.yaml", Data: []byte(yaml)}})
	require.NoError(t, err)
	return c
}

// The reference's own example configuration (its README), unchanged.
const referenceExample = `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`

const nested = `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 100
  - key: header_match
    value: only-children
    descriptors:
      - key: path
        value: /foo
        rate_limit:
          unit: minute
          requests_per_unit: 3
  - key: nothing
    value: here
  - key: path
    value: /api/*
    rate_limit:
      unit: hour
      requests_per_unit: 50
  - key: user
    value: team-*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: role
    value: a*b
    rate_limit:
      unit: minute
      requests_per_unit: 6
  - key: client
    detailed_metric: true
    rate_limit:
      unit: day
      requests_per_unit: 1000
`

func TestMatch(t *testing.T) {
	c := load(t, referenceExample)
	m := c.Match("mongo_cps", desc("database", "users"))
	require.NotNil(t, m)
	require.Equal(t, uint32(500), m.Rule.RequestsPerUnit)
	require.Equal(t, pb.RateLimitResponse_RateLimit_SECOND, m.Rule.Unit)
	require.Equal(t, ratelimit.Limit{Rate: 500, Window: time.Second}, m.Rule.Limit)
	require.Equal(t, "mongo_cps.database_users", m.MetricKey)
	require.Equal(t, "mongo_cps|database=users", m.ID)
	require.Nil(t, c.Match("mongo_cps", desc("database", "other")), "no default for database")
	require.Nil(t, c.Match("unknown", desc("database", "users")))

	c = load(t, nested)
	for _, tc := range []struct {
		name string
		d    *rlv3.RateLimitDescriptor
		rate int64 // 0: no rule
		key  string
		id   string
	}{
		{"exact value first", desc("remote_address", "50.0.0.5"), 100, "edge_proxy_per_ip.remote_address_50.0.0.5", "edge_proxy_per_ip|remote_address=50.0.0.5"},
		{"then the key's default", desc("remote_address", "10.0.0.1"), 10, "edge_proxy_per_ip.remote_address", "edge_proxy_per_ip|remote_address=10.0.0.1"},
		{"a rule at the depth of the last entry only", desc("remote_address", "10.0.0.1", "path", "/x"), 0, "", ""},
		{"a nested rule", desc("header_match", "only-children", "path", "/foo"), 3, "edge_proxy_per_ip.header_match_only-children.path_/foo", "edge_proxy_per_ip|header_match=only-children|path=/foo"},
		{"a parent without a rule", desc("header_match", "only-children"), 0, "", ""},
		{"a node with neither rule nor children", desc("nothing", "here"), 0, "", ""},
		{"a wildcard", desc("path", "/api/v1/users"), 50, "edge_proxy_per_ip.path_/api/*", "edge_proxy_per_ip|path=/api/v1/users"},
		{"a wildcard's values share a count with share_threshold", desc("user", "team-7-admin"), 5, "edge_proxy_per_ip.user_team-*", "edge_proxy_per_ip|user=team-*"},
		{"a * in the middle matches itself", desc("role", "a*b"), 6, "edge_proxy_per_ip.role_a*b", "edge_proxy_per_ip|role=a*b"},
		{"and any run of bytes", desc("role", "axb"), 6, "edge_proxy_per_ip.role_a*b", "edge_proxy_per_ip|role=axb"},
		{"detailed_metric names the values", desc("client", "acme"), 1000, "edge_proxy_per_ip.client_acme", "edge_proxy_per_ip|client=acme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := c.Match("edge_proxy_per_ip", tc.d)
			if tc.rate == 0 {
				require.Nil(t, m)
				return
			}
			require.NotNil(t, m)
			require.Equal(t, tc.rate, m.Rule.Limit.Rate)
			require.Equal(t, tc.key, m.MetricKey)
			require.Equal(t, tc.id, m.ID)
		})
	}
}

// wildcards is the reference's test/config/wildcard.yaml (at f2fb157),
// with a trailing wildcard before an exact value and a default, and two
// wildcards that both match.
const wildcards = `
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 22}
  - key: order
    value: a*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: order
    value: ab
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: order
    value: '*b'
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: order
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: overlap
    value: ab*ba
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// A '*' anywhere in a value, as the reference's wildcardMatch
// (src/config/config_impl.go at f2fb157, lines 199-237; its
// TestWildcardConfig, test/config/config_test.go lines 576-705): an exact
// value first, then the wildcards in file order, then the key's default.
func TestWildcardAnywhere(t *testing.T) {
	c := load(t, wildcards)
	for _, tc := range []struct {
		key, value string
		rate       int64 // 0: no rule
		metric     string
	}{
		{"wild", "foo", 20, "test-domain.wild_foo*"},
		{"wild", "foo123", 20, "test-domain.wild_foo*"},
		{"noWild", "foo1", 0, ""},
		{"midWild", "barab", 21, "test-domain.midWild_bar*b"},
		{"midWild", "bar123b", 21, "test-domain.midWild_bar*b"},
		{"midWild", "barb", 21, "test-domain.midWild_bar*b"},
		{"midWild", "bara", 0, ""},
		{"midWild", "xbarb", 0, ""},
		{"multiWild", "foo123bar456baz", 10, "test-domain.multiWild_foo*bar*baz"},
		{"multiWild", "foobarbaz", 10, "test-domain.multiWild_foo*bar*baz"},
		{"multiWild", "foo123baz", 0, ""},
		{"multiWild", "bar456baz", 0, ""},
		{"multiWild", "foobazbar", 0, ""},
		{"order", "ab", 2, "test-domain.order_ab"},
		{"order", "axb", 1, "test-domain.order_a*"},
		{"order", "xb", 3, "test-domain.order_*b"},
		{"order", "x", 4, "test-domain.order"},
		{"overlap", "aba", 0, ""},
		{"overlap", "abba", 5, "test-domain.overlap_ab*ba"},
	} {
		m := c.Match("test-domain", desc(tc.key, tc.value))
		if tc.rate == 0 {
			require.Nil(t, m, "%s=%s", tc.key, tc.value)
			continue
		}
		require.NotNil(t, m, "%s=%s", tc.key, tc.value)
		require.Equal(t, tc.rate, m.Rule.Limit.Rate, "%s=%s", tc.key, tc.value)
		require.Equal(t, tc.metric, m.MetricKey, "%s=%s", tc.key, tc.value)
	}
	m := c.Match("test-domain", desc("nestedWild", "val1", "wild", "goose"))
	require.Equal(t, "test-domain.nestedWild_val1.wild_goo*", m.MetricKey)
	require.Equal(t, c.Match("test-domain", desc("order", "xb")).ID, c.Match("test-domain", desc("order", "yyb")).ID,
		"share_threshold: the values of *b share one count")
}

// Ids never collide, whatever the bytes of keys and values.
func TestIDsDoNotCollide(t *testing.T) {
	a := idOf("d", desc("a", "b|c=d").Entries, nil)
	b := idOf("d", desc("a", "b", "c", "d").Entries, nil)
	require.NotEqual(t, a, b)
	require.NotEqual(t, idOf("d|a", desc("b", "c").Entries, nil), idOf("d", desc("a|b", "c").Entries, nil))
	require.NotEqual(t, idOf(`d\`, desc("a", "b").Entries, nil), idOf("d", desc(`\a`, "b").Entries, nil))
}

func TestMatchOverride(t *testing.T) {
	c := load(t, referenceExample)
	d := desc("database", "users")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE}
	m := c.Match("mongo_cps", d)
	require.NotNil(t, m)
	require.Equal(t, ratelimit.Limit{Rate: 7, Window: time.Minute}, m.Rule.Limit)
	require.Equal(t, pb.RateLimitResponse_RateLimit_MINUTE, m.Rule.Unit)
}

func TestOurKeys(t *testing.T) {
	c := load(t, `
domain: ours
descriptors:
  - key: a
    rate_limit: {window: 1500ms, requests_per_unit: 3, strict: true}
  - key: b
    rate_limit: {window: 60000, requests_per_unit: 3, leased: true}
`)
	a := c.Match("ours", desc("a", "x")).Rule
	require.Equal(t, ratelimit.Limit{Rate: 3, Window: 1500 * time.Millisecond, Strict: true}, a.Limit)
	require.Equal(t, pb.RateLimitResponse_RateLimit_UNKNOWN, a.Unit)
	b := c.Match("ours", desc("b", "x")).Rule
	require.Equal(t, ratelimit.Limit{Rate: 3, Window: time.Minute, Leased: true}, b.Limit)
	require.Equal(t, pb.RateLimitResponse_RateLimit_MINUTE, b.Unit)
}

// Every load error the reference has, and ours, names the file and the line.
func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown key", "domain: d\ndescriptors:\n  - key: a\n    ratelimit: {unit: second}\n", "config.yaml:4: config error, unknown key 'ratelimit'"},
		{"unlimited with a unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n", "config.yaml:3: should not specify rate limit unit when unlimited"},
		{"empty domain", "descriptors:\n  - key: a\n", "config.yaml:1: config file cannot have empty domain"},
		{"empty file", "", "config.yaml: config file cannot have empty domain"},
		{"empty key", "domain: d\ndescriptors:\n  - value: a\n", "config.yaml:3: descriptor has empty key"},
		{"duplicate key", "domain: d\ndescriptors:\n  - key: a\n  - key: a\n", "config.yaml:4: duplicate descriptor composite key 'd.a'"},
		{"invalid unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "config.yaml:3: invalid rate limit unit 'fortnight'"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: x, replaces: [{name: x}]}\n", "config.yaml:3: replaces should not contain name of same descriptor"},
		{"replaces nothing", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n", "config.yaml:3: should not have an empty replaces entry"},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", "config.yaml:3: share_threshold can only be used with wildcard values (containing '*'), but found key 'a_b'"},
		{"metadata that is no map", "domain: d\ndescriptors:\n  - key: a\n    metadata: text\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "config.yaml:3: error parsing metadata"},
		{"not YAML", "domain: [", "config.yaml: error loading config file"},
		{"a list of scalars", "domain: d\ndescriptors:\n  - a\n", "config.yaml:3: config error, yaml file contains list of type other than map: a"},
		{"a negative rate", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "config.yaml:4: error loading config file"},
		{"both unit and window", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, window: 10s, requests_per_unit: 1}\n", "config.yaml:3: rate limit has both unit 'second' and window"},
		{"a window not of whole ms", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {window: 1500us, requests_per_unit: 1}\n", "config.yaml:4: invalid rate limit window '1500us': not a whole number of ms"},
		{"a rate the window cannot hold", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: year, requests_per_unit: 4000000000}\n", "config.yaml:3: rate limit 4000000000 per 8760h0m0s: invalid limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadConfig([]File{{Name: "config.yaml", Data: []byte(tc.yaml)}})
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := LoadConfig([]File{{Name: "a.yaml", Data: []byte(referenceExample)}, {Name: "b.yaml", Data: []byte(referenceExample)}})
	require.ErrorContains(t, err, "b.yaml:2: duplicate domain 'mongo_cps' in config file")
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(referenceExample), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".hidden.yaml"), []byte(referenceExample), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not yaml"), 0o644))
	_, err := LoadDir(dir, false)
	require.ErrorContains(t, err, "duplicate domain", "a dot file is loaded unless told not to")
	c, err := LoadDir(dir, true)
	require.NoError(t, err)
	require.Equal(t, []string{"mongo_cps"}, c.Domains())
}

// FuzzLoadConfig: no input makes the loader panic, and what loads matches
// without panicking either.
func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte(referenceExample), "database", "users")
	f.Add([]byte(nested), "path", "/api/x")
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    value: '*'\n    rate_limit: {window: 1, requests_per_unit: 1}\n"), "a", "")
	f.Fuzz(func(t *testing.T, data []byte, key, value string) {
		c, err := LoadConfig([]File{{Name: "f.yaml", Data: data}})
		if err != nil {
			return
		}
		for _, domain := range c.Domains() {
			c.Match(domain, desc(key, value))
			c.Match(domain, desc(key, value, key, value))
		}
	})
}

// A file of nested aliases (a billion nodes expanded) is refused quickly.
func TestAliasBomb(t *testing.T) {
	yaml := "domain: d\ndescriptors:\n  - key: l0\n    descriptors: &l0 [{key: a}, {key: b}, {key: c}, {key: d}, {key: e}, {key: f}, {key: g}, {key: h}, {key: i}, {key: j}]\n"
	for i := 1; i <= 9; i++ {
		yaml += fmt.Sprintf("  - key: l%d\n    descriptors: &l%d [", i, i)
		for j := range 10 {
			yaml += fmt.Sprintf("{key: k%d, descriptors: *l%d}, ", j, i-1)
		}
		yaml += "]\n"
	}
	_, err := LoadConfig([]File{{Name: "bomb.yaml", Data: []byte(yaml)}})
	require.ErrorContains(t, err, "nodes (aliases expanded)")
}

func TestOverrideClamped(t *testing.T) {
	c := load(t, referenceExample)
	d := desc("database", "users")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4_000_000_000, Unit: typev3.RateLimitUnit_YEAR}
	m := c.Match("mongo_cps", d)
	require.NotNil(t, m, "an override the window cannot hold exactly still limits")
	require.Equal(t, int64(285_616), m.Rule.Limit.Rate)
	require.NoError(t, m.Rule.Limit.Validate())
}

func TestReadDirSkipsDirectories(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(referenceExample), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "old.yaml"), 0o755))
	files, err := ReadDir(dir, false)
	require.NoError(t, err)
	require.Len(t, files, 1)
}

// MERGE_DOMAIN_CONFIG: a domain's descriptors over several files, each
// adding to its top level; a descriptor two files give is an error, as is
// a domain twice without merging.
func TestLoadConfigMerged(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")}
	b := File{Name: "b.yaml", Data: []byte("domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 9}\n")}
	c, err := LoadConfigMerged([]File{a, b})
	require.NoError(t, err)
	require.Equal(t, int64(2), c.Match("api", desc("user", "x")).Rule.Limit.Rate)
	require.Equal(t, int64(9), c.Match("api", desc("tenant", "x")).Rule.Limit.Rate)
	require.Equal(t, []string{"api"}, c.Domains())
	_, err = LoadConfig([]File{a, b})
	require.EqualError(t, err, "b.yaml:1: duplicate domain 'api' in config file")
	_, err = LoadConfigMerged([]File{a, a})
	require.ErrorContains(t, err, "duplicate descriptor composite key 'api.user'")
}

// quota_mode: a rule of its own kind, whose Limit holds back no other
// descriptor (the decision is the Server's: TestQuotaModeDecision).
func TestQuotaMode(t *testing.T) {
	c := load(t, "domain: api\ndescriptors:\n  - key: tokens\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	r := c.Match("api", desc("tokens", "t")).Rule
	require.True(t, r.QuotaMode)
	require.False(t, r.Shadow, "its status says over")
	require.True(t, r.Limit.Shadow)
}
