// Command gubernator runs the bench's hot-id workload (bench.RunHot) on a
// cluster of github.com/gubernator-io/gubernator/v2 peers inside this
// process, with the GLOBAL behaviour: each of -peers daemons
// (gubernator.SpawnDaemon on free loopback ports, default Behaviors) is one
// server, called over gRPC by -c goroutines through a client of its own,
// all on one key, against a limit of -rate per -window that is reached.
// It prints one JSON line (bench.HotResult, kind "hot", every admitted
// decision accounted per window) for `bench hottable`.
//
// A module of its own, outside the workspace (GOWORK=off), so that the
// bench module and the workspace never pull in gubernator's dependencies:
//
//	cd bench/gubernator && GOWORK=off go run . -peers 8 -c 8 -rate 10000 -duration 5s
//
// bench/gubernator.sh runs it over rounds beside the leased mode.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
	"github.com/slidingwindow/ratelimit/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gubernator:", err)
		os.Exit(1)
	}
}

func run() error {
	peers := flag.Int("peers", 8, "gubernator daemons in the cluster, each a server of the workload")
	conc := flag.Int("c", 8, "goroutines per peer")
	rate := flag.Int64("rate", 10_000, "the limit, per -window")
	window := flag.Duration("window", time.Second, "the limit's duration")
	algorithm := flag.String("algorithm", "token", "token (TOKEN_BUCKET, gubernator's default) or leaky (LEAKY_BUCKET)")
	dur := flag.Duration("duration", 5*time.Second, "measured time")
	warmup := flag.Duration("warmup", 300*time.Millisecond, "unmeasured time before, same load")
	round := flag.Int("round", 1, "round number, copied into the JSON")
	flag.Parse()
	algo := gubernator.Algorithm_TOKEN_BUCKET
	switch *algorithm {
	case "token":
	case "leaky":
		algo = gubernator.Algorithm_LEAKY_BUCKET
	default:
		return fmt.Errorf("-algorithm %q: token or leaky", *algorithm)
	}

	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	log.SetOutput(os.Stderr)
	ctx := context.Background()
	var daemons []*gubernator.Daemon
	defer func() { closeAll(daemons) }()
	var infos []gubernator.PeerInfo
	for i := range *peers {
		grpcAddr, err := freeAddr()
		if err != nil {
			return err
		}
		httpAddr, err := freeAddr()
		if err != nil {
			return err
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		d, err := gubernator.SpawnDaemon(sctx, gubernator.DaemonConfig{
			Logger:            log.WithField("peer", i),
			InstanceID:        grpcAddr,
			GRPCListenAddress: grpcAddr,
			HTTPListenAddress: httpAddr,
			AdvertiseAddress:  grpcAddr,
		})
		cancel()
		if err != nil {
			return fmt.Errorf("peer %d on %s: %w", i, grpcAddr, err)
		}
		daemons = append(daemons, d)
		infos = append(infos, gubernator.PeerInfo{GRPCAddress: d.GRPCListeners[0].Addr().String(), HTTPAddress: d.HTTPListener.Addr().String()})
	}
	for _, d := range daemons {
		d.SetPeers(infos)
	}

	servers := make([]bench.Decider, len(daemons))
	for i, info := range infos {
		client, err := gubernator.DialV1Server(info.GRPCAddress, nil)
		if err != nil {
			return fmt.Errorf("dialling peer %d: %w", i, err)
		}
		servers[i] = &decider{client: client, limit: *rate, duration: window.Milliseconds(), algorithm: algo}
	}
	res, err := bench.RunHot(ctx, bench.HotConfig{
		Name: "gubernator/global/" + *algorithm, Servers: servers, Concurrency: *conc, ID: "hot",
		Duration: *dur, Warmup: *warmup, Rate: *rate, Window: *window, Windows: true, Round: *round,
	})
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Printf("%s\n", b)
	if !res.OK {
		return fmt.Errorf("%s: %s", res.Name, res.Problem)
	}
	return nil
}

// decider asks one peer for one hit of the key "hot", GLOBAL.
type decider struct {
	client          gubernator.V1Client
	limit, duration int64
	algorithm       gubernator.Algorithm
}

func (d *decider) Allow(ctx context.Context, _ string) (bool, error) {
	req := &gubernator.RateLimitReq{
		Name: "bench", UniqueKey: "hot", Hits: 1, Limit: d.limit, Duration: d.duration,
		Algorithm: d.algorithm, Behavior: gubernator.Behavior_GLOBAL,
	}
	resp, err := d.client.GetRateLimits(ctx, &gubernator.GetRateLimitsReq{Requests: []*gubernator.RateLimitReq{req}})
	if err != nil {
		return false, err
	}
	if len(resp.Responses) != 1 {
		return false, fmt.Errorf("%d responses to one request", len(resp.Responses))
	}
	r := resp.Responses[0]
	if r.Error != "" {
		return false, fmt.Errorf("gubernator: %s", r.Error)
	}
	return r.Status == gubernator.Status_UNDER_LIMIT, nil
}

func (d *decider) Close() error {
	if c, ok := d.client.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// closeAll closes the daemons, giving up after 5s: a Daemon's Close has
// been seen to hang here now and then, after the measurement.
func closeAll(daemons []*gubernator.Daemon) {
	done := make(chan struct{})
	go func() {
		for _, d := range daemons {
			d.Close()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		fmt.Fprintln(os.Stderr, "gubernator: the daemons did not close within 5s; exiting without them")
	}
}

// freeAddr returns a loopback address whose port was free just now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
