// RedisClock: the Limiter's clock read from Redis's TIME.

package ratelimit

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// defaultSyncInterval is how often a RedisClock asks Redis for its time
// unless WithSyncInterval says otherwise. Between samples it extrapolates
// with the local monotonic clock, which drifts by well under a millisecond
// in 10 seconds, so more frequent samples would buy nothing but round trips.
const defaultSyncInterval = 10 * time.Second

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

// RedisClock is a clock that follows the TIME of a Redis server, so that
// application servers whose own clocks disagree still place requests in the
// same windows. Pass its Now method to WithClock:
//
//	rc := ratelimit.NewRedisClock(client)
//	defer rc.Close()
//	limiter := ratelimit.New(client, ratelimit.WithClock(rc.Now))
//
// It samples Redis's TIME now and then (every 10 seconds), takes the
// reply as Redis's time at the middle of the round trip, and in between
// extrapolates with the local clock: with the default local clock, time.Now,
// that is Go's monotonic reading, so steps of the local wall clock between
// samples do not move it. Each sample is off by at most half its round trip.
//
// Now never goes backwards. When a sample says Redis is behind what Now last
// returned (say after a failover to a server whose clock is behind), Now
// holds at its last value until the new estimate catches up: for that long
// every request falls on one millisecond, so windows do not advance and the
// limiter admits less, never more. A sample ahead of the last one makes Now
// jump forward, as if that much time had passed.
//
// Before its first successful sync, which the background goroutine makes at
// once, a RedisClock reads the local clock. Call Sync before serving to
// avoid that: if the local clock is ahead of Redis and Now was called, Now
// holds until Redis's time catches up with what it returned. After a failed
// sync it goes on extrapolating from the last good sample, and the
// background goroutine retries within a second. The errors of failed
// background syncs go to the function WithSyncErrorHandler sets; by default
// they are logged through log/slog, a line every 10 seconds at most, so that
// a clock that cannot read TIME (a Redis ACL user without +time, say) does
// not quietly follow the local clock for ever. With a Redis Cluster each
// sync asks some node; the nodes' own clocks should agree (NTP) to well
// within a window.
//
// New does not use a RedisClock unless told to: it costs a goroutine and a
// Close, and servers whose clocks NTP keeps within milliseconds of each
// other need none for windows of a second or more.
//
// A RedisClock is safe for simultaneous use by multiple goroutines. Close it
// to stop its background goroutine; Now goes on working after Close,
// extrapolating from the last sample.
type RedisClock struct {
	client   redis.UniversalClient
	local    func() time.Time
	interval time.Duration // <= 0: no background loop
	ctxAware bool          // the client stops at the ctx deadline by itself

	// onError gets the errors of the background loop's syncs; Sync's callers
	// get their own.
	onError func(ctx context.Context, err error)

	sample atomic.Pointer[clockSample] // nil until the first successful sync
	last   atomic.Int64                // Unix ns of the latest time Now returned
	syncs  atomic.Uint64               // how many syncs have begun

	cancel context.CancelFunc
	done   chan struct{} // closed when the background loop has returned
}

// clockSample is one answer to TIME: Redis's estimated time at one local
// reading. Now adds to it the local time elapsed since.
type clockSample struct {
	local time.Time // the local clock when TIME returned, monotonic reading and all
	redis time.Time // Redis's time then: the reply plus half the round trip
	seq   uint64    // which sync took it: of two, the later begun wins
}

// RedisClockOption configures a RedisClock; pass options to NewRedisClock.
type RedisClockOption interface{ apply(*redisClockConfig) }

// clockOptionFunc adapts a function to RedisClockOption.
type clockOptionFunc func(*redisClockConfig)

func (f clockOptionFunc) apply(c *redisClockConfig) { f(c) }

// redisClockConfig holds what the options set.
type redisClockConfig struct {
	interval time.Duration
	local    func() time.Time
	onError  func(ctx context.Context, err error) // nil: log
}

// WithSyncInterval sets how often the background goroutine asks Redis for
// its time (default 10s); after a failed sync it tries again after a
// second, or after d if that is shorter. A d of zero or less
// turns the background sync off: NewRedisClock then starts no goroutine, and
// the clock moves to Redis's time only when Sync is called.
func WithSyncInterval(d time.Duration) RedisClockOption {
	return clockOptionFunc(func(c *redisClockConfig) { c.interval = d })
}

// WithLocalClock sets the local clock a RedisClock measures round trips with
// and extrapolates with between samples (default time.Now, whose monotonic
// reading keeps steps of the wall clock out). Tests use it to give each
// simulated server a clock of its own. A nil now keeps the default.
func WithLocalClock(now func() time.Time) RedisClockOption {
	return clockOptionFunc(func(c *redisClockConfig) {
		if now != nil {
			c.local = now
		}
	})
}

// WithSyncErrorHandler sets the function called with the error of every
// background sync that fails, so that a clock that cannot read Redis's time
// (Redis is down, or a Redis ACL user lacks +time) is seen to fall back on
// the local clock. Calls to Sync return their error instead and do not reach
// fn; nor does a sync that Close cut short. fn runs on the clock's goroutine,
// which waits for it before the next sync and which Close waits for, so it
// should be quick; its ctx is done once Close is called. The default logs
// through log/slog's default logger at Warn level, at most one line every 10
// seconds, counting the errors it left out. A nil fn restores the default.
func WithSyncErrorHandler(fn func(ctx context.Context, err error)) RedisClockOption {
	return clockOptionFunc(func(c *redisClockConfig) { c.onError = fn })
}

// NewRedisClock returns a RedisClock that follows client's TIME, and starts
// one goroutine that syncs at once and then every sync interval until Close.
// With a nil client it starts none, Now reads the local clock, and Sync
// returns ErrNilClient.
func NewRedisClock(client redis.UniversalClient, opts ...RedisClockOption) *RedisClock {
	cfg := redisClockConfig{interval: defaultSyncInterval, local: time.Now}
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&cfg)
		}
	}
	c := &RedisClock{
		client:   client,
		local:    cfg.local,
		interval: cfg.interval,
		onError:  cfg.onError,
		done:     make(chan struct{}),
	}
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
// the local time elapsed since, or the local clock before any sample. It
// never returns a time before one it returned already. It takes no lock and
// does not allocate, and fits WithClock.
func (c *RedisClock) Now() time.Time {
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

// Sync asks Redis for its time once, now, and makes the answer the clock's
// new sample. It blocks for one round trip: at most a second, less if ctx is
// done sooner. On an error the clock keeps its last sample. Call it at
// start-up, before serving, so that Now follows Redis from the first
// request; the background goroutine calls it too. Sync is safe to call at
// any time, after Close too.
func (c *RedisClock) Sync(ctx context.Context) error {
	if c.client == nil {
		return ErrNilClient
	}
	seq := c.syncs.Add(1)
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	before := c.local()
	var rt time.Time
	var err error
	if c.ctxAware {
		rt, err = c.client.Time(ctx).Result()
	} else {
		rt, err = transport.Watch(ctx, func(ctx context.Context) (time.Time, error) {
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
	s := &clockSample{local: after, redis: rt.Add(rtt / 2), seq: seq}
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

// Close stops the background goroutine and waits for it to return, which it
// does at once even if a sync is under way (with a client whose
// ContextTimeoutEnabled is false, the client itself goes on waiting for
// that TIME reply until its ReadTimeout, on a goroutine of its own). It
// always returns nil, and may be called more than once.
func (c *RedisClock) Close() error {
	c.cancel()
	<-c.done
	return nil
}

// loop syncs at once, then every interval, sooner after a failure, until ctx
// is cancelled.
func (c *RedisClock) loop(ctx context.Context) {
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

// syncLog is a RedisClock's default sync error handler. Like the Limiter's
// (logHandler) it logs at most once every logEvery, counting the errors it
// left out, so that a Redis that stays unreadable gives a line every 10
// seconds rather than one per retry; logHandler itself would say the failure
// policy decided, which is not what happened. Only the clock's goroutine
// calls it, so it needs no atomics.
//
// It paces itself by the clock's local clock rather than by time.Now: a test
// that injects a fake local clock then decides when 10 seconds have passed
// instead of waiting for them, and with the default local clock, time.Now,
// the two are the same, monotonic reading and all, so steps of the wall
// clock neither silence it nor make it chatty. (A local clock without a
// monotonic reading that is stepped back silences it for the step.)
type syncLog struct {
	clock   *RedisClock
	next    time.Time // nothing is logged before it
	dropped int       // errors not logged since the last line
}

func (h *syncLog) handle(ctx context.Context, err error) {
	now := h.clock.local()
	if now.Before(h.next) {
		h.dropped++
		return
	}
	h.next = now.Add(logEvery)
	msg := "ratelimit: redis clock: sync failed; Now extrapolates from the last sample with the local clock" +
		" (a Redis ACL user needs the TIME command: +time)"
	if h.clock.sample.Load() == nil {
		msg = "ratelimit: redis clock: sync failed; Now reads the local clock, as the clock has never synced" +
			" (a Redis ACL user needs the TIME command: +time)"
	}
	slog.Default().WarnContext(ctx, msg, "error", err, "errors_not_logged", h.dropped)
	h.dropped = 0
}
