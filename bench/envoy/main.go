// Command envoy measures ratelimit-rls (this repository's Envoy rate limit
// service) against envoyproxy/ratelimit, the reference, on one
// redis-server of its own, with one configuration (a file, or with -xds
// pushed over xDS): ShouldRateLimit
// calls a second and their p50/p99 at several concurrencies, for requests
// of one and of three descriptors, services interleaved, with Redis's CPU
// and commands per call; and with -boundary, what each allows of bursts at
// a window's end and the next window's start. bench/envoy.sh builds both
// binaries and runs it; bench/README.md holds its tables. A module of its
// own, outside go.work: bench's other contenders pin an older gRPC.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const config = `
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: edge
    rate_limit: {unit: second, requests_per_unit: 10}
`

func main() {
	ours := flag.String("ours", "", "the ratelimit-rls binary")
	reference := flag.String("reference", "", "envoyproxy/ratelimit's service_cmd binary")
	duration := flag.Duration("duration", 3*time.Second, "measured time per run")
	warmup := flag.Duration("warmup", 300*time.Millisecond, "unmeasured time before each run")
	rounds := flag.Int("rounds", 3, "rounds, each running every (descriptors, clients, service) once")
	clients := flag.String("clients", "1 8 64", "concurrent clients, space-separated")
	boundary := flag.Bool("boundary", false, "measure bursts at a window's end instead")
	quota := flag.Bool("quota", false, "measure a fleet of emulated Envoys on ratelimit-rls's quota service (RLQS) instead, beside the rate limit service at the same traffic")
	minutes := flag.Int("minutes", 3, "with -quota, the minutes of the fleet over the limit")
	xds := flag.Bool("xds", false, "configure both services over xDS (CONFIG_TYPE=GRPC_XDS_SOTW) from a management server in this process, not from files")
	flag.Parse()
	if *ours == "" || *reference == "" {
		log.Fatal("envoy: -ours and -reference name the two binaries (bench/envoy.sh builds them)")
	}
	redisAddr, stopRedis := startRedis()
	defer stopRedis()
	var source []string // the services' configuration source: files unless -xds
	if *xds {
		addr, stop := startManagement()
		defer stop()
		source = []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + addr, "CONFIG_GRPC_XDS_NODE_ID=bench"}
	}
	files := map[string]string{"config.yaml": config}
	if *quota {
		files["quota.yaml"] = quotaConfig
		source = append(source, "CACHE_KEY_PREFIX="+quotaPrefix)
	}
	services := []*service{
		start("reference", *reference, redisAddr, source, files),
		start("ratelimit-rls", *ours, redisAddr, source, files),
	}
	defer func() {
		for _, s := range services {
			s.stop()
		}
	}()
	if *boundary {
		measureBoundary(services)
		return
	}
	if *quota {
		measureQuota(services[1], services[0], redis.NewClient(&redis.Options{Addr: redisAddr}), *duration, *minutes)
		return
	}
	var cs []int
	for _, f := range strings.Fields(*clients) {
		n, err := strconv.Atoi(f)
		if err != nil {
			log.Fatalf("envoy: -clients %q", *clients)
		}
		cs = append(cs, n)
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	results := map[string][]run{}
	for round := range *rounds {
		for _, descriptors := range []int{1, 3} {
			for _, c := range cs {
				order := slices.Clone(services)
				if round%2 == 1 {
					slices.Reverse(order)
				}
				for _, s := range order {
					r := measure(rdb, s, descriptors, c, *warmup, *duration)
					key := fmt.Sprint(descriptors, "/", c, "/", s.name)
					results[key] = append(results[key], r)
					fmt.Fprintf(os.Stderr, "[round %d] %d descriptor(s), %d clients, %-13s %8.0f calls/s p50 %6.0f µs p99 %6.0f µs\n",
						round+1, descriptors, c, s.name, r.rate, r.p50, r.p99)
				}
			}
		}
	}
	from := "a file"
	if *xds {
		from = "xDS (a go-control-plane snapshot cache in the bench)"
	}
	fmt.Printf("%d round(s) of %v per run, services interleaved (the order flipped each round); medians over rounds; configuration from %s.\n\n", *rounds, *duration, from)
	fmt.Println("| descriptors | clients | service | calls/s | vs reference | p50 µs | p99 µs | Redis CPU µs/call | Redis commands/call |")
	fmt.Println("|--:|--:|---|--:|--:|--:|--:|--:|--:|")
	for _, descriptors := range []int{1, 3} {
		for _, c := range cs {
			ref := median(results[fmt.Sprint(descriptors, "/", c, "/reference")])
			for _, s := range services {
				m := median(results[fmt.Sprint(descriptors, "/", c, "/", s.name)])
				fmt.Printf("| %d | %d | %s | %.0f | %.2f× | %.0f | %.0f | %.1f | %.2f |\n",
					descriptors, c, s.name, m.rate, m.rate/ref.rate, m.p50, m.p99, m.redisCPU, m.commands)
			}
		}
	}
}

// service is one of the two services, running.
type service struct {
	name   string
	addr   string // its gRPC address
	cmd    *exec.Cmd
	client pb.RateLimitServiceClient
}

func (s *service) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// freePort returns a loopback port nothing listens on now.
func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRedis starts a redis-server of the bench's own.
func startRedis() (string, func()) {
	program := os.Getenv("REDIS_SERVER")
	if program == "" {
		program = "redis-server"
	}
	port := freePort()
	cmd := exec.Command(program, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	addr := fmt.Sprint("127.0.0.1:", port)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for c.Ping(context.Background()).Err() != nil {
		time.Sleep(20 * time.Millisecond) // a process starting
	}
	return addr, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
}

// startManagement serves config over xDS, as Envoy Gateway does, to the
// node "bench", and returns its address.
func startManagement() (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	policy := func(n uint32, unit rlsconf.RateLimitUnit) *rlsconf.RateLimitPolicy {
		return &rlsconf.RateLimitPolicy{RequestsPerUnit: n, Unit: unit}
	}
	cfg := &rlsconf.RateLimitConfig{Name: "bench", Domain: "bench", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "user", RateLimit: policy(1000000, rlsconf.RateLimitUnit_HOUR)},
		{Key: "tenant", RateLimit: policy(1000000, rlsconf.RateLimitUnit_HOUR)},
		{Key: "path", RateLimit: policy(1000000, rlsconf.RateLimitUnit_HOUR)},
		{Key: "edge", RateLimit: policy(10, rlsconf.RateLimitUnit_SECOND)},
	}}
	snap, err := cachev3.NewSnapshot("1", map[resource.Type][]types.Resource{resource.RateLimitConfigType: {cfg}})
	if err != nil {
		log.Fatal(err)
	}
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	if err := cache.SetSnapshot(context.Background(), "bench", snap); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, cache, nil))
	go func() { _ = g.Serve(ln) }()
	return ln.Addr().String(), func() { g.Stop(); cancel() }
}

// start runs bin, as the service name, on redisAddr with files (by name)
// for its configuration (or as source says, with source's settings), and
// waits until it answers.
func start(name, bin, redisAddr string, source []string, files map[string]string) *service {
	root, err := os.MkdirTemp("", "envoy-bench")
	if err != nil {
		log.Fatal(err)
	}
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	for file, text := range files {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	grpcPort, httpPort, debugPort := freePort(), freePort(), freePort()
	cmd := exec.Command(bin)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=error",
		"GRPC_HOST=127.0.0.1", fmt.Sprint("GRPC_PORT=", grpcPort), "HOST=127.0.0.1", fmt.Sprint("PORT=", httpPort),
		"DEBUG_HOST=127.0.0.1", fmt.Sprint("DEBUG_PORT=", debugPort),
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr, "REDIS_POOL_SIZE=64",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		// ours bounded by 3 s as the reference's client is by its own
		// timeouts, not by its 100 ms default
		"RLS_TIMEOUT=3s",
	}
	cmd.Env = append(cmd.Env, source...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthcheck", httpPort))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			log.Fatalf("envoy: %s did not start", name)
		}
		time.Sleep(20 * time.Millisecond) // a process starting
	}
	conn, err := grpc.NewClient(fmt.Sprint("127.0.0.1:", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	return &service{name: name, addr: fmt.Sprint("127.0.0.1:", grpcPort), cmd: cmd, client: pb.NewRateLimitServiceClient(conn)}
}

// request returns a request of n descriptors (1 or 3) of ids drawn from
// 10,000 users, 100 tenants and 10 paths.
func request(rng *rand.Rand, n int) *pb.RateLimitRequest {
	entry := func(k string, v int) *rlv3.RateLimitDescriptor {
		return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k, Value: strconv.Itoa(v)}}}
	}
	req := &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", rng.IntN(10_000))}}
	if n == 3 {
		req.Descriptors = append(req.Descriptors, entry("tenant", rng.IntN(100)), entry("path", rng.IntN(10)))
	}
	return req
}

// run is one measured run.
type run struct {
	rate, p50, p99     float64
	redisCPU, commands float64
}

// measure runs clients goroutines of calls against s for d, after warmup.
func measure(rdb *redis.Client, s *service, descriptors, clients int, warmup, d time.Duration) run {
	var measuring atomic.Bool
	stop := make(chan struct{})
	lat := make([][]time.Duration, clients)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for {
				select {
				case <-stop:
					return
				default:
				}
				req := request(rng, descriptors)
				t := time.Now()
				resp, err := s.client.ShouldRateLimit(context.Background(), req)
				took := time.Since(t)
				if err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
					failed.Add(1)
				}
				if measuring.Load() {
					lat[i] = append(lat[i], took)
				}
			}
		})
	}
	time.Sleep(warmup) // the load's warm-up, in real time
	cpu0, calls0 := redisStats(rdb)
	measuring.Store(true)
	t0 := time.Now()
	time.Sleep(d) // the measured run, in real time
	measuring.Store(false)
	elapsed := time.Since(t0)
	cpu1, calls1 := redisStats(rdb)
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		log.Fatalf("envoy: %s: %d calls failed or were not OK", s.name, n)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	n := float64(len(all))
	q := func(p float64) float64 { return float64(all[int(p*(n-1))].Microseconds()) }
	return run{rate: n / elapsed.Seconds(), p50: q(0.5), p99: q(0.99),
		redisCPU: (cpu1 - cpu0) * 1e6 / n, commands: float64(calls1-calls0) / n}
}

// redisStats returns Redis's CPU seconds (user and system) and the commands
// it has run, from INFO.
func redisStats(rdb *redis.Client) (cpu float64, calls int64) {
	info, err := rdb.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		switch {
		case strings.HasPrefix(line, "used_cpu_sys:"), strings.HasPrefix(line, "used_cpu_user:"):
			v, _ := strconv.ParseFloat(line[strings.IndexByte(line, ':')+1:], 64)
			cpu += v
		case strings.HasPrefix(line, "cmdstat_") && !strings.HasPrefix(line, "cmdstat_info:"):
			for _, field := range strings.Split(line[strings.IndexByte(line, ':')+1:], ",") {
				if v, ok := strings.CutPrefix(field, "calls="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					calls += n
				}
			}
		}
	}
	return cpu, calls
}

// measureBoundary sends each service bursts of 10 requests for one id
// against a limit of 10 a second: one 100 ms before a second ends, one 100
// ms after; then a steady 15 a second for 5 s. It prints what each allowed.
func measureBoundary(services []*service) {
	burst := func(s *service, id string) int {
		ok := 0
		for range 10 {
			if burstOne(s, id) {
				ok++
			}
		}
		return ok
	}
	until := func(t time.Time) { time.Sleep(time.Until(t)) } // wall-clock alignment with the services' windows
	fmt.Println("Limit 10 per second on one id; each row a fresh id. Allowed of each burst of 10:")
	fmt.Println()
	fmt.Println("| trial | service | at 0.9 s of a second | at 0.1 s of the next | allowed within 0.2 s |")
	fmt.Println("|--:|---|--:|--:|--:|")
	for trial := 1; trial <= 3; trial++ {
		for _, s := range services {
			id := fmt.Sprint("b", trial, "-", time.Now().UnixNano())
			next := time.Now().Truncate(time.Second).Add(time.Second)
			until(next.Add(900 * time.Millisecond))
			a := burst(s, id)
			until(next.Add(1100 * time.Millisecond))
			b := burst(s, id)
			fmt.Printf("| %d | %s | %d | %d | %d |\n", trial, s.name, a, b, a+b)
		}
	}
	fmt.Println()
	fmt.Println("A steady 15 requests a second on one id for 5 s (75 requests), limit 10 per second:")
	fmt.Println()
	fmt.Println("| service | allowed | most allowed in any 1 s |")
	fmt.Println("|---|--:|--:|")
	for _, s := range services {
		id := fmt.Sprint("s-", time.Now().UnixNano())
		var times []time.Time
		start := time.Now()
		for i := range 75 {
			until(start.Add(time.Duration(i) * time.Second / 15))
			if burstOne(s, id) {
				times = append(times, time.Now())
			}
		}
		most := 0
		for i := range times {
			n := 0
			for _, t := range times[i:] {
				if t.Sub(times[i]) < time.Second {
					n++
				}
			}
			most = max(most, n)
		}
		fmt.Printf("| %s | %d | %d |\n", s.name, len(times), most)
	}
}

// burstOne sends one request for id and reports whether it was allowed.
func burstOne(s *service, id string) bool {
	resp, err := s.client.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "bench",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "edge", Value: id}}}}})
	if err != nil {
		log.Fatal(err)
	}
	return resp.OverallCode == pb.RateLimitResponse_OK
}

// median returns the run of the median rate, and the median of each other
// figure.
func median(runs []run) run {
	pick := func(f func(run) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return run{
		rate: pick(func(r run) float64 { return r.rate }), p50: pick(func(r run) float64 { return r.p50 }),
		p99: pick(func(r run) float64 { return r.p99 }), redisCPU: pick(func(r run) float64 { return r.redisCPU }),
		commands: pick(func(r run) float64 { return r.commands }),
	}
}
