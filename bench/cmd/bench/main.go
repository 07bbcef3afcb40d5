// Command bench runs one contender of the comparison per process and makes
// the table; bench/run.sh drives it.
//
//	bench run -addr 127.0.0.1:6379 -contender ours -scenario allowed -c 64 -duration 3s -flush
//	bench mem -addr 127.0.0.1:6379 -contender ours -windows 2 -flush
//	bench table results.jsonl...
//	bench scriptcost round1.txt round2.txt...
//	bench scriptcost -pattern 'one|batch16'
//	bench hot -addr 127.0.0.1:6379 -mode leased -servers 8 -c 8 -duration 3s -flush
//	bench hot -addr 127.0.0.1:6379 -mode leased -rate 10000 -account -duration 5s -flush
//	bench hottable hot.jsonl...
//	bench list [-scenario denied]
//	bench freeport
//	bench ping -addr 127.0.0.1:6379
//
// run, mem and hot print one JSON line and exit 1 when calls failed or the
// outcome missed the scenario's check. -flush runs FLUSHALL: give it only
// for a server the bench owns.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/bench"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "run":
		err = run(args)
	case "mem":
		err = mem(args)
	case "table":
		err = table(args)
	case "scriptcost":
		err = scriptcost(args)
	case "hot":
		err = hot(args)
	case "hottable":
		err = hottable(args)
	case "list":
		err = list(args)
	case "freeport":
		err = freeport()
	case "ping":
		err = ping(args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: bench run|mem|table|scriptcost|hot|hottable|list|freeport|ping [flags]; bench CMD -h for flags")
	os.Exit(2)
}

// errFailed reports a run whose result is printed but not OK.
var errFailed = errors.New("the run failed its checks (see the JSON line)")

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:6379", "Redis address")
	name := fs.String("contender", "ours", fmt.Sprint("one of ", bench.Names()))
	scenario := fs.String("scenario", "allowed", "allowed or denied")
	conc := fs.Int("c", 1, "goroutines deciding at once")
	dur := fs.Duration("duration", 3*time.Second, "measured time")
	warmup := fs.Duration("warmup", 300*time.Millisecond, "unmeasured time before, same load")
	round := fs.Int("round", 1, "round number, copied into the JSON")
	pool := fs.Int("pool", 0, "go-redis PoolSize (0: go-redis's default, 10 per GOMAXPROCS)")
	flush := fs.Bool("flush", false, "FLUSHALL first (only for a server the bench owns)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	_ = fs.Parse(args)
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	c, err := bench.Lookup(*name)
	if err != nil {
		return err
	}
	s, err := bench.LookupScenario(*scenario)
	if err != nil {
		return err
	}
	res, err := bench.Run(context.Background(), bench.RunConfig{
		Contender: c, Scenario: s, Concurrency: *conc, Duration: *dur, Warmup: *warmup,
		Options: redis.Options{Addr: *addr, PoolSize: *pool}, Round: *round, Flush: *flush,
	})
	if err != nil {
		return err
	}
	if err := printJSON(res); err != nil {
		return err
	}
	if !res.OK {
		return fmt.Errorf("%s, %s, %d goroutines: %s: %w", res.Contender, res.Scenario, res.Concurrency, res.Problem, errFailed)
	}
	return nil
}

func mem(args []string) error {
	fs := flag.NewFlagSet("mem", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:6379", "Redis address")
	name := fs.String("contender", "ours", fmt.Sprint("one of ", bench.Names()))
	clients := fs.Int("clients", 100_000, "distinct clients")
	windows := fs.Int("windows", 1, "consecutive windows each client is active in")
	conc := fs.Int("c", 16, "goroutines making the requests")
	flush := fs.Bool("flush", false, "FLUSHALL first; the measurement needs an empty server (only for a server the bench owns)")
	_ = fs.Parse(args)
	c, err := bench.Lookup(*name)
	if err != nil {
		return err
	}
	res, err := bench.MeasureMemory(context.Background(), bench.MemoryConfig{
		Contender: c, Options: redis.Options{Addr: *addr}, Clients: *clients,
		Windows: *windows, Concurrency: *conc, Flush: *flush,
	})
	if err != nil {
		return err
	}
	if err := printJSON(res); err != nil {
		return err
	}
	if !res.OK {
		return fmt.Errorf("%s, memory, %d windows: %s: %w", res.Contender, res.Windows, res.Problem, errFailed)
	}
	return nil
}

func table(files []string) error {
	in, done, err := inputs(files)
	if err != nil {
		return err
	}
	defer done()
	res, err := bench.ReadResults(in)
	if err != nil {
		return err
	}
	if err := bench.Table(os.Stdout, res); err != nil {
		return err
	}
	if res.Failed() {
		return errors.New("some runs failed; see the end of the table")
	}
	return nil
}

// scriptcost prints the table of the root module's BenchmarkScriptCost
// from the outputs of go test -bench ScriptCost in files, one round each;
// with -pattern, the -bench regexp that runs the cases its argument matches
// instead.
// bench/scriptcost.sh uses both.
func scriptcost(args []string) error {
	fs := flag.NewFlagSet("scriptcost", flag.ExitOnError)
	pattern := fs.Bool("pattern", false, "print the -bench regexp that runs the cases the argument matches (a regexp; none: all) and exit")
	_ = fs.Parse(args)
	if *pattern {
		if fs.NArg() > 1 {
			return errors.New("scriptcost -pattern: one regexp at most")
		}
		fmt.Println(bench.ScriptCostPattern(fs.Arg(0)))
		return nil
	}
	files := fs.Args()
	if len(files) == 0 {
		return errors.New("scriptcost: give the output of each round's go test -bench ScriptCost, one file a round")
	}
	var rounds [][]bench.ScriptCost
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return err
		}
		round, err := bench.ReadScriptCost(fh)
		fh.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		rounds = append(rounds, round)
	}
	return bench.ScriptCostTable(os.Stdout, rounds)
}

// hot runs the hot-id workload once (bench.RunHot): -servers Limiters, each
// on a client of its own, -c goroutines each, one id, leased or not.
// bench/hot.sh drives it.
func hot(args []string) error {
	fs := flag.NewFlagSet("hot", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:6379", "Redis address")
	mode := fs.String("mode", "leased", "leased or unleased: Limit.Leased")
	servers := fs.Int("servers", 8, "Limiters, each ratelimit.New on a go-redis client of its own")
	conc := fs.Int("c", 8, "goroutines per Limiter")
	rate := fs.Int64("rate", 1<<40, "Limit.Rate (the default is never reached)")
	window := fs.Duration("window", time.Second, "Limit.Window")
	account := fs.Bool("account", false, "record every admitted decision and account for them per window (for a -rate that is reached)")
	minAllowed := fs.Float64("min-allowed", -1, "least share of decisions that must be allowed (default: 0.999 without -account, 0 with)")
	dur := fs.Duration("duration", 3*time.Second, "measured time")
	warmup := fs.Duration("warmup", 300*time.Millisecond, "unmeasured time before, same load")
	round := fs.Int("round", 1, "round number, copied into the JSON")
	flush := fs.Bool("flush", false, "FLUSHALL first (only for a server the bench owns)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run (warm-up included) to this file")
	_ = fs.Parse(args)
	if *mode != "leased" && *mode != "unleased" {
		return fmt.Errorf("hot: -mode %q: leased or unleased", *mode)
	}
	if *minAllowed < 0 {
		*minAllowed = 0.999
		if *account {
			*minAllowed = 0
		}
	}
	ctx := context.Background()
	stats := redis.NewClient(&redis.Options{Addr: *addr})
	defer stats.Close()
	if err := stats.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("hot: Redis at %s: %w", *addr, err)
	}
	if *flush {
		if err := stats.FlushAll(ctx).Err(); err != nil {
			return fmt.Errorf("FLUSHALL: %w", err)
		}
	}
	limit := ratelimit.Limit{Rate: *rate, Window: *window, Leased: *mode == "leased"}
	var placer *bench.Placer // the per-window accounting places each decision where its Limiter did
	if *account {
		placer = new(bench.Placer)
	}
	stop, err := startCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stop()
	res, err := bench.RunHot(ctx, bench.HotConfig{
		Name: *mode, Servers: bench.NewHotOurs(*addr, *servers, limit, placer), Concurrency: *conc,
		ID: "hot", Duration: *dur, Warmup: *warmup, Rate: *rate, Window: *window,
		Windows: *account, Placer: placer, MinAllowed: *minAllowed, Stats: stats, Round: *round,
	})
	if err != nil {
		return err
	}
	if err := printJSON(res); err != nil {
		return err
	}
	if !res.OK {
		return fmt.Errorf("hot, %s, %d × %d: %s: %w", res.Name, res.Servers, res.Concurrency, res.Problem, errFailed)
	}
	return nil
}

// inputs returns files one after another, or stdin when there are none,
// and a func that closes them.
func inputs(files []string) (io.Reader, func(), error) {
	var readers []io.Reader
	var opened []*os.File
	done := func() {
		for _, fh := range opened {
			_ = fh.Close()
		}
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			done()
			return nil, nil, err
		}
		opened = append(opened, fh)
		readers = append(readers, fh)
	}
	if len(readers) == 0 {
		readers = append(readers, os.Stdin)
	}
	return io.MultiReader(readers...), done, nil
}

// hottable prints the tables of hot's JSON lines, from files or stdin.
func hottable(files []string) error {
	in, done, err := inputs(files)
	if err != nil {
		return err
	}
	defer done()
	res, err := bench.ReadHotResults(in)
	if err != nil {
		return err
	}
	if err := bench.HotTable(os.Stdout, res); err != nil {
		return err
	}
	for _, r := range res {
		if !r.OK {
			return errors.New("some runs failed; see the end of the table")
		}
	}
	return nil
}

// list prints the contenders' names, one a line: those that take part in
// the scenario if one is given (the offline no-op only where all requests
// are allowed, as its decisions are not checked), or, with -memory, those
// that keep state in Redis.
func list(args []string) error {
	fs := flag.NewFlagSet("list", flag.ExitOnError)
	scenario := fs.String("scenario", "", "only the contenders that run in this scenario")
	memory := fs.Bool("memory", false, "only the contenders whose memory can be measured")
	_ = fs.Parse(args)
	var s bench.Scenario
	if *scenario != "" {
		var err error
		if s, err = bench.LookupScenario(*scenario); err != nil {
			return err
		}
	}
	for _, c := range bench.Contenders() {
		if c.Offline && (*memory || s.MinDenied > 0) {
			continue
		}
		fmt.Println(c.Name)
	}
	return nil
}

// freeport prints a TCP port free on the loopback interface just now.
func freeport() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println(l.Addr().(*net.TCPAddr).Port)
	return nil
}

// ping waits up to -wait for Redis to answer PING.
func ping(args []string) error {
	fs := flag.NewFlagSet("ping", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:6379", "Redis address")
	wait := fs.Duration("wait", 10*time.Second, "how long to keep trying")
	_ = fs.Parse(args)
	client := redis.NewClient(&redis.Options{Addr: *addr, MaxRetries: -1})
	defer client.Close()
	deadline := time.Now().Add(*wait)
	for {
		err := client.Ping(context.Background()).Err()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer from %s after %v: %w", *addr, *wait, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func printJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Printf("%s\n", b)
	return err
}

// startCPUProfile starts a CPU profile written to path, if path is not
// empty, and returns what stops it.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
