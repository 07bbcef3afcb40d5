package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestScriptCostTable(t *testing.T) {
	rounds := []string{`goos: linux
BenchmarkScriptCost/bare-incr-pexpire-2   	    2000	     16000 ns/op	         4.000 redis-µs/call	         4.000 redis-µs/decision
BenchmarkScriptCost/one-2                 	    2000	     16000 ns/op	         6.000 redis-µs/call	         6.000 redis-µs/decision	         1.500 x-bare/call	         1.500 x-bare/decision
BenchmarkScriptCost/batch16/both-keys-2   	    2000	    201371 ns/op	        64.00 redis-µs/call	         4.000 redis-µs/decision	        16.00 x-bare/call	         1.000 x-bare/decision
PASS
`, `BenchmarkScriptCost/bare-incr-pexpire   	    2000	     16000 ns/op	         8.000 redis-µs/call	         8.000 redis-µs/decision
BenchmarkScriptCost/one                 	    2000	     16000 ns/op	         10.00 redis-µs/call	         10.00 redis-µs/decision	         1.250 x-bare/call	         1.250 x-bare/decision
`, `BenchmarkScriptCost/bare-incr-pexpire-16  	    2000	     16000 ns/op	         5.000 redis-µs/call	         5.000 redis-µs/decision
BenchmarkScriptCost/one-16                	    2000	     16000 ns/op	         10.00 redis-µs/call	         10.00 redis-µs/decision	         2.000 x-bare/call	         2.000 x-bare/decision
`}
	var all [][]ScriptCost
	for _, r := range rounds {
		round, err := ReadScriptCost(strings.NewReader(r))
		require.NoError(t, err)
		all = append(all, round)
	}
	require.Equal(t, []ScriptCost{{"bare-incr-pexpire", 8, 8}, {"one", 10, 10}}, all[1])
	var b strings.Builder
	require.NoError(t, ScriptCostTable(&b, all))
	out := b.String()
	for _, want := range []string{
		"| bare-incr-pexpire | 1 | 5.00 (4.00–8.00) | 5.00 (4.00–8.00) | 1.00 | 1.00 | 3 |\n",
		// The median of the rounds' ratios (1.5, 1.25, 2), not the ratio
		// of the medians (10 / 5).
		"| one | 1 | 10.00 (6.00–10.00) | 10.00 (6.00–10.00) | 1.50 (1.25–2.00) | 1.50 (1.25–2.00) | 3 |\n",
		"| batch16/both-keys | 16 | 64.00 | 4.00 | 16.00 | 1.00 | 1 |\n",
	} {
		require.Contains(t, out, want)
	}

	_, err := ReadScriptCost(strings.NewReader("BenchmarkScriptCost/one-2 2000 16000 ns/op\n"))
	require.Error(t, err, "a result without Redis's time")
	require.Error(t, ScriptCostTable(&b, [][]ScriptCost{{}}), "no results")
}

func TestScriptCostPattern(t *testing.T) {
	for cases, want := range map[string]string{
		"":    "^BenchmarkScriptCost$/",
		"one": "^BenchmarkScriptCost$/^bare-incr-pexpire$|^BenchmarkScriptCost$/one",
		"one/denied|batch16": "^BenchmarkScriptCost$/^bare-incr-pexpire$|^BenchmarkScriptCost$/one/denied" +
			"|^BenchmarkScriptCost$/batch16",
		// A '|' inside parentheses or brackets, or escaped, is the case's.
		`(one|all2)/x|[|]|a\|b`: "^BenchmarkScriptCost$/^bare-incr-pexpire$|^BenchmarkScriptCost$/(one|all2)/x" +
			`|^BenchmarkScriptCost$/[|]|^BenchmarkScriptCost$/a\|b`,
		// A '(' inside a class opens nothing; a ']' that closes no class
		// is a character, as the testing package reads them.
		`[(]|one`: "^BenchmarkScriptCost$/^bare-incr-pexpire$|^BenchmarkScriptCost$/[(]|^BenchmarkScriptCost$/one",
		`]|one`:   "^BenchmarkScriptCost$/^bare-incr-pexpire$|^BenchmarkScriptCost$/]|^BenchmarkScriptCost$/one",
	} {
		require.Equal(t, want, ScriptCostPattern(cases), cases)
	}
}
