#!/usr/bin/env bash
# The cost of per-op metrics and the flight recorder: the same collectives with the sidecars'
# op telemetry on and off (--op-telemetry), interleaved in one run so that both see the same
# machine. Prints the 8-byte allreduce latency and the 32 MiB allreduce bus bandwidth of each
# round and the median overhead. Targets: under 5% at 8 bytes and under 2% at 32 MiB.
#
# Usage: bench/telemetry_overhead.sh [ROUNDS] [TOPOLOGY]    (defaults: 5 rounds, 1x4)
# Needs a build (scripts/build.sh); uses $BUILD_DIR (default build/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${BUILD_DIR:-$root/build}/bin/collectives_bench
rounds=${1:-5}
topology=${2:-1x4}

run() {  # run TELEMETRY SIZE ITERS -> time in us of the allreduce row
  "$bench" --topologies "$topology" --ops allreduce --sizes "$2" --iters "$3" --warmup 20 \
    --sidecar-arg --op-telemetry --sidecar-arg "$1" | awk '$1 ~ /^[0-9]+$/ && $4 == "sum" {print $6}'
}

echo "allreduce on topology $topology, op telemetry on vs off, $rounds interleaved rounds"
printf '%-6s %14s %14s %16s %16s\n' round "8B on (us)" "8B off (us)" "32MiB on (us)" "32MiB off (us)"
small_on=(); small_off=(); big_on=(); big_off=()
for ((r = 1; r <= rounds; r++)); do
  a=$(run on 8 400); b=$(run off 8 400); c=$(run on 32M 10); d=$(run off 32M 10)
  small_on+=("$a"); small_off+=("$b"); big_on+=("$c"); big_off+=("$d")
  printf '%-6s %14s %14s %16s %16s\n' "$r" "$a" "$b" "$c" "$d"
done
/usr/bin/python3 - "${small_on[*]}" "${small_off[*]}" "${big_on[*]}" "${big_off[*]}" <<'PY'
import statistics, sys
so, sf, bo, bf = ([float(x) for x in arg.split()] for arg in sys.argv[1:])
def line(name, on, off, target):
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"{name}: median {m_on:.1f} us with telemetry, {m_off:.1f} us without: "
          f"overhead {100 * (m_on - m_off) / m_off:+.1f}% (target < {target}%)")
line("8-byte allreduce latency", so, sf, 5)
busbw = lambda us: 2 * 3 / 4 * 32 * 2**20 / (us * 1e-6) / 1e9
m_on, m_off = statistics.median(bo), statistics.median(bf)
print(f"32 MiB allreduce busbw: {busbw(m_on):.3f} GB/s with telemetry, {busbw(m_off):.3f} GB/s without: "
      f"overhead {100 * (m_on - m_off) / m_off:+.1f}% in time (target < 2%)")
PY
