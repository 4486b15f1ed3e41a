#!/usr/bin/env bash
# The GPU checks in one step, for a machine with a GPU, CUDA and NCCL (under /usr/local/cuda or
# $CUDA_HOME): builds with the GPU backend, runs every C++ GPU test, the GPU benchmark, then the
# torch tests where the Python has a CUDA torch, and prints the benchmark's table and a pass/fail
# summary.
# Exits 0 when every GPU test ran and passed; 1 when one failed; 2 when this machine cannot run
# them (no GPU, or the build has no GPU backend) — a skip is never reported as a pass.
#
#   scripts/gpu-check.sh            # build into build-gpu/ (or $BUILD_DIR) and check
#   SKIP_BUILD=1 scripts/gpu-check.sh   # check an existing build (e.g. scripts/gpu-bundle.sh's)
# PYTHON names the interpreter with torch (default /usr/bin/python3); TEST_TIMEOUT bounds each
# test program in seconds (default 900); GPU_CHECK_LOG names the full log (default a temp file).
set -uo pipefail
python=${PYTHON:-/usr/bin/python3}
test_timeout=${TEST_TIMEOUT:-900}
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build-gpu}
# The GPU test programs. Their tests skip (with the reason) where no GPU is usable.
gpu_tests=(gpu_inventory_test device_kernels_test nccl_backend_test ipc_mapping_cache_test
           client_unit_test cuda_vmm_export_test sidecar_gpu_collectives_test)

echo "== GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
else
  echo "nvidia-smi: not found"
fi

if [[ -z ${SKIP_BUILD:-} ]]; then
  echo "== build ($build_dir)"
  BUILD_DIR=$build_dir "$root/scripts/build.sh" -DCOLLECTIVED_WITH_GPU=ON || {
    echo "gpu-check: FAIL (build)"
    exit 1
  }
fi
if ! grep -q 'COLLECTIVED_NCCL_LIBRARY:FILEPATH=/' "$build_dir/CMakeCache.txt" 2>/dev/null; then
  echo "gpu-check: CANNOT RUN: $build_dir has no GPU backend (CUDA or NCCL not found at build time)"
  exit 2
fi

echo "== what the sidecar sees"
"$build_dir/bin/gpu_inventory_test" --gtest_brief=1 2>&1 | grep -E "no GPU here|FAILED|PASSED" || true

echo "== GPU tests"
log=${GPU_CHECK_LOG:-$(mktemp)}
: >"$log"
status=0
for test in "${gpu_tests[@]}"; do
  if [[ ! -x $build_dir/bin/$test ]]; then
    echo "[  FAILED  ] $test (not built) (0 ms)" | tee -a "$log"
    status=1
    continue
  fi
  timeout "$test_timeout" "$build_dir/bin/$test" >>"$log" 2>&1
  code=$?
  if [[ $code -ne 0 ]]; then
    status=1
    [[ $code -eq 124 ]] && echo "[  FAILED  ] $test (timed out after $test_timeout s) (0 ms)" >>"$log"
  fi
done
grep -E "^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]|no usable GPU|no GPU visible" "$log"

echo "== GPU benchmark"
# Its figures are printed even after a failed test (the verdict stays FAIL); it checks the result
# of one op per size itself.
if [[ -x $build_dir/bin/gpu_allreduce_bench ]]; then
  timeout "$test_timeout" "$build_dir/bin/gpu_allreduce_bench" ${GPU_BENCH_ARGS:-}
  bench=$?
  if [[ $bench -eq 1 || $bench -eq 124 ]]; then
    echo "[  FAILED  ] gpu_allreduce_bench (exit $bench) (0 ms)" >>"$log"
    status=1
  fi
else
  echo "[  FAILED  ] gpu_allreduce_bench (not built) (0 ms)" >>"$log"
  status=1
fi

echo "== torch on CUDA"
if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  if (cd "$root/tests/python" && PYTHONPATH=$build_dir/python COLLECTIVED_BUILD_DIR=$build_dir \
        timeout "$test_timeout" "$python" -m pytest -q -rs test_gpu_torch.py) >>"$log" 2>&1; then
    echo "[       OK ] test_gpu_torch.py" | tee -a "$log"
  else
    echo "[  FAILED  ] test_gpu_torch.py (pytest)" | tee -a "$log"
    status=1
  fi
  tail -5 "$log"
else
  echo "[  SKIPPED ] test_gpu_torch.py ($python has no CUDA torch here) (0 ms)" | tee -a "$log"
fi
skipped=$(grep -cE "^\[ +SKIPPED +\] [A-Za-z].*\(" "$log")
failed=$(grep -cE "^\[ +FAILED +\] [A-Za-z].*\(" "$log")
passed=$(grep -cE "^\[ +OK +\] [A-Za-z]" "$log")
# Tests that need more GPUs than the machine has (two sidecars on two GPUs) say so when they skip;
# they are reported, but do not make a one-GPU machine unable to check the rest.
needs_more_gpus=$(grep -cE "^needs [0-9]+ GPUs, this machine has" "$log")

echo "== summary: $passed passed, $failed failed, $skipped skipped"
if [[ $status -ne 0 || $failed -gt 0 ]]; then
  echo "gpu-check: FAIL"
  grep -B5 -A20 "Failure" "$log" | head -120
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
