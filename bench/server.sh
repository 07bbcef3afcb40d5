# Sourced by run.sh and hot.sh, from the bench directory, with REDIS_SERVER
# set: a temporary directory, $tmp, removed on exit; the bench binary built
# there, $bench; and start_redis, which starts a redis-server with no
# persistence on a free loopback port, sets $addr, and stops it on exit.

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

echo "building..." >&2
go build -o "$tmp/bench" ./cmd/bench
bench=$tmp/bench

start_redis() {
	# A port can be taken between freeport and the server's bind: try a few.
	local try port
	for try in 1 2 3 4 5; do
		port=$("$bench" freeport)
		"$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
			--daemonize no --loglevel warning --logfile "$tmp/redis.log" &
		redis_pid=$!
		addr=127.0.0.1:$port
		if "$bench" ping -addr "$addr" -wait 5s 2>/dev/null && kill -0 "$redis_pid" 2>/dev/null; then
			return 0
		fi
		kill "$redis_pid" 2>/dev/null || true
		wait "$redis_pid" 2>/dev/null || true
		redis_pid=
	done
	echo "redis-server would not start:" >&2
	cat "$tmp/redis.log" >&2
	exit 1
}
