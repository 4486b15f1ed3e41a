#!/usr/bin/env bash
# The GPU checks in one step, for a machine with a GPU, CUDA and NCCL, sized for the few minutes
# such a machine is lent: every C++ GPU test (engine, client, the sidecar matrix with trainers
# sharing GPU 0 and with two sidecars on one GPU over NCCL), the torch tests where the Python has
# a CUDA torch (the torch suite and the two tests that need it alone in parallel lanes),
# then, alone on the GPU, the C++ benchmark (gpu_allreduce_bench), again under an MPS control
# daemon of the check's own, and the torch benchmark (bench/gpu_torch_bench.py). Ends with one
# summary: tests passed / failed / not run, the benchmark tables, and the verdict.
#
#   scripts/gpu-check.sh [--quick]          # build into build-gpu/ (or $BUILD_DIR) and check
#   SKIP_BUILD=1 scripts/gpu-check.sh       # check an existing build (scripts/gpu-bundle.sh's)
#
# --quick: one size per figure and the smallest matrix (float32 cases, the two-rank topologies);
# about 3 minutes instead of 8. Every stage runs under a time budget of its own, so that a hang
# costs that stage only, and within what is left of the whole check's deadline
# (GPU_CHECK_DEADLINE seconds: 470, --quick 175), so that the check ends within its 8 (3) minutes
# whatever happens: a stage cut short or not run for want of time is a failure that says so.
# PYTHON names the interpreter with torch (default /usr/bin/python3); GPU_CHECK_LOG names the
# full log (default a temp file); GPU_CHECK_BUDGETS="T P B Q" replaces the budgets (C++ tests,
# torch tests, C++ benchmark (each of its two runs), torch benchmark, in seconds);
# GPU_BENCH_ARGS (both runs of the C++ benchmark) and TORCH_BENCH_ARGS replace the benchmarks'
# arguments.
#
# Exit status: 0 when every GPU test ran and passed (tests that need more GPUs than the machine
# has are listed as not run); 1 when one failed or a stage ran out of time; 2 when this machine
# cannot run them (no GPU, or the build has no GPU backend): a skip is never reported as a pass.
set -uo pipefail
python=${PYTHON:-/usr/bin/python3}
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build-gpu}
quick=
[[ ${1:-} == --quick ]] && quick=1
started=$SECONDS
# Budgets in seconds: C++ tests, torch tests, C++ benchmark, torch benchmark.
if [[ -n $quick ]]; then
  budget_tests=100 budget_torch_tests=100 budget_bench=40 budget_torch_bench=110
  gtest_filter='-*FourRanks*:*float16*:*bfloat16*:*int64*'
  bench_args=(--sizes 8,1M,64M --rounds 3)
  mps_bench_args=(--sizes 8,1M,64M --rounds 3)
  torch_bench_args=(--quick)
  torch_test_filter=(-k "2ranks or expandable")
else
  budget_tests=180 budget_torch_tests=180 budget_bench=60 budget_torch_bench=230
  gtest_filter='*'
  bench_args=(--sizes 8:1G:8)
  mps_bench_args=(--sizes 8,1M,16M,64M,256M,1G --rounds 3)
  torch_bench_args=()
  torch_test_filter=()
fi
check_deadline=${GPU_CHECK_DEADLINE:-$([[ -n $quick ]] && echo 175 || echo 470)}
[[ -n ${GPU_CHECK_BUDGETS:-} ]] &&
  read -r budget_tests budget_torch_tests budget_bench budget_torch_bench <<<"$GPU_CHECK_BUDGETS"
[[ -n ${GPU_BENCH_ARGS:-} ]] && read -r -a bench_args <<<"$GPU_BENCH_ARGS" &&
  mps_bench_args=("${bench_args[@]}")
[[ -n ${TORCH_BENCH_ARGS:-} ]] && read -r -a torch_bench_args <<<"$TORCH_BENCH_ARGS"
# The GPU test programs. Their tests skip (with the reason) where no GPU is usable.
gpu_tests=(gpu_inventory_test device_kernels_test nccl_backend_test ipc_mapping_cache_test
           client_unit_test cuda_vmm_export_test cuda_ipc_export_test
           sidecar_gpu_collectives_test)

log=${GPU_CHECK_LOG:-$(mktemp)}
: >"$log"
tables=$(mktemp)
stage() { echo "== $1 (at $((SECONDS - started)) s)"; }

stage "GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
else
  echo "nvidia-smi: not found"
fi

if [[ -z ${SKIP_BUILD:-} ]]; then
  stage "build ($build_dir)"
  BUILD_DIR=$build_dir "$root/scripts/build.sh" -DCOLLECTIVED_WITH_GPU=ON || {
    echo "gpu-check: FAIL (build)"
    exit 1
  }
fi
if ! grep -q 'COLLECTIVED_NCCL_LIBRARY:FILEPATH=/' "$build_dir/CMakeCache.txt" 2>/dev/null; then
  echo "gpu-check: CANNOT RUN: $build_dir has no GPU backend (CUDA or NCCL not found at build time)"
  exit 2
fi
bin=$build_dir/bin

stage "what the sidecar sees"
"$bin/gpu_inventory_test" --gtest_brief=1 2>&1 | grep -E "no GPU here|FAILED|PASSED" || true
torch_cuda=
if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null
then
  torch_cuda=1
  "$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
fi

# The seconds a stage may take: its own budget (the argument), or what is left of the check's
# deadline (5 s kept for the summary) where that is less.
budget_for() {
  local own=$1 left=$((check_deadline - (SECONDS - started) - 5))
  ((left < 0)) && left=0
  echo $((own < left ? own : left))
}

# Runs "$@" under `budget` seconds, its output appended to `file`; a run out of time is a failure
# that names the stage (written here: callers add a line only for other failures). A budget under
# a second (the check's deadline is spent) runs nothing: a failure that says so, exit 124.
run_bounded() {
  local name=$1 budget=$2 file=$3
  shift 3
  if ((budget < 1)); then
    echo "[  FAILED  ] $name (not run: the check's $check_deadline s deadline is spent) (0 ms)" \
      >>"$file"
    return 124
  fi
  timeout --kill-after=10 "$budget" "$@" >>"$file" 2>&1
  local code=$?
  if [[ $code -eq 124 || $code -eq 137 ]]; then
    echo "[  FAILED  ] $name (out of its $budget s budget) (0 ms)" >>"$file"
  fi
  return $code
}

# Lane 1: the C++ GPU tests, one program after the other, within one budget.
cpp_tests() {
  local deadline=$((SECONDS + budget_tests)) status=0
  for test in "${gpu_tests[@]}"; do
    if [[ ! -x $bin/$test ]]; then
      echo "[  FAILED  ] $test (not built) (0 ms)"
      status=1
      continue
    fi
    local left=$((deadline - SECONDS))
    if ((left <= 0)); then
      echo "[  FAILED  ] $test (not run: the C++ tests' $budget_tests s budget is spent) (0 ms)"
      status=1
      continue
    fi
    run_bounded "$test" "$left" /dev/stdout "$bin/$test" --gtest_filter="$gtest_filter" ||
      status=1
  done
  return $status
}

# Lane 2: the torch tests on CUDA (test_gpu_torch.py), where torch has CUDA.
torch_tests() {
  if [[ -z $torch_cuda ]]; then
    echo "[  SKIPPED ] test_gpu_torch.py ($python has no CUDA torch here) (0 ms)"
    return 0
  fi
  (cd "$root/tests/python" && PYTHONPATH=$build_dir/python COLLECTIVED_BUILD_DIR=$build_dir \
     run_bounded test_gpu_torch.py "$budget_torch_tests" /dev/stdout \
       "$python" -m pytest -q -rs -p no:cacheprovider "${torch_test_filter[@]}" test_gpu_torch.py)
}

budget_tests=$(budget_for "$budget_tests")
budget_torch_tests=$(budget_for "$budget_torch_tests")
stage "GPU tests (C++ and torch side by side, budgets $budget_tests s and $budget_torch_tests s)"
cpp_log=$(mktemp)
torch_log=$(mktemp)
cpp_tests >"$cpp_log" 2>&1 &
cpp_pid=$!
torch_tests >"$torch_log" 2>&1 &
torch_pid=$!
wait $cpp_pid
cpp_status=$?
wait $torch_pid
torch_status=$?
cat "$cpp_log" "$torch_log" >>"$log"
grep -E "^\[ +FAILED +\] [A-Za-z]" "$cpp_log" | sort -u | head -60
echo "C++ tests: $(grep -cE '^\[ +OK +\] [A-Za-z]' "$cpp_log") passed," \
     "$(grep -cE '^\[ +SKIPPED +\] [A-Za-z].*\([0-9]+ ms\)$' "$cpp_log") skipped, why:"
grep -E "^(no usable GPU|needs [0-9]+ GPUs)" "$cpp_log" | sort | uniq -c | head -10
tail -3 "$torch_log"
# pytest's verdicts in the summary's terms (pytest -rs prints one SKIPPED line per skip).
torch_passed=$(grep -oE '[0-9]+ passed' "$torch_log" | tail -1 | grep -oE '[0-9]+' || true)
torch_failed=$(grep -oE '[0-9]+ (failed|error)' "$torch_log" | awk '{s+=$1} END {print s+0}')
torch_skipped=$(grep -oE '[0-9]+ skipped' "$torch_log" | tail -1 | grep -oE '[0-9]+' || true)
[[ -z $torch_cuda ]] && torch_skipped=1
status=0
[[ $cpp_status -ne 0 || $torch_status -ne 0 ]] && status=1

# Runs gpu_allreduce_bench (named `name` in failures) with the remaining arguments, its tables
# appended to the summary's; a failure (exit 2: no usable GPU, is not one) sets status=1.
run_bench() {
  local name=$1
  shift
  run_bounded "$name" "$(budget_for "$budget_bench")" "$tables" "$bin/gpu_allreduce_bench" "$@"
  local code=$?
  if [[ $code -ne 0 && $code -ne 2 ]]; then
    [[ $code -ne 124 && $code -ne 137 ]] &&
      echo "[  FAILED  ] $name (exit $code) (0 ms)" >>"$log"
    status=1
  fi
}

stage "C++ benchmark (alone on the GPU)"
if [[ -x $bin/gpu_allreduce_bench ]]; then
  run_bench gpu_allreduce_bench "${bench_args[@]}"
else
  echo "[  FAILED  ] gpu_allreduce_bench (not built) (0 ms)" >>"$log"
  status=1
fi

# The C++ benchmark again under an MPS control daemon of this check's own (the trainers' and the
# sidecar's contexts then share the GPU instead of time-slicing: see docs/gpu.md, "MPS"), within
# the same budget; not run, saying why, where the daemon cannot start or does not answer. The
# daemon's variables are set for its own commands only (a machine's own MPS settings stay).
mps_control() {
  CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log \
    timeout 30 nvidia-cuda-mps-control "$@"
}
stage "C++ benchmark under MPS"
if [[ ! -x $bin/gpu_allreduce_bench ]]; then
  echo "C++ benchmark under MPS: not run (not built)" >>"$tables"
elif ! command -v nvidia-cuda-mps-control >/dev/null; then
  echo "C++ benchmark under MPS: not run (nvidia-cuda-mps-control is not on PATH)" >>"$tables"
else
  mps_dir=$(mktemp -d)
  mkdir -p "$mps_dir/pipe" "$mps_dir/log"
  if ! mps_control -d >/dev/null 2>&1; then
    echo "C++ benchmark under MPS: not run (nvidia-cuda-mps-control -d failed)" >>"$tables"
  else
    answered=
    for _ in $(seq 50); do  # -d returns before the daemon answers
      if echo get_server_list | mps_control >/dev/null 2>&1; then
        answered=1
        break
      fi
      sleep 0.2
    done
    if [[ -z $answered ]]; then
      echo "C++ benchmark under MPS: not run (the MPS control daemon did not answer in 10 s)" \
        >>"$tables"
    else
      echo -e "\n# gpu_allreduce_bench under MPS (a control daemon of this check's own)" >>"$tables"
      CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log \
        run_bench "gpu_allreduce_bench under MPS" "${mps_bench_args[@]}"
      echo "MPS servers that ran (none: the benchmark did not use MPS):" \
        "$(echo get_server_list | mps_control 2>/dev/null | tr '\n' ' ')" >>"$tables"
    fi
    echo quit | mps_control >/dev/null 2>&1
  fi
  rm -rf "$mps_dir"
fi

stage "torch benchmark (alone on the GPU)"
if [[ -n $torch_cuda ]]; then
  PYTHONPATH=$build_dir/python run_bounded gpu_torch_bench.py \
    "$(budget_for "$budget_torch_bench")" "$tables" \
    "$python" -u "$root/bench/gpu_torch_bench.py" --build-dir "$build_dir" "${torch_bench_args[@]}"
  code=$?
  if [[ $code -ne 0 ]]; then
    [[ $code -ne 124 && $code -ne 137 ]] &&
      echo "[  FAILED  ] gpu_torch_bench.py (exit $code) (0 ms)" >>"$log"
    status=1
  fi
else
  echo "gpu_torch_bench.py: not run ($python has no CUDA torch here)" >>"$tables"
fi
grep -E "^\[ +FAILED +\]" "$tables" >>"$log"

skipped=$(( $(grep -cE "^\[ +SKIPPED +\] [A-Za-z].*\(" "$cpp_log") + ${torch_skipped:-0} ))
failed=$(( $(grep -cE "^\[ +FAILED +\] [A-Za-z].*\(" "$log") + torch_failed ))
passed=$(( $(grep -cE "^\[ +OK +\] [A-Za-z]" "$cpp_log") + ${torch_passed:-0} ))
# Tests that need more GPUs than the machine has (two sidecars on two GPUs) say so when they skip;
# they are reported, but do not make a one-GPU machine unable to check the rest.
needs_more_gpus=$(grep -cE "^needs [0-9]+ GPUs, this machine has" "$cpp_log")

stage "summary"
echo "-- benchmark tables"
cat "$tables"
echo "-- tests: $passed passed, $failed failed, $skipped not run" \
     "($needs_more_gpus of them need more GPUs than this machine has)"
echo "-- took $((SECONDS - started)) s${quick:+ (--quick)} (deadline $check_deadline s); full log:" \
  "$log"
if [[ $status -ne 0 || $failed -gt 0 ]]; then
  echo "gpu-check: FAIL"
  grep -hE "^\[ +FAILED +\]" "$log" | sort -u | head -40
  grep -B5 -A20 "Failure" "$log" | head -150
  exit 1
fi
if [[ $skipped -gt $needs_more_gpus ]]; then
  echo "gpu-check: CANNOT RUN: $((skipped - needs_more_gpus)) GPU tests skipped (no usable GPU here)"
  exit 2
fi
if [[ $needs_more_gpus -gt 0 ]]; then
  echo "gpu-check: PASS ($needs_more_gpus tests need more GPUs than this machine has: not run)"
else
  echo "gpu-check: PASS"
fi
