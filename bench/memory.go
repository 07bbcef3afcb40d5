package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
)

// MemoryLimit is the limit of the memory measurement: loose enough that
// every request is allowed, and long enough that no contender's key expires
// while it runs (a GCRA key lives one emission interval, here a minute).
var MemoryLimit = ratelimit.PerHour(60)

// memoryRetries is how many times the memory measurement makes a failed call
// again.
const memoryRetries = 3

// MemoryConfig describes one measurement of Redis memory per client.
type MemoryConfig struct {
	Contender   Contender
	Options     redis.Options // the Redis client's options (Addr at least)
	Clients     int           // distinct client ids, each making one request per window
	Windows     int           // 1, or 2: each client active in two consecutive windows
	Concurrency int           // goroutines making the requests
	// Flush runs FLUSHALL before the measurement, which needs an empty
	// server. Only for a server the bench owns.
	Flush bool
}

// MemoryResult is the outcome of one memory measurement, as one JSON line.
type MemoryResult struct {
	Kind      string `json:"kind"` // "memory"
	Contender string `json:"contender"`
	Windows   int    `json:"windows"`
	Clients   int    `json:"clients"`
	// UsedBefore and UsedAfter are INFO memory's used_memory, in bytes,
	// with no connection open but the meter's.
	UsedBefore int64 `json:"used_memory_before"`
	UsedAfter  int64 `json:"used_memory_after"`
	// Keys is DBSIZE after.
	Keys int64 `json:"keys"`
	// BytesPerClient is (UsedAfter - UsedBefore) / Clients.
	BytesPerClient float64 `json:"bytes_per_client"`
	KeysPerClient  float64 `json:"keys_per_client"`
	Allowed        int64   `json:"allowed"`
	// Retried counts calls that failed and were made again: the memory
	// measurement needs every client's key, not every call's speed (a call
	// that timed out may have counted, and then its retry counts twice in
	// the same key, which changes no size).
	Retried int64 `json:"retried"`
	// Errors counts calls that failed even when made again.
	Errors int64 `json:"errors"`
	// Clocked reports whether the second window was reached by moving the
	// contender's clock; otherwise both requests came at once in real time.
	Clocked bool   `json:"clocked"`
	OK      bool   `json:"ok"`
	Problem string `json:"problem,omitempty"`
}

// MeasureMemory measures the growth of Redis's used_memory when Clients
// clients each make one allowed request in each of Windows consecutive
// windows. The server must hold nothing else: Flush empties it first.
//
// Both readings are taken with the contender's connections closed and only
// the meter's one open, so that connection buffers (which the pool's size
// moves) do not count: first after a warm-up that loads the contender's
// scripts, then after the requests.
func MeasureMemory(ctx context.Context, cfg MemoryConfig) (MemoryResult, error) {
	res := MemoryResult{Kind: "memory", Contender: cfg.Contender.Name, Windows: cfg.Windows,
		Clients: cfg.Clients, Clocked: cfg.Contender.Clocked}
	if cfg.Contender.Offline {
		return res, errors.New("bench: an offline contender keeps nothing in Redis")
	}
	if cfg.Clients < 1 || cfg.Windows < 1 || cfg.Concurrency < 1 {
		return res, errors.New("bench: need clients, windows and concurrency of 1 or more")
	}
	meterOpts := cfg.Options
	meterOpts.PoolSize, meterOpts.MaxIdleConns = 1, 1
	meter := redis.NewClient(&meterOpts)
	defer meter.Close()
	if cfg.Flush {
		if err := meter.FlushAll(ctx).Err(); err != nil {
			return res, fmt.Errorf("bench: FLUSHALL: %w", err)
		}
	}
	base := time.Now()
	var offset atomic.Int64
	now := func() time.Time { return base.Add(time.Duration(offset.Load())) }

	// session runs fn with a fresh contender on its own client, then closes
	// both and waits for the server to see its connections go.
	session := func(fn func(d Decider) error) error {
		opts := cfg.Options
		client := redis.NewClient(&opts)
		d, err := cfg.Contender.New(ctx, Env{Client: client, Options: cfg.Options, Limit: MemoryLimit, Now: now})
		if err != nil {
			client.Close()
			return fmt.Errorf("bench: starting %s: %w", cfg.Contender.Name, err)
		}
		err = fn(d)
		err = errors.Join(err, closeDecider(d), client.Close())
		return errors.Join(err, waitAlone(ctx, meter))
	}

	warm := IDs("warmup-", 4*cfg.Concurrency)
	err := session(func(d Decider) error {
		if _, _, errs, first := drive(ctx, d, warm, cfg.Concurrency, memoryRetries); errs > 0 {
			return fmt.Errorf("bench: warming up %s: %d calls failed; the first: %w", cfg.Contender.Name, errs, first)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	if err := meter.FlushAll(ctx).Err(); err != nil {
		return res, fmt.Errorf("bench: FLUSHALL after warm-up: %w", err)
	}
	if res.UsedBefore, err = usedMemory(ctx, meter); err != nil {
		return res, err
	}

	ids := IDs("", cfg.Clients)
	var first error
	err = session(func(d Decider) error {
		for w := range cfg.Windows {
			offset.Store(int64(w) * int64(MemoryLimit.Window))
			allowed, retried, errs, e := drive(ctx, d, ids, cfg.Concurrency, memoryRetries)
			res.Allowed += allowed
			res.Retried += retried
			res.Errors += errs
			if first == nil {
				first = e
			}
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	// Let the server's cron finish rehashing the keyspace, so that it does
	// not hold two tables while we look.
	time.Sleep(300 * time.Millisecond)
	if res.UsedAfter, err = usedMemory(ctx, meter); err != nil {
		return res, err
	}
	if res.Keys, err = meter.DBSize(ctx).Result(); err != nil {
		return res, fmt.Errorf("bench: DBSIZE: %w", err)
	}
	res.BytesPerClient = float64(res.UsedAfter-res.UsedBefore) / float64(cfg.Clients)
	res.KeysPerClient = float64(res.Keys) / float64(cfg.Clients)
	switch want := int64(cfg.Clients * cfg.Windows); {
	case res.Errors > 0:
		res.Problem = fmt.Sprintf("%d calls failed; the first: %v", res.Errors, first)
	case res.Allowed != want:
		res.Problem = fmt.Sprintf("%d of %d requests allowed; all should be", res.Allowed, want)
	}
	res.OK = res.Problem == ""
	return res, nil
}

// waitAlone waits until meter's is the only connection the server has.
func waitAlone(ctx context.Context, meter *redis.Client) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := infoField(ctx, meter, "clients", "connected_clients")
		if err != nil {
			return err
		}
		if n <= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %d clients still connected; the memory measurement needs the server to itself", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drive makes one request for each id with conc goroutines, trying a
// failed one again up to retries times, and returns how many were allowed,
// how many were tried again, how many failed for good and the first error.
func drive(ctx context.Context, d Decider, ids []string, conc, retries int) (allowed, retried, errs int64, first error) {
	var next, nAllowed, nRetried, nErrs atomic.Int64
	var once sync.Once
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(len(ids)) {
					return
				}
				ok, err := d.Allow(ctx, ids[i])
				for try := 0; err != nil && try < retries; try++ {
					nRetried.Add(1)
					ok, err = d.Allow(ctx, ids[i])
				}
				switch {
				case err != nil:
					nErrs.Add(1)
					once.Do(func() { first = err })
				case ok:
					nAllowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return nAllowed.Load(), nRetried.Load(), nErrs.Load(), first
}

// usedMemory returns used_memory from INFO memory.
func usedMemory(ctx context.Context, client *redis.Client) (int64, error) {
	return infoField(ctx, client, "memory", "used_memory")
}

// infoField returns the integer field name of INFO section.
func infoField(ctx context.Context, client *redis.Client, section, name string) (int64, error) {
	info, err := client.Info(ctx, section).Result()
	if err != nil {
		return 0, fmt.Errorf("bench: INFO %s: %w", section, err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("bench: INFO %s: %s %q: %w", section, name, v, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("bench: INFO %s has no %s", section, name)
}
