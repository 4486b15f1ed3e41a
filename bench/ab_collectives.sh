#!/usr/bin/env bash
# A/B comparison of two builds of collectived with bench/collectives_bench: the same sizes,
# topologies and ops, run alternately (A, B, A, B, ...) for N rounds with fresh sidecars each
# time, so that a noisy shared machine hits both sides alike. Prints, per (op, topology, size),
# the median time per op of each build over the rounds and the ratio B / A (below 1: B faster).
#
#   bench/ab_collectives.sh A_BUILD_DIR B_BUILD_DIR [--rounds N] [collectives_bench options]
#
# Each build dir must hold bin/collectived and bin/collectives_bench (build them with
# `ninja -C DIR collectived collectives_bench`; to compare against an older commit, build it in a
# `git worktree`). Options after the two dirs go to collectives_bench (default: --quick).
# Exit status: non-zero if any run failed (an op error or a wrong result).
set -uo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
a_dir=$1 b_dir=$2
shift 2
rounds=5
bench_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
    *) bench_args+=("$1"); shift ;;
  esac
done
[[ ${#bench_args[@]} -eq 0 ]] && bench_args=(--quick)
for dir in "$a_dir" "$b_dir"; do
  for bin in collectived collectives_bench; do
    if [[ ! -x "$dir/bin/$bin" ]]; then
      echo "ab_collectives.sh: $dir/bin/$bin is missing" >&2
      exit 2
    fi
  done
done

out=$(mktemp -d /tmp/ab-collectives-XXXXXX)
failed=0
for ((round = 1; round <= rounds; round++)); do
  for side in A B; do
    dir=$a_dir
    [[ $side == B ]] && dir=$b_dir
    if ! "$dir/bin/collectives_bench" --daemon "$dir/bin/collectived" "${bench_args[@]}" \
        > "$out/$side.$round.txt" 2>&1; then
      echo "round $round, build $side ($dir): collectives_bench failed (see $out/$side.$round.txt)"
      failed=1
    fi
  done
  echo "round $round of $rounds done"
done

/usr/bin/python3 - "$out" "$rounds" "$a_dir" "$b_dir" <<'PY'
import pathlib, re, statistics, sys
out, rounds, a_dir, b_dir = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
header = re.compile(r"^# collectived \| (\S+) \| (\S+) \|")
def parse(path):
    times, section = {}, None
    for line in path.read_text().splitlines():
        m = header.match(line)
        if m:
            section = (m.group(1), m.group(2))
            continue
        fields = line.split()
        if section and len(fields) == 10 and fields[0].isdigit():
            times[section + (int(fields[0]),)] = float(fields[5])
    return times
runs = {side: [parse(out / f"{side}.{r}.txt") for r in range(1, rounds + 1)] for side in "AB"}
keys = sorted(set().union(*runs["A"], *runs["B"]), key=lambda k: (k[0], k[1], k[2]))
print(f"A = {a_dir}\nB = {b_dir}\nmedian time per op (us) over {rounds} rounds; ratio = B / A")
print(f"{'op':<16}{'topology':<10}{'size (B)':>12}{'A (us)':>12}{'B (us)':>12}{'B/A':>8}")
ratios = []
for key in keys:
    a = [r[key] for r in runs["A"] if key in r]
    b = [r[key] for r in runs["B"] if key in r]
    if not a or not b:
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    ratios.append(mb / ma)
    print(f"{key[0]:<16}{key[1]:<10}{key[2]:>12}{ma:>12.1f}{mb:>12.1f}{mb / ma:>8.2f}")
if ratios:
    print(f"geometric mean of B/A over {len(ratios)} rows: "
          f"{statistics.geometric_mean(ratios):.3f}")
print(f"raw outputs: {out}")
PY
exit $failed
