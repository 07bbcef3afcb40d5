// An emulated Envoy for the RLQS conformance harness (rlqs_conformance_test.go):
// one data plane's rate_limit_quota filter driving one
// StreamRateLimitQuotas stream, with the client's behaviour as
// envoyproxy/envoy's source/extensions/filters/http/rate_limit_quota
// (global_client_impl.cc) has it, quirks included.

package main

import (
	"context"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// bucketKey is a bucket id's map as one string, its keys sorted: the
// emulator's (and the checks') name for the bucket.
func bucketKey(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + m[k])
	}
	return b.String()
}

// stateKind is what decides a bucket's requests.
type stateKind int

const (
	stateNone     stateKind = iota // no assignment, or an expired one: denied (no_assignment_behavior / expired_assignment_behavior deny)
	stateAllowAll                  // blanket ALLOW_ALL
	stateDenyAll                   // blanket DENY_ALL
	stateTokens                    // a token bucket
)

// bucketState is a bucket as it stood at a time: what the checks replay.
// Between two states of one bucket nothing is admitted (a state is
// recorded after every tick's admissions and every change).
type bucketState struct {
	at      time.Time
	seg     int // the assignment in force (a token bucket re-sent identical keeps its seg); 0 for none
	kind    stateKind
	tokens  float64 // stateTokens: tokens at at
	max     float64
	rate    float64 // tokens a second; +Inf for a fill_interval under 1 s
	expires time.Time
	// gone marks the Envoy's end (stop): it admits nothing more, which no
	// server can know
	gone bool
}

// potential is what a greedy Envoy could still admit from t on under the
// assignment of s (s.at <= t, nothing admitted in between): the tokens it
// would hold at t plus the fills until the assignment expires.
func (s bucketState) potential(t time.Time) float64 { return s.potentialAfter(t, 0) }

// potentialAfter is potential with the fills counted for extra past the
// expiry, for an assignment still in force at t.
func (s bucketState) potentialAfter(t time.Time, extra time.Duration) float64 {
	if s.kind == stateNone || s.kind == stateDenyAll || !t.Before(s.expires) {
		return 0
	}
	if s.kind == stateAllowAll || math.IsInf(s.rate, 1) {
		return math.Inf(1)
	}
	tokens := math.Min(s.max, s.tokens+s.rate*t.Sub(s.at).Seconds())
	return math.Floor(tokens + s.rate*(s.expires.Sub(t)+extra).Seconds())
}

// assignmentRecord is one bucket action as the emulator applied it.
type assignmentRecord struct {
	at       time.Time
	bucket   string
	what     string // "token_bucket", "allow_all", "deny_all", "abandon", "skipped: ..."
	max, tpf uint32
	fill     time.Duration
	ttl      time.Duration // as Envoy reads it: whole seconds
	extended bool          // an identical token bucket: the TTL extended, the tokens kept
	granted  float64       // what it let a greedy Envoy admit when applied (potential)
}

// killRecord is a stream that ended under the Envoy (killStream, stop):
// the server cannot know what the Envoy admitted after its last report on
// it.
type killRecord struct {
	at, lastSend time.Time
}

// envoyBucket is one quota bucket of the filter.
type envoyBucket struct {
	id              map[string]string
	allowed, denied uint64
	lastReport      time.Time
	state           bucketState
	tb              *typev3.TokenBucket // the token bucket in force, for Envoy's equality
}

// emulatedEnvoy is one Envoy's rate_limit_quota filter talking to an RLQS
// server over one stream, as Envoy's client does:
//   - it reports every period (Envoy's reporting_interval; real Envoy uses
//     5 s) all its buckets, each with time_elapsed in whole seconds since
//     its last report (so 0 happens), and the domain on every message; a
//     bucket's first request sends a report of that bucket at once;
//   - a bucket starts with no assignment, and then and after its
//     assignment expires it denies (the strict choices of
//     no_assignment_behavior and expired_assignment_behavior);
//   - an assignment's TTL is its whole seconds: unset or under 1 s, it has
//     expired at once;
//   - a token bucket fills continuously at tokens_per_fill (unset: 0, as
//     Envoy reads the wrapper) over fill_interval's whole seconds (under
//     1 s: a division by 0, an unlimited rate), starts full, holds at most
//     max_tokens; a token bucket equal to the one in force (Envoy compares
//     max_tokens, tokens_per_fill and fill_interval's nanos only) extends
//     the TTL and keeps the tokens; any other replaces the bucket;
//   - requests_per_time_unit, an unset strategy and an action for a bucket
//     it does not have are skipped; abandon forgets the bucket;
//   - a report made while the stream is down is dropped (the counters
//     already reset); the stream is reopened at the next report.
//
// Demand is R requests a second per bucket (setDemand), tried at each
// tick. An emulatedEnvoy is safe for one goroutine ticking and its
// stream's receiver; the checks read it after stop.
type emulatedEnvoy struct {
	name   string
	client rlqspb.RateLimitQuotaServiceClient
	domain string
	period time.Duration
	now    func() time.Time

	mu         sync.Mutex
	ctx        context.Context
	cancelAll  context.CancelFunc
	stream     rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel     context.CancelFunc
	tried      bool        // the stream was opened once (Envoy opens it at the first bucket)
	lastSend   time.Time   // when the last report sent on the stream was made
	sends      []time.Time // when each report sent was made, on any stream
	stopped    bool
	buckets    map[string]*envoyBucket
	demand     map[string]*demand
	nextReport time.Time
	seg        int
	last       time.Time // the latest instant recorded: the histories stay in order

	sent, received, dropped int
	notify                  chan struct{}
	admissions              map[string][]time.Time
	history                 map[string][]bucketState
	assignments             []assignmentRecord
	kills                   []killRecord
	streamErrs              []error
	wg                      sync.WaitGroup
}

// demand is a bucket's R requests a second since start.
type demand struct {
	id    map[string]string
	rate  float64
	start time.Time
	tried int
}

// newEnvoy returns an Envoy of domain reporting every period on client,
// reading the clock now.
func newEnvoy(t *testing.T, name string, client rlqspb.RateLimitQuotaServiceClient, domain string, period time.Duration, now func() time.Time) *emulatedEnvoy {
	ctx, cancel := context.WithCancel(context.Background())
	e := &emulatedEnvoy{name: name, client: client, domain: domain, period: period, now: now,
		ctx: ctx, cancelAll: cancel, buckets: map[string]*envoyBucket{}, demand: map[string]*demand{},
		notify: make(chan struct{}, 1), admissions: map[string][]time.Time{}, history: map[string][]bucketState{}}
	t.Cleanup(e.stop)
	return e
}

// setDemand makes the Envoy try rate requests a second of bucket id from
// now on (0: none).
func (e *emulatedEnvoy) setDemand(id map[string]string, rate float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.demand[bucketKey(id)] = &demand{id: id, rate: rate, start: e.now()}
}

// run ticks the Envoy every step of the real clock until ctx is done or
// the Envoy stops.
func (e *emulatedEnvoy) run(ctx context.Context, step time.Duration) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		tick := time.NewTicker(step)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-e.ctx.Done():
				return
			case <-tick.C:
				e.tick(e.now())
			}
		}
	}()
}

// outgoing is a message to send, and whether it is a periodic report
// (which reopens a stream that is down) or a bucket's first report.
type outgoing struct {
	msg      *rlqspb.RateLimitQuotaUsageReports
	periodic bool
	made     time.Time // its counters' end: admissions after it are in the next report
}

// tick tries the demand due by now, then sends the periodic report if
// one is due.
func (e *emulatedEnvoy) tick(now time.Time) {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return
	}
	now = e.clamp(now)
	var out []outgoing
	keys := make([]string, 0, len(e.demand))
	for k := range e.demand {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		d := e.demand[k]
		due := int(d.rate*now.Sub(d.start).Seconds()) - d.tried
		for range max(due, 0) {
			d.tried++
			if m := e.request(d.id, now); m != nil {
				out = append(out, outgoing{msg: m, made: now})
			}
		}
	}
	if !e.nextReport.IsZero() && !now.Before(e.nextReport) {
		out = append(out, outgoing{msg: e.report(now), periodic: true, made: now})
		e.nextReport = now.Add(e.period) // Envoy re-arms its timer when it fires
	}
	for k, b := range e.buckets {
		e.record(k, b, now)
	}
	e.mu.Unlock()
	for _, o := range out {
		e.send(o)
	}
}

// request decides one request of bucket id at now, as the filter does,
// and returns the bucket's first report when the bucket is new.
func (e *emulatedEnvoy) request(id map[string]string, now time.Time) *rlqspb.RateLimitQuotaUsageReports {
	k := bucketKey(id)
	b := e.buckets[k]
	if b == nil {
		// the first request: no assignment yet, denied; reported at once
		// (its counters reset by that report), and the report timer starts
		b = &envoyBucket{id: id, lastReport: now}
		e.buckets[k] = b
		if e.nextReport.IsZero() {
			e.nextReport = now.Add(e.period)
		}
		e.record(k, b, now)
		return &rlqspb.RateLimitQuotaUsageReports{Domain: e.domain, BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqspb.BucketId{Bucket: id}, TimeElapsed: durationpb.New(0), NumRequestsDenied: 1}}}
	}
	e.expire(k, b, now)
	admit := false
	switch b.state.kind {
	case stateAllowAll:
		admit = true
	case stateTokens:
		b.fill(now)
		if b.state.tokens >= 1 {
			b.state.tokens--
			admit = true
		}
	}
	if admit {
		b.allowed++
		e.admissions[k] = append(e.admissions[k], now)
	} else {
		b.denied++
	}
	return nil
}

// fill brings a token bucket's tokens to now.
func (b *envoyBucket) fill(now time.Time) {
	s := &b.state
	if math.IsInf(s.rate, 1) {
		s.tokens = s.max
	} else {
		s.tokens = math.Min(s.max, s.tokens+s.rate*now.Sub(s.at).Seconds())
	}
	s.at = now
}

// expire ends b's assignment when its TTL has run out by now.
func (e *emulatedEnvoy) expire(k string, b *envoyBucket, now time.Time) {
	if b.state.kind != stateNone && !now.Before(b.state.expires) {
		b.state = bucketState{at: now}
		b.tb = nil
		e.record(k, b, now)
	}
}

// record appends b's state at now to its history.
func (e *emulatedEnvoy) record(k string, b *envoyBucket, now time.Time) {
	if b.state.kind == stateTokens {
		b.fill(now)
	}
	s := b.state
	s.at = now
	e.history[k] = append(e.history[k], s)
}

// report builds the periodic report of every bucket at now, resetting
// their counters.
func (e *emulatedEnvoy) report(now time.Time) *rlqspb.RateLimitQuotaUsageReports {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: e.domain}
	keys := make([]string, 0, len(e.buckets))
	for k := range e.buckets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b := e.buckets[k]
		elapsed := now.Sub(b.lastReport).Truncate(time.Second) // Envoy's duration_cast<seconds>
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: b.id}, TimeElapsed: durationpb.New(elapsed),
			NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	return m
}

// send sends o on the stream, opening it for a periodic report (or the
// very first report) when it is down; a report that cannot go is dropped.
func (e *emulatedEnvoy) send(o outgoing) {
	e.mu.Lock()
	st := e.stream
	open := st == nil && (o.periodic || !e.tried) && !e.stopped
	e.mu.Unlock()
	if open {
		st = e.open()
	}
	if st == nil || st.Send(o.msg) != nil {
		e.mu.Lock()
		e.dropped++
		e.mu.Unlock()
		return
	}
	e.mu.Lock()
	e.sent++
	e.lastSend = o.made
	e.sends = append(e.sends, o.made)
	e.mu.Unlock()
}

// open starts a stream and its receiver; nil if it cannot start.
func (e *emulatedEnvoy) open() rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient {
	ctx, cancel := context.WithCancel(e.ctx)
	st, err := e.client.StreamRateLimitQuotas(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tried = true
	if err != nil || e.stopped {
		cancel()
		if err != nil {
			e.streamErrs = append(e.streamErrs, err)
		}
		return nil
	}
	e.stream, e.cancel, e.lastSend = st, cancel, time.Time{}
	e.wg.Add(1)
	go e.receive(st)
	return st
}

// receive applies what the server sends on st until st ends.
func (e *emulatedEnvoy) receive(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	defer e.wg.Done()
	for {
		m, err := st.Recv()
		e.mu.Lock()
		if err != nil {
			if e.stream == st { // the server ended it: Envoy's onRemoteClose
				e.stream = nil
				e.kills = append(e.kills, killRecord{at: e.clamp(e.now()), lastSend: e.lastSend})
			}
			e.streamErrs = append(e.streamErrs, err)
			e.mu.Unlock()
			return
		}
		if !e.stopped {
			e.apply(m, e.clamp(e.now()))
		}
		e.received++
		e.mu.Unlock()
		select {
		case e.notify <- struct{}{}:
		default:
		}
	}
}

// apply applies a response's bucket actions at now, as Envoy's
// onQuotaResponseImpl does.
func (e *emulatedEnvoy) apply(m *rlqspb.RateLimitQuotaResponse, now time.Time) {
	for _, a := range m.GetBucketAction() {
		id := a.GetBucketId().GetBucket()
		k := bucketKey(id)
		b := e.buckets[k]
		if len(id) == 0 || b == nil {
			e.assignments = append(e.assignments, assignmentRecord{at: now, bucket: k, what: "skipped: a bucket it does not have"})
			continue
		}
		e.expire(k, b, now)
		if a.GetAbandonAction() != nil {
			delete(e.buckets, k)
			e.history[k] = append(e.history[k], bucketState{at: now})
			e.assignments = append(e.assignments, assignmentRecord{at: now, bucket: k, what: "abandon"})
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		r := assignmentRecord{at: now, bucket: k, ttl: time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second}
		next := bucketState{at: now, expires: now.Add(r.ttl)}
		var tb *typev3.TokenBucket
		switch s := qa.GetRateLimitStrategy().GetStrategy().(type) {
		case *typev3.RateLimitStrategy_BlanketRule_:
			e.seg++
			next.seg, next.kind, r.what = e.seg, stateAllowAll, "allow_all"
			if s.BlanketRule == typev3.RateLimitStrategy_DENY_ALL {
				next.kind, r.what = stateDenyAll, "deny_all"
			}
		case *typev3.RateLimitStrategy_TokenBucket:
			tb = s.TokenBucket
			r.what, r.max, r.tpf, r.fill = "token_bucket", tb.GetMaxTokens(), tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().AsDuration()
			if b.state.kind == stateTokens && envoyTokenBucketsEqual(tb, b.tb) {
				b.fill(now)
				next.seg, next.kind, next.tokens, next.max, next.rate = b.state.seg, stateTokens, b.state.tokens, b.state.max, b.state.rate
				tb, r.extended = b.tb, true
			} else {
				e.seg++
				next.seg, next.kind, next.max, next.rate = e.seg, stateTokens, float64(tb.GetMaxTokens()), envoyFillRate(tb)
				next.tokens = next.max
			}
		default:
			e.assignments = append(e.assignments, assignmentRecord{at: now, bucket: k, what: "skipped: requests_per_time_unit or no strategy"})
			continue
		}
		r.granted = next.potential(now)
		if r.extended {
			r.granted -= b.state.potential(now) // what the extension adds
		}
		b.state, b.tb = next, tb
		if r.ttl == 0 { // Envoy's timer of 0 ms: expired before any request sees it
			b.state, b.tb = bucketState{at: now}, nil
		}
		e.assignments = append(e.assignments, r)
		e.record(k, b, now)
	}
}

// envoyTokenBucketsEqual is Envoy's protoTokenBucketsEq: fill_interval's
// seconds are not compared, so a change of them alone keeps the old bucket.
func envoyTokenBucketsEqual(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() && a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// envoyFillRate is Envoy's fill rate: tokens_per_fill (0 when unset)
// over fill_interval's whole seconds, +Inf when those are 0.
func envoyFillRate(tb *typev3.TokenBucket) float64 {
	secs := tb.GetFillInterval().GetSeconds()
	if secs <= 0 {
		return math.Inf(1)
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(secs)
}

// killStream cancels the stream's ctx, as a connection lost would end it;
// the Envoy lives on, keeps its assignments and reopens the stream at its
// next report.
func (e *emulatedEnvoy) killStream() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.killLocked()
}

func (e *emulatedEnvoy) killLocked() {
	if e.stream == nil {
		return
	}
	e.cancel()
	e.stream = nil
	e.kills = append(e.kills, killRecord{at: e.clamp(e.now()), lastSend: e.lastSend})
}

// stop ends the Envoy: its stream, its demand and its buckets (an Envoy
// gone admits nothing more). It may be called again.
func (e *emulatedEnvoy) stop() {
	e.mu.Lock()
	if !e.stopped {
		now := e.clamp(e.now())
		e.killLocked()
		e.stopped = true
		for k := range e.buckets {
			e.history[k] = append(e.history[k], bucketState{at: now, gone: true})
		}
		e.cancelAll()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// clamp is t, or the latest instant recorded if that is later: the tick
// reads the clock before it takes the lock, the receiver after.
func (e *emulatedEnvoy) clamp(t time.Time) time.Time {
	if t.Before(e.last) {
		return e.last
	}
	e.last = t
	return t
}

// settle waits until the server has answered every report sent: for a
// server that answers each report once (the harness's fakes).
func (e *emulatedEnvoy) settle(t *testing.T) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		e.mu.Lock()
		done := e.received >= e.sent
		e.mu.Unlock()
		if done {
			return
		}
		select {
		case <-e.notify:
		case <-timeout.C:
			t.Fatalf("%s: the server answered %d of %d reports", e.name, e.received, e.sent)
		}
	}
}

// stateAt is bucket k's state in force at t (its last one at or before t).
func (e *emulatedEnvoy) stateAt(k string, t time.Time) bucketState {
	h := e.history[k]
	i := sort.Search(len(h), func(i int) bool { return h[i].at.After(t) })
	if i == 0 {
		return bucketState{at: t}
	}
	return h[i-1]
}

// admittedIn is how many requests of bucket k the Envoy admitted in
// (from, to].
func (e *emulatedEnvoy) admittedIn(k string, from, to time.Time) int {
	a := e.admissions[k]
	lo := sort.Search(len(a), func(i int) bool { return a[i].After(from) })
	hi := sort.Search(len(a), func(i int) bool { return a[i].After(to) })
	return hi - lo
}

// share is the assignment bucket k last received by t, in force or run
// out, as (fill rate, max tokens): (0, 0) for none or DENY_ALL, +Inf for
// ALLOW_ALL. Run out counts: between a strict limit's sub-windows the
// service leaves a bucket without an assignment for up to a report
// period (docs/envoy.md), which changes no share.
func (e *emulatedEnvoy) share(k string, t time.Time) (rate, maxTokens float64) {
	h := e.history[k]
	i := sort.Search(len(h), func(i int) bool { return h[i].at.After(t) })
	for i > 0 && h[i-1].kind == stateNone {
		i--
	}
	if i == 0 {
		return 0, 0
	}
	s := h[i-1]
	switch s.kind {
	case stateAllowAll:
		return math.Inf(1), math.Inf(1)
	case stateTokens:
		return s.rate, s.max
	}
	return 0, 0
}

// times is every instant bucket k's state was recorded.
func (e *emulatedEnvoy) times(k string) []time.Time {
	var ts []time.Time
	for _, s := range e.history[k] {
		ts = append(ts, s.at)
	}
	return slices.Compact(ts)
}

// lastReport is when the last report the Envoy sent by t was made (zero:
// none).
func (e *emulatedEnvoy) lastReport(t time.Time) time.Time {
	i := sort.Search(len(e.sends), func(i int) bool { return e.sends[i].After(t) })
	if i == 0 {
		return time.Time{}
	}
	return e.sends[i-1]
}

// reach is the most a greedy Envoy could admit of bucket k after a report
// it made at from, as a server that has heard nothing from it since must
// reckon it: from δ before from (the report may have taken δ to arrive),
// under the assignment in force then and each it applied by until (to its
// expiry as of until), each until δ after it was replaced or ended (so may
// the next have taken δ; an extension that would then have come after
// the bucket expired starts a full one), as if the Envoy lived on. What the Envoy held δ
// before from is a full bucket, less what its admissions since the bucket
// started show it cannot hold: no report tells a server more.
func (e *emulatedEnvoy) reach(k string, from, until time.Time, delta time.Duration) float64 {
	h := e.history[k]
	start := from.Add(-delta)
	i := sort.Search(len(h), func(i int) bool { return h[i].at.After(start) })
	cur := bucketState{at: start}
	if i > 0 && start.Before(h[i-1].expires) {
		cur = h[i-1]
	}
	tokens := cur.tokens
	if cur.kind == stateTokens {
		j := i - 1
		for j > 0 && h[j-1].seg == cur.seg {
			j--
		}
		started := h[j].at
		tokens = math.Min(cur.max, cur.max+cur.rate*start.Sub(started).Seconds()-float64(e.admittedIn(k, started, start)))
	}
	total := 0.0
	add := func(s bucketState, tokens float64, start, end time.Time) {
		switch {
		case s.kind == stateAllowAll || (s.kind == stateTokens && math.IsInf(s.rate, 1)):
			total = math.Inf(1)
		case s.kind == stateTokens && end.After(start):
			total += math.Floor(tokens + s.rate*end.Sub(start).Seconds())
		}
	}
	for _, s := range h[i:] {
		if s.at.After(until) {
			break
		}
		if s.gone {
			continue // the server cannot know the Envoy is gone
		}
		if s.seg == cur.seg && (!s.expires.After(cur.expires) || s.at.Add(delta).Before(cur.expires)) {
			cur.expires = later(cur.expires, s.expires) // the same bucket, its TTL extended
			continue
		}
		if s.seg == cur.seg {
			// an extension that, δ later, would have found the bucket
			// expired and started a full one: the server cannot know
			s.tokens = s.max
		}
		add(cur, tokens, start, earlier(s.at, cur.expires).Add(delta))
		cur, tokens, start = s, s.tokens, s.at
	}
	add(cur, tokens, start, cur.expires.Add(delta))
	return total
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
