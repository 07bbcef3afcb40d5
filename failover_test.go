package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// decided is one decision of a failover run, as its caller saw it.
type decided struct {
	at       time.Time
	id       string
	allowed  bool
	degraded bool
	err      error
}

// A Redis Cluster master failover is a few seconds for the slots that moved,
// and nothing for the others. Three masters with a replica each, 16
// goroutines over 5,000 ids under FailClosed and the library's defaults
// otherwise, and one master killed with SIGKILL: the ids of the live
// masters are never denied by the policy but for the moments the whole
// cluster answers CLUSTERDOWN (it requires full coverage, the default);
// every id is decided by Redis again within 2 s of the replica's promotion;
// and no id is admitted past its limit.
//
// Redis replicates asynchronously, so a SIGKILL under load can lose the
// last writes the master acknowledged, which the promoted replica never saw
// (docs/failure-modes.md says what that costs). The test lets the replica
// catch up under a short pause of writes before the kill, so that what it
// checks is the Limiter's behaviour, not Redis's replication lag.
func TestClusterFailover(t *testing.T) {
	long(t)
	t.Parallel()
	const (
		nodeTimeout = time.Second
		ids         = 5000
		goroutines  = 16
		after       = 2500 * time.Millisecond // of load after the promotion
	)
	c := redistest.StartClusterWithReplicas(t, 3, 1, "--cluster-node-timeout", fmt.Sprint(nodeTimeout.Milliseconds()))
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()}) // go-redis's defaults
	t.Cleanup(func() { _ = cc.Close() })
	e := env{client: cc, clock: clock.NewFake(epoch), prefix: t.Name()}
	limit := ratelimit.PerHour(15) // the clock stands still: one window, and at most 15 admitted per id
	l := ratelimit.New(cc, ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix(e.prefix),
		ratelimit.WithFailurePolicy(ratelimit.FailClosed),
		ratelimit.WithTimeout(time.Second), // the default 100ms, with room for a loaded machine
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))

	ctx := context.Background()
	victim := c.Masters()[0]
	replica := c.ReplicasOf(victim)[0]
	onVictim := map[string]bool{}
	for i := range ids {
		id := fmt.Sprint("id-", i)
		node, err := cc.MasterForKey(ctx, e.key(id, limit.Window, e.windowIndex(limit.Window)))
		require.NoError(t, err)
		onVictim[id] = node.Options().Addr == victim.Addr
	}

	load := startLoad(l, limit, goroutines, ids, 1)
	// Load before the kill; then writes pause while the replica catches
	// up, and the master dies.
	load.wait(t, 1000)
	c.PauseWritesAndSync(t, victim, 2*time.Second)
	killed := time.Now()
	victim.Stop()
	promoted := c.WaitPromoted(t, replica, 30*time.Second)
	for time.Since(promoted) < after { // waits on the load, which runs on its own goroutines
		time.Sleep(50 * time.Millisecond)
	}
	log := load.stop()

	slices.SortFunc(log, func(a, b decided) int { return a.at.Compare(b.at) })
	var firstDown, lastDown, lastVictimDegraded time.Time
	admitted := map[string]int64{}
	var victimDegraded, othersDegraded, othersOutside, after2s int
	for _, d := range log {
		if d.allowed {
			admitted[d.id]++
		}
		down := d.err != nil && strings.Contains(d.err.Error(), "CLUSTERDOWN")
		if down {
			if firstDown.IsZero() {
				firstDown = d.at
			}
			lastDown = d.at
		}
		switch {
		case !d.degraded:
		case onVictim[d.id]:
			victimDegraded++
			lastVictimDegraded = d.at
		default:
			othersDegraded++
			if !down {
				othersOutside++
				if othersOutside <= 5 {
					t.Errorf("id %s of a live master denied by the policy, not for CLUSTERDOWN, at kill%+v: %v", d.id, d.at.Sub(killed), d.err)
				}
			}
		}
		if d.at.After(promoted.Add(2*time.Second)) && d.degraded {
			after2s++
		}
	}
	// Every error says what failed: the node, and for a timeout the
	// timeout and the last dial error to that node alone.
	unnamed := 0
	for _, d := range log {
		if d.err == nil {
			continue
		}
		msg := d.err.Error()
		named := strings.Contains(msg, "127.0.0.1:") || strings.Contains(msg, "Redis Cluster")
		bare := strings.HasSuffix(msg, "context deadline exceeded") && !strings.Contains(msg, "no reply within")
		_, dialed, _ := strings.Cut(msg, "last dial error")
		if !named || bare || dialed != "" && !strings.Contains(dialed, victim.Addr) {
			unnamed++
			if unnamed <= 5 {
				t.Errorf("an error that does not say what failed: %v", d.err)
			}
		}
	}
	over := 0
	for id, n := range admitted {
		if n > limit.Rate {
			over++
			if over <= 5 {
				t.Errorf("id %s admitted %d times, limit %d", id, n, limit.Rate)
			}
		}
	}
	t.Logf("%d decisions; kill to promotion %v", len(log), promoted.Sub(killed).Round(time.Millisecond))
	t.Logf("ids of the killed master: %d degraded decisions, the last at promotion%s", victimDegraded, offset(lastVictimDegraded.Sub(promoted)))
	if !firstDown.IsZero() {
		t.Logf("CLUSTERDOWN from kill%s to kill%s", offset(firstDown.Sub(killed)), offset(lastDown.Sub(killed)))
	}
	t.Logf("ids of the live masters: %d degraded decisions, %d of them outside CLUSTERDOWN", othersDegraded, othersOutside)
	t.Logf("ids over their limit: %d", over)
	require.Zero(t, unnamed, "errors that do not say what failed")
	require.Zero(t, othersOutside, "decisions for the live masters' ids denied by the policy, not for CLUSTERDOWN")
	require.Zero(t, over, "ids admitted past their limit")
	require.Positive(t, victimDegraded, "the kill was felt")
	require.Zero(t, after2s, "decisions degraded more than 2 s after the promotion")
	require.True(t, lastVictimDegraded.Before(promoted.Add(2*time.Second)))
	var redisAfter int
	for _, d := range log {
		if d.at.After(promoted.Add(2*time.Second)) && !d.degraded && onVictim[d.id] {
			redisAfter++
		}
	}
	require.Positive(t, redisAfter, "the promoted replica decided")
}

// A Sentinel failover recovers by itself: a master and its replica under
// one Sentinel, 16 goroutines over 5,000 ids under FailClosed, the master
// killed with SIGKILL. Decisions are degraded from the kill until the
// failover client has moved to the promoted replica, within 2 s of the
// promotion, and no id is admitted past its limit (the replica caught up
// under a pause of writes before the kill, as in TestClusterFailover).
func TestSentinelFailover(t *testing.T) {
	long(t)
	t.Parallel()
	const ids, goroutines, after = 5000, 16, 2500 * time.Millisecond
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	sentinel := redistest.StartSentinel(t, "limiter", master, time.Second, 1)
	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "limiter", SentinelAddrs: []string{sentinel.Addr}})
	t.Cleanup(func() { _ = client.Close() })
	clk := clock.NewFake(epoch)
	limit := ratelimit.PerHour(15)
	l := ratelimit.New(client, ratelimit.WithClock(clk.Now), ratelimit.WithPrefix(t.Name()),
		ratelimit.WithFailurePolicy(ratelimit.FailClosed), ratelimit.WithTimeout(time.Second),
		ratelimit.WithErrorHandler(func(context.Context, string, error) {}))

	load := startLoad(l, limit, goroutines, ids, 2)
	load.wait(t, 1000)
	redistest.PauseWritesAndSync(t, master, []*redistest.Server{replica}, 2*time.Second)
	killed := time.Now()
	master.Stop()
	promoted := redistest.WaitMaster(t, replica, 30*time.Second)
	for time.Since(promoted) < after { // waits on the load, which runs on its own goroutines
		time.Sleep(50 * time.Millisecond)
	}
	log := load.stop()

	admitted := map[string]int64{}
	var degraded int
	var first, last time.Time
	for _, d := range log {
		if d.allowed {
			admitted[d.id]++
		}
		if d.degraded {
			degraded++
			if first.IsZero() || d.at.Before(first) {
				first = d.at
			}
			if d.at.After(last) {
				last = d.at
			}
		}
	}
	over := 0
	for _, n := range admitted {
		if n > limit.Rate {
			over++
		}
	}
	t.Logf("%d decisions; kill to promotion %v; %d degraded, from kill%s to promotion%s; %d ids over their limit",
		len(log), promoted.Sub(killed).Round(time.Millisecond), degraded,
		offset(first.Sub(killed)), offset(last.Sub(promoted)), over)
	require.Positive(t, degraded, "the kill was felt")
	require.True(t, last.Before(promoted.Add(2*time.Second)), "degraded %v after the promotion", last.Sub(promoted))
	require.Zero(t, over, "ids admitted past their limit")
}

// offset writes d as an offset from a moment: " + 1.2s", " - 80ms".
func offset(d time.Duration) string {
	if d < 0 {
		return " - " + (-d).Round(time.Millisecond).String()
	}
	return " + " + d.Round(time.Millisecond).String()
}

// load is decisions made on a Limiter from several goroutines, as from
// traffic, until it is stopped.
type load struct {
	mu   sync.Mutex
	log  []decided
	made atomic.Int64
	done chan struct{}
	wg   sync.WaitGroup
}

// startLoad decides limit on l from goroutines goroutines over ids ids,
// picked at random (seed), each at most once a millisecond: the policy
// answers in microseconds, and a spin would only pile up records (and
// load a shared machine).
func startLoad(l *ratelimit.Limiter, limit ratelimit.Limit, goroutines, ids int, seed uint64) *load {
	ld := &load{done: make(chan struct{})}
	for g := range goroutines {
		ld.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), seed))
			var mine []decided
			defer func() {
				ld.mu.Lock()
				ld.log = append(ld.log, mine...)
				ld.mu.Unlock()
			}()
			for {
				select {
				case <-ld.done:
					return
				default:
				}
				id := fmt.Sprint("id-", rng.IntN(ids))
				res, err := l.Allow(context.Background(), id, limit)
				mine = append(mine, decided{at: time.Now(), id: id, allowed: res.Allowed, degraded: res.Degraded, err: err})
				ld.made.Add(1)
				time.Sleep(time.Millisecond)
			}
		})
	}
	return ld
}

// wait waits until the load has made n decisions; it stops the load and
// fails the test if that takes 30 s.
func (ld *load) wait(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := ld.made.Load()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			ld.stop()
			t.Fatalf("only %d decisions in 30s", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop stops the load and returns its decisions, in no particular order.
func (ld *load) stop() []decided {
	close(ld.done)
	ld.wg.Wait()
	return ld.log
}
