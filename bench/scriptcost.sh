#!/usr/bin/env bash
# What each kind of script call costs Redis itself, against a bare INCR and
# PEXPIRE: a thin wrapper of the root module's BenchmarkScriptCost
# (script_bench_test.go), which sends the library's own keys and arguments,
# so that this script knows nothing of the script's argument layout. Prints
# a markdown table on stdout; the benchmark's output goes to stderr.
#
#   bench/scriptcost.sh                     # every case, 5 rounds, ~5 minutes on 2 cores
#   ROUNDS=1 CALLS=2000 bench/scriptcost.sh # a smoke run
#   CASES='one|batch16' bench/scriptcost.sh
#
# Environment (defaults in brackets):
#   ROUNDS        rounds [5; RUNS, its old name, if set]
#   CALLS         script calls per case and round, -benchtime CALLSx
#                 [100000; REQUESTS, its old name, if set]
#   CASES         a -bench regexp of the cases to run beside
#                 bare-incr-pexpire, which always runs (the ratios need it):
#                 'one' runs one, one/both-keys and one/denied; a '/' filters
#                 the level below ('one/denied' runs one and one/denied) [all]
#   REDIS_SERVER  the redis-server binary the benchmark starts [redis-server]
#
# Each round is one run of the root module's test binary: its own
# redis-server, bare-incr-pexpire first, then every case, each FLUSHALLed and
# primed as the bench's "allowed" scenario leaves its keys (see the
# benchmark). Rounds are separate runs rather than -count, which would run
# each case ROUNDS times in a row: a case's ratio to bare-incr-pexpire is
# taken within its round, moments apart on the same server, and this
# machine moves both (±20% from run to run) more than their ratio. The
# benchmark raises the server's priority itself.
set -euo pipefail

ROUNDS=${ROUNDS:-${RUNS:-5}}
CALLS=${CALLS:-${REQUESTS:-100000}}
CASES=${CASES:-}
export RATELIMIT_REDIS_SERVER=${REDIS_SERVER:-${RATELIMIT_REDIS_SERVER:-redis-server}}

cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "building..." >&2
go build -o "$tmp/bench" ./cmd/bench
(cd .. && go test -c -o "$tmp/ratelimit.test" .)

pattern=$("$tmp/bench" scriptcost -pattern "$CASES")
files=()
for round in $(seq 1 "$ROUNDS"); do
	out=$tmp/round$round.txt
	echo "round $round/$ROUNDS" >&2
	# In the root, as go test runs it: the tests' files are found from there.
	if ! (cd .. && "$tmp/ratelimit.test" -test.run '^$' -test.bench "$pattern" \
		-test.benchtime "${CALLS}x" -test.count 1) >"$out" 2>&1; then
		cat "$out" >&2
		echo "bench/scriptcost.sh: BenchmarkScriptCost failed in round $round (see above)" >&2
		exit 1
	fi
	grep '^BenchmarkScriptCost/' "$out" >&2 || true
	files+=("$out")
done

echo "## Redis's own time per script call"
echo
echo "- $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//');" \
	"$(go version | sed 's/^go version //'); $("$RATELIMIT_REDIS_SERVER" --version | sed 's/ sha=.*//');" \
	"load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- the root module's BenchmarkScriptCost, $ROUNDS round(s) of $CALLS calls per case" \
	"(go test -run '^\$' -bench '$pattern' -benchtime ${CALLS}x, once per round);" \
	"medians with (min–max) over rounds"
echo "- Redis µs: INFO commandstats usec / calls of EVALSHA (the script's run, wall time), per call and per decision;" \
	"× bare-incr-pexpire: per round, the case's µs per call (or per decision) over bare-incr-pexpire's µs per call" \
	"in the same round, then the median of those ratios"
echo
"$tmp/bench" scriptcost "${files[@]}"
