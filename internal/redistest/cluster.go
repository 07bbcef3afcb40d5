// A Redis Cluster of real servers on loopback, masters with replicas:
// where a key lives, and the wait for a failover to settle.

package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// pollInterval is how long the polls here pause between two questions to a
// server: short next to a cluster's node timeout, long enough not to load a
// small machine.
const pollInterval = 20 * time.Millisecond

// StartCluster starts n masters (ServerProgram) with cluster mode on and no
// replicas, joins them with `CLIProgram --cluster create`, waits until every
// node reports cluster_state:ok and knows every other, and returns their
// addresses. The CLI wants n >= 3.
func StartCluster(t TB, n int) []string {
	t.Helper()
	return StartClusterWithReplicas(t, n, 0).Addrs()
}

// Cluster is a Redis Cluster on loopback, started by StartClusterWithReplicas.
//
// Its roles are those the cluster came up with, read from the nodes once the
// CLI had created it: after a failover, Masters, ReplicasOf and MasterOf
// still name the nodes as they were, so that a test can name the replica it
// expects to take over from the master it kills. MasterFor asks the live
// cluster instead.
//
// A Cluster is safe for simultaneous use by multiple goroutines; the methods
// that take t fail it, and so must be called from the test's goroutine.
type Cluster struct {
	nodes    []*Server
	masters  []*Server
	replicas map[*Server][]*Server
	masterOf map[*Server]*Server
}

// StartClusterWithReplicas starts masters*(1+replicasPerMaster) servers
// (ServerProgram) with cluster mode on, each with its own cluster config
// file and with args passed to every node (say "--cluster-node-timeout",
// "1000"), and creates a cluster of them with `CLIProgram --cluster create
// ... --cluster-replicas replicasPerMaster`. It returns once every node
// reports cluster_state:ok, every replica and its master report the link
// between them up, so that writes from then on reach the replicas at once
// (if asynchronously: see PauseWritesAndSync), and every node sees every
// other with the same role and no failure flag: before that, killing a
// master could find the other masters unaware of the replica that is to
// replace it. The nodes stop when t ends, by SIGKILL as Stop does.
//
// The CLI, not the order of the nodes, decides which become replicas: ask
// Masters and ReplicasOf. The CLI wants masters >= 3. Restart of a node
// starts an empty server that is in no cluster.
func StartClusterWithReplicas(t TB, masters, replicasPerMaster int, args ...string) *Cluster {
	t.Helper()
	cli := Require(t, CLIProgram())
	if masters < 1 || replicasPerMaster < 0 {
		t.Fatalf("redistest: a cluster of %d masters with %d replicas each", masters, replicasPerMaster)
	}
	c := &Cluster{}
	for i := range masters * (1 + replicasPerMaster) {
		argv := append([]string{"--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i),
			// A replica's first copy goes through a file: when the
			// master streams it over the socket instead (the default),
			// it waits 5s for more replicas to share the transfer, and
			// then holds back the writes that follow until the replica
			// acknowledges, up to a second after the replica reports
			// its link up. A test could not know when its writes begin
			// to reach the replicas.
			"--repl-diskless-sync", "no"}, args...)
		c.nodes = append(c.nodes, Start(t, argv...))
	}
	create := append(append([]string{"--cluster", "create"}, c.Addrs()...),
		"--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	out, err := exec.Command(cli, create...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s --cluster create: %v\n%s", cli, err, out)
	}

	clients := make([]*redis.Client, len(c.nodes))
	for i, s := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		defer clients[i].Close()
	}
	if err := waitFor(func(ctx context.Context) error {
		return c.readRoles(ctx, clients, masters, replicasPerMaster)
	}); err != nil {
		t.Fatalf("cluster did not come up: %v\n%s --cluster create said:\n%s", err, cli, out)
	}
	return c
}

// readRoles asks every node for its role and its view of the cluster, and
// records the roles in c once the cluster is whole and every node agrees.
func (c *Cluster) readRoles(ctx context.Context, clients []*redis.Client, masters, replicasPerMaster int) error {
	byAddr := map[string]*Server{}
	for _, s := range c.nodes {
		byAddr[s.Addr] = s
	}
	var ms []*Server
	replicas := map[*Server][]*Server{}
	masterOf := map[*Server]*Server{}
	ids := make([]string, len(c.nodes))
	online := map[*Server]map[string]bool{} // master -> its replicas it streams to
	for i, s := range c.nodes {
		info, err := clients[i].ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", s.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster not ready yet", s.Addr)
		}
		if ids[i], err = clients[i].ClusterMyID(ctx).Result(); err != nil {
			return fmt.Errorf("%s: CLUSTER MYID: %w", s.Addr, err)
		}
		repl, err := replicationInfo(ctx, clients[i])
		if err != nil {
			return fmt.Errorf("%s: %w", s.Addr, err)
		}
		switch repl["role"] {
		case "master":
			ms = append(ms, s)
			online[s] = onlineReplicas(repl)
		case "slave":
			m := byAddr[net.JoinHostPort(repl["master_host"], repl["master_port"])]
			if m == nil {
				return fmt.Errorf("%s replicates %s:%s, not a node of this cluster", s.Addr, repl["master_host"], repl["master_port"])
			}
			if link := repl["master_link_status"]; link != "up" {
				return fmt.Errorf("%s: link to its master %s is %s", s.Addr, m.Addr, link)
			}
			masterOf[s] = m
			replicas[m] = append(replicas[m], s)
		default:
			return fmt.Errorf("%s: role %q", s.Addr, repl["role"])
		}
	}
	if len(ms) != masters {
		return fmt.Errorf("%d masters, want %d", len(ms), masters)
	}
	for _, m := range ms {
		if len(replicas[m]) != replicasPerMaster {
			return fmt.Errorf("%s has %d replicas, want %d", m.Addr, len(replicas[m]), replicasPerMaster)
		}
		// Its master's side of the link must be up too: it streams
		// writes to a replica only once it has sent its first copy.
		for _, r := range replicas[m] {
			if !online[m][r.Addr] {
				return fmt.Errorf("%s does not stream to its replica %s yet", m.Addr, r.Addr)
			}
		}
	}

	// Each node's view must match the roles: the masters that vote in a
	// failover must know which replica belongs to the master that failed.
	index := map[*Server]int{}
	for i, s := range c.nodes {
		index[s] = i
	}
	for i, s := range c.nodes {
		text, err := clients[i].ClusterNodes(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER NODES: %w", s.Addr, err)
		}
		seen := parseClusterNodes(text)
		for j, other := range c.nodes {
			n, ok := seen[ids[j]]
			if !ok {
				return fmt.Errorf("%s does not know %s yet", s.Addr, other.Addr)
			}
			wantRole, wantMaster := "master", "-"
			if m := masterOf[other]; m != nil {
				wantRole, wantMaster = "slave", ids[index[m]]
			}
			switch {
			case slices.ContainsFunc(n.flags, func(f string) bool {
				return f == "fail" || f == "fail?" || f == "handshake" || f == "noaddr"
			}):
				return fmt.Errorf("%s sees %s as %s", s.Addr, other.Addr, strings.Join(n.flags, ","))
			case !slices.Contains(n.flags, wantRole) || n.master != wantMaster:
				return fmt.Errorf("%s does not see %s as a %s of %s yet", s.Addr, other.Addr, wantRole, wantMaster)
			case n.link != "connected":
				return fmt.Errorf("%s: bus link to %s is %s", s.Addr, other.Addr, n.link)
			}
		}
	}
	c.masters, c.replicas, c.masterOf = ms, replicas, masterOf
	return nil
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	flags  []string
	master string // the master's node ID, "-" for a master
	link   string
}

// parseClusterNodes reads CLUSTER NODES text into a map from node ID.
// Lines too short to be a node are left out.
func parseClusterNodes(text string) map[string]clusterNode {
	nodes := map[string]clusterNode{}
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		nodes[f[0]] = clusterNode{flags: strings.Split(f[2], ","), master: f[3], link: f[7]}
	}
	return nodes
}

// replicationInfo returns the fields of INFO replication.
func replicationInfo(ctx context.Context, c *redis.Client) (map[string]string, error) {
	text, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO replication: %w", err)
	}
	fields := map[string]string{}
	for line := range strings.Lines(text) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && !strings.HasPrefix(k, "#") {
			fields[k] = v
		}
	}
	return fields, nil
}

// onlineReplicas returns the addresses of the replicas that a master's
// INFO replication lists as online, from lines like
// "slave0:ip=127.0.0.1,port=7001,state=online,offset=42,lag=0".
func onlineReplicas(repl map[string]string) map[string]bool {
	addrs := map[string]bool{}
	for k, v := range repl {
		if !strings.HasPrefix(k, "slave") {
			continue
		}
		f := map[string]string{}
		for kv := range strings.SplitSeq(v, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				f[k] = v
			}
		}
		if f["state"] == "online" {
			addrs[net.JoinHostPort(f["ip"], f["port"])] = true
		}
	}
	return addrs
}

// Addrs returns the address of every node, masters and replicas, for a
// go-redis ClusterClient.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr
	}
	return addrs
}

// Masters returns the nodes that were masters when the cluster came up.
func (c *Cluster) Masters() []*Server {
	return slices.Clone(c.masters)
}

// ReplicasOf returns the nodes that replicated master when the cluster came
// up: none if master was not a master of c.
func (c *Cluster) ReplicasOf(master *Server) []*Server {
	return slices.Clone(c.replicas[master])
}

// MasterOf returns the master that replica replicated when the cluster came
// up, or nil if replica was a master or is not a node of c.
func (c *Cluster) MasterOf(replica *Server) *Server {
	return c.masterOf[replica]
}

// Node returns the node of c at addr, as in a go-redis client's
// Options().Addr, or nil if there is none.
func (c *Cluster) Node(addr string) *Server {
	for _, s := range c.nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// MasterFor returns the node that serves key's slot as its master now, as
// the first running node that answers sees it: during a failover, that
// node's view may lag the cluster's. It fails t if no node answers or the
// slot is served by no node of c.
func (c *Cluster) MasterFor(t TB, key string) *Server {
	t.Helper()
	var errs []error
	for _, s := range c.nodes {
		if s.cmd.ProcessState != nil {
			continue // stopped: it cannot answer
		}
		addr, err := masterAddrFor(s.Addr, key)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Addr, err))
			continue
		}
		if m := c.Node(addr); m != nil {
			return m
		}
		t.Fatalf("redistest: %s says %q is served by %s, not a node of the cluster", s.Addr, key, addr)
	}
	t.Fatalf("redistest: no node could tell which serves %q: %v", key, errors.Join(errs...))
	return nil
}

// masterAddrFor asks the node at addr for the address of the master of
// key's slot.
func masterAddrFor(addr, key string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	slot, err := rc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return "", err
	}
	//lint:ignore SA1019 go-redis routes by CLUSTER SLOTS: this is the view a client of the tests gets
	ranges, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, r := range ranges {
		if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr, nil // the master comes first
		}
	}
	return "", fmt.Errorf("slot %d is not served", slot)
}

// WaitPromoted polls replica, every 20ms with INFO replication, until it
// reports role:master, and returns the time it first saw that. It fails t
// if that takes longer than timeout. Give a generous timeout: a failover
// takes the node timeout, then a vote, then a random delay, and longer on a
// busy machine.
//
// role:master means the replica has taken over its master's slots; its
// cluster_state may still be fail for a moment, until it sees the cluster
// whole again, so a command to it right after may get a CLUSTERDOWN error.
func (c *Cluster) WaitPromoted(t TB, replica *Server, timeout time.Duration) time.Time {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr, MaxRetries: -1})
	defer rc.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		repl, err := replicationInfo(ctx, rc)
		seen := time.Now()
		cancel()
		if err == nil && repl["role"] == "master" {
			return seen
		}
		if seen.After(deadline) {
			state := fmt.Sprintf("role %q", repl["role"])
			if err != nil {
				state = err.Error()
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			nodes, _ := rc.ClusterNodes(ctx).Result()
			cancel()
			t.Fatalf("redistest: %s was not promoted within %v: %s; its CLUSTER NODES:\n%s", replica.Addr, timeout, state, nodes)
		}
		time.Sleep(pollInterval) // the replica is another process: poll it
	}
}

// PauseWritesAndSync makes master stop running writes for pause (CLIENT
// PAUSE <ms> WRITE: clients that send one wait, reads go on), then waits
// until every replica it had when the cluster came up has processed the
// master's whole replication stream, master_repl_offset on the master
// against slave_repl_offset on each replica, and the link is up. It fails t
// if that does not happen before pause ends, since writes run again then.
//
// Redis replication is asynchronous: the master answers a write before its
// replicas have it, so a master killed under load takes its last writes
// with it, and a replica promoted in its place never saw them. No client
// can prevent that. A test that asserts exact counts across a failover calls
// PauseWritesAndSync and then kills the master (Stop): every write the
// master acknowledged is on the replica that takes over, and a write sent
// during the pause waits on the master and dies with it without having run,
// so its client sees an error, never a lost success. A test of what a real
// crash loses does not sync.
func (c *Cluster) PauseWritesAndSync(t TB, master *Server, pause time.Duration) {
	t.Helper()
	if !slices.Contains(c.masters, master) {
		t.Fatalf("redistest: PauseWritesAndSync of %s, not a master of the cluster", master.Addr)
	}
	PauseWritesAndSync(t, master, c.ReplicasOf(master), pause)
}

// PauseWritesAndSync is Cluster.PauseWritesAndSync for a master and its
// replicas outside a cluster (say, under Sentinel).
func PauseWritesAndSync(t TB, master *Server, replicas []*Server, pause time.Duration) {
	t.Helper()
	if pause < time.Millisecond {
		t.Fatalf("redistest: a pause of %v: CLIENT PAUSE counts whole milliseconds", pause)
	}
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, MaxRetries: -1})
	defer mc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := mc.Do(ctx, "client", "pause", pause.Milliseconds(), "write").Err(); err != nil {
		t.Fatalf("redistest: CLIENT PAUSE on %s: %v", master.Addr, err)
	}
	end := time.Now().Add(pause)
	clients := make([]*redis.Client, len(replicas))
	for i, r := range replicas {
		clients[i] = redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
		defer clients[i].Close()
	}
	for {
		err := synced(master, mc, replicas, clients)
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("redistest: the replicas of %s did not catch up within the pause of %v: %v", master.Addr, pause, err)
		}
		time.Sleep(pollInterval) // the replicas are other processes: poll them
	}
}

// synced reports, as nil, whether every replica has processed master's
// whole replication stream.
func synced(master *Server, mc *redis.Client, replicas []*Server, clients []*redis.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	repl, err := replicationInfo(ctx, mc)
	if err != nil {
		return fmt.Errorf("%s: %w", master.Addr, err)
	}
	want, err := strconv.ParseInt(repl["master_repl_offset"], 10, 64)
	if err != nil {
		return fmt.Errorf("%s: master_repl_offset %q", master.Addr, repl["master_repl_offset"])
	}
	for i, r := range replicas {
		repl, err := replicationInfo(ctx, clients[i])
		if err != nil {
			return fmt.Errorf("%s: %w", r.Addr, err)
		}
		if m := net.JoinHostPort(repl["master_host"], repl["master_port"]); m != master.Addr {
			return fmt.Errorf("%s replicates %s now, not %s", r.Addr, m, master.Addr)
		}
		if link := repl["master_link_status"]; link != "up" {
			return fmt.Errorf("%s: link to its master is %q", r.Addr, link)
		}
		got, err := strconv.ParseInt(repl["slave_repl_offset"], 10, 64)
		if err != nil {
			return fmt.Errorf("%s: slave_repl_offset %q", r.Addr, repl["slave_repl_offset"])
		}
		if got < want {
			return fmt.Errorf("%s has processed the stream to offset %d of %d", r.Addr, got, want)
		}
	}
	return nil
}
