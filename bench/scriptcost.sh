#!/usr/bin/env bash
# What each script costs Redis itself: usec_per_call from INFO commandstats,
# with redis-benchmark calling one script at a time, on a redis-server of its
# own. Prints a markdown table on stdout (progress goes to stderr).
#
#   bench/scriptcost.sh                      # every case, 3 runs each
#   CASES="ours-1 ours-batch16" bench/scriptcost.sh
#   SCRIPT=/tmp/variant.lua bench/scriptcost.sh   # a variant of our script
#
# Environment (defaults in brackets):
#   RUNS          runs of each case; the table gives min–max [3]
#   REQUESTS      redis-benchmark -n [200000]
#   CLIENTS       redis-benchmark -c [4]
#   PIPELINE      redis-benchmark -P: calls per round trip [1]; more leaves
#                 the server CPU per call closer to the script's own cost
#   KEYSPACE      redis-benchmark -r: distinct ids [10000]
#   CASES         cases, space-separated [all in the list below but
#                 empty-batch16, which shows what passing a batch's
#                 arguments costs]
#   SCRIPT        our script [sliding_window.lua beside this file]
#   REDIS_SERVER  the redis-server binary [redis-server]
#   REDIS_BENCHMARK  the redis-benchmark binary [redis-benchmark]
#   REDIS_NICE    niceness of the server, -20 to 19 [0]; on a busy machine a
#                 negative one (as root) keeps other processes from
#                 preempting the server inside a call, which usec_per_call,
#                 measured in wall time, would count
#
# Each run is: FLUSHALL, CONFIG RESETSTAT, redis-benchmark, INFO
# commandstats. Keys are 'rl:{__rand_int__}:<window ms>:<index>'; each
# __rand_int__ is drawn on its own, so the current and previous keys of a
# limit are two of the 10,000 ids' keys, like a client with no previous
# window (only current keys are written). Every ours-* request is allowed
# and written (its rate is 10^9), but ours-denied's, which are read only.
set -euo pipefail

RUNS=${RUNS:-3}
REQUESTS=${REQUESTS:-200000}
CLIENTS=${CLIENTS:-4}
PIPELINE=${PIPELINE:-1}
KEYSPACE=${KEYSPACE:-10000}
CASES=${CASES:-empty article ours-1 ours-denied ours-batch16 ours-all2 ours-all3 ours-all4}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
REDIS_BENCHMARK=${REDIS_BENCHMARK:-redis-benchmark}
REDIS_NICE=${REDIS_NICE:-0}

cd "$(dirname "$0")"
SCRIPT=${SCRIPT:-sliding_window.lua}
tmp=$(mktemp -d)
redis_pid=
cleanup() {
	if [ -n "$redis_pid" ]; then
		kill "$redis_pid" 2>/dev/null || true
		wait "$redis_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# A random high port; one that is taken makes the server exit, and the next
# try takes another.
for try in 1 2 3 4 5; do
	port=$((20000 + RANDOM % 40000))
	nice -n "$REDIS_NICE" "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
		--daemonize no --loglevel warning --logfile "$tmp/redis.log" &
	redis_pid=$!
	for _ in $(seq 50); do
		redis-cli -p "$port" PING >/dev/null 2>&1 && break
		sleep 0.1
	done
	if redis-cli -p "$port" PING >/dev/null 2>&1 && kill -0 "$redis_pid" 2>/dev/null; then
		break
	fi
	kill "$redis_pid" 2>/dev/null || true
	wait "$redis_pid" 2>/dev/null || true
	redis_pid=
	[ "$try" = 5 ] && { echo "redis-server would not start:" >&2; cat "$tmp/redis.log" >&2; exit 1; }
done
cli() { redis-cli -p "$port" "$@"; }

ours=$(cli -x SCRIPT LOAD <"$SCRIPT")
article=$(cli -x SCRIPT LOAD <article.lua)
empty=$(cli SCRIPT LOAD 'return {1,0,0}')

# limit W RATE: the keys and arguments of one sliding limit of window W ms,
# halfway through its window, of rate RATE.
declare -a K A
limit() {
	K+=("rl:{__rand_int__}:$1:5" "rl:{__rand_int__}:$1:4")
	A+=("$2" "$(($1 / 2))" "$1" "$((2 * $1))")
}
# request RATE W...: one request of cost 1 against limits of windows W...
request() {
	local rate=$1
	shift
	A+=(1 "$#" 0)
	for w in "$@"; do limit "$w" "$rate"; done
}

# args CASE: sets sha, per (decisions per call) and the command's K and A.
args() {
	K=() A=()
	per=1
	case $1 in
	empty) sha=$empty ;;
	empty-batch16)
		sha=$empty A=(16 0) per=16
		for _ in $(seq 16); do request 1000000000 60000; done
		;;
	article)
		sha=$article
		K=("rate:{__rand_int__}:28333333" "rate:{__rand_int__}:28333332")
		A=(1000000000 60 1700000000)
		;;
	ours-1) sha=$ours A=(1 0) && request 1000000000 60000 ;;
	ours-denied) sha=$ours A=(1 0) && request 0 60000 ;;
	ours-batch16)
		sha=$ours A=(16 0) per=16
		for _ in $(seq 16); do request 1000000000 60000; done
		;;
	ours-all[0-9]*)
		local k=${1#ours-all} ws=(1000 60000 3600000 86400000 604800000 2592000000)
		sha=$ours A=(1 0)
		request 1000000000 "${ws[@]:0:$k}"
		;;
	*) echo "unknown case $1" >&2 && exit 2 ;;
	esac
}

describe() {
	case $1 in
	empty) echo "\`return {1,0,0}\`: invoking a script, nothing more" ;;
	empty-batch16) echo "\`return {1,0,0}\` given ours-batch16's 32 keys and 114 arguments" ;;
	article) echo "the article's script (article.lua): GET, GET, INCR, EXPIRE" ;;
	ours-1) echo "ours, one request, one limit, allowed (MGET, INCRBY)" ;;
	ours-denied) echo "ours, one request, one limit, denied (MGET only)" ;;
	ours-batch16) echo "ours, a batch of 16 requests on distinct ids, one limit each, all allowed" ;;
	ours-all*) echo "ours, AllowAll: one request, ${1#ours-all} limits (1s, 1m, 1h, 1d...), allowed" ;;
	esac
}

# usec prints usec_per_call of EVALSHA.
usec() { cli INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p'; }
# cpu prints the main thread's CPU seconds, user and system.
cpu() {
	cli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user)_main_thread:/ {s += $2} END {printf "%.6f\n", s}'
}
# range prints "lo–hi" of its arguments, each divided by $per, 2 decimals.
range() {
	printf '%s\n' "$@" | sort -g | sed -n '1p;$p' | tr '\n' ' ' |
		awk -v per="$per" '{printf "%.2f–%.2f", $1 / per, $2 / per}'
}

echo "| case | keys | usec_per_call (min–max of $RUNS) | decisions per call | µs per decision | server CPU µs per call |"
echo "|---|--:|--:|--:|--:|--:|"
for c in $CASES; do
	args "$c"
	vals=() cpus=()
	for run in $(seq "$RUNS"); do
		cli FLUSHALL >/dev/null
		cli CONFIG RESETSTAT >/dev/null
		cpu0=$(cpu)
		if ! out=$("$REDIS_BENCHMARK" -p "$port" -c "$CLIENTS" -P "$PIPELINE" -r "$KEYSPACE" -n "$REQUESTS" -q \
			EVALSHA "$sha" "${#K[@]}" "${K[@]}" "${A[@]}" 2>&1) || echo "$out" | grep -qi err; then
			echo "$c: redis-benchmark failed: $(echo "$out" | tr '\r' '\n' | grep -i err | head -1)" >&2
			exit 1
		fi
		cpu1=$(cpu)
		v=$(usec)
		vals+=("$v")
		cpus+=("$(awk -v a="$cpu0" -v b="$cpu1" -v n="$REQUESTS" 'BEGIN {print (b - a) * 1e6 / n}')")
		echo "$c run $run: $v µs per call ($(echo "$out" | tr '\r' '\n' | tail -1 | sed 's/^ *//'))" >&2
	done
	printf '| %s: %s | %d | %s | %d | %s | %s |\n' "$c" "$(describe "$c")" "${#K[@]}" \
		"$(per=1 range "${vals[@]}")" "$per" "$(range "${vals[@]}")" "$(per=1 range "${cpus[@]}")"
done
echo
echo "- usec_per_call: INFO commandstats, the time Redis spent running the script (wall time); server CPU: INFO cpu," \
	"the main thread's user + system time per call, which adds reading the command and writing the reply"
echo "- $("$REDIS_SERVER" --version | sed 's/ sha=.*//'); redis-benchmark -c $CLIENTS -P $PIPELINE -r $KEYSPACE -n $REQUESTS; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
