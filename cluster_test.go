package ratelimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
)

// A batch sent to a Cluster master that does not serve its keys (as after a
// resharding or a failover the client has not seen yet) is refused before
// the script writes anything, and goes again one decision per call through
// the Cluster client: every decision is made, and counted exactly once.
func TestClusterBatchRefusedGoesAgain(t *testing.T) {
	t.Parallel()
	addrs := redistest.SharedCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	ctx := context.Background()
	l := New(cc, WithPrefix(t.Name()), WithTimeout(time.Minute)) // a loaded machine must not turn a decision into a policy one
	limit := PerMinute(10)

	// ids by master, and a master that serves none of some ids
	byNode := map[*redis.Client][]string{}
	for i := 0; len(byNode) < 3 || fewest(byNode) < 3; i++ {
		id := fmt.Sprint("id-", i)
		d := l.newTestDecision(id, limit)
		node, err := cc.MasterForKey(ctx, d.reqs[0].Keys[0])
		require.NoError(t, err)
		byNode[node] = append(byNode[node], id)
	}
	var home, elsewhere *redis.Client
	for node := range byNode {
		if home == nil {
			home = node
		} else if elsewhere == nil {
			elsewhere = node
		}
	}
	for _, tc := range []struct {
		name string
		ids  []string // the batch: which master serves which id
	}{
		{"first id elsewhere (MOVED)", []string{byNode[elsewhere][0], byNode[home][0], byNode[home][1]}},
		{"a later id elsewhere (non local key)", []string{byNode[home][2], byNode[elsewhere][1], byNode[elsewhere][2]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var batch [][]*script.Request
			for _, id := range tc.ids {
				batch = append(batch, l.newTestDecision(id, limit).reqs)
			}
			for i, r := range l.t.SendBatch(ctx, home, batch) {
				require.NoError(t, r.Err, tc.ids[i])
				require.Len(t, r.Replies, 1)
				require.True(t, r.Replies[0].Allowed, tc.ids[i])
				require.Equal(t, int64(0), r.Replies[0].Counts[0], "%s was counted before", tc.ids[i])
			}
			for _, id := range tc.ids {
				res, err := l.Peek(ctx, id, limit)
				require.NoError(t, err)
				require.Equal(t, int64(1), res.Count, "%s counted once", id)
			}
			require.False(t, l.t.CrossOff(), "a refused batch does not turn cluster batching off")
		})
	}
}

// fewest returns the fewest ids any master serves in m.
func fewest(m map[*redis.Client][]string) int {
	least := -1
	for _, ids := range m {
		if least < 0 || len(ids) < least {
			least = len(ids)
		}
	}
	return least
}

// newTestDecision builds a cost-1 decision of id against limit, now.
func (l *Limiter) newTestDecision(id string, limit Limit) *decision {
	d := &decision{cost: 1, limits: []Limit{limit}, results: make([]Result, 1)}
	l.build(d, id, l.now().UnixMilli())
	return d
}
