// RedisClock: the Limiter's clock read from Redis's TIME.

package ratelimit

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/redistime"
)

// defaultSyncInterval is how often a RedisClock asks Redis for its time
// unless WithSyncInterval says otherwise. Between samples it extrapolates
// with the local monotonic clock, which drifts by well under a millisecond
// in 10 seconds, so more frequent samples would buy nothing but round trips.
const defaultSyncInterval = 10 * time.Second

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
	c      *redistime.Clock
	client redis.UniversalClient
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
	return &RedisClock{c: redistime.New(client, cfg.local, cfg.interval, cfg.onError), client: client}
}

// Now returns Redis's time as the clock estimates it: the last sample plus
// the local time elapsed since, or the local clock before any sample. It
// never returns a time before one it returned already. It takes no lock and
// does not allocate, and fits WithClock.
func (c *RedisClock) Now() time.Time { return c.c.Now() }

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
	return c.c.Sync(ctx)
}

// Close stops the background goroutine and waits for it to return, which it
// does at once even if a sync is under way (with a client whose
// ContextTimeoutEnabled is false, the client itself goes on waiting for
// that TIME reply until its ReadTimeout, on a goroutine of its own). It
// always returns nil, and may be called more than once.
func (c *RedisClock) Close() error {
	c.c.Close()
	return nil
}
