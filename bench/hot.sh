#!/usr/bin/env bash
# One hot id, many servers: leased limits (Limit.Leased) against unleased
# ones, on a redis-server of its own. Prints a markdown report on stdout
# (progress goes to stderr).
#
#   bench/hot.sh                                  # 3 rounds, ~2 minutes on 2 cores
#   GUBERNATOR=1 bench/hot.sh                     # and gubernator's GLOBAL, ~3 minutes
#   ROUNDS=1 DURATION=1s REACHED_DURATION=2s bench/hot.sh   # a quick smoke run
#
# Environment (defaults in brackets):
#   DURATION          measured time per run of "allowed" [3s]
#   REACHED_DURATION  measured time per run of "reached" (about that many
#                     windows; warm-up and the first decisions are accounted
#                     too) [5s]
#   WARMUP            unmeasured time before each run [300ms]
#   ROUNDS            rounds; each runs every mode once per scenario [3]
#   SERVERS           Limiters, each ratelimit.New on a go-redis client of its
#                     own (ContextTimeoutEnabled) [8]
#   CONCURRENCY       goroutines per Limiter [8]
#   RATES             the limits of "reached", per second, space-separated:
#                     each is a run of its own per mode and round [10000 1000]
#   SCENARIOS         allowed (a limit of 2^40 per second: every decision
#                     allowed), reached (each of RATES per second, accounted
#                     per window) [allowed reached]
#   MODES             unleased, leased [unleased leased]
#   GUBERNATOR        1: "reached" also runs gubernator's GLOBAL behaviour,
#                     SERVERS peers in one process (bench/gubernator, a module
#                     of its own built with GOWORK=off; the first build
#                     downloads its dependencies) [0]
#   REDIS_SERVER      the redis-server binary [redis-server]
#   RESULTS           if set, the raw JSON lines are copied there
#   COMMIT            the commit the report names [git rev-parse --short HEAD,
#                     "with uncommitted changes" if the work tree differs]
#
# Each (round, scenario, mode) is one process of cmd/bench (bench hot),
# interleaved, the modes' order reversed every other round; the server is
# started with no persistence on a free loopback port, FLUSHALLed before
# every run, and stopped on exit. A run whose calls fail, that has a
# degraded decision, or in "allowed" denies more than 0.1%, is reported and
# makes the script exit 1 at the end.
set -euo pipefail

DURATION=${DURATION:-3s}
REACHED_DURATION=${REACHED_DURATION:-5s}
WARMUP=${WARMUP:-300ms}
ROUNDS=${ROUNDS:-3}
SERVERS=${SERVERS:-8}
CONCURRENCY=${CONCURRENCY:-8}
RATES=${RATES:-${RATE:-10000 1000}}
SCENARIOS=${SCENARIOS:-allowed reached}
MODES=${MODES:-unleased leased}
REDIS_SERVER=${REDIS_SERVER:-redis-server}

cd "$(dirname "$0")"
. ./server.sh
if [ "${GUBERNATOR:-0}" = 1 ]; then
	(cd gubernator && GOWORK=off go build -o "$tmp/gubernator" .)
fi

start_redis

results=$tmp/results.jsonl
: >"$results"
failed=0
start=$(date +%s)
reversed=$(echo "$MODES" | tr ' ' '\n' | tac | tr '\n' ' ')
for round in $(seq 1 "$ROUNDS"); do
	modes=$MODES
	[ $((round % 2)) = 0 ] && modes=$reversed
	cells=
	for scenario in $SCENARIOS; do
		case $scenario in
		allowed) cells="$cells allowed" ;;
		reached) for rate in $RATES; do cells="$cells reached:$rate"; done ;;
		*) echo "unknown scenario $scenario" >&2; exit 2 ;;
		esac
	done
	for cell in $cells; do
		scenario=${cell%%:*}
		rate=${cell#*:}
		case $scenario in
		allowed) args=(-duration "$DURATION") ;;
		reached) args=(-duration "$REACHED_DURATION" -rate "$rate" -account) ;;
		esac
		run_modes=$modes
		[ "$scenario" = reached ] && [ "${GUBERNATOR:-0}" = 1 ] && run_modes="$modes gubernator"
		for mode in $run_modes; do
			if [ "$mode" = gubernator ]; then
				cmd=("$tmp/gubernator" -peers "$SERVERS" -c "$CONCURRENCY" -warmup "$WARMUP" -round "$round"
					-duration "$REACHED_DURATION" -rate "$rate")
			else
				cmd=("$bench" hot -addr "$addr" -mode "$mode" -servers "$SERVERS" -c "$CONCURRENCY"
					-warmup "$WARMUP" -round "$round" -flush "${args[@]}")
			fi
			if ! line=$("${cmd[@]}"); then
				failed=1
				echo "FAILED: $mode, $scenario, round $round" >&2
			fi
			[ -n "$line" ] && echo "$line" >>"$results"
			printf '[%4ds] round %s/%s %-14s %-10s %s\n' "$(($(date +%s) - start))" "$round" "$ROUNDS" \
				"$cell" "$mode" "$(echo "$line" | grep -o '"decisions_per_s":[0-9]*' | cut -d: -f2)/s" >&2
		done
	done
done
[ -n "${RESULTS:-}" ] && cp "$results" "$RESULTS"

echo "## One hot id: leased against unleased"
echo
echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
if [ -z "${COMMIT:-}" ]; then
	COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
	git diff --quiet HEAD -- .. 2>/dev/null || COMMIT="$COMMIT with uncommitted changes"
fi
echo "- $(go version | sed 's/^go version //'), $("$REDIS_SERVER" --version | sed 's/ sha=.*//'); commit $COMMIT"
echo "- Redis and the bench share the machine; no pinning. Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- $SERVERS Limiters (each ratelimit.New on a go-redis client of its own, ContextTimeoutEnabled; WithTimeout(3s) and an Observer)" \
	"× $CONCURRENCY goroutines each, one id, in one process; $ROUNDS round(s), modes interleaved (reversed every other round)," \
	"each run its own process, after $WARMUP of warm-up; medians with (min–max) over rounds"
echo "- allowed: $DURATION per run, Limit{Rate: 1<<40, Window: time.Second}, Leased or not; reached: $REACHED_DURATION per run, Rate $(echo "$RATES" | sed "s/ / and /g") per second," \
	"every admitted decision recorded from the first on and accounted per window"
if [ "${GUBERNATOR:-0}" = 1 ]; then
	echo "- gubernator/global/token: github.com/gubernator-io/gubernator/v2 v2.13.0, $SERVERS peers (SpawnDaemon, default Behaviors: GlobalSyncWait 100ms)" \
		"in one process, each called over gRPC by $CONCURRENCY goroutines through a client of its own; one key, Behavior GLOBAL," \
		"TOKEN_BUCKET, limit $(echo "$RATES" | sed "s/ / and /g") per duration 1s; run after the modes above in each round"
fi
echo "- Redis calls: EVAL and EVALSHA (INFO commandstats) over the measured time, give-backs included; from a lease: decisions whose" \
	"Event.Source was SourceLease; latencies per decision, the caller's time.Now around Allow"
echo
"$bench" hottable "$results" || failed=1

if [ "$failed" != 0 ]; then
	echo >&2
	echo "bench/hot.sh: SOME RUNS FAILED (see above)" >&2
	exit 1
fi
