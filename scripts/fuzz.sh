#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/) with clang-14, libFuzzer, ASan and UBSan into build-fuzz/ and
# runs each for a bounded time from a fresh copy of its seed corpus (tests/fuzz/corpus/<target>/).
#
#   scripts/fuzz.sh [--seconds N] [--jobs J] [--junit FILE] [target...]
#
#   --seconds N   run each target for N seconds (default 10)
#   --jobs J      fuzz each target with J parallel processes (libFuzzer -fork=J; default 1)
#   --junit FILE  also write a JUnit report, one test case per target (used by scripts/test.sh)
#   target...     some of: translate_request_fuzzer shm_view_fuzzer store_request_fuzzer
#                 group_records_fuzzer (default: all)
#
# Prints, per target, the executions, the coverage reached and whether it found a crash; exits
# non-zero if the build failed or any target crashed, timed out or ran out of memory, and names
# the input that did it (under build-fuzz/fuzz-runs/<target>/artifacts/). Replay a crash with
# `build-fuzz/bin/<target> <file>`; once fixed, copy it to tests/fuzz/corpus/<target>/crash-<what>
# so the ctest test fuzz_replay.<target> keeps it fixed. New inputs the run found are left in
# build-fuzz/fuzz-runs/<target>/corpus/.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${FUZZ_BUILD_DIR:-$root/build-fuzz}
all_targets=(translate_request_fuzzer shm_view_fuzzer store_request_fuzzer group_records_fuzzer)
seconds=10
jobs=1
junit=""
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds=${2:?--seconds needs a value}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a value}; shift 2 ;;
    --junit) junit=${2:?--junit needs a file}; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *)
      if [[ " ${all_targets[*]} " != *" $1 "* ]]; then
        echo "fuzz.sh: unknown target $1 (one of: ${all_targets[*]})" >&2; exit 2
      fi
      targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=("${all_targets[@]}")
[[ "$seconds" =~ ^[0-9]+$ && "$jobs" =~ ^[1-9][0-9]*$ ]] || {
  echo "fuzz.sh: --seconds and --jobs take whole numbers" >&2; exit 2; }

# JUnit report: one <testcase> per target; $1 = "name|status|message" lines.
write_junit() {
  [[ -n "$junit" ]] || return 0
  mkdir -p "$(dirname "$junit")"
  /usr/bin/python3 - "$junit" "$@" <<'PY'
import sys, xml.etree.ElementTree as ET
suite = ET.Element("testsuite", name="fuzz")
failures = 0
for line in sys.argv[2:]:
    name, status, message = line.split("|", 2)
    case = ET.SubElement(suite, "testcase", classname="fuzz", name=name)
    if status != "ok":
        failures += 1
        ET.SubElement(case, "failure", message=message).text = message
    else:
        ET.SubElement(case, "system-out").text = message
suite.set("tests", str(len(sys.argv) - 2))
suite.set("failures", str(failures))
ET.ElementTree(suite).write(sys.argv[1], encoding="unicode", xml_declaration=True)
PY
}

for tool in clang-14 clang++-14; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fuzz.sh: $tool not found (Debian packages clang-14 libclang-rt-14-dev: scripts/setup.sh)"
    write_junit $(for t in "${targets[@]}"; do echo "$t|fail|$tool not installed"; done)
    exit 1
  fi
done

echo "== fuzz: building ${targets[*]} with clang-14 (libFuzzer, ASan, UBSan) in $build_dir"
launcher=()
command -v ccache >/dev/null 2>&1 &&
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if [[ ! -f "$build_dir/build.ninja" ]]; then
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_C_COMPILER=clang-14 \
    -DCMAKE_CXX_COMPILER=clang++-14 -DCOLLECTIVED_FUZZ=ON -DCOLLECTIVED_BUILD_TESTS=OFF \
    -DCOLLECTIVED_BUILD_BENCH=OFF -DCOLLECTIVED_WITH_GPU=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" "${launcher[@]}" >/dev/null ||
    { rm -f "$build_dir/build.ninja"; echo "fuzz.sh: configure failed";
      write_junit $(for t in "${targets[@]}"; do echo "$t|fail|configure failed"; done); exit 1; }
fi
if ! cmake --build "$build_dir" -j "${JOBS:-$(nproc)}" --target "${targets[@]}"; then
  echo "fuzz.sh: build failed"
  write_junit $(for t in "${targets[@]}"; do echo "$t|fail|build failed"; done)
  exit 1
fi

failed=0
results=()
printf '%-26s %10s %8s %8s  %s\n' target execs exec/s cov result
for target in "${targets[@]}"; do
  run_dir=$build_dir/fuzz-runs/$target
  rm -rf "$run_dir" && mkdir -p "$run_dir/corpus" "$run_dir/artifacts"
  cp "$root/tests/fuzz/corpus/$target/"* "$run_dir/corpus/"
  fork=()
  ((jobs > 1)) && fork=(-fork="$jobs")
  (cd "$run_dir" && "$build_dir/bin/$target" -max_total_time="$seconds" -rss_limit_mb=2048 \
     -timeout=10 -print_final_stats=1 -artifact_prefix="$run_dir/artifacts/" "${fork[@]}" \
     corpus >"$run_dir/log" 2>&1)
  rc=$?
  # The last status line: "#<execs> ... cov: <n> ... exec/s: <r> ...".
  status=$(grep -E '^#[0-9]+' "$run_dir/log" | grep 'cov:' | tail -1)
  execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$status")
  cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$status")
  rate=$(sed -nE 's/.*exec\/s:? ([0-9]+).*/\1/p' <<<"$status")
  artifacts=$(find "$run_dir/artifacts" -type f | sort)
  if [[ $rc -eq 0 && -z "$artifacts" ]]; then
    result="ok"
    results+=("$target|ok|${execs:-?} executions, cov ${cov:-?}, ${seconds}s")
  else
    failed=1
    result="FAILED (rc=$rc) ${artifacts:-no input saved: see $run_dir/log}"
    results+=("$target|fail|rc=$rc input: ${artifacts:-none} log: $run_dir/log
$(grep -E 'ERROR|SUMMARY|FUZZ_CHECK|runtime error' "$run_dir/log" | head -20)")
    grep -E 'ERROR|SUMMARY|FUZZ_CHECK|runtime error' "$run_dir/log" | head -20
  fi
  printf '%-26s %10s %8s %8s  %s\n' "$target" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$result"
done
write_junit "${results[@]}"
if ((failed)); then
  echo "fuzz: FAILED (inputs under $build_dir/fuzz-runs/<target>/artifacts/)"
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${seconds}s without a crash"
