package transport

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// A server with a memory limit and a policy that evicts live counts is
// warned of, once a look-up of its eviction policy sees it; noeviction, no
// memory limit, and a user not granted CONFIG say nothing.
func TestEvictionPolicyWarning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	for _, tc := range []struct {
		maxmemory, policy string
		user              bool // an ACL user without CONFIG
		warns             bool
	}{
		{"20mb", "allkeys-lru", false, true},
		{"20mb", "volatile-ttl", false, true},
		{"20mb", "allkeys-random", false, true},
		{"20mb", "noeviction", false, false},
		{"0", "allkeys-lru", false, false},
		{"20mb", "allkeys-lru", true, false},
	} {
		t.Run(tc.maxmemory+"/"+tc.policy+map[bool]string{true: "/ACL user", false: ""}[tc.user], func(t *testing.T) {
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory", tc.maxmemory).Err())
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err())
			opt := &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}
			if tc.user {
				require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "noconfig", "reset", "on", ">pw", "~*", "+@all", "-config").Err())
				opt.Username, opt.Password = "noconfig", "pw"
			}
			client := redis.NewClient(opt)
			// Connected first: the look-up's own bound (evictionCheckTimeout,
			// 1 s) then covers one CONFIG GET, not a dial and handshake too
			// on a loaded machine.
			require.NoError(t, client.Ping(ctx).Err())
			var warned []error
			tr := newTestTransport(t, client, func(c *Config) {
				c.Warn = func(err error) { warned = append(warned, err) }
			})
			tr.checkEviction(tr.one) // what the first call starts, here on the test's goroutine
			if !tc.warns {
				require.Empty(t, warned)
				return
			}
			require.Len(t, warned, 1)
			require.ErrorIs(t, warned[0], ErrEvictionPolicy)
			require.ErrorContains(t, warned[0], tc.policy)
			require.ErrorContains(t, warned[0], srv.Addr)
		})
	}
}
