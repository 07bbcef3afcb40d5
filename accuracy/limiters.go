package main

// limit is one client's limit: at most rate (in cost) per w ms.
type limit struct{ rate, w int64 }

// decider decides one client's requests, given in time order: t in ms, n
// the cost. It admits the request (and counts it) or not.
type decider interface {
	allow(t, n int64) bool
}

// algorithm is one way of deciding, as the tables name it.
type algorithm struct {
	name  string
	about string
	new   func(limit) decider
}

// algorithms are the ways the study compares, the truth first.
var algorithms = []algorithm{
	{"exact log", "the truth: allowed iff the cost admitted in the last W ms, plus this one, is at most R (a sorted-set log, memory per request)",
		func(l limit) decider { return &exactLog{limit: l} }},
	{"sliding (this library)", "allowed iff estimate(cur, prev, W, e) + n <= R: the library's arithmetic, held to its own decisions by window_test.go",
		func(l limit) decider { return &sliding{limit: l} }},
	{"fixed window", "allowed iff the current window's count + n <= R",
		func(l limit) decider { return &fixed{limit: l} }},
	{"GCRA (redis_rate)", "go-redis/redis_rate's GCRA with its default burst = R and emission interval W/R, in exact integers",
		func(l limit) decider { return &gcra{limit: l, burst: l.rate} }},
	{"strict (k=10)", "allowed iff strictCount of the k+1 sub-windows of W/k ms + n <= R",
		func(l limit) decider { return &strict{limit: l, s: l.w / subWindows} }},
	{"count-denied", "the library's sliding window, but a denied request's cost is added to the current count too (Cloudflare's rule), up to R: the script adds min(n, R - current count)",
		func(l limit) decider { return &sliding{limit: l, countDenied: true} }},
}

// exactLog is the sliding log: every admitted request, expired after W ms.
type exactLog struct {
	limit
	log spanLog
}

func (d *exactLog) allow(t, n int64) bool {
	d.log.expire(t, d.w)
	if d.log.sum+n > d.rate {
		return false
	}
	d.log.add(t, n)
	return true
}

// stamp is one admitted request in a spanLog.
type stamp struct{ t, n int64 }

// spanLog holds the requests admitted in the last W ms and their total cost.
type spanLog struct {
	q    []stamp
	head int
	sum  int64
}

// expire drops the requests older than the span (t-w, t].
func (l *spanLog) expire(t, w int64) {
	for l.head < len(l.q) && l.q[l.head].t <= t-w {
		l.sum -= l.q[l.head].n
		l.head++
	}
	if l.head > 1024 && l.head > len(l.q)/2 {
		l.q = append(l.q[:0], l.q[l.head:]...)
		l.head = 0
	}
}

func (l *spanLog) add(t, n int64) {
	l.q = append(l.q, stamp{t, n})
	l.sum += n
}

// sliding is the library's sliding window counter, or with countDenied
// Cloudflare's variant where denied requests count too, as the script
// counts them: a denial adds its cost to the current count up to the rate.
type sliding struct {
	limit
	countDenied bool
	i           int64 // current window's index
	cur, prev   int64
}

// advance moves the counts to window j, where t is.
func (d *sliding) advance(j int64) {
	switch {
	case j == d.i+1:
		d.prev, d.cur = d.cur, 0
	case j > d.i+1:
		d.prev, d.cur = 0, 0
	}
	d.i = j
}

func (d *sliding) allow(t, n int64) bool {
	j := t / d.w
	d.advance(j)
	if estimate(d.cur, d.prev, d.w, t-j*d.w)+n <= d.rate {
		d.cur += n
		return true
	}
	if d.countDenied {
		d.cur += max(0, min(n, d.rate-d.cur))
	}
	return false
}

// fixed is a fixed window counter.
type fixed struct {
	limit
	i, cur int64
}

func (d *fixed) allow(t, n int64) bool {
	if j := t / d.w; j != d.i {
		d.i, d.cur = j, 0
	}
	if d.cur+n > d.rate {
		return false
	}
	d.cur += n
	return true
}

// gcra is redis_rate's allowN: with T = W/R the emission interval and tat
// the theoretical arrival time, a request is allowed when
// max(tat, now) + n×T - burst×T <= now, and then tat becomes
// max(tat, now) + n×T. Time is counted in 1/R ms, where T is exactly W:
// redis_rate computes in float seconds, which this does without rounding.
type gcra struct {
	limit
	burst int64
	tat   int64 // in 1/R ms
}

func (d *gcra) allow(t, n int64) bool {
	now := t * d.rate
	next := max(d.tat, now) + n*d.w
	if next-d.burst*d.w > now {
		return false
	}
	d.tat = next
	return true
}

// strict is strict mode: counts of the last k+1 sub-windows of s ms, in a
// ring indexed by sub-window.
type strict struct {
	limit
	s    int64
	j    int64 // the newest sub-window counted
	ring [subWindows + 1]int64
}

func (d *strict) allow(t, n int64) bool {
	const slots = subWindows + 1
	j := t / d.s
	for x := max(d.j+1, j-slots+1); x <= j; x++ {
		d.ring[x%slots] = 0
	}
	d.j = max(d.j, j)
	var counts [slots]int64          // counts[i] is sub-window j-i's, as the core passes them
	for i := range min(slots, j+1) { // none before time 0
		counts[i] = d.ring[(j-i)%slots]
	}
	if strictCount(counts[:])+n > d.rate {
		return false
	}
	d.ring[j%slots] += n
	return true
}
