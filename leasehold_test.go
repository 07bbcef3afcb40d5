package ratelimit_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/slidingwindow/ratelimit"
	"github.com/slidingwindow/ratelimit/internal/clock"
	"github.com/slidingwindow/ratelimit/internal/redistest"
)

// holdLimit is the leased limit of the tests below: leases of at most
// Rate/20 = 100,000 units. Their Limiters' clock stands still at epoch, so
// that every decision falls in one window, and holdDecisions plus what 16
// callers could hold (16 × Rate/20) stays below Rate: no lease is cut
// short for nearing the limit, and every decision is allowed.
var holdLimit = ratelimit.Limit{Rate: 2_000_000, Window: time.Hour, Leased: true}

// holdDecisions is how many decisions a run makes, all its callers together.
const holdDecisions = 200_000

// A Leased limit holds at most Rate/20 units unused per id, however many
// goroutines of one process decide it at once (docs/leases.md: "never more
// than Rate/20 at once"): Redis never counts more than this process has
// admitted plus Rate/20, and once Close has returned exactly what it
// admitted.
//
// A sampler reads the count Redis holds with GET while 1, 4 and 16
// goroutines decide one hot id, then loads how many decisions were
// admitted: count − admitted is at most what was held unused when the GET
// ran, plus the requests then in flight (counted in Redis, not yet added to
// admitted: at most one of cost 1 per goroutine), since admissions after
// the GET only lower it. Above Rate/20 + goroutines, a lease was over its
// bound.
//
// Not parallel: how many goroutines really run at once is what it tests.
func TestLeaseHoldBound(t *testing.T) {
	mk := serverEnv(t)
	for _, goroutines := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("%d goroutines", goroutines), func(t *testing.T) {
			e := mk(t)
			ctx := context.Background()
			l := e.limiter()
			t.Cleanup(func() { _ = l.Close(ctx) }) // closed below, unless the test failed first
			key := e.key("hot", holdLimit.Window, e.windowIndex(holdLimit.Window))
			counted := func() (int64, error) {
				n, err := e.client.Get(ctx, key).Int64()
				if errors.Is(err, redis.Nil) {
					return 0, nil
				}
				return n, err
			}

			var (
				admitted atomic.Int64
				errs     firstError
				workers  sync.WaitGroup
			)
			for range goroutines {
				workers.Go(func() {
					for range holdDecisions / goroutines {
						res, err := l.Allow(ctx, "hot", holdLimit)
						if err == nil && (!res.Allowed || res.Degraded) {
							err = fmt.Errorf("a decision was not allowed from Redis: %+v", res)
						}
						if err != nil {
							errs.report(err)
							return
						}
						admitted.Add(1)
					}
				})
			}
			done := make(chan struct{})
			var maxUnused, samples int64
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					select {
					case <-done:
						return
					default:
					}
					n, err := counted() // first: see the doc comment
					if err != nil {
						errs.report(err)
						return
					}
					maxUnused = max(maxUnused, n-admitted.Load())
					samples++
				}
			}()
			workers.Wait()
			close(done)
			<-sampled
			require.NoError(t, errs.get())
			require.Equal(t, int64(holdDecisions/goroutines*goroutines), admitted.Load())

			// Once the callers are done, nothing is in flight: exact.
			n, err := counted()
			require.NoError(t, err)
			held := l.Stats().LeasedUnits
			require.Equal(t, n-admitted.Load(), held, "counted in Redis and not admitted is what the leases hold")
			maxUnused = max(maxUnused, held)

			// Close gives back every unit the leases hold.
			require.NoError(t, l.Close(ctx))
			n, err = counted()
			require.NoError(t, err)
			require.Equal(t, admitted.Load(), n, "after Close Redis holds exactly what was admitted")
			st := l.Stats()
			require.Zero(t, st.LeasedUnits)
			require.Zero(t, st.LeaseUnitsLost)

			bound := leaseBound(holdLimit) + int64(goroutines)
			t.Logf("%2d goroutines: max unused %7d, bound %7d (Rate/20 %d + %d in flight), %d samples, %d held at the end",
				goroutines, maxUnused, bound, leaseBound(holdLimit), goroutines, samples, held)
			require.LessOrEqual(t, maxUnused, bound,
				"%d goroutines: Redis counted up to %d units more than was admitted, above Rate/20 = %d plus %d in flight",
				goroutines, maxUnused, leaseBound(holdLimit), goroutines)
		})
	}
}

// leaseBound is the most a process may hold unused of limit, per id:
// Rate/20 (docs/leases.md).
func leaseBound(limit ratelimit.Limit) int64 { return max(1, limit.Rate/20) }

// crashPrefix is the key prefix of TestLeaseHoldCrash's child.
const crashPrefix = "TestLeaseHoldCrash"

// A process killed without Close strands in Redis what its leases held:
// at most Rate/20 per id, plus its requests in flight, however many of its
// goroutines were deciding (docs/leases.md: "One that exits without Close
// leaves what its leases held (up to Rate/20 per id and limit)").
//
// The test binary runs itself as a child, whose 16 goroutines decide one
// hot id, holdDecisions in all, and count each admission in a file they
// map shared: what the file says survives the SIGKILL the test sends
// ~300 ms in. By then the child has often made all its decisions and
// waits, as a process that dies soon after its last ones: its sweeper
// gives back only what no decision used for about a second.
func TestLeaseHoldCrash(t *testing.T) {
	if addr := os.Getenv("RATELIMIT_LEASE_CRASH_ADDR"); addr != "" {
		crashChild(addr, os.Getenv("RATELIMIT_LEASE_CRASH_FILE"))
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("skipping: the child counts its admissions in a file mapped with syscall.Mmap; this test runs on Linux")
	}
	srv := redistest.Start(t)
	e := env{client: srv.Client(t), clock: clock.NewFake(epoch), prefix: crashPrefix}
	file := filepath.Join(t.TempDir(), "admitted")
	require.NoError(t, os.WriteFile(file, make([]byte, 8), 0o600))

	child := exec.Command(os.Args[0], "-test.run", "^TestLeaseHoldCrash$")
	child.Env = append(os.Environ(), "RATELIMIT_LEASE_CRASH_ADDR="+srv.Addr, "RATELIMIT_LEASE_CRASH_FILE="+file)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	stdout := bufio.NewReader(out)
	line, err := stdout.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "deciding\n", line)
	time.Sleep(300 * time.Millisecond) // the child decides meanwhile
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	rest, _ := io.ReadAll(stdout)
	_ = child.Wait()
	ws := child.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child ended before it was killed: %s\n%s", child.ProcessState, rest)

	// Redis may still run a call the child sent before it died: wait until
	// it has closed the child's connections, which it does after.
	ctx := context.Background()
	require.Eventually(t, func() bool {
		list, err := e.client.ClientList(ctx).Result()
		return err == nil && !strings.Contains(list, "name=leasehold-child")
	}, 10*time.Second, time.Millisecond)

	mem, err := os.ReadFile(file)
	require.NoError(t, err)
	admitted := int64(binary.NativeEndian.Uint64(mem))
	require.Positive(t, admitted)
	counted := e.get(t, "hot", holdLimit.Window, e.windowIndex(holdLimit.Window))
	stranded, bound := counted-admitted, leaseBound(holdLimit)+16
	t.Logf("killed: admitted %d, counted %d, stranded %d, bound %d (Rate/20 %d + 16 in flight)",
		admitted, counted, stranded, bound, leaseBound(holdLimit))
	require.GreaterOrEqual(t, stranded, int64(0), "Redis counted every admission")
	require.LessOrEqual(t, stranded, bound,
		"a killed process stranded %d units, above Rate/20 = %d plus 16 in flight", stranded, leaseBound(holdLimit))
}

// crashChild is TestLeaseHoldCrash's child: 16 goroutines decide holdLimit
// for one hot id, holdDecisions in all, adding each admission to the int64
// that file holds, mapped shared; then they wait to be killed.
func crashChild(addr, file string) {
	fail := func(err error) {
		fmt.Println("child:", err)
		os.Exit(1)
	}
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		fail(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, 8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		fail(err)
	}
	admitted := (*int64)(unsafe.Pointer(&mem[0])) // page-aligned
	client := redis.NewClient(&redis.Options{Addr: addr, ClientName: "leasehold-child"})
	l := ratelimit.New(client, ratelimit.WithPrefix(crashPrefix), ratelimit.WithTimeout(time.Minute),
		ratelimit.WithClock(clock.NewFake(epoch).Now))
	fmt.Println("deciding")
	for range 16 {
		go func() {
			for range holdDecisions / 16 {
				res, err := l.Allow(context.Background(), "hot", holdLimit)
				if err == nil && (!res.Allowed || res.Degraded) {
					err = fmt.Errorf("a decision was not allowed from Redis: %+v", res)
				}
				if err != nil {
					fail(err)
				}
				atomic.AddInt64(admitted, 1)
			}
		}()
	}
	select {}
}
