package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"slices"
	"strings"
	"time"
)

// ReadHotResults reads the JSON lines of HotResult (kind "hot") from r;
// blank lines are skipped.
func ReadHotResults(r io.Reader) ([]HotResult, error) {
	var out []HotResult
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var v HotResult
		if err := json.Unmarshal(line, &v); err != nil {
			return nil, fmt.Errorf("bench: line %d: %w", n, err)
		}
		if v.Kind != "hot" {
			return nil, fmt.Errorf("bench: line %d: kind %q, not hot", n, v.Kind)
		}
		out = append(out, v)
	}
	return out, sc.Err()
}

// hotCell is the runs of one row: one mode on one fleet against one limit,
// accounted per window or not.
type hotCell struct {
	name              string
	servers, conc     int
	rate, windowMs    int64
	accounted         bool
	runs              []HotResult
	failed            int
	firstProblem      string
	firstProblemRound int
}

// HotTable writes the hot-id results as markdown: one table of the runs
// that every decision was allowed in, one of those accounted per window
// (a limit that is reached); medians with min–max over rounds. Modes come
// in HotModes's order, then any others by name. Failed runs are left out
// of the figures (a row with no other run, altogether) and listed at the
// end.
func HotTable(w io.Writer, results []HotResult) error {
	var cells []*hotCell
	find := func(r HotResult) *hotCell {
		for _, c := range cells {
			if c.name == r.Name && c.servers == r.Servers && c.conc == r.Concurrency &&
				c.rate == r.Rate && c.windowMs == r.WindowMs && c.accounted == (r.Admission != nil) {
				return c
			}
		}
		c := &hotCell{name: r.Name, servers: r.Servers, conc: r.Concurrency, rate: r.Rate, windowMs: r.WindowMs, accounted: r.Admission != nil}
		cells = append(cells, c)
		return c
	}
	for _, r := range results {
		c := find(r)
		if !r.OK {
			c.failed++
			if c.firstProblem == "" {
				c.firstProblem, c.firstProblemRound = r.Problem, r.Round
			}
			continue
		}
		c.runs = append(c.runs, r)
	}
	rank := func(name string) int {
		if i := slices.Index(HotModes, name); i >= 0 {
			return i
		}
		return len(HotModes)
	}
	slices.SortStableFunc(cells, func(a, b *hotCell) int {
		if ra, rb := rank(a.name), rank(b.name); ra != rb {
			return ra - rb
		}
		return strings.Compare(a.name, b.name)
	})
	var b strings.Builder
	var allowed, accounted []*hotCell
	for _, c := range cells {
		if len(c.runs) == 0 {
			continue // only failed runs: listed at the end
		}
		if c.accounted {
			accounted = append(accounted, c)
		} else {
			allowed = append(allowed, c)
		}
	}
	if len(allowed) > 0 {
		b.WriteString("| mode | servers × goroutines | limit | decisions/s | × unleased | Redis calls / 1,000 decisions | p50 µs | p99 µs | " +
			"from a lease | lease p50 µs | lease p99 µs | Redis-decided p50 µs | client CPU µs/decision | Redis CPU µs/decision | allocs/decision | rounds |\n")
		b.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, c := range allowed {
			base := pairBase(cells, c, "unleased")
			fmt.Fprintf(&b, "| %s | %d × %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				c.name, c.servers, c.conc, limitText(c.rate, c.windowMs),
				c.spread(func(r HotResult) float64 { return r.PerSecond }).format(0),
				ratioCell(c, base),
				c.calls(2),
				c.spread(func(r HotResult) float64 { return r.P50 }).format(2),
				c.spread(func(r HotResult) float64 { return r.P99 }).format(1),
				c.percent(func(r HotResult) float64 { return r.LeaseShare }),
				c.ifAny(func(r HotResult) float64 { return r.LeaseShare }, func(r HotResult) float64 { return r.LeaseP50 }, 3),
				c.ifAny(func(r HotResult) float64 { return r.LeaseShare }, func(r HotResult) float64 { return r.LeaseP99 }, 2),
				c.ifAny(func(r HotResult) float64 { return r.RedisShare }, func(r HotResult) float64 { return r.RedisP50 }, 1),
				c.spread(func(r HotResult) float64 { return r.ClientCPUPerDecision }).format(2),
				c.ifAny(readStats, func(r HotResult) float64 { return r.RedisCPUPerDecision }, 3),
				c.spread(func(r HotResult) float64 { return r.AllocsPerDecision }).format(1),
				c.roundsText())
		}
	}
	if len(accounted) > 0 {
		if len(allowed) > 0 {
			b.WriteString("\n")
		}
		b.WriteString("| mode | servers × goroutines | limit | decisions/s | allowed | Redis calls / 1,000 decisions | windows | placed at | " +
			"worst window: admitted / limit | bound | worst sliding estimate / limit | bound | windows from the first admission: worst | " +
			"worst interval of a window's length / limit | calls across a window's edge | rounds |\n")
		b.WriteString("|---|---|---|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, c := range accounted {
			adm := func(f func(*Admission) float64, digits int) string {
				return c.spread(func(r HotResult) float64 { return f(r.Admission) }).format(digits)
			}
			placed := "the call's start"
			for _, r := range c.runs {
				if r.Admission.Placed {
					placed = "the limiter's clock"
				}
			}
			// The sliding estimate is this library's rule, not another's.
			estimate, estimateBound := "–", "–"
			if slices.Contains(HotModes, c.name) {
				estimate = adm(func(a *Admission) float64 { return a.WorstEstimate }, 4)
				estimateBound = adm(func(a *Admission) float64 { return a.WorstEstimateBound }, 4)
			}
			fmt.Fprintf(&b, "| %s | %d × %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				c.name, c.servers, c.conc, limitText(c.rate, c.windowMs),
				c.spread(func(r HotResult) float64 { return r.PerSecond }).format(0),
				c.percent(func(r HotResult) float64 { return float64(r.Allowed) / float64(max(r.Decisions, 1)) }),
				c.calls(1),
				adm(func(a *Admission) float64 { return float64(a.Windows) }, 0),
				placed,
				adm(func(a *Admission) float64 { return a.WorstWindow }, 4),
				adm(func(a *Admission) float64 { return a.WorstWindowBound }, 4),
				estimate, estimateBound,
				adm(func(a *Admission) float64 { return a.WorstFromFirst }, 4),
				adm(func(a *Admission) float64 { return a.WorstInterval }, 4),
				adm(func(a *Admission) float64 { return float64(a.Straddled) }, 0),
				c.roundsText())
		}
	}
	var failures []string
	for _, c := range cells {
		if c.failed > 0 {
			failures = append(failures, fmt.Sprintf("%s, %d × %d, %s, round %d: %s",
				c.name, c.servers, c.conc, limitText(c.rate, c.windowMs), c.firstProblemRound, c.firstProblem))
		}
	}
	if len(failures) > 0 {
		b.WriteString("\nFAILED runs (left out of the figures; the first of each row):\n\n")
		for _, f := range failures {
			b.WriteString("- " + f + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// readStats is 1 for a run whose Redis figures were read, 0 if not.
func readStats(r HotResult) float64 {
	if r.RedisStats {
		return 1
	}
	return 0
}

// calls formats the spread of Redis calls per 1,000 decisions, "–" if no
// run read them.
func (c *hotCell) calls(digits int) string {
	return c.ifAny(readStats, func(r HotResult) float64 { return r.ScriptCallsPer1000 }, digits)
}

func (c *hotCell) spread(f func(HotResult) float64) spread {
	xs := make([]float64, len(c.runs))
	for i, r := range c.runs {
		xs[i] = f(r)
	}
	return spreadOf(xs)
}

// percent formats the spread of a share as percentages: "48.6% (29.8–55.9%)",
// or "100.0%" when the least and greatest print alike.
func (c *hotCell) percent(f func(HotResult) float64) string {
	sp := c.spread(func(r HotResult) float64 { return 100 * f(r) })
	lo, med, hi := fmt.Sprintf("%.1f", sp.lo), fmt.Sprintf("%.1f", sp.med), fmt.Sprintf("%.1f", sp.hi)
	if lo == hi {
		return med + "%"
	}
	return med + "% (" + lo + "–" + hi + "%)"
}

// ifAny formats f's spread over the runs whose share is positive, "–" if
// none is.
func (c *hotCell) ifAny(share, f func(HotResult) float64, digits int) string {
	var xs []float64
	for _, r := range c.runs {
		if share(r) > 0 {
			xs = append(xs, f(r))
		}
	}
	if len(xs) == 0 {
		return "–"
	}
	return spreadOf(xs).format(digits)
}

func (c *hotCell) roundsText() string {
	if c.failed > 0 {
		return fmt.Sprintf("%d (%d FAILED)", len(c.runs)+c.failed, c.failed)
	}
	return fmt.Sprint(len(c.runs))
}

// pairBase returns the row of mode name on c's fleet and limit, nil if
// there is none or it is c.
func pairBase(cells []*hotCell, c *hotCell, name string) *hotCell {
	for _, o := range cells {
		if o != c && o.name == name && o.servers == c.servers && o.conc == c.conc &&
			o.rate == c.rate && o.windowMs == c.windowMs && o.accounted == c.accounted {
			return o
		}
	}
	return nil
}

// ratioCell is the median (min–max) of c's decisions/s over base's in the
// same round, over the rounds both have; "1.00×" for the base itself, "–"
// without one.
func ratioCell(c, base *hotCell) string {
	if base == nil {
		if c.name == "unleased" {
			return "1.00×"
		}
		return "–"
	}
	var xs []float64
	for _, r := range c.runs {
		for _, o := range base.runs {
			if o.Round == r.Round && o.PerSecond > 0 {
				xs = append(xs, r.PerSecond/o.PerSecond)
			}
		}
	}
	if len(xs) == 0 {
		return "–"
	}
	return spreadOf(xs).times(1)
}

// limitText says a limit: "10,000 per 1s", or "2^40 per 1s" for the
// limit so high that it is never reached.
func limitText(rate, windowMs int64) string {
	r := groupThousands(fmt.Sprint(rate))
	if rate >= 1<<40 && rate&(rate-1) == 0 {
		r = fmt.Sprintf("2^%d", bits.Len64(uint64(rate))-1)
	}
	return r + " per " + (time.Duration(windowMs) * time.Millisecond).String()
}
