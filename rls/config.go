// The configuration: envoyproxy/ratelimit's YAML files, loaded with the
// same keys, the same errors and the same meaning, and the rules a
// request's descriptor matches.

package rls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/slidingwindow/ratelimit"
)

// Config is a loaded set of rate limit configuration files: per domain, a
// tree of descriptors with their rules. It is read-only once loaded, and
// safe for simultaneous use.
type Config struct {
	domains map[string]*node
	// calendar: the domains (nil: all) where WithCalendar made units of a
	// day and up calendar periods in zone
	calendar     map[string]bool
	calendarAll  bool
	calendarZone *time.Location
}

// Rule is the rate_limit of one descriptor of the configuration.
type Rule struct {
	// Name is the rule's name, which replaces names.
	Name string
	// Replaces names the rules this one replaces when both match.
	Replaces []string
	// Unlimited rules allow everything without asking Redis.
	Unlimited bool
	// Shadow (shadow_mode) rules let a request over them through, their
	// status OK.
	Shadow bool
	// QuotaMode (quota_mode) rules keep their status, OVER_LIMIT when
	// over, but a request is over as a whole only when every quota_mode
	// descriptor of it is over (or another rule is): the reference's
	// quota mode (envoyproxy/ratelimit PR #1059).
	QuotaMode bool
	// Metadata is the descriptor's metadata, sent back in the response's
	// dynamic metadata when the descriptor passes (WithDynamicMetadata).
	Metadata *structpb.Struct
	// DetailedMetric names the rule's metrics by the request's values.
	DetailedMetric bool
	// RequestsPerUnit and Unit are the limit as the reference's answer
	// reports it (current_limit): Unit is UNKNOWN for a window that is no
	// unit (ours: window).
	RequestsPerUnit uint32
	Unit            pb.RateLimitResponse_RateLimit_Unit
	// Limit is what the library decides: RequestsPerUnit in a sliding
	// window of the unit's length (Strict and Leased from strict and
	// leased, Shadow from shadow_mode or quota_mode: neither holds back
	// another descriptor of the request), named Name. Its Rate is 0 for a rule of 0 requests, which
	// denies every request without asking Redis.
	Limit ratelimit.Limit
	// Key is the rule's place in the configuration, as the reference
	// names its metrics: domain.key_value.key...
	Key string
	// byUnit: the rule's length is its unit (not a window), which
	// WithCalendar may make a calendar period.
	byUnit bool
}

// node is one descriptor of the configuration: by the key (and value) of
// a request's entry, the next level, and a rule.
type node struct {
	children       map[string]*node // by key_value, or key for a default
	wildcards      []wildcard       // the children whose value has a *, in file order
	rule           *Rule
	valueToMetric  bool
	shareThreshold bool
	pattern        string // the node's value, with its *, when shareThreshold
}

// wildcard is a child whose key_value has a '*', each of which matches
// any run of bytes, as in the reference since PR #1085 (March 2026; its
// January build, the newest the Go module proxy serves, matched a trailing
// '*' only, and read one elsewhere as itself).
type wildcard struct {
	key   string   // key_value, as in children
	parts []string // key_value split at its '*'s
}

// match reports whether s, a request's key_value, matches w, as the
// reference's wildcardMatch: the first part a prefix, the last a suffix,
// the ones between in order, none overlapping.
func (w wildcard) match(s string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if !strings.HasPrefix(s, first) || len(s)-len(first) < len(last) || !strings.HasSuffix(s, last) {
		return false
	}
	rest := s[len(first) : len(s)-len(last)]
	for _, part := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}

// units are the reference's units, by name, with their lengths: a month is
// 30 days and a year 365, as the reference counts them.
var units = map[string]struct {
	unit pb.RateLimitResponse_RateLimit_Unit
	len  time.Duration
}{
	"SECOND": {pb.RateLimitResponse_RateLimit_SECOND, time.Second},
	"MINUTE": {pb.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	"HOUR":   {pb.RateLimitResponse_RateLimit_HOUR, time.Hour},
	"DAY":    {pb.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	"WEEK":   {pb.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	"MONTH":  {pb.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
	"YEAR":   {pb.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
}

// validKeys are the keys a configuration file may hold, at any level, as
// in the reference, with ours (window, strict, leased, calendar).
var validKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true,
	"unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"quota_mode": true, "name": true, "replaces": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true, "metadata": true,
	"window": true, "strict": true, "leased": true, "calendar": true,
}

// A ConfigError says what is wrong with a configuration file, and where.
type ConfigError struct {
	File string // the file's name
	Line int    // 1 and up; 0 when the file as a whole is at fault
	Msg  string
}

// Error is file:line: msg, or file: msg.
func (e *ConfigError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// File is one configuration file: its name (for errors) and content.
type File struct {
	Name string
	Data []byte
}

// MaxConfigBytes bounds one configuration file.
const MaxConfigBytes = 16 << 20

// LoadConfig loads files, each a YAML document of the reference's format,
// into one Config. Two files of one domain are an error, as in the
// reference without MERGE_DOMAIN_CONFIG.
func LoadConfig(files []File) (*Config, error) { return loadConfig(files, false) }

// LoadConfigMerged loads files as LoadConfig does, but the descriptors of
// a domain may be split over several files, as in the reference with
// MERGE_DOMAIN_CONFIG=true: each file adds its descriptors to the domain's
// top level, and one that is there already is an error (duplicate
// descriptor composite key).
func LoadConfigMerged(files []File) (*Config, error) { return loadConfig(files, true) }

func loadConfig(files []File, merge bool) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	for _, f := range files {
		if err := c.load(f, merge); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// LoadDir loads the configuration files of dir (see ReadDir) with
// LoadConfig. Their names in errors are their paths.
func LoadDir(dir string, ignoreDotFiles bool) (*Config, error) {
	files, err := ReadDir(dir, ignoreDotFiles)
	if err != nil {
		return nil, err
	}
	return LoadConfig(files)
}

// ReadDir reads the configuration files of dir: its regular *.yaml and
// *.yml files, in name order; with ignoreDotFiles, not those whose names
// start with a dot. A program that watches dir compares what it reads.
func ReadDir(dir string, ignoreDotFiles bool) ([]File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []File
	for _, e := range entries {
		name := e.Name()
		ext := filepath.Ext(name)
		if !e.Type().IsRegular() && e.Type()&os.ModeSymlink == 0 || ext != ".yaml" && ext != ".yml" || ignoreDotFiles && strings.HasPrefix(name, ".") {
			continue
		}
		data, err := readLimited(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: filepath.Join(dir, name), Data: data})
	}
	return files, nil
}

// readLimited reads the file at path, refusing one over MaxConfigBytes.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err == nil && len(data) > MaxConfigBytes {
		err = &ConfigError{File: path, Msg: fmt.Sprintf("larger than %d bytes", MaxConfigBytes)}
	}
	return data, err
}

// load adds file f to c; with merge, to a domain c has already.
func (c *Config) load(f File, merge bool) error {
	fail := func(n *yaml.Node, format string, args ...any) error {
		e := &ConfigError{File: f.Name, Msg: fmt.Sprintf(format, args...)}
		if n != nil {
			e.Line = n.Line
		}
		return e
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(f.Data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return fail(nil, "config file cannot have empty domain")
		}
		return fail(nil, "error loading config file: %v", err)
	}
	root := doc.Content[0]
	budget := maxNodes
	if err := checkKeys(root, &budget, fail); err != nil {
		return err
	}
	var y yamlRoot
	if err := root.Decode(&y); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			// "line 4: cannot unmarshal …": the line, where ours go
			if line, msg, ok := strings.Cut(strings.TrimPrefix(te.Errors[0], "line "), ": "); ok {
				if n, err := strconv.Atoi(line); err == nil {
					return fail(&yaml.Node{Line: n}, "error loading config file: %s", msg)
				}
			}
		}
		return fail(root, "error loading config file: %v", err)
	}
	if y.Domain == "" {
		return fail(root, "config file cannot have empty domain")
	}
	d := c.domains[y.Domain]
	switch {
	case d != nil && !merge:
		return fail(root, "duplicate domain '%s' in config file", y.Domain)
	case d == nil:
		d = &node{children: map[string]*node{}}
	}
	if err := d.loadDescriptors(y.Domain+".", y.Descriptors, fail); err != nil {
		return err
	}
	c.domains[y.Domain] = d
	return nil
}

// maxNodes bounds the nodes checkKeys visits in a file, aliases followed:
// a file of nested aliases must not take it exponential time.
const maxNodes = 1_000_000

// checkKeys refuses a key of n, at any depth, that the format has not, and
// lists of anything but maps: the reference's validateYamlKeys. Metadata is
// free-form. budget counts down the nodes it may still visit.
func checkKeys(n *yaml.Node, budget *int, fail func(*yaml.Node, string, ...any) error) error {
	if *budget--; *budget < 0 {
		return fail(n, "config error, more than %d nodes (aliases expanded)", maxNodes)
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag != "!!str" && k.Tag != "" {
				return fail(k, "config error, key is not of type string: %v", k.Value)
			}
			if !validKeys[k.Value] {
				return fail(k, "config error, unknown key '%s'", k.Value)
			}
			if k.Value == "metadata" {
				continue
			}
			if err := checkKeys(v, budget, fail); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for _, e := range n.Content {
			if e.Kind != yaml.MappingNode {
				return fail(e, "config error, yaml file contains list of type other than map: %v", e.Value)
			}
			if err := checkKeys(e, budget, fail); err != nil {
				return err
			}
		}
	case yaml.AliasNode:
		return checkKeys(n.Alias, budget, fail)
	}
	return nil
}

// The YAML of a file, as the reference reads it, with ours.
type yamlRoot struct {
	Domain      string
	Descriptors []yamlDescriptor
}

type yamlDescriptor struct {
	Key            string
	Value          string
	RateLimit      *yamlRateLimit `yaml:"rate_limit"`
	Descriptors    []yamlDescriptor
	ShadowMode     bool      `yaml:"shadow_mode"`
	QuotaMode      bool      `yaml:"quota_mode"`
	DetailedMetric bool      `yaml:"detailed_metric"`
	ValueToMetric  bool      `yaml:"value_to_metric"`
	ShareThreshold bool      `yaml:"share_threshold"`
	Metadata       yaml.Node `yaml:"metadata"`
	line           int
}

type yamlRateLimit struct {
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	Unit            string
	Unlimited       bool
	Name            string
	Replaces        []struct{ Name string }
	Window          yaml.Node // ours: a whole number of ms, or a duration such as 1500ms
	Strict          bool
	Leased          bool
	Calendar        string // ours: a time zone; the unit (DAY, WEEK, MONTH, YEAR) is then a calendar period there
}

// UnmarshalYAML keeps the line of a descriptor, for errors.
func (d *yamlDescriptor) UnmarshalYAML(n *yaml.Node) error {
	type plain yamlDescriptor
	if err := n.Decode((*plain)(d)); err != nil {
		return err
	}
	d.line = n.Line
	return nil
}

// loadDescriptors adds ds, the descriptors under parentKey (domain. or
// the parent's key.), to n, as the reference's loadDescriptors.
func (n *node) loadDescriptors(parentKey string, ds []yamlDescriptor, fail func(*yaml.Node, string, ...any) error) error {
	for _, d := range ds {
		at := &yaml.Node{Line: d.line}
		if d.Key == "" {
			return fail(at, "descriptor has empty key")
		}
		finalKey := d.Key
		if d.Value != "" {
			finalKey += "_" + d.Value
		}
		fullKey := parentKey + finalKey
		if _, dup := n.children[finalKey]; dup {
			return fail(at, "duplicate descriptor composite key '%s'", fullKey)
		}
		child := &node{children: map[string]*node{}, valueToMetric: d.ValueToMetric, shareThreshold: d.ShareThreshold}
		if d.RateLimit != nil {
			rule, err := newRule(d, fullKey, at, fail)
			if err != nil {
				return err
			}
			if rule.Metadata, err = metadataOf(&d.Metadata); err != nil {
				return fail(at, "error parsing metadata: %v", err)
			}
			child.rule = rule
		}
		wild := strings.Contains(finalKey, "*")
		if d.ShareThreshold {
			if !wild {
				return fail(at, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", finalKey)
			}
			child.pattern = d.Value
		}
		if wild {
			n.wildcards = append(n.wildcards, wildcard{key: finalKey, parts: strings.Split(finalKey, "*")})
		}
		if err := child.loadDescriptors(fullKey+".", d.Descriptors, fail); err != nil {
			return err
		}
		n.children[finalKey] = child
	}
	return nil
}

// newRule returns the rule of d, at fullKey.
func newRule(d yamlDescriptor, fullKey string, at *yaml.Node, fail func(*yaml.Node, string, ...any) error) (*Rule, error) {
	y := d.RateLimit
	soft := d.ShadowMode || d.QuotaMode // neither holds back another descriptor
	r := &Rule{Name: y.Name, Unlimited: y.Unlimited, Shadow: d.ShadowMode, QuotaMode: d.QuotaMode, DetailedMetric: d.DetailedMetric,
		RequestsPerUnit: y.RequestsPerUnit, Key: fullKey}
	u, validUnit := units[strings.ToUpper(y.Unit)]
	hasWindow := !y.Window.IsZero()
	switch {
	case y.Unlimited && (validUnit || hasWindow):
		return nil, fail(at, "should not specify rate limit unit when unlimited")
	case y.Unlimited:
	case hasWindow && y.Unit != "":
		return nil, fail(at, "rate limit has both unit '%s' and window: give one", y.Unit)
	case hasWindow:
		w, err := parseWindow(y.Window.Value)
		if err != nil {
			return nil, fail(&y.Window, "invalid rate limit window '%s': %v", y.Window.Value, err)
		}
		r.Limit.Window = w
		r.Unit = pb.RateLimitResponse_RateLimit_UNKNOWN
		for _, u := range units {
			if u.len == w {
				r.Unit = u.unit
			}
		}
	case !validUnit:
		return nil, fail(at, "invalid rate limit unit '%s'", y.Unit)
	default:
		r.Unit, r.Limit.Window, r.byUnit = u.unit, u.len, true
	}
	var period ratelimit.Period
	var zone *time.Location
	if y.Calendar != "" {
		period = periodOf(r.Unit)
		switch {
		case y.Unlimited || hasWindow:
			return nil, fail(at, "calendar '%s' needs a unit of day, week, month or year, not a window or unlimited", y.Calendar)
		case period == 0:
			return nil, fail(at, "calendar '%s' with unit '%s': a calendar period is a day, a week, a month or a year", y.Calendar, y.Unit)
		}
		loc, err := time.LoadLocation(y.Calendar)
		if err != nil {
			return nil, fail(at, "calendar '%s': %v", y.Calendar, err)
		}
		zone = locationOf(loc)
		r.Limit.Window = 0
	}
	for _, rep := range y.Replaces {
		if rep.Name == "" {
			return nil, fail(at, "should not have an empty replaces entry")
		}
		if rep.Name == y.Name {
			return nil, fail(at, "replaces should not contain name of same descriptor")
		}
		r.Replaces = append(r.Replaces, rep.Name)
	}
	if !y.Unlimited {
		r.Limit = ratelimit.Limit{Rate: int64(y.RequestsPerUnit), Window: r.Limit.Window, Name: y.Name, Strict: y.Strict, Shadow: soft, Leased: y.Leased,
			Calendar: period, Location: zone}
		if r.Limit.Rate > 0 {
			if err := r.Limit.Validate(); err != nil {
				per := r.Limit.Window.String()
				if period != 0 {
					per = period.String() + " period in " + y.Calendar
				}
				return nil, fail(at, "rate limit %d per %v: %v", y.RequestsPerUnit, per, strings.TrimPrefix(err.Error(), "ratelimit: "))
			}
		}
	} else if y.Strict || y.Leased {
		return nil, fail(at, "an unlimited rate limit cannot be strict or leased")
	}
	return r, nil
}

// metadataOf returns a descriptor's metadata as the reference reads it: a
// map of anything JSON holds, keys of any scalar written as strings; nil
// for none.
func metadataOf(n *yaml.Node) (*structpb.Struct, error) {
	if n.IsZero() {
		return nil, nil
	}
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, nil
	}
	return structpb.NewStruct(jsonOf(m).(map[string]any))
}

// jsonOf returns v with every map's keys strings and every value one
// structpb takes (a YAML timestamp becomes its text).
func jsonOf(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = jsonOf(e)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[fmt.Sprint(k)] = jsonOf(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = jsonOf(e)
		}
		return out
	case time.Time:
		return v.Format(time.RFC3339Nano)
	}
	return v
}

// parseWindow reads our window: a whole number of ms, or a Go duration of
// whole ms.
func parseWindow(s string) (time.Duration, error) {
	var d time.Duration
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		if ms < 1 || ms > math.MaxInt64/int64(time.Millisecond) {
			return 0, errors.New("not a positive number of ms")
		}
		d = time.Duration(ms) * time.Millisecond
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, errors.New("neither a number of ms nor a duration")
	}
	if d < time.Millisecond || d%time.Millisecond != 0 {
		return 0, errors.New("not a whole number of ms")
	}
	return d, nil
}

// A Match is what a request's descriptor matched: its rule, and what the
// request counts under (ID) and is reported as (MetricKey).
type Match struct {
	Rule *Rule
	// ID is the id the descriptor is counted under: the domain and every
	// entry's key and value (a value that share_threshold shares, its
	// wildcard), unambiguously joined.
	ID string
	// MetricKey is the rule's Key, or with detailed_metric or
	// value_to_metric, the key with the request's values.
	MetricKey string
	// share is, by entry, the share_threshold wildcard an entry's value
	// counts under ("" for its own value); nil when there is none.
	share []string
}

// Domains returns the names of c's domains, sorted.
func (c *Config) Domains() []string {
	names := make([]string, 0, len(c.domains))
	for name := range c.domains {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Match returns the rule descriptor d of domain matches, or nil for none,
// as the reference's GetLimit: at each level of the configuration the
// entry's key_value, then a wildcard of its level, then its key alone; only
// a rule at the depth of the descriptor's last entry applies. A descriptor
// that carries its own limit (RateLimitOverride) gets that limit, as in
// the reference, unless its unit is unknown; a rate the window cannot hold
// exactly is lowered to the most it holds (a million a second holds; a
// year holds 285,616), the safe side.
func (c *Config) Match(domain string, d *rlv3.RateLimitDescriptor) *Match {
	root := c.domains[domain]
	if root == nil {
		return nil
	}
	entries := d.GetEntries()
	var detailed, byValue strings.Builder
	detailed.WriteString(domain)
	byValue.WriteString(domain)
	if o := d.GetLimit(); o != nil {
		unit := pb.RateLimitResponse_RateLimit_Unit(o.GetUnit()) // the same numbers, as the reference converts them
		u, ok := unitOf(unit)
		if !ok {
			return nil
		}
		key := descriptorKey(domain, entries)
		limit := ratelimit.Limit{Window: u}
		if p := periodOf(unit); p != 0 && (c.calendarAll || c.calendar[domain]) {
			limit = ratelimit.Limit{Calendar: p, Location: locationOf(c.calendarZone)}
		}
		limit.Rate = min(int64(o.GetRequestsPerUnit()), maxRate(limit))
		r := &Rule{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: unit, Key: key, Limit: limit}
		return &Match{Rule: r, ID: idOf(domain, entries, nil), MetricKey: key}
	}
	var rule *Rule
	var share []string
	at, prev := root.children, root
	for i, e := range entries {
		finalKey := e.GetKey() + "_" + e.GetValue()
		detailed.WriteString(".")
		detailed.WriteString(finalKey)
		next := at[finalKey]
		wild := ""
		if next == nil {
			for _, w := range prev.wildcards {
				if w.match(finalKey) {
					next, wild = at[w.key], w.key
					break
				}
			}
		}
		byKey := false
		if next == nil {
			next, byKey = at[e.GetKey()], true
		}
		byValue.WriteString(".")
		if next != nil {
			value := ""
			switch {
			case wild != "" && next.shareThreshold:
				value = next.pattern
				if share == nil {
					share = make([]string, len(entries))
				}
				share[i] = value
			case wild != "" && next.valueToMetric:
				value = e.GetValue()
			case wild != "":
				value = strings.TrimPrefix(wild, e.GetKey()+"_")
			case !byKey:
				value = e.GetValue()
			case next.valueToMetric:
				value = e.GetValue()
			}
			byValue.WriteString(e.GetKey())
			if value != "" {
				byValue.WriteString("_" + value)
			}
		} else {
			byValue.WriteString(e.GetKey())
		}
		if next != nil && next.rule != nil && i == len(entries)-1 {
			rule = next.rule
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		at, prev = next.children, next
	}
	if rule == nil {
		return nil
	}
	m := &Match{Rule: rule, ID: idOf(domain, entries, share), MetricKey: rule.Key, share: share}
	switch {
	case rule.DetailedMetric && share != nil:
		var b strings.Builder
		b.WriteString(domain)
		for i, e := range entries {
			b.WriteString("." + e.GetKey())
			switch {
			case share[i] != "":
				b.WriteString("_" + share[i])
			case e.GetValue() != "":
				b.WriteString("_" + e.GetValue())
			}
		}
		m.MetricKey = b.String()
	case rule.DetailedMetric:
		m.MetricKey = detailed.String()
	default:
		m.MetricKey = byValue.String()
	}
	return m
}

// WithCalendar returns a copy of c where, in the domains named (every
// domain when none is), a rule whose unit is a day, a week, a month or a
// year counts calendar periods in zone, as the key calendar of a file
// does: the day from midnight, the week from Monday, the month from the
// 1st, the year from January 1st, there. Limits Envoy sends with a
// descriptor of those domains count so too. A rule with a window, or a
// calendar of its own, keeps it; a strict one is a period, which is a
// hard bound already. This is how a service configured over
// xDS, whose RateLimitConfig has no calendar, gets calendar quotas.
func (c *Config) WithCalendar(zone *time.Location, domains ...string) *Config {
	out := &Config{domains: make(map[string]*node, len(c.domains)), calendarZone: zone, calendarAll: len(domains) == 0,
		calendar: map[string]bool{}}
	for _, d := range domains {
		out.calendar[d] = true
	}
	for name, n := range c.domains {
		if out.calendarAll || out.calendar[name] {
			n = n.withCalendar(zone)
		}
		out.domains[name] = n
	}
	return out
}

// withCalendar returns a copy of n and its children whose rules by a unit
// of a day and up count calendar periods in zone.
func (n *node) withCalendar(zone *time.Location) *node {
	out := *n
	out.children = make(map[string]*node, len(n.children))
	for k, child := range n.children {
		out.children[k] = child.withCalendar(zone)
	}
	if r := n.rule; r != nil && r.byUnit && !r.Unlimited && r.Limit.Calendar == 0 {
		if p := periodOf(r.Unit); p != 0 {
			rule := *r
			rule.Limit.Calendar, rule.Limit.Window, rule.Limit.Location = p, 0, locationOf(zone)
			rule.Limit.Strict = false // a period is a hard bound already
			out.rule = &rule
		}
	}
	return &out
}

// periodOf returns the calendar period of a unit, 0 for a unit shorter than
// a day.
func periodOf(u pb.RateLimitResponse_RateLimit_Unit) ratelimit.Period {
	switch u {
	case pb.RateLimitResponse_RateLimit_DAY:
		return ratelimit.Daily
	case pb.RateLimitResponse_RateLimit_WEEK:
		return ratelimit.Weekly
	case pb.RateLimitResponse_RateLimit_MONTH:
		return ratelimit.Monthly
	case pb.RateLimitResponse_RateLimit_YEAR:
		return ratelimit.Yearly
	}
	return 0
}

// locationOf returns zone as a Limit holds it: nil for UTC.
func locationOf(zone *time.Location) *time.Location {
	if zone == nil || zone == time.UTC {
		return nil
	}
	return zone
}

// maxRate returns the most requests a limit holds exactly: the library's
// Rate × window in ms is at most 2^53, and a calendar period's count too.
func maxRate(limit ratelimit.Limit) int64 {
	if limit.Calendar != 0 {
		return 1 << 53
	}
	return (1 << 53) / limit.Window.Milliseconds()
}

// unitOf returns the length of a reference unit.
func unitOf(u pb.RateLimitResponse_RateLimit_Unit) (time.Duration, bool) {
	for _, x := range units {
		if x.unit == u {
			return x.len, true
		}
	}
	return 0, false
}

// descriptorKey is the reference's name of a descriptor that carries its
// own limit: domain.key_value.key...
func descriptorKey(domain string, entries []*rlv3.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	b.WriteString(domain + ".")
	for i, e := range entries {
		if i > 0 {
			b.WriteString(".")
		}
		b.WriteString(e.GetKey())
		if e.GetValue() != "" {
			b.WriteString("_" + e.GetValue())
		}
	}
	return b.String()
}

// idOf returns the id a descriptor of domain counts under: the domain,
// then each entry's key and value (or its share_threshold wildcard),
// separated by '|' and '=', each of which, and '\', is escaped by a '\' in
// a field: two different descriptors never share an id.
func idOf(domain string, entries []*rlv3.RateLimitDescriptor_Entry, share []string) string {
	var b strings.Builder
	escape(&b, domain)
	for i, e := range entries {
		b.WriteByte('|')
		escape(&b, e.GetKey())
		b.WriteByte('=')
		v := e.GetValue()
		if share != nil && share[i] != "" {
			v = share[i]
		}
		escape(&b, v)
	}
	return b.String()
}

// escape writes s with '\', '|' and '=' escaped by a '\'.
func escape(b *strings.Builder, s string) {
	if !strings.ContainsAny(s, `\|=`) {
		b.WriteString(s)
		return
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '\\' || c == '|' || c == '=' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
}
