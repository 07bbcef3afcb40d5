// Command worker shows background workers pacing their calls to a
// third-party API with Limiter.Wait. Several workers, each standing for a
// separate process with its own Limiter and its own Redis connection, share
// one quota of 10 calls in any second until a deadline 3 seconds away: each
// stops when its next turn would come after the deadline, a little over 2
// seconds in, once the third second's quota is spent. Then it prints how
// many calls each made in each one-second window, beside the count Redis
// held for that window (read as the window ended, before Redis expired it),
// and the most calls any span of a second held, which never exceeds the
// quota. A third party
// counts its quota over any span, not over whole seconds, so the limit is
// Strict: the sliding window counter alone lets waiters released together
// at a boundary fit up to twice the rate into one span. It runs against an
// embedded in-process Redis (miniredis), or a real one when REDIS_ADDR is
// set:
//
//	go run ./examples/worker
//	REDIS_ADDR=localhost:6379 go run ./examples/worker
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit"
)

const (
	workers = 4
	runFor  = 3 * time.Second
	prefix  = "example-worker"
	// callTime is how long the simulated third-party call takes.
	callTime = 5 * time.Millisecond
)

// limit is the third party's quota, shared by every worker: at most 10
// calls in any span of a second.
var limit = ratelimit.Limit{Rate: 10, Window: time.Second, Strict: true}

func main() {
	newClient, where, stop := connect()
	defer stop()
	id := "api-" + strconv.FormatInt(time.Now().UnixNano(), 36) // fresh counts every run

	// Every worker reads the same clock, as processes on synchronised hosts
	// would; it is shifted so that the run starts on a window boundary and
	// the windows below are the run's seconds.
	begin := time.Now()
	shift := begin.Truncate(limit.Window).Add(limit.Window).Sub(begin)
	start := begin.Add(shift)

	fmt.Printf("%d workers share %v for %q, on %s, until a deadline %v away (each stops once its next turn would come after it).\n",
		workers, limit, id, where, runFor)
	ctx, cancel := context.WithTimeout(context.Background(), runFor)
	defer cancel()

	calls := make([][]int, workers) // calls[w][i]: calls worker w made in window i
	var mu sync.Mutex
	var placed []time.Time // when each call was placed in its window, in the run's time
	stopped := make([]string, workers)

	// Redis expires a window's keys a second or so after the window ends
	// (a real Redis does; miniredis, whose clock does not run, keeps them),
	// before the run does: read each window's count as it ends, a
	// sub-window later so that a call placed just before the end has
	// landed, and the windows still open when the run ends then.
	reader := newClient()
	defer reader.Close()
	first := start.UnixMilli() / limit.Window.Milliseconds()
	var counted []int64 // counted[i]: the count Redis held for window i
	done := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		late := limit.Window / ratelimit.StrictSubWindows
		for i := 0; ; i++ {
			// Window i ends at begin + (i+1) windows by the wall clock: the
			// workers' clock is the wall clock shifted to start at begin.
			t := time.NewTimer(time.Until(begin.Add(time.Duration(i+1)*limit.Window + late)))
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
			}
			counted = append(counted, stored(reader, id, first+int64(i)))
		}
	}()

	var wg sync.WaitGroup
	for w := range workers {
		client := newClient()
		defer client.Close()
		// decided is when the Limiter last read its clock: it reads it once
		// per decision, so after Wait returns it is when the call was placed
		// in its window.
		var decided atomic.Int64
		limiter := ratelimit.New(client,
			ratelimit.WithPrefix(prefix),
			ratelimit.WithFailurePolicy(ratelimit.FailClosed),
			ratelimit.WithClock(func() time.Time {
				now := time.Now().Add(shift)
				decided.Store(now.UnixNano())
				return now
			}))
		wg.Go(func() {
			for {
				err := limiter.Wait(ctx, id, limit)
				switch {
				case errors.Is(err, ratelimit.ErrWaitExceedsDeadline):
					stopped[w] = "its next turn came after the deadline"
					return
				case errors.Is(err, context.DeadlineExceeded):
					stopped[w] = "the deadline came while it waited"
					return
				case err != nil:
					stopped[w] = err.Error()
					return
				}
				at := time.Unix(0, decided.Load())
				mu.Lock()
				placed = append(placed, at)
				mu.Unlock()
				i := int(at.Sub(start) / limit.Window)
				for len(calls[w]) <= i {
					calls[w] = append(calls[w], 0)
				}
				calls[w][i]++
				callAPI()
			}
		})
	}
	wg.Wait()
	took := time.Since(begin)
	close(done)
	<-read

	windows := 0
	for _, c := range calls {
		windows = max(windows, len(c))
	}
	fmt.Println()
	fmt.Print("window          ")
	for w := range workers {
		fmt.Printf("  w%d", w+1)
	}
	fmt.Println("  total  in Redis")
	over := false
	all := 0
	for i := range windows {
		from := time.Duration(i) * limit.Window
		fmt.Printf("%5.1fs to %4.1fs ", from.Seconds(), (from + limit.Window).Seconds())
		total := 0
		for w := range workers {
			n := 0
			if i < len(calls[w]) {
				n = calls[w][i]
			}
			total += n
			fmt.Printf("%4d", n)
		}
		all += total
		if i == len(counted) { // still open when the run ended
			counted = append(counted, stored(reader, id, first+int64(i)))
		}
		over = over || int64(total) > limit.Rate || counted[i] > limit.Rate
		fmt.Printf("  %5d  %8d\n", total, counted[i])
	}
	fmt.Printf("%-16s%s  %5d\n", "all", strings.Repeat("    ", workers), all)
	most := mostInAnySpan(placed, limit.Window)
	over = over || int64(most) > limit.Rate
	fmt.Printf("\nThe most calls in any span of %v: %d.\n\n", limit.Window, most)
	for w, why := range stopped {
		fmt.Printf("w%d stopped: %s.\n", w+1, why)
	}
	if over {
		fmt.Printf("A span of %v held more than %d calls.\n", limit.Window, limit.Rate)
		os.Exit(1)
	}
	fmt.Printf("No span of %v held more than %d calls. Took %.1fs.\n", limit.Window, limit.Rate, took.Seconds())
}

// mostInAnySpan returns the most of times that any span of length w holds,
// checking every span that starts at one of them (the fullest span starts
// at some call).
func mostInAnySpan(times []time.Time, w time.Duration) int {
	slices.SortFunc(times, time.Time.Compare)
	most, j := 0, 0
	for i := range times {
		for j < len(times) && times[j].Sub(times[i]) < w {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// callAPI stands for the call to the third party that the quota protects.
func callAPI() { time.Sleep(callTime) }

// stored returns the count Redis holds for id in the window of the given
// index: the sum of its sub-windows, read from their documented keys,
// <prefix>:{<id>}:<window in ms>/<sub-windows>:<sub-window index>.
func stored(client *redis.Client, id string, index int64) int64 {
	var n int64
	for j := range int64(ratelimit.StrictSubWindows) {
		key := fmt.Sprintf("%s:{%s}:%d/%d:%d", prefix, id, limit.Window.Milliseconds(), ratelimit.StrictSubWindows,
			index*ratelimit.StrictSubWindows+j)
		c, err := client.Get(context.Background(), key).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			log.Fatalf("GET %s: %v", key, err)
		}
		n += c
	}
	return n
}

// connect returns a maker of clients of the Redis at REDIS_ADDR, or of a
// miniredis started here, with a word on which it is. The clients stop at
// their ctx's deadline, so no call outlives the run.
func connect() (newClient func() *redis.Client, where string, stop func()) {
	addr := os.Getenv("REDIS_ADDR")
	where = "Redis at " + addr
	stop = func() {}
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			log.Fatalf("start miniredis: %v", err)
		}
		addr, where, stop = mr.Addr(), "an embedded miniredis (set REDIS_ADDR to use a real Redis)", mr.Close
	}
	newClient = func() *redis.Client {
		return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, DialerRetries: 1})
	}
	return newClient, where, stop
}
