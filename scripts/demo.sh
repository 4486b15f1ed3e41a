#!/usr/bin/env bash
# The README's main command: builds, starts collectived with its defaults, checks its health and
# its store over gRPC with collectivectl, then stops it with SIGTERM and checks it cleaned up.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
export BUILD_DIR=$build_dir
"$root/scripts/build.sh"
bin=$build_dir/bin
socket=/run/collectived/collectived.sock

echo "== starting collectived with its defaults"
"$bin/collectived" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$bin/collectivectl" health >/dev/null 2>&1 && break
  kill -0 $daemon 2>/dev/null || { echo "collectived exited early"; exit 1; }
  sleep 0.1
done
echo "== collectivectl health"
"$bin/collectivectl" health
echo "== collectivectl info"
"$bin/collectivectl" info
echo "== the rendezvous store over gRPC"
"$bin/collectivectl" store set demo/greeting "hello from collectived"
printf 'get demo/greeting -> '; "$bin/collectivectl" store get demo/greeting
printf 'add demo/counter 3 -> '; "$bin/collectivectl" store add demo/counter 3
echo "== stopping collectived (SIGTERM)"
kill -TERM $daemon
wait $daemon
trap - EXIT
if [[ -e $socket ]]; then echo "socket $socket was left behind"; exit 1; fi
echo "collectived stopped cleanly; socket removed"
