package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidingwindow/ratelimit/rls/internal/testredis"
)

// cutoverConfig is what the reference and ours load. The hour's rule
// serves TestCutoverAlternating: its 30 requests take well under a second,
// so that they fall in one fixed window unless they cross the hour, which
// the test says (and then bounds each window apart). The second's rule
// serves TestCutoverRollout: a fresh window each second, so that the limit
// binds in every phase of the rollout.
const cutoverConfig = `
domain: cutover
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: id
    rate_limit: {unit: second, requests_per_unit: 5}
`

// startOurs starts ratelimit-rls on redisAddr with cutoverConfig and env.
func startOurs(t *testing.T, redisAddr string, env ...string) *service {
	t.Helper()
	s := start(t, append([]string{"REDIS_URL=" + redisAddr}, env...)...)
	require.NoError(t, os.WriteFile(filepath.Join(s.configDir, "config.yaml"), []byte(cutoverConfig), 0o644))
	waitFor(t, "our configuration", func() bool { return strings.Contains(s.log.String(), "domains=[cutover]") })
	return s
}

// dialRLS returns a client of the service at addr.
func dialRLS(t *testing.T, addr string) pb.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

// TestCutoverAlternating is the measurement of the cutover: 30 requests
// for one user, 10 an hour, alternating between a reference process and
// ours on one redis-server. Without REFERENCE_CUTOVER each counts apart
// and 20 pass; with it, at most 10 in each of the reference's windows.
func TestCutoverAlternating(t *testing.T) {
	bin := referenceBinary(t)
	redisSrv := testredis.Start(t)
	ref := dialRLS(t, startReference(t, bin, redisSrv.Addr, cutoverConfig))
	apart := dialRLS(t, startOurs(t, redisSrv.Addr).grpcAddr)
	cutover := dialRLS(t, startOurs(t, redisSrv.Addr, "REFERENCE_CUTOVER=true").grpcAddr)

	run := fmt.Sprint(time.Now().UnixNano()) // fresh keys
	// alternate returns how many of 30 requests passed, by the hour they
	// were decided in (sent and answered in that hour).
	alternate := func(ours pb.RateLimitServiceClient, user string) (passed map[int64]int, crossed bool) {
		passed = map[int64]int{}
		for i := range 30 {
			c := ref
			if i%2 == 1 {
				c = ours
			}
			before := time.Now().Unix() / 3600
			r, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "cutover", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", user)}})
			require.NoError(t, err)
			after := time.Now().Unix() / 3600
			crossed = crossed || before != after
			if r.OverallCode == pb.RateLimitResponse_OK {
				passed[after]++
			}
		}
		return passed, crossed
	}

	passed, crossed := alternate(cutover, run+"-cutover")
	t.Logf("REFERENCE_CUTOVER=true: passed by hour %v", passed)
	for hour, n := range passed {
		require.LessOrEqual(t, n, 10, "hour %d", hour)
	}
	without, crossedToo := alternate(apart, run+"-apart")
	t.Logf("without REFERENCE_CUTOVER: passed by hour %v", without)
	if crossed || crossedToo {
		t.Skip("the requests crossed the hour, where each window counts apart; the bound per window held")
	}
	require.Equal(t, 10, passed[time.Now().Unix()/3600], "the limit, once")
	require.Equal(t, 20, without[time.Now().Unix()/3600], "each process's limit: the fault the cutover fixes")
}

// pod is a process that serves in TestCutoverRollout.
type pod struct {
	name     string
	ours     bool
	client   pb.RateLimitServiceClient
	inFlight sync.WaitGroup
	stop     func()
}

// tally is what one id's window saw.
type tally struct {
	refAdmitted, oursAdmitted, refused int
	phases                             []string
}

// TestCutoverRollout replaces two reference processes under load by two
// of ours in cutover, one by one, all on one redis-server: per fixed
// window of a second and id, at most the limit is admitted before, during
// and after. A request counts towards a window only when it was sent and
// answered within that second (the few that straddle two are left out of
// the bound, and counted in the log).
func TestCutoverRollout(t *testing.T) {
	bin := referenceBinary(t)
	redisSrv := testredis.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisSrv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	const limit = 5
	run := fmt.Sprint(time.Now().UnixNano())
	ids := []string{run + "-a", run + "-b"}

	refPod := func(name string) *pod {
		s := launchReference(t, bin, map[string]string{"config.yaml": cutoverConfig}, "REDIS_URL="+redisSrv.Addr)
		s.waitHealthy(t)
		return &pod{name: name, client: dialRLS(t, s.grpcAddr), stop: func() { _ = s.cmd.Process.Kill() }}
	}
	oursPod := func(name string) *pod {
		// a timeout of a second, not 100 ms: a call that times out on a
		// busy machine says nothing of the bound
		s := startOurs(t, redisSrv.Addr, "REFERENCE_CUTOVER=true", "RLS_TIMEOUT=1s")
		return &pod{name: name, ours: true, client: dialRLS(t, s.grpcAddr), stop: func() { _ = s.cmd.Process.Kill() }}
	}

	var mu sync.Mutex
	pods := []*pod{refPod("ref-1"), refPod("ref-2")}
	phase := "before"
	tallies := map[string]*tally{} // by window (unix second) and id
	straddled, failed := 0, 0
	var counted sync.Map // reference key → the most its counter was seen at
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for ctx.Err() == nil {
				id := ids[rng.IntN(len(ids))]
				mu.Lock()
				p := pods[rng.IntN(len(pods))]
				p.inFlight.Add(1)
				ph := phase
				mu.Unlock()
				before := time.Now().Unix()
				r, err := p.client.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "cutover", Descriptors: []*rlv3.RateLimitDescriptor{desc("id", id)}})
				after := time.Now().Unix()
				p.inFlight.Done()
				mu.Lock()
				if err != nil {
					failed++ // neither admitted nor refused: Envoy's failure_mode_deny decides
					if failed == 1 {
						t.Logf("%s: %v", p.name, err)
					}
				} else if before != after {
					straddled++
				} else {
					k := fmt.Sprint(after, " ", id)
					tl := tallies[k]
					if tl == nil {
						tl = &tally{}
						tallies[k] = tl
					}
					switch {
					case r.OverallCode != pb.RateLimitResponse_OK:
						tl.refused++
					case p.ours:
						tl.oursAdmitted++
					default:
						tl.refAdmitted++
					}
					if !slices.Contains(tl.phases, ph) {
						tl.phases = append(tl.phases, ph)
					}
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond) // pacing the load, not waiting for time to pass
			}
		}()
	}
	// the reference's counters, read as they grow: a counter lives a
	// second or more after its last increment
	sample := func() {
		now := time.Now().Unix()
		for _, sec := range []int64{now - 1, now} {
			for _, id := range ids {
				key := fmt.Sprintf("cutover_id_%s_%d", id, sec)
				if n, err := rdb.Get(context.Background(), key).Int(); err == nil {
					if old, ok := counted.Load(key); !ok || old.(int) < n {
						counted.Store(key, n)
					}
				}
			}
		}
	}
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for ctx.Err() == nil {
			sample()
			time.Sleep(50 * time.Millisecond) // sampling, not waiting for time to pass
		}
	}()

	// each phase lasts until every pod of it has served some requests
	settle := func() {
		served := func() int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, tl := range tallies {
				n += tl.refAdmitted + tl.oursAdmitted + tl.refused
			}
			return n
		}
		from := served()
		waitFor(t, "requests of the phase", func() bool { return served() >= from+1500 })
	}
	add := func(p *pod, name string) {
		mu.Lock()
		pods = append(pods, p)
		phase = name
		mu.Unlock()
		settle()
	}
	remove := func(name, next string) {
		mu.Lock()
		i := slices.IndexFunc(pods, func(p *pod) bool { return p.name == name })
		p := pods[i]
		pods = slices.Delete(pods, i, i+1)
		phase = next
		mu.Unlock()
		p.inFlight.Wait()
		p.stop()
		settle()
	}
	settle()
	add(oursPod("ours-1"), "ref-1 ref-2 ours-1")
	remove("ref-1", "ref-2 ours-1")
	add(oursPod("ours-2"), "ref-2 ours-1 ours-2")
	remove("ref-2", "after: ours-1 ours-2")
	cancel()
	wg.Wait()
	<-sampled
	sample()

	keys := make([]string, 0, len(tallies))
	for k := range tallies {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-10s %-3s %5s %12s %13s %7s %17s  %s\n", "window", "id", "limit", "ref admitted", "ours admitted", "refused", "counted in Redis", "pods")
	over := 0
	for _, k := range keys {
		tl := tallies[k]
		sec, id, _ := strings.Cut(k, " ")
		n := "?"
		if v, ok := counted.Load(fmt.Sprintf("cutover_id_%s_%s", id, sec)); ok {
			n = fmt.Sprint(v)
		}
		fmt.Fprintf(&b, "%-10s %-3s %5d %12d %13d %7d %17s  %s\n", sec, id[len(id)-1:], limit, tl.refAdmitted, tl.oursAdmitted, tl.refused, n, strings.Join(tl.phases, " | "))
		if tl.refAdmitted+tl.oursAdmitted > limit {
			over++
		}
	}
	fmt.Fprintf(&b, "%d requests straddled two seconds and are left out; %d calls failed", straddled, failed)
	t.Log(b.String())
	require.Zero(t, over, "windows where more than the limit was admitted")
	require.Less(t, failed, 20, "calls that failed")
}
