#!/usr/bin/env bash
# Compares this library with other Redis rate limiters on a redis-server of
# its own, and prints a markdown report on stdout (progress goes to stderr).
#
#   bench/run.sh                           # the full comparison, ~10 minutes on 2 cores
#   ROUNDS=1 DURATION=1s MEM_CLIENTS=10000 bench/run.sh   # a quick smoke run
#
# Environment (defaults in brackets):
#   DURATION      measured time per run [3s]
#   WARMUP        unmeasured time before each run [300ms]
#   ROUNDS        rounds; each round runs every contender once per cell [3]
#   CONCURRENCY   goroutines, space-separated [1 8 64]
#   SCENARIOS     scenarios, space-separated [allowed denied]
#   CONTENDERS    contenders, space-separated [all that `bench list` prints]
#   MEM_CLIENTS   clients in the memory measurement; 0 skips it [100000]
#   POOL          go-redis PoolSize; 0 is go-redis's default [0]
#   REDIS_SERVER  the redis-server binary [redis-server]
#   RESULTS       if set, the raw JSON lines are copied there
#
# Each (round, scenario, concurrency, contender) is one process of the same
# binary, interleaved: A B C, A B C, ... The server is started with no
# persistence on a free loopback port, FLUSHALLed before every run, and
# stopped on exit. A run whose calls fail, that has a degraded decision (the
# failure policy's, not Redis's), or whose outcome misses its scenario's
# check, is reported and makes the script exit 1 at the end.
set -euo pipefail

DURATION=${DURATION:-3s}
WARMUP=${WARMUP:-300ms}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-1 8 64}
SCENARIOS=${SCENARIOS:-allowed denied}
MEM_CLIENTS=${MEM_CLIENTS:-100000}
POOL=${POOL:-0}
REDIS_SERVER=${REDIS_SERVER:-redis-server}

cd "$(dirname "$0")"
. ./server.sh
CONTENDERS=${CONTENDERS:-$("$bench" list | tr '\n' ' ')}

start_redis

in_list() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }

results=$tmp/results.jsonl
: >"$results"
failed=0
start=$(date +%s)
for round in $(seq 1 "$ROUNDS"); do
	for scenario in $SCENARIOS; do
		eligible=$("$bench" list -scenario "$scenario" | tr '\n' ' ')
		for conc in $CONCURRENCY; do
			for c in $CONTENDERS; do
				in_list "$c" "$eligible" || continue
				if ! line=$("$bench" run -addr "$addr" -contender "$c" -scenario "$scenario" \
					-c "$conc" -duration "$DURATION" -warmup "$WARMUP" -round "$round" \
					-pool "$POOL" -flush); then
					failed=1
					echo "FAILED: $c, $scenario, $conc goroutines, round $round" >&2
				fi
				[ -n "$line" ] && echo "$line" >>"$results"
				printf '[%4ds] round %s/%s %-8s c=%-3s %-20s %s\n' "$(($(date +%s) - start))" \
					"$round" "$ROUNDS" "$scenario" "$conc" "$c" \
					"$(echo "$line" | grep -o '"decisions_per_s":[0-9]*' | cut -d: -f2)/s" >&2
			done
		done
	done
done

if [ "$MEM_CLIENTS" -gt 0 ]; then
	memory=$("$bench" list -memory | tr '\n' ' ')
	for c in $CONTENDERS; do
		in_list "$c" "$memory" || continue
		for windows in 1 2; do
			if ! line=$("$bench" mem -addr "$addr" -contender "$c" -windows "$windows" \
				-clients "$MEM_CLIENTS" -flush); then
				failed=1
				echo "FAILED: $c, memory, $windows windows" >&2
			fi
			[ -n "$line" ] && echo "$line" >>"$results"
			printf '[%4ds] memory %-20s %s window(s): %s B/client\n' "$(($(date +%s) - start))" "$c" "$windows" \
				"$(echo "$line" | grep -o '"bytes_per_client":[0-9.]*' | cut -d: -f2)" >&2
		done
	done
fi
[ -n "${RESULTS:-}" ] && cp "$results" "$RESULTS"

echo "## Rate limiter comparison"
echo
echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
echo "- $(go version | sed 's/^go version //'), $("$REDIS_SERVER" --version | sed 's/ sha=.*//')"
echo "- Redis and the bench share the machine; no pinning. Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- $ROUNDS round(s) of $DURATION per run (after $WARMUP of warm-up), contenders interleaved; each run its own process;" \
	"medians with (min–max) over rounds; go-redis PoolSize $( [ "$POOL" = 0 ] && echo "default (10 × GOMAXPROCS)" || echo "$POOL")"
echo "- each goroutine decides again as soon as its decision returns, as a server's goroutine whose next request has come;" \
	"it yields (runtime.Gosched) only after a decision answered in under 5µs without waiting (a local deny cache, the noop)," \
	"in place of the read a server's goroutine would block on (a decision that waited on Redis gave up its processor already);" \
	"one goroutine makes the scenario's first decisions before the others start (a connection, the scripts, the abuser past its limit)"
echo "- allocs and bytes per decision are the whole process's runtime.MemStats deltas over the measured time, divided by decisions;" \
	"client CPU µs/decision is the bench process's CPU time (getrusage, user + system, every thread) over the measured time," \
	"divided by decisions (the noop row shows what the harness itself costs)"
echo "- Redis CPU µs/decision: the server's CPU time (INFO cpu, user + system) over the measured time, divided by decisions;" \
	"script calls/decision: EVAL and EVALSHA calls (INFO commandstats) per decision; > 100 ms: measured decisions slower than" \
	"the Limiter's default timeout (100 ms), summed over rounds; degraded: decisions the failure policy made (any fails the run); every ours*" \
	"runs with WithTimeout(3s), go-redis's ReadTimeout, which bounds the other libraries"
echo "- script µs/call and script µs/decision: the EVAL and EVALSHA usec of INFO commandstats (the scripts' run inside Redis," \
	"wall time) over their calls, and over decisions; call × bare/incr and decision × bare/incr: the row's script µs per call," \
	"and per decision, over bare/incr's per call (INCR+PEXPIRE, one call a decision) in the same round, scenario and" \
	"goroutines, then the median of those per-round ratios"
echo
"$bench" table "$results" || failed=1

if [ "$failed" != 0 ]; then
	echo >&2
	echo "bench/run.sh: SOME RUNS FAILED (see above)" >&2
	exit 1
fi
