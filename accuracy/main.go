// Command accuracy measures how the library's sliding window decides against
// the exact sliding log, next to a fixed window, GCRA (as go-redis/redis_rate
// does it), strict mode and count-denied mode, on seeded traces of honest
// clients and attackers, and what a leased limit under-uses against an
// unleased one (running the library on miniredis). It writes
// docs/accuracy.md and docs/accuracy.svg:
//
//	cd accuracy && go run .
//
// It is a module of its own so that its code never reaches the library's
// users. It decides with the library's arithmetic (window.go), which
// window_test.go holds to the library's own decisions.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

func main() {
	out := flag.String("out", filepath.Join("..", "docs"), "directory to write accuracy.md and accuracy.svg to")
	seed := flag.Uint64("seed", 1, "seed the traces are drawn from")
	flag.Parse()

	start := time.Now()
	c := defaultConfig()
	c.Seed = *seed
	s := runStudy(c)
	s.leaseConfig = defaultLeaseConfig()
	s.leaseConfig.Seed = *seed
	var err error
	if s.leases, err = runLeases(s.leaseConfig); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, r := range s.leases {
		if r.over > 0 {
			fmt.Fprintf(os.Stderr, "accuracy: a leased limit broke the sliding rule at %d admissions (%s, %d servers)\n", r.over, r.demand, r.servers)
			os.Exit(1)
		}
	}
	if err := write(*out, s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s and %s in %v\n", filepath.Join(*out, "accuracy.md"), filepath.Join(*out, "accuracy.svg"),
		time.Since(start).Round(time.Millisecond))
}

// write writes the study's report and figure to dir.
func write(dir string, s *study) error {
	svg, err := renderChart(s.config, s.chart)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("accuracy: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "accuracy.md"), []byte(s.markdown()), 0o644); err != nil {
		return fmt.Errorf("accuracy: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "accuracy.svg"), svg, 0o644); err != nil {
		return fmt.Errorf("accuracy: %w", err)
	}
	return nil
}
