package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Results holds the JSON lines of a whole run, as Table reads them.
type Results struct {
	Runs   []RunResult
	Memory []MemoryResult
}

// ReadResults reads JSON lines of RunResult and MemoryResult, told apart by
// their "kind", from r; blank lines are skipped.
func ReadResults(r io.Reader) (Results, error) {
	var res Results
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var kind struct {
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(line, &kind); err != nil {
			return res, fmt.Errorf("bench: line %d: %w", n, err)
		}
		switch kind.Kind {
		case "run":
			var v RunResult
			if err := json.Unmarshal(line, &v); err != nil {
				return res, fmt.Errorf("bench: line %d: %w", n, err)
			}
			res.Runs = append(res.Runs, v)
		case "memory":
			var v MemoryResult
			if err := json.Unmarshal(line, &v); err != nil {
				return res, fmt.Errorf("bench: line %d: %w", n, err)
			}
			res.Memory = append(res.Memory, v)
		default:
			return res, fmt.Errorf("bench: line %d: unknown kind %q", n, kind.Kind)
		}
	}
	return res, sc.Err()
}

// spread is the median, least and greatest of a few measurements.
type spread struct{ med, lo, hi float64 }

func spreadOf(xs []float64) spread {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return spread{}
	}
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{med, s[0], s[len(s)-1]}
}

// format prints the spread as "med (lo–hi)" with digits decimals, or just
// "med" when there was one measurement.
func (s spread) format(digits int) string {
	f := func(v float64) string { return groupThousands(fmt.Sprintf("%.*f", digits, v)) }
	if s.lo == s.hi {
		return f(s.med)
	}
	return f(s.med) + " (" + f(s.lo) + "–" + f(s.hi) + ")"
}

// times prints the spread of a multiple: "med× (lo–hi)".
func (s spread) times(digits int) string {
	f := s.format(digits)
	if med, rest, ok := strings.Cut(f, " "); ok {
		return med + "× " + rest
	}
	return f + "×"
}

// groupThousands puts commas in the integer part of a formatted number.
func groupThousands(s string) string {
	intPart, frac, _ := strings.Cut(s, ".")
	neg := strings.HasPrefix(intPart, "-")
	intPart = strings.TrimPrefix(intPart, "-")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	out := b.String()
	if neg {
		out = "-" + out
	}
	if frac != "" {
		out += "." + frac
	}
	return out
}

// Table writes res as markdown: for each scenario one table of runs
// (medians over rounds, with min–max), then the memory table and a legend.
// Contenders come in the order of Contenders, then any unknown ones by name.
func Table(w io.Writer, res Results) error {
	order := contenderOrder(res)
	var b strings.Builder
	for _, sc := range scenarioOrder(res) {
		fmt.Fprintf(&b, "### Scenario %q", sc.Name)
		if sc.About != "" {
			fmt.Fprintf(&b, ": %s", sc.About)
		}
		b.WriteString("\n\n")
		b.WriteString("| contender | goroutines | decisions/s | vs ours | p50 µs | p99 µs | allocs/decision | B/decision | " +
			"client CPU µs/decision | Redis CPU µs/decision | script calls/decision | script µs/call | call × " + BareCounter + " | " +
			"script µs/decision | decision × " + BareCounter + " | allowed | denied | > 100 ms | degraded | rounds |\n")
		b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, conc := range concurrencies(res, sc.Name) {
			base := spreadOf(pick(res.Runs, sc.Name, conc, "ours", perSecond)).med
			for _, name := range order {
				runs := filter(res.Runs, sc.Name, conc, name)
				if len(runs) == 0 {
					continue
				}
				get := func(f func(RunResult) float64) spread {
					return spreadOf(pick(res.Runs, sc.Name, conc, name, f))
				}
				rate := get(perSecond)
				vs := "–"
				if c, err := Lookup(name); base > 0 && (err != nil || !c.Offline) {
					vs = fmt.Sprintf("%.2f×", rate.med/base)
				}
				var allowed, denied, slow, degraded, decisions int64
				bad := 0
				for _, r := range runs {
					allowed += r.Allowed
					denied += r.Denied
					degraded += r.Degraded
					slow += r.Slow
					decisions += r.Decisions
					if !r.OK {
						bad++
					}
				}
				rounds := fmt.Sprint(len(runs))
				if bad > 0 {
					rounds += fmt.Sprintf(" (%d FAILED)", bad)
				}
				redisCPU, calls := "–", "–"
				script := [4]string{"–", "–", "–", "–"}
				if c, err := Lookup(name); err != nil || !c.Offline {
					redisCPU = get(func(r RunResult) float64 { return r.RedisCPUPerDecision }).format(1)
					calls = get(func(r RunResult) float64 { return r.ScriptCallsPerDecision }).format(3)
					script = scriptCells(runs, filter(res.Runs, sc.Name, conc, BareCounter))
				}
				fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %d | %s |\n",
					name, conc, rate.format(0), vs,
					get(func(r RunResult) float64 { return r.P50 }).format(1),
					get(func(r RunResult) float64 { return r.P99 }).format(1),
					get(func(r RunResult) float64 { return r.AllocsPerDecision }).format(1),
					get(func(r RunResult) float64 { return r.BytesPerDecision }).format(0),
					get(func(r RunResult) float64 { return r.ClientCPUPerDecision }).format(1),
					redisCPU, calls, script[0], script[1], script[2], script[3],
					share(allowed, decisions), share(denied, decisions), slow, degraded, rounds)
			}
		}
		b.WriteString("\n")
	}
	if len(res.Memory) > 0 {
		b.WriteString("### Redis memory per tracked client\n\n")
		fmt.Fprintf(&b, "INFO memory used_memory delta over %s clients, each making one allowed request (limit %v), "+
			"divided by the clients; then each client active in two consecutive windows.\n\n",
			groupThousands(fmt.Sprint(res.Memory[0].Clients)), MemoryLimit)
		b.WriteString("| contender | B/client, 1 window | keys/client | B/client, 2 windows | keys/client |\n")
		b.WriteString("|---|--:|--:|--:|--:|\n")
		for _, name := range order {
			cells := []string{"–", "–", "–", "–"}
			found := false
			for _, m := range res.Memory {
				if m.Contender != name || (m.Windows != 1 && m.Windows != 2) {
					continue
				}
				found = true
				i := 2 * (m.Windows - 1)
				cells[i] = fmt.Sprintf("%.1f", m.BytesPerClient)
				if m.Retried > 0 {
					cells[i] += fmt.Sprintf(" (%d calls retried)", m.Retried)
				}
				if !m.OK {
					cells[i] += " (FAILED: " + m.Problem + ")"
				}
				cells[i+1] = fmt.Sprintf("%.2f", m.KeysPerClient)
				if m.Windows == 2 && !m.Clocked {
					cells[i+1] += "†"
				}
			}
			if found {
				fmt.Fprintf(&b, "| %s | %s |\n", name, strings.Join(cells, " | "))
			}
		}
		b.WriteString("\n† keeps one key per client whatever the time (GCRA, or a fixed window keyed by id alone): " +
			"its second request came at once, in real time.\n\n")
	}
	b.WriteString("Contenders:\n\n")
	for _, name := range order {
		about := "(not registered in this build)"
		if c, err := Lookup(name); err == nil {
			about = c.About
		}
		fmt.Fprintf(&b, "- **%s**: %s\n", name, about)
	}
	if failed := failures(res); len(failed) > 0 {
		b.WriteString("\nFAILED runs:\n\n")
		for _, f := range failed {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// BareCounter is the contender whose Redis time per script call the table
// weighs every row's against: INCR and PEXPIRE, the least a counter costs.
const BareCounter = "bare/incr"

// scriptCells returns the table's script cells for runs, the rounds of one
// row: Redis's µs per script call (rounds with no call left out) and its
// multiple of bare's per call, then µs per decision and its multiple of
// bare's per call (bare makes one call a decision). A multiple is taken
// within each round, against bare's run of the same round, scenario and
// goroutines, which ran moments apart (a failed bare run is no measure);
// the cell is their median.
func scriptCells(runs, bare []RunResult) [4]string {
	var perCall, perDecision, xCall, xDecision []float64
	for _, r := range runs {
		perDecision = append(perDecision, r.ScriptUsPerDecision)
		var base float64
		if i := slices.IndexFunc(bare, func(b RunResult) bool { return b.Round == r.Round && b.OK }); i >= 0 {
			base, _ = bare[i].scriptUsPerCall()
		}
		if base > 0 {
			xDecision = append(xDecision, r.ScriptUsPerDecision/base)
		}
		if us, ok := r.scriptUsPerCall(); ok {
			perCall = append(perCall, us)
			if base > 0 {
				xCall = append(xCall, us/base)
			}
		}
	}
	cells := [4]string{"–", "–", "–", "–"}
	for i, xs := range [][]float64{perCall, xCall, perDecision, xDecision} {
		if len(xs) == 0 {
			continue
		}
		if i%2 == 0 {
			cells[i] = spreadOf(xs).format(1)
		} else {
			cells[i] = spreadOf(xs).times(2)
		}
	}
	return cells
}

// scriptUsPerCall returns Redis's time per script call of r, in µs, and
// false if r made none.
func (r RunResult) scriptUsPerCall() (float64, bool) {
	if r.ScriptCallsPerDecision <= 0 {
		return 0, false
	}
	return r.ScriptUsPerDecision / r.ScriptCallsPerDecision, true
}

// Failed reports whether any run or measurement in res is not OK.
func (res Results) Failed() bool { return len(failures(res)) > 0 }

func failures(res Results) []string {
	var out []string
	for _, r := range res.Runs {
		if !r.OK {
			out = append(out, fmt.Sprintf("%s, %s, %d goroutines, round %d: %s", r.Contender, r.Scenario, r.Concurrency, r.Round, r.Problem))
		}
	}
	for _, m := range res.Memory {
		if !m.OK {
			out = append(out, fmt.Sprintf("%s, memory, %d windows: %s", m.Contender, m.Windows, m.Problem))
		}
	}
	return out
}

func perSecond(r RunResult) float64 { return r.PerSecond }

func share(part, whole int64) string {
	if whole == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(part)/float64(whole))
}

func filter(runs []RunResult, scenario string, conc int, name string) []RunResult {
	var out []RunResult
	for _, r := range runs {
		if r.Scenario == scenario && r.Concurrency == conc && r.Contender == name {
			out = append(out, r)
		}
	}
	return out
}

func pick(runs []RunResult, scenario string, conc int, name string, f func(RunResult) float64) []float64 {
	var out []float64
	for _, r := range filter(runs, scenario, conc, name) {
		out = append(out, f(r))
	}
	return out
}

// contenderOrder lists the contenders in res: registered ones first, in
// their order, then the rest by name.
func contenderOrder(res Results) []string {
	seen := map[string]bool{}
	for _, r := range res.Runs {
		seen[r.Contender] = true
	}
	for _, m := range res.Memory {
		seen[m.Contender] = true
	}
	var order []string
	for _, name := range Names() {
		if seen[name] {
			order = append(order, name)
			delete(seen, name)
		}
	}
	var rest []string
	for name := range seen {
		rest = append(rest, name)
	}
	slices.Sort(rest)
	return append(order, rest...)
}

// scenarioOrder lists the scenarios in res, registered ones first.
func scenarioOrder(res Results) []Scenario {
	seen := map[string]bool{}
	for _, r := range res.Runs {
		seen[r.Scenario] = true
	}
	var out []Scenario
	for _, s := range Scenarios() {
		if seen[s.Name] {
			out = append(out, s)
			delete(seen, s.Name)
		}
	}
	var rest []string
	for name := range seen {
		rest = append(rest, name)
	}
	slices.Sort(rest)
	for _, name := range rest {
		out = append(out, Scenario{Name: name})
	}
	return out
}

func concurrencies(res Results, scenario string) []int {
	var out []int
	for _, r := range res.Runs {
		if r.Scenario == scenario && !slices.Contains(out, r.Concurrency) {
			out = append(out, r.Concurrency)
		}
	}
	slices.Sort(out)
	return out
}
