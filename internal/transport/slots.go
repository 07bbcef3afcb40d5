// A Redis Cluster's masters: the server of a key, the slot map loaded
// within a decision's deadline and reloaded after a failure, the servers
// forgotten once unused; and the slot of a key.

package transport

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// reloadEvery is how often, at most, a Cluster client is told to reload its
// slot map while calls to one of its masters fail: often enough that the
// slots of a failed master move to its promoted replica within a fraction
// of a second of the promotion, seldom enough to cost the cluster nothing.
const reloadEvery = 250 * time.Millisecond

// serverFor returns the server that serves key: on a Cluster, its master as
// the client's slot map has it now. A Cluster client without a slot map yet
// loads one first, which its caller waits for until leave is done (see
// awaitMap): go-redis loads it on the caller's goroutine, bounded by its
// own timeouts, not by the call's deadline.
func (t *Transport) serverFor(leave, wire context.Context, key string) (*server, error) {
	if t.cluster == nil {
		return t.one, nil
	}
	if !t.mapped.Load() {
		if err := t.awaitMap(leave, wire); err != nil {
			return nil, err
		}
	}
	node, err := t.cluster.MasterForKey(wire, key)
	if err != nil {
		t.reload()
		return nil, err
	}
	addr := node.Options().Addr
	now := time.Now().UnixNano()
	if v, ok := t.servers.Load(addr); ok && v.(*server).client == node {
		s := v.(*server)
		if now-s.used.Load() > int64(usedGrain) {
			s.used.Store(now)
		}
		return s, nil
	}
	// A master not seen before, or one whose client go-redis made anew (the
	// node left the slot map and came back): its own breaker and batcher.
	t.dials.hookNode(node)
	t.forgetStale(now)
	s := t.newServer(addr, node, t.maxBatch > 1, true)
	s.used.Store(now)
	for {
		old, loaded := t.servers.LoadOrStore(addr, s)
		if !loaded {
			return s, nil
		}
		if old.(*server).client == node {
			return old.(*server), nil
		}
		if t.servers.CompareAndSwap(addr, old, s) {
			return s, nil
		}
	}
}

// A mapLoad is a load of the Cluster client's slot map, in a goroutine of
// its own: err is set before done is closed.
type mapLoad struct {
	started time.Time
	done    chan struct{}
	err     error
}

// awaitMap waits until the Cluster client has its slot map, or leave is
// done. One load is in flight at a time; decisions that come while it lasts
// wait for it; one that has lasted past its bound (a client whose own
// timeouts never end it) is left to itself, and another starts. A caller
// who leaves before wire's deadline gets a *CallerLeft, told the load's
// failure if it fails by then.
func (t *Transport) awaitMap(leave, wire context.Context) error {
	t.mapMu.Lock()
	m := t.loading
	if m == nil || time.Since(m.started) > t.mapBound() {
		m = &mapLoad{started: time.Now(), done: make(chan struct{})}
		t.loading = m
		t.work.Go(func() { t.loadMap(m) })
	}
	t.mapMu.Unlock()
	select {
	case <-m.done:
		return m.err
	case <-leave.Done():
	}
	if leave == wire {
		return fmt.Errorf("loading its slot map: %w", wire.Err())
	}
	gone := &CallerLeft{err: leave.Err(), Late: &Late{}}
	t.work.Go(func() {
		var err error
		select {
		case <-m.done:
			err = m.err
		case <-wire.Done():
			err = fmt.Errorf("loading its slot map: %w", wire.Err())
		}
		if err != nil {
			err = t.explain(wire, nil, err)
		}
		gone.Late.end(err)
	})
	return gone
}

// loadMap loads the Cluster client's slot map for m, within go-redis's own
// timeouts and at most slotMapWait (a client that stops at its ctx's
// deadline), then ends the load: the next decision without a map starts
// another.
func (t *Transport) loadMap(m *mapLoad) {
	ctx, cancel := context.WithTimeout(context.Background(), t.mapBound())
	defer cancel()
	if _, err := t.cluster.MasterForKey(ctx, ""); err != nil {
		m.err = fmt.Errorf("loading its slot map: %w", err)
	} else {
		t.mapped.Store(true)
	}
	t.mapMu.Lock()
	if t.loading == m {
		t.loading = nil
	}
	t.mapMu.Unlock()
	close(m.done)
}

// mapBound is how long a load of the slot map may last: the Limiter's
// timeout, or slotMapWait if that is longer.
func (t *Transport) mapBound() time.Duration { return max(t.timeout, slotMapWait) }

// slotMapWait bounds a load of a Cluster client's slot map, on a client
// that stops at its ctx's deadline, when the Limiter's timeout is shorter:
// a large Cluster's map may take longer than a decision waits.
const slotMapWait = time.Second

// forgetStale drops the Cluster servers no decision has used for
// staleServer.
func (t *Transport) forgetStale(now int64) {
	t.servers.Range(func(addr, v any) bool {
		if now-v.(*server).used.Load() > int64(staleServer) {
			t.servers.CompareAndDelete(addr, v)
		}
		return true
	})
}

// reload tells a Cluster client to reload its slot map, at most once every
// reloadEvery: go-redis reloads it by itself only on MOVED and ASK, on a
// retry (which the script never gets), and every minute, so that without
// this the slots of a failed master would stay with it for up to a minute
// after its replica took over.
func (t *Transport) reload() {
	if t.cluster == nil {
		return
	}
	now := time.Now().UnixNano()
	next := t.nextReload.Load()
	if now < next || !t.nextReload.CompareAndSwap(next, now+int64(reloadEvery)) {
		return
	}
	t.cluster.ReloadState(context.Background())
}

// SplitSlots reports whether keys of different hash slots cannot be in one
// script call: t's client is a Redis Cluster's, or its server refused such
// a call (oneSlot). Every id's keys share its hash tag, so only calls of
// several ids are split: batches, and AllowMany.
func (t *Transport) SplitSlots() bool { return t.cluster != nil || t.oneSlot.Load() }

// slotRefusal reports whether err is a server's refusal of a call whose
// keys are in several hash slots, made before the call wrote anything: a
// Cluster's CROSSSLOT, which comes before the script runs, or a script's
// access to keys of another slot (ElastiCache Serverless and proxies that
// check a script's keys, redisson/redisson#6463), which comes at the
// script's first read, the MGET of every key, before any write.
func slotRefusal(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "CROSSSLOT") || strings.Contains(err.Error(), "do not hash to the same slot"))
}

// HashSlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash
// tag, the part between the first '{' and the first '}' after it when
// that part is not empty, else of the whole key; modulo 16384.
func HashSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc % 16384)
}
