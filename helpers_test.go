package ratelimit_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// The helpers the tests of package ratelimit_test share: environments to
// run against, clients, error handlers, failure policies and hooks.

// epoch is a Unix time that starts a second, a minute and an hour, so that
// epoch.Add(d) lies d into a window of any of those lengths.
var epoch = time.UnixMilli(1_700_002_800_000)

// env is what one semantic test runs against: a client of some Redis, a
// fake clock, and a key prefix no other test uses.
type env struct {
	client redis.UniversalClient
	clock  *clock.Fake
	prefix string
	opts   []ratelimit.Option // for every Limiter of the env
	// limited, if set, is the client the env's Limiters use instead of
	// client: one logged in as a Redis ACL user granted only what a
	// Limiter needs, while the test's own reads and writes use client.
	limited redis.UniversalClient
}

// limiter returns a Limiter on the env's client, clock and prefix. Its
// timeout is long: these tests compare exact results, and a busy machine
// must not turn one into a failure-policy decision. The timeout has tests of
// its own.
func (e env) limiter(opts ...ratelimit.Option) *ratelimit.Limiter {
	client := e.client
	if e.limited != nil {
		client = e.limited
	}
	return ratelimit.New(client, append([]ratelimit.Option{
		ratelimit.WithClock(e.clock.Now), ratelimit.WithPrefix(e.prefix),
		ratelimit.WithTimeout(time.Minute),
	}, append(e.opts, opts...)...)...)
}

// key spells out the documented key format independently of the library.
func (e env) key(id string, window time.Duration, index int64) string {
	esc := strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(id)
	return fmt.Sprintf("%s:{%s}:%d:%d", e.prefix, esc, window.Milliseconds(), index)
}

// windowIndex is the index of the window the clock is in.
func (e env) windowIndex(window time.Duration) int64 {
	return e.clock.Now().UnixMilli() / window.Milliseconds()
}

// set stores counts for id's current and previous windows.
func (e env) set(t *testing.T, id string, window time.Duration, cur, prev int64) {
	t.Helper()
	ctx := context.Background()
	i := e.windowIndex(window)
	if cur > 0 {
		require.NoError(t, e.client.Set(ctx, e.key(id, window, i), cur, 0).Err())
	}
	if prev > 0 {
		require.NoError(t, e.client.Set(ctx, e.key(id, window, i-1), prev, 0).Err())
	}
}

// get returns the count stored for id in the window index, 0 when none is.
func (e env) get(t *testing.T, id string, window time.Duration, index int64) int64 {
	t.Helper()
	n, err := e.client.Get(context.Background(), e.key(id, window, index)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(t, err)
	return n
}

// keys returns every key under the test's prefix, on every node.
func (e env) keys(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	if cc, ok := e.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var all []string
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			keys, err := c.Keys(ctx, e.prefix+":*").Result()
			mu.Lock()
			all = append(all, keys...)
			mu.Unlock()
			return err
		}))
		return all
	}
	keys, err := e.client.Keys(ctx, e.prefix+":*").Result()
	require.NoError(t, err)
	return keys
}

// newEnv is how a backend gives a test a fresh environment.
type newEnv func(t *testing.T) env

func miniredisEnv(t *testing.T) env {
	mr := miniredis.RunT(t)
	return env{client: newClient(t, &redis.Options{Addr: mr.Addr()}), clock: clock.NewFake(epoch), prefix: "test"}
}

// serverEnv starts one redis-server for all the tests it serves; each gets
// its own prefix.
func serverEnv(t *testing.T) newEnv {
	c := redistest.Start(t).Client(t)
	return func(t *testing.T) env {
		return env{client: c, clock: clock.NewFake(epoch), prefix: t.Name()}
	}
}

// clusterEnv starts a 3-master Redis Cluster for all the tests it serves.
func clusterEnv(t *testing.T) newEnv {
	addrs := redistest.SharedCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	return func(t *testing.T) env {
		return env{client: c, clock: clock.NewFake(epoch), prefix: sharedPrefix(t)}
	}
}

// envs numbers the envs made on the Cluster, which every test of the
// process shares.
var envs atomic.Int64

// sharedPrefix returns a prefix of t's own on a Redis that outlives it (the
// shared Cluster): under -count, a test run again on the same fake clock
// would find the keys of its runs before.
func sharedPrefix(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), envs.Add(1))
}

// limiterACL is what a Limiter's Redis ACL user is granted (docs/failure-modes.md
// gives it), but for the key pattern, which the tests' env sets.
const limiterACL = "-@all +evalsha +eval +mget +get +exists +set +incrby +decrby +del +time +zadd +zrem +zrange +zcard +zremrangebyscore +zscore +pexpireat"

// aclEnv starts one redis-server for all the tests it serves, with an ACL
// user granted only limiterACL on the keys of prefixes that start with
// "limited-": each test's Limiters log in as that user and keep their keys
// under such a prefix.
func aclEnv(t *testing.T) newEnv {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	args := []any{"ACL", "SETUSER", "limiter", "reset", "on", ">secret", "~limited-*", "resetchannels"}
	for _, rule := range strings.Fields(limiterACL) {
		args = append(args, rule)
	}
	require.NoError(t, admin.Do(context.Background(), args...).Err())
	limited := newClient(t, &redis.Options{Addr: srv.Addr, Username: "limiter", Password: "secret"})
	return func(t *testing.T) env {
		return env{client: admin, limited: limited, clock: clock.NewFake(epoch), prefix: "limited-" + t.Name()}
	}
}

// aclClusterEnv is aclEnv on a 3-master Redis Cluster, whose client needs
// CLUSTER SLOTS too.
func aclClusterEnv(t *testing.T) newEnv {
	addrs := redistest.SharedCluster(t)
	for _, addr := range addrs {
		args := []any{"ACL", "SETUSER", "limiter", "reset", "on", ">secret", "~limited-*", "resetchannels"}
		for _, rule := range strings.Fields(limiterACL + " +cluster|slots") {
			args = append(args, rule)
		}
		admin := newClient(t, &redis.Options{Addr: addr})
		require.NoError(t, admin.Do(context.Background(), args...).Err())
	}
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = admin.Close() })
	limited := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: "limiter", Password: "secret"})
	t.Cleanup(func() { _ = limited.Close() })
	return func(t *testing.T) env {
		return env{client: admin, limited: limited, clock: clock.NewFake(epoch), prefix: "limited-" + sharedPrefix(t)}
	}
}

// withOpts returns mk with opts added to every Limiter of its envs.
func withOpts(mk newEnv, opts ...ratelimit.Option) newEnv {
	return func(t *testing.T) env {
		e := mk(t)
		e.opts = opts
		return e
	}
}

// backend is a named kind of Redis to run a test against.
type backend struct {
	name string
	mk   newEnv
}

// singleServers returns the backends of one server: miniredis and a real
// redis-server (started once for all the tests it serves).
func singleServers(t *testing.T) []backend {
	return []backend{{"miniredis", miniredisEnv}, {"RedisServer", serverEnv(t)}}
}

// long skips t, a scenario of several seconds on real servers (a failover,
// a live resharding), unless RATELIMIT_LONG=1: .ci/run sets it, and the
// README's go test ./... stays short without it.
func long(t *testing.T) {
	t.Helper()
	if os.Getenv("RATELIMIT_LONG") != "1" {
		t.Skip("skipping: a scenario of several seconds on real servers; RATELIMIT_LONG=1 runs it, as .ci/run does")
	}
}

// depth returns n, the steps of a property test, under RATELIMIT_LONG=1 (as
// .ci/run runs every test), else a third of them: the README's go test
// ./... samples each property, CI checks it in full.
func depth(t *testing.T, n int) int {
	t.Helper()
	if os.Getenv("RATELIMIT_LONG") == "1" {
		return n
	}
	t.Logf("%d steps of %d; RATELIMIT_LONG=1 runs them all, as .ci/run does", n/3, n)
	return n / 3
}

// newClient returns a client with opt that t closes when it ends.
func newClient(t testing.TB, opt *redis.Options) *redis.Client {
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// warmPool has client's pool make n connections, each through its
// handshake, and keeps them idle in it: n calls at once then find one each,
// ready, however late a proxy makes the replies after.
func warmPool(t *testing.T, client *redis.Client, n int) {
	t.Helper()
	conns := make([]*redis.Conn, n)
	for i := range conns {
		conns[i] = client.Conn() // holds its connection until closed
		require.NoError(t, conns[i].Ping(context.Background()).Err())
	}
	for _, c := range conns {
		require.NoError(t, c.Close()) // back to the pool
	}
	require.Equal(t, uint32(n), client.PoolStats().TotalConns)
}

// loadScript has the decision script in the script cache of c's server, as
// a first decision leaves it, made here with a long timeout: a Limiter
// whose timeout is short then finds it there, and its first decision on a
// warm connection needs no EVAL, however loaded the machine.
func loadScript(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	l := ratelimit.New(c, ratelimit.WithTimeout(time.Minute), ratelimit.WithPrefix(t.Name()+"-load"))
	res, err := l.Allow(context.Background(), "load", ratelimit.PerMinute(1))
	require.NoError(t, err)
	require.False(t, res.Degraded)
}

// deadAddr returns a loopback address where nothing listens: a dial is
// refused at once.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// downClient returns a client of a Redis that has gone away, with go-redis's
// command retries off.
func downClient(t *testing.T) *redis.Client {
	return newClient(t, &redis.Options{Addr: deadAddr(t), MaxRetries: -1})
}

// errorLog is an error handler that keeps every error it is given and the
// id it was for. It is safe for simultaneous use.
type errorLog struct {
	mu   sync.Mutex
	ids  []string
	errs []error
}

func (h *errorLog) handle(_ context.Context, id string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids = append(h.ids, id)
	h.errs = append(h.errs, err)
}

// all returns the errors handled so far.
func (h *errorLog) all() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.errs)
}

// seen returns the ids of the errors handled so far.
func (h *errorLog) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ids)
}

// policyCase is one way of deciding when Redis cannot, with what such a
// decision must look like. Every outage test runs every entry: a new policy
// is one more entry.
type policyCase struct {
	name   string
	policy ratelimit.FailurePolicy
	opts   []ratelimit.Option // the policy and what goes with it
	// degraded returns what is wrong with a decision the policy made
	// because Redis could not, or nil.
	degraded func(limit ratelimit.Limit, res ratelimit.Result, err error) error
}

// failOpen checks a FailOpen decision.
func failOpen(limit ratelimit.Limit, res ratelimit.Result, err error) error {
	want := ratelimit.Result{Allowed: true, Limit: limit, Remaining: limit.Rate, Degraded: true}
	if err != nil || res != want {
		return fmt.Errorf("FailOpen decided %+v, %v; want %+v, nil", res, err, want)
	}
	return nil
}

// failClosed checks a FailClosed decision.
func failClosed(limit ratelimit.Limit, res ratelimit.Result, err error) error {
	want := ratelimit.Result{Limit: limit, Degraded: true}
	if !errors.Is(err, ratelimit.ErrUnavailable) || res != want {
		return fmt.Errorf("FailClosed decided %+v, %v; want %+v and ErrUnavailable", res, err, want)
	}
	return nil
}

// failLocalReplicas is the WithReplicas of the FailLocal entry.
const failLocalReplicas = 4

var policyCases = []policyCase{
	{
		name:     "FailOpen",
		policy:   ratelimit.FailOpen,
		opts:     []ratelimit.Option{ratelimit.WithFailurePolicy(ratelimit.FailOpen)},
		degraded: failOpen,
	},
	{
		// Every decision tries Redis and waits for it to fail: the cost of
		// an outage without the circuit breaker.
		name:     "FailOpen, no breaker",
		policy:   ratelimit.FailOpen,
		opts:     []ratelimit.Option{ratelimit.WithFailurePolicy(ratelimit.FailOpen), ratelimit.WithCircuitBreaker(0, 0)},
		degraded: failOpen,
	},
	{
		name:   "FailLocal",
		policy: ratelimit.FailLocal,
		opts:   []ratelimit.Option{ratelimit.WithFailurePolicy(ratelimit.FailLocal), ratelimit.WithReplicas(failLocalReplicas)},
		degraded: func(limit ratelimit.Limit, res ratelimit.Result, err error) error {
			share := max(1, limit.Rate/failLocalReplicas)
			if err != nil || !res.Degraded || res.Limit != limit || res.Count > share || res.Allowed && res.RetryAfter != 0 {
				return fmt.Errorf("FailLocal decided %+v, %v; want a local decision against %d", res, err, share)
			}
			return nil
		},
	},
	{
		name:     "FailClosed",
		policy:   ratelimit.FailClosed,
		opts:     []ratelimit.Option{ratelimit.WithFailurePolicy(ratelimit.FailClosed)},
		degraded: failClosed,
	},
}

// with returns the policy's options followed by more.
func (p policyCase) with(more ...ratelimit.Option) []ratelimit.Option {
	return append(slices.Clone(p.opts), more...)
}

// requireDegraded checks a decision for id that the policy made because
// Redis could not, and that the error handler saw the Redis error once, for
// id; a FailClosed error wraps it. It returns that Redis error.
func requireDegraded(t *testing.T, p policyCase, id string, limit ratelimit.Limit, res ratelimit.Result, err error, h *errorLog) error {
	t.Helper()
	require.NoError(t, p.degraded(limit, res, err))
	require.Equal(t, []string{id}, h.seen())
	redisErr := h.all()[0]
	require.Error(t, redisErr)
	if err != nil {
		require.ErrorIs(t, err, redisErr, "the returned error wraps the Redis error")
	}
	return redisErr
}

// hookFunc is a go-redis hook that runs around every command a client
// sends: it calls next to send the command on.
type hookFunc func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error

func (h hookFunc) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h hookFunc) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { return h(ctx, cmd, next) }
}

func (h hookFunc) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// onCommand returns a hook that calls before as each command named name
// goes out and after with its result, when they are not nil.
func onCommand(name string, before func(), after func(error)) hookFunc {
	return func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if !strings.EqualFold(cmd.Name(), name) {
			return next(ctx, cmd)
		}
		if before != nil {
			before()
		}
		err := next(ctx, cmd)
		if after != nil {
			after(err)
		}
		return err
	}
}

// hookedClient returns a new client of the same servers as c, with hook.
func hookedClient(t *testing.T, c redis.UniversalClient, hook redis.Hook) redis.UniversalClient {
	t.Helper()
	var nc redis.UniversalClient
	switch c := c.(type) {
	case *redis.ClusterClient:
		opt := *c.Options()
		nc = redis.NewClusterClient(&opt)
	case *redis.Client:
		opt := *c.Options()
		nc = redis.NewClient(&opt)
	default:
		t.Fatalf("hookedClient: %T", c)
	}
	nc.AddHook(hook)
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// flushScripts empties the script cache of every node.
func flushScripts(ctx context.Context, c redis.UniversalClient) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(ctx context.Context, s *redis.Client) error {
			return s.ScriptFlush(ctx).Err()
		})
	}
	return c.ScriptFlush(ctx).Err()
}

// firstError keeps the first error reported to it, from any goroutine, so
// that the test's own goroutine can check it: require and t.FailNow must
// not be called from another.
type firstError struct {
	mu  sync.Mutex
	err error
}

// report keeps err if it is the first non-nil error.
func (f *firstError) report(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

// get returns the first error reported, or nil.
func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// timedSync syncs rc and returns how long the sync took: its sample is off
// Redis's time by at most half of that.
func timedSync(t *testing.T, rc *ratelimit.RedisClock) time.Duration {
	t.Helper()
	begin := time.Now()
	require.NoError(t, rc.Sync(t.Context()))
	return time.Since(begin)
}

// TestMain runs the package's tests, stops the Redis Cluster they share,
// and fails the run if they left a goroutine behind.
//
// go-redis's logger is silenced: the servers these tests kill, hang and
// refuse make it log thousands of lines (failed dials, closed connections)
// that would bury a failing test's FAIL lines. What a test needs to know of
// an error it checks itself.
//
// Unless -parallel says otherwise, 6 parallel tests run at a time rather
// than one per core: most of them wait on servers (a failover, a timeout, a
// process starting) far more than they compute. Under -race, which makes
// them compute several times longer, the default of one per core stays.
func TestMain(m *testing.M) {
	redis.SetLogger(&logging.VoidLogger{})
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && !raceEnabled {
		_ = flag.Set("test.parallel", "6")
	}
	// go-redis retries a failed dial from a goroutine of the pool's, which
	// sleeps a second between tries before it sees the pool closed: it ends
	// by itself, and a short run (-run TestFailLocal) ends sooner.
	goleak.VerifyTestMain(stopShared{m}, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// stopShared runs the tests, then stops the shared cluster, before goleak
// looks for goroutines left behind.
type stopShared struct{ m *testing.M }

func (s stopShared) Run() int {
	code := s.m.Run()
	redistest.StopShared()
	return code
}
