#!/usr/bin/env bash
# Runs the collectived collectives benchmark and the same measurement through PyTorch's own Gloo
# backend, then compares them.
#
# How to run (from anywhere; the binaries must be built first):
#
#   cmake -S . -B build -G Ninja && ninja -C build collectived collectives_bench
#   bench/run_collectives_bench.sh            # full run: 8 B .. 64 MiB in x4 steps, a few minutes
#   bench/run_collectives_bench.sh --quick    # 8 B .. 32 MiB in x8 steps, fewer iterations
#
# Options (passed to both programs unless noted):
#   --quick, --sizes LIST|MIN:MAX[:F], --iters N, --warmup N,
#   --ops allreduce,allgather,broadcast,reduce_scatter,
#   --topologies 1x4,4x1,2x2 (collectived only),
#   --rounds N (this script: rounds of the target measurement below; default 3, --quick 1)
# Environment: BUILD_DIR (default: <repo>/build), PYTHON (default: /usr/bin/python3, which has
# torch), RESULTS_DIR (where both raw outputs are kept; default: a fresh directory under /tmp).
#
# What it prints:
#   1. bench/collectives_bench's nccl-tests style tables (size, count, type, redop, root, time
#      in us, algbw and busbw in GB/s, #wrong, iters) for allreduce, allgather
#      (allgather_into_tensor), broadcast and reduce_scatter (reduce_scatter_tensor), float32, on
#      the three topologies of 4 ranks: 1x4 (one sidecar, 4 ranks), 4x1 (4 sidecars, 1 rank
#      each), 2x2 (2 sidecars, 2 ranks each, interleaved);
#   2. bench/torch_gloo_bench.py's tables for the same ops and sizes through torch.distributed's
#      Gloo backend (4 processes on loopback; "n/a" where this torch's Gloo cannot run the op);
#   3. per op, a side-by-side table of busbw (GB/s): collectived on each topology beside
#      PyTorch Gloo, and the ratio collectived 1x4 / PyTorch Gloo;
#   4. the issue's target: 32 MiB allreduce on one sidecar with 4 ranks, collectived busbw /
#      PyTorch Gloo busbw, and whether it reaches 3x. On a shared machine one table row is noisy,
#      so it is measured again in N interleaved rounds (collectived 20 ops, then PyTorch Gloo 10
#      ops, each round with fresh processes); each side's median busbw gives the ratio. The ratio
#      from the tables is printed beside it.
# Exit status: non-zero when either benchmark failed (an op error or wrong results).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
PYTHON="${PYTHON:-/usr/bin/python3}"
BENCH="$BUILD_DIR/bin/collectives_bench"

if [[ ! -x "$BENCH" || ! -x "$BUILD_DIR/bin/collectived" ]]; then
  echo "run_collectives_bench.sh: $BENCH or $BUILD_DIR/bin/collectived is missing;" >&2
  echo "  build them: cmake -S $ROOT -B $BUILD_DIR -G Ninja && ninja -C $BUILD_DIR collectived collectives_bench" >&2
  exit 2
fi

common=()
cd_only=()
rounds=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) common+=("$1"); rounds="${rounds:-1}"; shift ;;
    --rounds) rounds="${2:?--rounds needs a value}"; shift 2 ;;
    --sizes|--iters|--warmup|--ops) common+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    --topologies) cd_only+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_collectives_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

RESULTS_DIR="${RESULTS_DIR:-$(mktemp -d /tmp/collectives-bench-XXXXXX)}"
mkdir -p "$RESULTS_DIR"
cd_out="$RESULTS_DIR/collectived.txt"
torch_out="$RESULTS_DIR/torch_gloo.txt"

echo "=== collectived (bench/collectives_bench) ==="
"$BENCH" "${common[@]}" "${cd_only[@]}" | tee "$cd_out"
cd_rc=${PIPESTATUS[0]}

echo
echo "=== PyTorch Gloo (bench/torch_gloo_bench.py) ==="
"$PYTHON" "$ROOT/bench/torch_gloo_bench.py" "${common[@]}" | tee "$torch_out"
torch_rc=${PIPESTATUS[0]}

compare="$RESULTS_DIR/compare.py"
cat > "$compare" <<'EOF'
import statistics
import sys

mode, cd_path, torch_path, results_dir, rounds = sys.argv[1:6]
rounds = int(rounds)

def parse(path):
    """{(op, topology): {size: (time_us, busbw) or None for n/a/error}}, in file order."""
    tables, current = {}, None
    for line in open(path):
        if line.startswith("# collectived |") or line.startswith("# torch-gloo |"):
            fields = [f.strip() for f in line[1:].split("|")]
            current = tables.setdefault((fields[1], fields[2]), {})
        elif current is not None and line.strip() and not line.startswith("#"):
            cols = line.split()
            try:
                current[int(cols[0])] = (float(cols[5]), float(cols[7]))
            except (ValueError, IndexError):
                current[int(cols[0])] = None
    return tables


def verdict(cd_bw, torch_bw):
    ratio = cd_bw / torch_bw
    met = "target met" if ratio >= 3 else f"target NOT met: {3 / ratio:.2f}x short"
    return (f"collectived busbw {cd_bw:.3f} GB/s, PyTorch Gloo busbw {torch_bw:.3f} GB/s, "
            f"ratio {ratio:.2f}x (target >= 3x: {met})")

TARGET = 32 << 20  # bytes of the issue's target row
cd, torch = parse(cd_path), parse(torch_path)
if mode == "tables":
    ops = []
    for op, _ in list(cd) + list(torch):
        if op not in ops:
            ops.append(op)
    topologies = [t for t in ("1x4", "4x1", "2x2") if any((op, t) in cd for op in ops)]
    fmt_bw = lambda v: "%9.3f" % v[1] if v else "%9s" % "n/a"

    print("=== side by side: busbw in GB/s (time of the 1x4 and torch runs in us) ===")
    for op in ops:
        torch_table = next((t for (o, _), t in torch.items() if o == op), {})
        sizes = sorted(set().union(*[cd.get((op, t), {}).keys() for t in topologies],
                                   torch_table.keys()))
        print(f"\n# {op}")
        head = "#%11s " % "size"
        for t in topologies:
            head += ("%10s %9s " % ("1x4 time", "1x4 busbw")) if t == "1x4" else "%9s " % (t + " busbw")
        head += "%11s %9s %8s" % ("torch time", "torch bw", "1x4/torch")
        print(head)
        for size in sizes:
            row = "%12d " % size
            for t in topologies:
                v = cd.get((op, t), {}).get(size)
                if t == "1x4":
                    row += ("%10.1f " % v[0] if v else "%10s " % "n/a") + fmt_bw(v) + " "
                else:
                    row += fmt_bw(v) + " "
            tv = torch_table.get(size)
            row += ("%11.1f " % tv[0] if tv else "%11s " % "n/a") + fmt_bw(tv)
            c1 = cd.get((op, "1x4"), {}).get(size)
            # Same bytes and factor on both sides: the busbw ratio is the inverse time ratio.
            row += " %8s" % ("%.1fx" % (tv[0] / c1[0]) if c1 and tv and c1[0] > 0 else "-")
            print(row)
    print()
    c1 = cd.get(("allreduce", "1x4"), {}).get(TARGET)
    tv = next((t for (o, _), t in torch.items() if o == "allreduce"), {}).get(TARGET)
    if c1 and tv and tv[1] > 0:
        print("32 MiB allreduce, 1 sidecar x 4 ranks, from the tables: " + verdict(c1[1], tv[1]))
    else:
        print("32 MiB allreduce on 1 sidecar x 4 ranks is not in both tables (see --sizes/--ops)")
else:
    cd_bws, torch_bws = [], []
    for r in range(1, rounds + 1):
        c = parse(f"{results_dir}/target-collectived-{r}.txt").get(("allreduce", "1x4"), {}).get(TARGET)
        t = parse(f"{results_dir}/target-torch-{r}.txt").get(("allreduce", "4procs"), {}).get(TARGET)
        if c and t and t[1] > 0:
            cd_bws.append(c[1])
            torch_bws.append(t[1])
    if cd_bws:
        print(f"32 MiB allreduce, 1 sidecar x 4 ranks, median of {len(cd_bws)} interleaved rounds: " +
              verdict(statistics.median(cd_bws), statistics.median(torch_bws)))
    elif rounds:
        print("the interleaved target rounds failed (see the raw outputs)")
EOF

echo
"$PYTHON" "$compare" tables "$cd_out" "$torch_out" "$RESULTS_DIR" 0

rounds="${rounds:-3}"
if [[ "$rounds" -gt 0 ]]; then
  echo
  echo "=== target: 32 MiB allreduce, 1 sidecar x 4 ranks vs PyTorch Gloo, $rounds interleaved rounds ==="
  for ((round = 1; round <= rounds; round++)); do
    "$BENCH" --sizes 32M --ops allreduce --topologies 1x4 --iters 20 \
      > "$RESULTS_DIR/target-collectived-$round.txt" || cd_rc=1
    "$PYTHON" "$ROOT/bench/torch_gloo_bench.py" --sizes 32M --ops allreduce --iters 10 \
      > "$RESULTS_DIR/target-torch-$round.txt" || torch_rc=1
    grep -h '^ *33554432 ' "$RESULTS_DIR/target-collectived-$round.txt" \
      "$RESULTS_DIR/target-torch-$round.txt" | awk -v r="$round" \
      'NR == 1 {c = $6; cb = $8} NR == 2 {printf "round %d: collectived %.1f us (busbw %s GB/s), PyTorch Gloo %.1f us (busbw %s GB/s)\n", r, c, cb, $6, $8}'
  done
  "$PYTHON" "$compare" target "$cd_out" "$torch_out" "$RESULTS_DIR" "$rounds"
fi

echo
echo "raw outputs: $RESULTS_DIR"
if [[ $cd_rc -ne 0 || $torch_rc -ne 0 ]]; then
  echo "run_collectives_bench.sh: FAILED (collectives_bench exit $cd_rc, torch_gloo_bench exit $torch_rc)" >&2
  exit 1
fi
