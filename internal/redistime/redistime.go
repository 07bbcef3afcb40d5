// Package redistime is a clock that follows the TIME of a Redis server:
// the root's RedisClock.
package redistime

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/logs"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

const (
	// syncRetry is how soon the background loop tries again after a failed
	// sync (or the sync interval, if that is shorter): an error often means
	// a failover, and the new server's clock should be adopted soon.
	syncRetry = time.Second
	// syncTimeout bounds one sync, so that a hung Redis neither holds up the
	// loop nor yields a sample whose round trip, and so whose uncertainty,
	// is large.
	syncTimeout = time.Second
)

// Clock follows the TIME of a Redis server: see the root's RedisClock,
// whose doc says what it does. It is safe for simultaneous use.
type Clock struct {
	client   redis.UniversalClient
	local    func() time.Time
	interval time.Duration // <= 0: no background loop
	ctxAware bool          // the client stops at the ctx deadline by itself

	// onError gets the errors of the background loop's syncs; Sync's callers
	// get their own.
	onError func(ctx context.Context, err error)

	sample atomic.Pointer[sample] // nil until the first successful sync
	last   atomic.Int64           // Unix ns of the latest time Now returned
	syncs  atomic.Uint64          // how many syncs have begun

	cancel context.CancelFunc
	done   chan struct{} // closed when the background loop has returned
}

// sample is one answer to TIME: Redis's estimated time at one local
// reading. Now adds to it the local time elapsed since.
type sample struct {
	local time.Time // the local clock when TIME returned, monotonic reading and all
	redis time.Time // Redis's time then: the reply plus half the round trip
	seq   uint64    // which sync took it: of two, the later begun wins
}

// New returns a clock that follows client's TIME, reading local
// between samples, and starts one goroutine that syncs at once and then
// every interval (none for an interval of 0 or less, or a nil client),
// telling onError (nil: a log line every 10 seconds at most) of its
// failures.
func New(client redis.UniversalClient, local func() time.Time, interval time.Duration, onError func(ctx context.Context, err error)) *Clock {
	c := &Clock{client: client, local: local, interval: interval, onError: onError, done: make(chan struct{})}
	if c.onError == nil {
		c.onError = (&syncLog{clock: c}).handle
	}
	if client != nil {
		c.ctxAware = transport.HonoursContext(client)
	}
	c.last.Store(math.MinInt64)
	if client == nil || c.interval <= 0 {
		c.cancel = func() {}
		close(c.done)
		return c
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.loop(ctx)
	return c
}

// Now returns Redis's time as the clock estimates it: the last sample plus
// the local time elapsed since, or the local clock before any sample,
// never before a time it returned already.
func (c *Clock) Now() time.Time {
	t := c.local()
	if s := c.sample.Load(); s != nil {
		t = s.redis.Add(t.Sub(s.local))
	}
	n := t.UnixNano()
	for {
		last := c.last.Load()
		if n <= last {
			return time.Unix(0, last)
		}
		if c.last.CompareAndSwap(last, n) {
			return time.Unix(0, n)
		}
	}
}

// Sync asks Redis for its time once, now, within syncTimeout, and makes
// the answer the clock's new sample. c's client must not be nil.
func (c *Clock) Sync(ctx context.Context) error {
	seq := c.syncs.Add(1)
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	before := c.local()
	var rt time.Time
	var err error
	if c.ctxAware {
		rt, err = c.client.Time(ctx).Result()
	} else {
		rt, err = transport.Watch(ctx, nil, func(ctx context.Context) (time.Time, error) {
			return c.client.Time(ctx).Result()
		})
	}
	after := c.local()
	if err != nil {
		return fmt.Errorf("ratelimit: redis clock: TIME: %w", err)
	}
	// Redis read its clock somewhere in [before, after]; the middle is off by
	// at most half the round trip either way.
	rtt := max(after.Sub(before), 0)
	s := &sample{local: after, redis: rt.Add(rtt / 2), seq: seq}
	// Of two syncs under way at once, keep the sample of the one begun
	// later. Not the one whose local reading is later: a local clock without
	// a monotonic reading may have been stepped back, and its new samples
	// must not lose to the old.
	for {
		cur := c.sample.Load()
		if cur != nil && cur.seq > seq {
			return nil
		}
		if c.sample.CompareAndSwap(cur, s) {
			return nil
		}
	}
}

// Close stops the background goroutine and waits for it to return.
func (c *Clock) Close() {
	c.cancel()
	<-c.done
}

// loop syncs at once, then every interval, sooner after a failure, until ctx
// is cancelled.
func (c *Clock) loop(ctx context.Context) {
	defer close(c.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		wait := c.interval
		if err := c.Sync(ctx); err != nil {
			wait = min(wait, syncRetry)
			if ctx.Err() == nil { // else Close cut it short: no failure of Redis's
				c.onError(ctx, err)
			}
		}
		timer.Reset(wait)
	}
}

// syncLog is a clock's default sync error handler: a line every 10
// seconds at most (logs.Limited), so that a Redis that stays unreadable
// gives a line every 10 seconds rather than one per retry; the Limiter's
// would say the failure policy decided, which is not what happened.
//
// It paces itself by the clock's local clock rather than by time.Now: a test
// that injects a fake local clock then decides when 10 seconds have passed
// instead of waiting for them, and with the default local clock, time.Now,
// the two are the same, so steps of the wall clock neither silence it nor
// make it chatty. (A local clock stepped back silences it for the step.)
type syncLog struct {
	clock *Clock
	logs.Limited
}

func (h *syncLog) handle(ctx context.Context, err error) {
	msg := "ratelimit: redis clock: sync failed; Now extrapolates from the last sample with the local clock" +
		" (a Redis ACL user needs the TIME command: +time)"
	if h.clock.sample.Load() == nil {
		msg = "ratelimit: redis clock: sync failed; Now reads the local clock, as the clock has never synced" +
			" (a Redis ACL user needs the TIME command: +time)"
	}
	h.Warn(ctx, h.clock.local(), msg, err)
}
