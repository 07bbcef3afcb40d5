package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ScriptCostBare is the case of the root module's BenchmarkScriptCost that
// the others are weighed against: a bare INCR and PEXPIRE.
const ScriptCostBare = "bare-incr-pexpire"

// ScriptCost is one case of the root module's BenchmarkScriptCost in one
// round: what one kind of script call cost Redis (INFO commandstats).
type ScriptCost struct {
	Case          string  // the sub-benchmark's name, "one/denied" say
	UsPerCall     float64 // redis-µs/call
	UsPerDecision float64 // redis-µs/decision
}

// gomaxprocsSuffix is what go test appends to a benchmark's name.
var gomaxprocsSuffix = regexp.MustCompile(`-[0-9]+$`)

// ReadScriptCost reads one round: the output of one run of
// go test -bench ScriptCost, in which each case ran once. Lines that are not
// results of BenchmarkScriptCost are skipped.
func ReadScriptCost(r io.Reader) ([]ScriptCost, error) {
	var out []ScriptCost
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || !strings.HasPrefix(fields[0], "BenchmarkScriptCost/") {
			continue
		}
		c := ScriptCost{Case: gomaxprocsSuffix.ReplaceAllString(strings.TrimPrefix(fields[0], "BenchmarkScriptCost/"), "")}
		var perCall, perDecision bool
		// After the name and b.N: pairs of a value and its unit.
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("bench: %q: %w", sc.Text(), err)
			}
			switch fields[i+1] {
			case "redis-µs/call":
				c.UsPerCall, perCall = v, true
			case "redis-µs/decision":
				c.UsPerDecision, perDecision = v, true
			}
		}
		if !perCall || !perDecision {
			return nil, fmt.Errorf("bench: %q: no redis-µs/call and redis-µs/decision", sc.Text())
		}
		out = append(out, c)
	}
	return out, sc.Err()
}

// ScriptCostTable writes rounds of BenchmarkScriptCost as markdown: per
// case, in the order they ran, the median (min–max) over rounds of Redis's
// µs per call and per decision, and the median of the per-round ratios to
// ScriptCostBare's µs per call. A round's ratio pairs a case with the bare
// counter of the same round, measured on the same server moments before:
// the machine moves both, and their ratio less.
func ScriptCostTable(w io.Writer, rounds [][]ScriptCost) error {
	var order []string
	for _, round := range rounds {
		for _, c := range round {
			if !slices.Contains(order, c.Case) {
				order = append(order, c.Case)
			}
		}
	}
	if len(order) == 0 {
		return fmt.Errorf("bench: no BenchmarkScriptCost results")
	}
	var b strings.Builder
	b.WriteString("| case | decisions/call | Redis µs/call | Redis µs/decision | per call × " + ScriptCostBare +
		" | per decision × " + ScriptCostBare + " | rounds |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|\n")
	for _, name := range order {
		var perCall, perDecision, perDecisionOfCall, xCall, xDecision []float64 // over rounds
		for _, round := range rounds {
			i := slices.IndexFunc(round, func(c ScriptCost) bool { return c.Case == name })
			if i < 0 {
				continue
			}
			c := round[i]
			perCall = append(perCall, c.UsPerCall)
			perDecision = append(perDecision, c.UsPerDecision)
			if c.UsPerDecision > 0 {
				// A whole number, printed to 4 digits in each.
				perDecisionOfCall = append(perDecisionOfCall, math.Round(c.UsPerCall/c.UsPerDecision))
			}
			j := slices.IndexFunc(round, func(c ScriptCost) bool { return c.Case == ScriptCostBare })
			if j >= 0 && round[j].UsPerCall > 0 {
				xCall = append(xCall, c.UsPerCall/round[j].UsPerCall)
				xDecision = append(xDecision, c.UsPerDecision/round[j].UsPerCall)
			}
		}
		ratio := func(xs []float64) string {
			if len(xs) == 0 {
				return "–"
			}
			return spreadOf(xs).format(2)
		}
		perCallOf := "–"
		if len(perDecisionOfCall) > 0 {
			perCallOf = spreadOf(perDecisionOfCall).format(0)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %d |\n", name,
			perCallOf, spreadOf(perCall).format(2), spreadOf(perDecision).format(2),
			ratio(xCall), ratio(xDecision), len(perCall))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ScriptCostPattern returns the -bench regexp that runs ScriptCostBare and
// the cases of BenchmarkScriptCost that cases matches (all if it is empty).
// go test splits a -bench regexp at each '|' outside brackets and
// parentheses into whole paths of names, so each of those alternatives of
// cases gets the benchmark's name in front: "one|batch16" is
// "^BenchmarkScriptCost$/one|^BenchmarkScriptCost$/batch16", and a '/'
// filters the level below ("one/denied").
func ScriptCostPattern(cases string) string {
	const top = "^BenchmarkScriptCost$/"
	if cases == "" {
		return top
	}
	var alts []string
	// Split where the testing package splits a -bench pattern into
	// alternatives: a '|' outside parentheses and character classes, with
	// parentheses inside a class not counted, nor a ']' that closes none.
	class, paren, start := 0, 0, 0
	for i := 0; i < len(cases); i++ {
		switch cases[i] {
		case '\\':
			i++
		case '[':
			class++
		case ']':
			class = max(class-1, 0)
		case '(':
			if class == 0 {
				paren++
			}
		case ')':
			if class == 0 {
				paren--
			}
		case '|':
			if class == 0 && paren == 0 {
				alts = append(alts, cases[start:i])
				start = i + 1
			}
		}
	}
	alts = append(alts, cases[start:])
	pattern := top + "^" + regexp.QuoteMeta(ScriptCostBare) + "$"
	for _, alt := range alts {
		pattern += "|" + top + alt
	}
	return pattern
}
