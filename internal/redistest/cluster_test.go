package redistest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every write that the master acknowledged survives a SIGKILL of the master
// after PauseWritesAndSync: the replica that takes over has it.
func TestClusterFailover(t *testing.T) {
	c := StartClusterWithReplicas(t, 3, 1, "--cluster-node-timeout", "1000")
	ctx := context.Background()

	masters := c.Masters()
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}
	var nodes []*Server
	for _, m := range masters {
		replicas := c.ReplicasOf(m)
		if len(replicas) != 1 {
			t.Fatalf("%s has %d replicas, want 1", m.Addr, len(replicas))
		}
		if got := c.MasterOf(replicas[0]); got != m {
			t.Fatalf("MasterOf(%s) = %v, want %s", replicas[0].Addr, got, m.Addr)
		}
		nodes = append(nodes, m, replicas[0])
	}
	for _, addr := range c.Addrs() {
		if !slices.Contains(nodes, c.Node(addr)) {
			t.Fatalf("node %s is neither a master nor a replica of one", addr)
		}
	}

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	key := fmt.Sprintf("{redistest:%s}:failover", t.Name())
	counter := fmt.Sprintf("{redistest:%s}:n", t.Name()) // the same slot
	if err := cc.Set(ctx, key, "kept", 0).Err(); err != nil {
		t.Fatal(err)
	}
	master := c.MasterFor(t, key)
	replica := c.ReplicasOf(master)[0]

	// The last of these are still on their way to the replica when the
	// pipeline returns: PauseWritesAndSync waits for them.
	const incrs = 2000
	pipe := master.Client(t).Pipeline()
	for range incrs {
		pipe.Incr(ctx, counter)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	c.PauseWritesAndSync(t, master, 20*time.Second)
	killed := time.Now()
	master.Stop()
	promoted := c.WaitPromoted(t, replica, time.Minute)
	t.Logf("%s: %s promoted %v after the SIGKILL of its master", ServerProgram(), replica.Addr, promoted.Sub(killed))

	// Right after its promotion the node may still call the cluster down:
	// ask until it answers something else.
	rc := replica.Client(t)
	var got string
	if err := waitFor(func(ctx context.Context) error {
		var err error
		got, err = rc.Get(ctx, key).Result()
		return err
	}); err != nil {
		t.Fatalf("GET %s on the promoted %s: %v", key, replica.Addr, err)
	}
	if got != "kept" {
		t.Fatalf("GET %s on the promoted %s = %q, want %q", key, replica.Addr, got, "kept")
	}
	if n, err := rc.Get(ctx, counter).Int(); err != nil || n != incrs {
		t.Fatalf("GET %s on the promoted %s = %d, %v; want %d", counter, replica.Addr, n, err, incrs)
	}

	// The other nodes learn of the promotion by gossip, a moment later;
	// then a ClusterClient finds the key on the new master.
	if err := waitFor(func(context.Context) error {
		for _, s := range c.Addrs() {
			if s == master.Addr {
				continue
			}
			addr, err := masterAddrFor(s, key)
			if err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
			if addr != replica.Addr {
				return fmt.Errorf("%s says %s serves %s, not the promoted %s", s, addr, key, replica.Addr)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// A ClusterClient sends the key's commands to the node its slot map
	// names until it reloads the map: a dial error to a dead master does
	// not make it reload, MOVED does, and the dead master cannot send one.
	cc.ReloadState(ctx)
	if err := waitFor(func(ctx context.Context) error {
		var err error
		got, err = cc.Get(ctx, key).Result()
		return err
	}); err != nil || got != "kept" {
		t.Fatalf("GET %s through the ClusterClient: %q, %v; want %q", key, got, err, "kept")
	}
}
