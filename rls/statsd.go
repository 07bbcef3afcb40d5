// The service's statsd metrics: what Metrics counts, under the reference's
// stat names, kept in memory and written out at each flush.

package rls

import (
	"bytes"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The reference's stat names (its stats scopes: ratelimit.service, and
// ratelimit_server for its gRPC interceptor's).
const (
	statRule          = "ratelimit.service.rate_limit."
	statRedisError    = "ratelimit.service.call.should_rate_limit.redis_error"
	statServiceError  = "ratelimit.service.call.should_rate_limit.service_error"
	statLoadSuccess   = "ratelimit.service.config_load_success"
	statLoadError     = "ratelimit.service.config_load_error"
	statGlobalShadow  = "ratelimit.service.global_shadow_mode"
	statTotalRequests = "ratelimit_server.ShouldRateLimit.total_requests"
	statResponseTime  = "ratelimit_server.ShouldRateLimit.response_time"
)

// The statistics of a rule, in the order of ruleStats.n.
var ruleStatNames = [...]string{".total_hits", ".over_limit", ".near_limit", ".within_limit", ".shadow_mode"}

const (
	statTotal = iota
	statOver
	statNear
	statWithin
	statShadow
)

// maxTimes is how many response times a flush sends at most: past it, a
// uniform sample of the calls, each line with its sample rate (|@r), so
// that a busy service's flush stays a few hundred packets.
const maxTimes = 1000

// packetSize bounds each Write of WriteTo: one UDP datagram that an MTU of
// 1500 carries whole (gostats's size for UDP).
const packetSize = 1432

// Statsd keeps a Server's metrics for a statsd server (Metrics.SetStatsd):
// counters summed between flushes, and the response times of the calls.
// WriteTo writes them out in statsd's line protocol, under the reference's
// names (ratelimit.service.rate_limit.<domain>.<key>.total_hits, ...). It
// is safe for simultaneous use.
type Statsd struct {
	tags string // appended to every name: EXTRA_TAGS, as gostats writes tags

	mu    sync.RWMutex // held to read rules while counting, to change it at a flush
	rules map[string]*ruleStats

	redisError, serviceError    atomic.Uint64
	loadSuccess, loadError      atomic.Uint64
	globalShadow, totalRequests atomic.Uint64
	timesMu                     sync.Mutex
	times                       []float64 // in milliseconds: a sample of timed calls when more than maxTimes
	timed                       int       // calls timed since the last flush
	random                      *rand.Rand
}

// ruleStats are a rule's counters since the last flush.
type ruleStats struct {
	name string // ratelimit.service.rate_limit.<key>, sanitized
	n    [len(ruleStatNames)]atomic.Uint64
}

// NewStatsd returns a Statsd whose stats carry tags (the reference's
// EXTRA_TAGS), written as gostats writes tags to a plain statsd server:
// ".__key=value" after the name, sorted by key, with '.', ':' and '|' of a
// value made '_'.
func NewStatsd(tags map[string]string) *Statsd {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		if v := tags[k]; k != "" && v != "" {
			b.WriteString(".__" + sanitizeStat(k) + "=" + strings.NewReplacer(".", "_").Replace(sanitizeStat(v)))
		}
	}
	return &Statsd{tags: b.String(), rules: map[string]*ruleStats{}, random: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

// sanitizeStat returns name fit for a statsd line, as the reference's
// SanitizeStatName makes it: ':' and '|' made '_', and the dots of an IPv4
// address; and, which the reference does not, a control character made
// '_' (a newline would end the line).
func sanitizeStat(name string) string {
	name = strings.Map(func(r rune) rune {
		if r == ':' || r == '|' || r < 0x20 || r == 0x7f {
			return '_'
		}
		return r
	}, name)
	return ipv4.ReplaceAllStringFunc(name, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

// rule adds counts, by statTotal..statShadow (where set), to the counters
// of the rule whose metric key is key.
func (s *Statsd) rule(key string, counts *[len(ruleStatNames)]float64, set *[len(ruleStatNames)]bool) {
	s.mu.RLock()
	r := s.rules[key]
	if r == nil {
		s.mu.RUnlock()
		s.mu.Lock()
		if r = s.rules[key]; r == nil {
			r = &ruleStats{name: statRule + sanitizeStat(key)}
			s.rules[key] = r
		}
		s.mu.Unlock()
		s.mu.RLock()
	}
	// counted under the read lock: a flush drops a rule idle since the
	// last one only when no call is counting into it
	for i, ok := range set {
		if ok && counts[i] > 0 {
			r.n[i].Add(uint64(counts[i]))
		}
	}
	s.mu.RUnlock()
}

// call counts a call that took d and, when failed, whether Redis (or
// Valkey) failed it.
func (s *Statsd) call(d time.Duration, failed, redis bool) {
	s.totalRequests.Add(1)
	switch {
	case failed && redis:
		s.redisError.Add(1)
	case failed:
		s.serviceError.Add(1)
	}
	ms := float64(d) / float64(time.Millisecond)
	s.timesMu.Lock()
	s.timed++
	if len(s.times) < maxTimes {
		s.times = append(s.times, ms)
	} else if i := s.random.IntN(s.timed); i < maxTimes { // reservoir sampling: each call kept with chance maxTimes/timed
		s.times[i] = ms
	}
	s.timesMu.Unlock()
}

// WriteTo writes what was counted since the last WriteTo to w, in statsd
// lines ("name:value|c", "name:value|ms"), and forgets it: counters that
// counted nothing are not written, as gostats writes none. Each Write is
// a whole number of lines of at most 1432 bytes (a UDP datagram). A rule
// that counted nothing since the last WriteTo is dropped, until it counts
// again. What a failed Write did not write is lost.
func (s *Statsd) WriteTo(w io.Writer) (int64, error) {
	var lines []byte
	counter := func(name string, n uint64) {
		if n > 0 {
			lines = append(lines, name...)
			lines = append(lines, s.tags...)
			lines = append(lines, ':')
			lines = strconv.AppendUint(lines, n, 10)
			lines = append(lines, "|c\n"...)
		}
	}
	s.mu.Lock()
	for key, r := range s.rules {
		idle := true
		for i := range r.n {
			n := r.n[i].Swap(0)
			counter(r.name+ruleStatNames[i], n)
			idle = idle && n == 0
		}
		if idle {
			delete(s.rules, key)
		}
	}
	s.mu.Unlock()
	counter(statRedisError, s.redisError.Swap(0))
	counter(statServiceError, s.serviceError.Swap(0))
	counter(statLoadSuccess, s.loadSuccess.Swap(0))
	counter(statLoadError, s.loadError.Swap(0))
	counter(statGlobalShadow, s.globalShadow.Swap(0))
	counter(statTotalRequests, s.totalRequests.Swap(0))

	s.timesMu.Lock()
	times, timed := s.times, s.timed
	s.times, s.timed = make([]float64, 0, len(times)), 0
	s.timesMu.Unlock()
	var rate []byte
	if timed > len(times) {
		rate = strconv.AppendFloat([]byte("|@"), float64(len(times))/float64(timed), 'g', 4, 64)
	}
	for _, ms := range times {
		lines = append(lines, statResponseTime...)
		lines = append(lines, s.tags...)
		lines = append(lines, ':')
		lines = strconv.AppendFloat(lines, ms, 'f', 3, 64)
		lines = append(lines, "|ms"...)
		lines = append(lines, rate...)
		lines = append(lines, '\n')
	}
	return writePackets(w, lines)
}

// writePackets writes lines to w in Writes of whole lines of at most
// packetSize bytes (a longer line alone).
func writePackets(w io.Writer, lines []byte) (int64, error) {
	var written int64
	for len(lines) > 0 {
		end := len(lines)
		if end > packetSize {
			end = bytes.LastIndexByte(lines[:packetSize], '\n') + 1
			if end == 0 { // a line longer than a packet
				end = bytes.IndexByte(lines, '\n') + 1
			}
		}
		n, err := w.Write(lines[:end])
		written += int64(n)
		if err != nil {
			return written, err
		}
		lines = lines[end:]
	}
	return written, nil
}
