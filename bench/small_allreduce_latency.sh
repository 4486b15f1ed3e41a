#!/usr/bin/env bash
# Per-op latency of one blocking 8-byte allreduce (one float64, inline, world size 1) from the
# Go, C++ and Python clients on one sidecar: median and p90 over N ops after 100 warm-up ops; and
# for C++ and Python the same N ops back to back (all submitted, then all waited for).
# Usage: bench/small_allreduce_latency.sh [N]   (default 2000; BUILD_DIR defaults to build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
n=${1:-2000}
dir=$(mktemp -d /tmp/cd-lat-XXXXXX)
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$build/bin/collectived" --socket "$dir/s.sock" --listen "127.0.0.1:$port" --advertise 127.0.0.1 \
  --metrics "" --log-level warning 2>"$dir/sidecar.log" &
pid=$!
trap 'kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
addr="unix://$dir/s.sock"
for _ in $(seq 100); do "$build/bin/collectivectl" --address "$addr" health >/dev/null 2>&1 && break; sleep 0.05; done
if [[ -x "$build/bin/collectived-go-example" ]]; then
  "$build/bin/collectived-go-example" -address "$addr" -bench "$n"
else
  echo "go: not built (no Go toolchain)"
fi
"$build/bin/collectived-cpp-mixed-rank" --address "$addr" --bench "$n"
PYTHONPATH="$build/python" /usr/bin/python3 - "$addr" "$n" <<'PY'
import sys, time
import numpy as np
import collectived
addr, n = sys.argv[1], int(sys.argv[2])
with collectived.Client(addr) as c:
    c.create_group("bench-py", rank=0, world_size=1)
    x = np.ones(1, np.float64)   # not in shared memory: travels inline
    times = []
    for i in range(n + 100):
        start = time.perf_counter()
        c.allreduce("bench-py", x)
        if i >= 100:
            times.append((time.perf_counter() - start) * 1e6)
    times.sort()
    print(f"python inline allreduce 8 B: median {times[len(times) // 2]:.1f} us, "
          f"p90 {times[len(times) * 9 // 10]:.1f} us over {n} ops")
    # Back to back: every op submitted (async_op), then all waited for; median of 5 rounds.
    arrays = [np.ones(1, np.float64) for _ in range(n)]
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        works = [c.allreduce("bench-py", a, async_op=True) for a in arrays]
        for w in works:
            w.wait()
        rounds.append((time.perf_counter() - start) / n * 1e6)
    rounds.sort()
    print(f"python inline allreduce 8 B back to back: {rounds[2]:.1f} us per op "
          f"(median of 5 rounds of {n})")
PY
