package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// smallConfig is a study small enough for a test: 100 per 6 s, 20 windows.
func smallConfig() config {
	return config{Rate: 100, Window: 6000, Windows: 20, Clients: 3, Attackers: 2, Seed: 7}
}

func outcomeOf(t *testing.T, tr traceResult, algo string) outcome {
	t.Helper()
	for _, o := range tr.outcomes {
		if o.algo == algo {
			return o
		}
	}
	t.Fatalf("no outcome of %s on %s", algo, tr.name)
	return outcome{}
}

// TestBounds checks on every trace what holds by construction: the exact
// log and strict mode never put more than R in a span of W, the exact log
// wrongly decides nothing, and nothing puts more than 2R in a span of W
// (each span meets at most two fixed windows; GCRA's bucket holds R and
// refills R per W).
func TestBounds(t *testing.T) {
	c := smallConfig()
	s := runStudy(c)
	for _, tr := range s.traces {
		t.Run(tr.name, func(t *testing.T) {
			if len(tr.reqs) == 0 {
				t.Fatal("empty trace")
			}
			exact := outcomeOf(t, tr, "exact log")
			if exact.worst > c.Rate || exact.wrongAllow != 0 || exact.wrongDeny != 0 || exact.rateError != 0 {
				t.Errorf("exact log: %+v", exact)
			}
			if strict := outcomeOf(t, tr, "strict (k=10)"); strict.worst > c.Rate || strict.wrongAllow != 0 {
				t.Errorf("strict: %+v", strict)
			}
			for _, o := range tr.outcomes {
				if o.worst > 2*c.Rate {
					t.Errorf("%s: %d in a span of W, over 2R", o.algo, o.worst)
				}
			}
		})
	}
}

// TestBoundaryAttack checks the attacks do what the report says: the fixed
// window lets the boundary attacker put nearly 2R in a span of W, the
// sliding window lets the precise attacker through every time with 2R, and
// count-denied shuts the boundary attacker out after its first R.
func TestBoundaryAttack(t *testing.T) {
	c := smallConfig()
	s := runStudy(c)
	bnd, precise := s.trace("boundary attacker"), s.trace("precise attacker")

	if fixed := outcomeOf(t, *bnd, "fixed window"); fixed.worst < 19*c.Rate/10 {
		t.Errorf("fixed window on the boundary attacker: %d in a span of W, want nearly 2R", fixed.worst)
	}
	if denied := outcomeOf(t, *bnd, "count-denied"); denied.worst > c.Rate {
		t.Errorf("count-denied on the boundary attacker: %d in a span of W, want at most R", denied.worst)
	}
	sliding := outcomeOf(t, *precise, "sliding (this library)")
	if sliding.admitted != sliding.requests || sliding.worst != 2*c.Rate {
		t.Errorf("sliding on the precise attacker: admitted %d of %d, %d in a span of W; want all and 2R",
			sliding.admitted, sliding.requests, sliding.worst)
	}
}

// TestDeciders checks each algorithm's rule on a few hand-made requests.
func TestDeciders(t *testing.T) {
	lim := limit{rate: 3, w: 100}
	for _, tc := range []struct {
		algo string
		reqs []int64 // ms of cost-1 requests
		want string  // A allowed, d denied
	}{
		{"exact log", []int64{0, 50, 99, 99, 100, 149, 150}, "AAAdAdA"},
		{"fixed window", []int64{0, 50, 99, 99, 100, 101, 102, 103}, "AAAdAAAd"},
		// Window 1 weighs window 0's 3 by floor(3×(100-e)/100): 3 at e=0,
		// 2 from e=1, 1 from e=34.
		{"sliding (this library)", []int64{10, 20, 30, 100, 101, 133, 134, 134}, "AAAdAdAd"},
		// The same, but the denials at 100, 101 and 134 fill window 1, which
		// then weighs on window 2 as the previous count.
		{"count-denied", []int64{10, 20, 30, 100, 101, 134, 250, 260, 300, 301, 302}, "AAAdddAAAAd"},
		// Burst 3 at once, then one per emission interval of 100/3 ms.
		{"GCRA (redis_rate)", []int64{0, 0, 0, 0, 33, 34, 66, 67}, "AAAddAdA"},
		// Sub-windows of 10 ms: the request at 9 counts until 110.
		{"strict (k=10)", []int64{9, 9, 9, 100, 109, 110}, "AAAddA"},
	} {
		t.Run(tc.algo, func(t *testing.T) {
			d := algorithmNamed(tc.algo).new(lim)
			var got []byte
			for _, ms := range tc.reqs {
				if d.allow(ms, 1) {
					got = append(got, 'A')
				} else {
					got = append(got, 'd')
				}
			}
			if string(got) != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// TestCountDeniedCap checks a denial adds its cost to the current count up
// to the rate, as the script does (math.min(cost, rate - cur)), and never
// lowers a count already above it.
func TestCountDeniedCap(t *testing.T) {
	d := algorithmNamed("count-denied").new(limit{rate: 10, w: 1000}).(*sliding)
	for _, tc := range []struct {
		t, n    int64
		allowed bool
		cur     int64 // the current count after the request
	}{
		{0, 4, true, 4},
		{1, 7, false, 10},       // 4 + 7 > 10: denied, 6 of its 7 counted
		{2, 1, false, 10},       // denied, nothing left to count
		{3, 1 << 40, false, 10}, // a cost above the rate adds nothing either
		{1000, 3, false, 3},     // the next window: 10 weigh 10, denied, counted
		{1001, 20, false, 10},   // above the rate: fills the count to the rate
	} {
		if got := d.allow(tc.t, tc.n); got != tc.allowed || d.cur != tc.cur {
			t.Errorf("at %d cost %d: allowed %v, current count %d; want %v, %d", tc.t, tc.n, got, d.cur, tc.allowed, tc.cur)
		}
	}
	// A count above the rate (admitted before a smaller limit) stays as it is.
	d = algorithmNamed("count-denied").new(limit{rate: 5, w: 1000}).(*sliding)
	d.cur = 8
	if d.allow(0, 1) || d.cur != 8 {
		t.Errorf("count above the rate: current count %d, want 8", d.cur)
	}
}

// TestDeterministic checks one seed gives one report and one figure, and
// another seed other traces.
func TestDeterministic(t *testing.T) {
	c := smallConfig()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	for i, dir := range dirs {
		cfg := c
		if i == 2 {
			cfg.Seed++
		}
		if err := write(dir, runStudy(cfg)); err != nil {
			t.Fatal(err)
		}
	}
	read := func(dir, name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, name := range []string{"accuracy.md", "accuracy.svg"} {
		if !bytes.Equal(read(dirs[0], name), read(dirs[1], name)) {
			t.Errorf("%s differs between two runs of one seed", name)
		}
	}
	if bytes.Equal(read(dirs[0], "accuracy.md"), read(dirs[2], "accuracy.md")) {
		t.Error("accuracy.md is the same for two seeds")
	}
}

// TestChartIsXML checks the figure is well-formed XML with a line per panel.
func TestChartIsXML(t *testing.T) {
	c := smallConfig()
	svg, err := renderChart(c, runStudy(c).chart)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(svg))
	lines := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v", err)
		}
		if el, ok := tok.(xml.StartElement); ok && el.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != len(chartAlgorithms) {
		t.Errorf("%d lines, want %d", lines, len(chartAlgorithms))
	}
}

// A leased limit never breaks the sliding rule for what it admitted, on any
// demand or number of servers, and under-uses little.
func TestLeases(t *testing.T) {
	c := leaseConfig{Rate: 400, Window: 1000, Windows: 6, Servers: []int{1, 4}, Seed: 3}
	rows, err := runLeases(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(leaseDemands)*len(c.Servers) {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.over != 0 {
			t.Errorf("%s on %d servers: the rule broken at %d admissions", r.demand, r.servers, r.over)
		}
		// What N servers can hold unused: N leases of at most R/20.
		if bound := float64(r.servers) / 20; r.underUse() > bound {
			t.Errorf("%s on %d servers: under-use %.3f above %.3f", r.demand, r.servers, r.underUse(), bound)
		}
		if r.unleased == 0 || r.fromLease == 0 {
			t.Errorf("%s on %d servers: %+v", r.demand, r.servers, r)
		}
	}
}
