#!/usr/bin/env bash
# ratelimit-rls against envoyproxy/ratelimit on one redis-server of their
# own: ShouldRateLimit calls/s, p50/p99 and Redis's cost per call at 1, 8 and
# 64 clients, one and three descriptors, interleaved; then bursts at a
# window's end (-boundary); then a fleet of emulated Envoys on the quota
# service (RLQS), beside the rate limit service at the same traffic
# (-quota). Prints markdown tables on stdout.
#
#   bench/envoy.sh                      # 3 rounds × 3 s, ~6 minutes on 2 cores; the fleet ~8 more
#   ROUNDS=1 DURATION=500ms bench/envoy.sh   # a smoke run
#
# Environment: ROUNDS [3], DURATION [3s], WARMUP [300ms], CLIENTS ["1 8 64"],
# REFERENCE (a service_cmd binary; built with go install when unset),
# SOURCES ["files xds"]: a table per configuration source, the file or the
# same configuration pushed over xDS (CONFIG_TYPE=GRPC_XDS_SOTW),
# BOUNDARY [1] (0 leaves the bursts out), QUOTA [1] (0 leaves the fleet
# out), QUOTA_DURATION [60s: a window's end in each] (the cost rows; 0
# leaves them out), QUOTA_MINUTES [3] (the fleet over the limit, from a
# minute's start; 0 leaves it out).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd rls && go build -o "$bin/ratelimit-rls" ./cmd/ratelimit-rls)
reference=${REFERENCE:-}
if [ -z "$reference" ]; then
  GOBIN="$bin" GOWORK=off go install github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36
  reference="$bin/service_cmd"
fi
cd bench/envoy # a module of its own, outside go.work: bench's other contenders need older gRPC
export GOWORK=off
for source in ${SOURCES:-files xds}; do
  xds=()
  if [ "$source" = xds ]; then xds=(-xds); fi
  go run . -ours "$bin/ratelimit-rls" -reference "$reference" -rounds "${ROUNDS:-3}" \
    -duration "${DURATION:-3s}" -warmup "${WARMUP:-300ms}" -clients "${CLIENTS:-1 8 64}" "${xds[@]}"
  echo
done
if [ "${BOUNDARY:-1}" = 1 ]; then
  echo
  go run . -ours "$bin/ratelimit-rls" -reference "$reference" -boundary
fi
if [ "${QUOTA:-1}" = 1 ]; then
  echo
  go run . -ours "$bin/ratelimit-rls" -reference "$reference" -quota \
    -duration "${QUOTA_DURATION:-60s}" -minutes "${QUOTA_MINUTES:-3}"
fi
