package ratelimit_test

// The engines users run (docs/engines.md), emulated by a proxy in front of
// a real redis-server that answers as they do: NOSCRIPT in each wording,
// replies that no retry changes, calls refused across hash slots.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/redistest"
	"github.com/slidingwindow/ratelimit/internal/script"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// isScript reports whether args are a script call, EVALSHA or EVAL.
func isScript(args []string) bool {
	return strings.EqualFold(args[0], "evalsha") || strings.EqualFold(args[0], "eval")
}

// Every tenth EVALSHA answered NOSCRIPT, in each engine's wording, is sent
// again once as EVAL, and the decisions are those of a Limiter that reaches
// the same server directly: one EVAL through the proxy for each NOSCRIPT,
// no more.
func TestNoScriptWordings(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	direct := newClient(t, &redis.Options{Addr: srv.Addr, MaxRetries: -1})
	for _, w := range []struct{ engine, reply string }{
		{"Redis", "NOSCRIPT No matching script. Please use EVAL."},
		{"Valkey 8 and ElastiCache Serverless", "NOSCRIPT No matching script."},
		{"Kvrocks", "ERR NOSCRIPT No matching script. Please use EVAL"},
		// Valkey 9.1's wording could not be checked here: the code is
		// what counts, whatever text follows it.
		{"any other text after the code", "NOSCRIPT script not in cache"},
	} {
		t.Run(w.engine, func(t *testing.T) {
			p := redistest.StartProxy(t, srv.Addr)
			var evalshas, answered atomic.Int64
			p.Answer(func(args []string) string {
				if strings.EqualFold(args[0], "evalsha") && evalshas.Add(1)%10 == 0 {
					answered.Add(1)
					return w.reply
				}
				return ""
			})
			now := time.Unix(1_700_000_000, 0)
			clock := func() time.Time { return now }
			opts := []ratelimit.Option{ratelimit.WithClock(clock), ratelimit.WithFailurePolicy(ratelimit.FailClosed), ratelimit.WithTimeout(time.Minute)}
			proxied := ratelimit.New(newClient(t, &redis.Options{Addr: p.Addr, MaxRetries: -1}), append(opts, ratelimit.WithPrefix(t.Name()+"-p"))...)
			straight := ratelimit.New(direct, append(opts, ratelimit.WithPrefix(t.Name()+"-d"))...)
			loadScript(t, direct) // NOSCRIPT only from the proxy
			require.NoError(t, direct.ScriptLoad(context.Background(), script.ConcurrencySource).Err())
			limit := ratelimit.PerMinute(5)
			for i := range 100 {
				id := "id" + strconv.Itoa(i%3)
				want, err := straight.Allow(context.Background(), id, limit)
				require.NoError(t, err)
				got, err := proxied.Allow(context.Background(), id, limit)
				require.NoError(t, err, "decision %d", i)
				require.EqualExportedValues(t, want, got, "decision %d", i)
				now = now.Add(7 * time.Second)
			}
			slot, err := proxied.Acquire(context.Background(), "slot", ratelimit.Concurrency{Max: 1, Lease: time.Minute})
			require.NoError(t, err)
			require.True(t, slot.Acquired)
			require.NoError(t, slot.Release(context.Background()))
			require.GreaterOrEqual(t, answered.Load(), int64(10))
			require.Equal(t, int(answered.Load()), p.Commands("eval"), "one EVAL for each NOSCRIPT")
		})
	}
}

// An error that mentions NOSCRIPT after its code is not one: it is sent
// again as nothing, and goes to the failure policy as the error it is.
func TestNoScriptLaterInTheTextIsNotOne(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr)
	loadScript(t, srv.Client(t))
	const reply = "ERR Error running script (call to f_1): @user_script:1: NOSCRIPT No matching script. Please use EVAL."
	p.Answer(func(args []string) string {
		if isScript(args) {
			return reply
		}
		return ""
	})
	h := &errorLog{}
	l := ratelimit.New(newClient(t, &redis.Options{Addr: p.Addr, MaxRetries: -1}),
		ratelimit.WithFailurePolicy(ratelimit.FailClosed), ratelimit.WithErrorHandler(h.handle), ratelimit.WithTimeout(time.Minute))
	res, err := l.Allow(context.Background(), "id", ratelimit.PerMinute(5))
	require.ErrorIs(t, err, ratelimit.ErrUnavailable)
	require.ErrorContains(t, err, reply)
	require.NotErrorIs(t, err, ratelimit.ErrMisconfigured)
	require.True(t, res.Degraded)
	require.Equal(t, 1, p.Commands("evalsha"))
	require.Zero(t, p.Commands("eval"), "not sent again")
	require.Len(t, h.all(), 1)
}

// What an engine answers every call the same until it is configured
// otherwise is ErrMisconfigured, at the first call, under every policy:
// not allowed, reported to the error handler, and no outage.
func TestMisconfiguredEngine(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	loadScript(t, srv.Client(t))
	answer := func(reply string) func([]string) string {
		return func(args []string) string {
			if isScript(args) {
				return reply
			}
			return ""
		}
	}
	for _, c := range []struct {
		name   string
		answer func([]string) string // nil: the server's own reply
		opts   []ratelimit.Option
		says   string
	}{
		{name: "Garnet without --lua", answer: answer("ERR This instance has Lua scripting support disabled"), says: "does not run Lua scripts"},
		{name: "no scripting", answer: answer("ERR unknown command 'evalsha', with args beginning with: "), says: "does not run Lua scripts"},
		{name: "NOPERM on EVALSHA", answer: answer("NOPERM User limiter has no permissions to run the 'evalsha' command"), says: "Least privilege"},
		{
			name: "NOPERM inside the script", says: "Least privilege",
			answer: answer("ERR The user executing the script can't run this command or subcommand script: 61636018f4e6b5817b89791bbed242f93fa089e3, on @user_script:1."),
		},
		{
			// Redis 7 itself refuses Upstash's flag.
			name: "allow-key-locking on Redis", opts: []ratelimit.Option{ratelimit.WithScriptFlags("allow-key-locking")},
			says: `refuses the scripts' first line "#!lua flags=allow-key-locking"`,
		},
		{name: "a flag no shebang holds", opts: []ratelimit.Option{ratelimit.WithScriptFlags("allow-key-locking,no-writes")}, says: "is not a script flag"},
	} {
		for _, pc := range policyCases {
			t.Run(c.name+"/"+pc.name, func(t *testing.T) {
				p := redistest.StartProxy(t, srv.Addr)
				p.Answer(c.answer)
				h := &errorLog{}
				l := ratelimit.New(newClient(t, &redis.Options{Addr: p.Addr, MaxRetries: -1}),
					pc.with(append(c.opts, ratelimit.WithErrorHandler(h.handle), ratelimit.WithTimeout(time.Minute))...)...)
				limit := ratelimit.PerMinute(5)
				for range 2 { // the first call, and every one after
					res, err := l.Allow(context.Background(), "id", limit)
					require.ErrorIs(t, err, ratelimit.ErrMisconfigured)
					require.ErrorContains(t, err, c.says)
					require.False(t, res.Allowed, "no policy allows through it")
					require.False(t, ratelimit.IsOutage(err))
				}
				slot, err := l.Acquire(context.Background(), "id", ratelimit.Concurrency{Max: 1, Lease: time.Minute})
				require.ErrorIs(t, err, ratelimit.ErrMisconfigured)
				require.False(t, slot.Acquired)
				results, err := l.AllowMany(context.Background(), []ratelimit.Quota{{ID: "a", Limit: limit, Cost: 1}, {ID: "b", Limit: limit, Cost: 1}})
				require.ErrorIs(t, err, ratelimit.ErrMisconfigured)
				require.False(t, results[0].Allowed || results[1].Allowed)
				require.Len(t, h.all(), 4, "each call reported")
				for _, err := range h.all() {
					require.ErrorIs(t, err, ratelimit.ErrMisconfigured)
				}
				res, err := l.Allow(context.Background(), "id", limit)
				require.NotErrorIs(t, err, ratelimit.ErrCircuitOpen, "no breaker opened: %+v", res)
			})
		}
	}
}

// Each script header loads where it should: none and the Cluster's
// allow-cross-slot-keys on redis-server, with a flag it knows joined to
// them, and a Limiter with that flag decides as one without.
func TestScriptFlags(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for _, sc := range []*script.Script{
		script.NewScript(script.Source, false),
		script.NewScript(script.Source, true),
		script.NewScript(script.Source, false, "allow-oom"),
		script.NewScript(script.Source, true, "allow-oom"),
		script.NewScript(script.ConcurrencySource, false, "allow-oom"),
	} {
		sha, err := c.ScriptLoad(ctx, sc.Src.(string)).Result()
		require.NoError(t, err, "%s", sc.Header)
		require.Equal(t, sc.SHA, sha)
	}
	require.Equal(t, "#!lua flags=allow-oom,allow-cross-slot-keys", script.NewScript(script.Source, true, "allow-oom").Header)
	err := c.ScriptLoad(ctx, script.NewScript(script.Source, false, "allow-key-locking").Src.(string)).Err()
	require.ErrorContains(t, err, "Unexpected flag in script shebang: allow-key-locking")

	now := time.Unix(1_700_000_000, 0)
	opts := []ratelimit.Option{ratelimit.WithClock(func() time.Time { return now }), ratelimit.WithFailurePolicy(ratelimit.FailClosed)}
	flagged := ratelimit.New(c, append(opts, ratelimit.WithScriptFlags("allow-oom"), ratelimit.WithPrefix(t.Name()+"-f"))...)
	plain := ratelimit.New(c, append(opts, ratelimit.WithPrefix(t.Name()+"-p"))...)
	for i := range 8 {
		want, err := plain.Allow(ctx, "id", ratelimit.PerMinute(5))
		require.NoError(t, err)
		got, err := flagged.Allow(ctx, "id", ratelimit.PerMinute(5))
		require.NoError(t, err)
		require.EqualExportedValues(t, want, got, "decision %d", i)
	}
}

// crossSlotRefusal answers, as a Cluster or ElastiCache Serverless would,
// every script call whose declared keys are in several hash slots, and
// counts them.
func crossSlotRefusal(refused *atomic.Int64) func([]string) string {
	return func(args []string) string {
		if !isScript(args) || len(args) < 3 {
			return ""
		}
		n, err := strconv.Atoi(args[2])
		if err != nil || n == 0 || 3+n > len(args) {
			return ""
		}
		for _, k := range args[4 : 3+n] {
			if transport.HashSlot(k) != transport.HashSlot(args[3]) {
				refused.Add(1)
				return "CROSSSLOT Keys in request don't hash to the same slot"
			}
		}
		return ""
	}
}

// Behind a server that refuses calls across hash slots, the first refusal
// tells the Limiter: the decisions of a refused batch go again one by one,
// and no batch is made after; an AllowMany's ids go in a call per slot.
func TestOneSlotCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	loadScript(t, srv.Client(t))
	p := redistest.StartProxy(t, srv.Addr)
	var refused atomic.Int64
	p.Answer(crossSlotRefusal(&refused))
	p.Delay(5 * time.Millisecond) // calls in flight long enough for the next decisions to batch
	client := newClient(t, &redis.Options{Addr: p.Addr, MaxRetries: -1, PoolSize: 8})
	now := time.Unix(1_700_000_000, 0) // one window throughout: no boundary to cross
	clock := ratelimit.WithClock(func() time.Time { return now })

	t.Run("batches", func(t *testing.T) {
		l := ratelimit.New(client, clock, ratelimit.BatchAlways(), ratelimit.WithFailurePolicy(ratelimit.FailClosed),
			ratelimit.WithTimeout(time.Minute), ratelimit.WithPrefix(t.Name()))
		const ids, each = 24, 3
		limit := ratelimit.PerMinute(2)
		allowed := make([]atomic.Int64, ids)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				for range each {
					res, err := l.Allow(context.Background(), fmt.Sprint("id", i), limit)
					if err != nil || res.Degraded {
						t.Errorf("id%d: %+v, %v", i, res, err)
						return
					}
					if res.Allowed {
						allowed[i].Add(1)
					}
				}
			})
		}
		wg.Wait()
		for i := range allowed {
			require.Equal(t, limit.Rate, allowed[i].Load(), "id%d: every decision by Redis, each once", i)
		}
		require.Positive(t, refused.Load(), "a batch across slots was made, and refused")
		before := refused.Load()
		for i := range ids {
			_, err := l.Allow(context.Background(), fmt.Sprint("id", i), limit)
			require.NoError(t, err)
		}
		require.Equal(t, before, refused.Load(), "no batch after the refusal")
	})

	t.Run("AllowMany", func(t *testing.T) {
		a, b := "a", "b"
		require.NotEqual(t, transport.HashSlot("{"+a+"}"), transport.HashSlot("{"+b+"}"))
		l := ratelimit.New(client, clock, ratelimit.WithBatching(1), ratelimit.WithFailurePolicy(ratelimit.FailClosed),
			ratelimit.WithTimeout(time.Minute), ratelimit.WithPrefix(t.Name()), ratelimit.WithErrorHandler(func(context.Context, string, error) {}))
		limit := ratelimit.PerMinute(5)
		quotas := []ratelimit.Quota{{ID: a, Limit: limit, Cost: 1}, {ID: b, Limit: limit, Cost: 1}}
		before := refused.Load()
		_, err := l.AllowMany(context.Background(), quotas)
		require.ErrorContains(t, err, "CROSSSLOT", "the first: refused, and decided by the policy")
		require.Equal(t, before+1, refused.Load())
		results, err := l.AllowMany(context.Background(), quotas)
		require.NoError(t, err)
		require.True(t, results[0].Allowed && results[1].Allowed && !results[0].Degraded)
		require.Equal(t, before+1, refused.Load(), "in a call per slot")
		for _, id := range []string{a, b} {
			res, err := l.Peek(context.Background(), id, limit)
			require.NoError(t, err)
			require.Equal(t, int64(1), res.Count, "%s counted once", id)
		}
	})
}
