#!/usr/bin/env bash
# The GPU checks in one step, for a machine with a GPU, CUDA and NCCL (under /usr/local/cuda or
# $CUDA_HOME): builds with the GPU backend, runs every GPU test (C++, and the torch ones where
# Debian's python3 has a CUDA torch), then the GPU benchmark, and prints a pass/fail summary and
# the benchmark's table.
# Exits 0 when every GPU test ran and passed; 1 when one failed; 2 when this machine cannot run
# them (no GPU, or the build has no GPU backend) — a skip is never reported as a pass.
#
#   scripts/gpu-check.sh            # build into build-gpu/ (or $BUILD_DIR) and check
#   SKIP_BUILD=1 scripts/gpu-check.sh   # check an existing build (e.g. one copied over)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build-gpu}
# The GPU test programs. Their tests skip (with the reason) where no GPU is usable.
gpu_tests=(gpu_inventory_test device_kernels_test nccl_backend_test ipc_mapping_cache_test
           client_unit_test sidecar_gpu_collectives_test)

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
log=$(mktemp)
status=0
for test in "${gpu_tests[@]}"; do
  if [[ ! -x $build_dir/bin/$test ]]; then
    echo "[  FAILED  ] $test (not built)" | tee -a "$log"
    status=1
    continue
  fi
  "$build_dir/bin/$test" >>"$log" 2>&1 || status=1
done
grep -E "^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]|no usable GPU|no GPU visible" "$log"

echo "== torch on CUDA"
if /usr/bin/python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  if (cd "$root/tests/python" && PYTHONPATH=$build_dir/python COLLECTIVED_BUILD_DIR=$build_dir \
        /usr/bin/python3 -m pytest -q -rs test_gpu_torch.py) >>"$log" 2>&1; then
    echo "[       OK ] test_gpu_torch.py" | tee -a "$log"
  else
    echo "[  FAILED  ] test_gpu_torch.py (pytest)" | tee -a "$log"
    status=1
  fi
  tail -5 "$log"
else
  echo "[  SKIPPED ] test_gpu_torch.py (Debian's python3 has no CUDA torch here) (0 ms)" | tee -a "$log"
fi
skipped=$(grep -cE "^\[ +SKIPPED +\] [A-Za-z].*\(" "$log")
failed=$(grep -cE "^\[ +FAILED +\] [A-Za-z].*\(" "$log")
passed=$(grep -cE "^\[ +OK +\] [A-Za-z]" "$log")

echo "== GPU benchmark"
if [[ $status -eq 0 && $failed -eq 0 && -x $build_dir/bin/gpu_allreduce_bench ]]; then
  "$build_dir/bin/gpu_allreduce_bench" ${GPU_BENCH_ARGS:-}
  bench=$?
  if [[ $bench -eq 1 ]]; then
    echo "[  FAILED  ] gpu_allreduce_bench (exit 1) (0 ms)" | tee -a "$log"
    status=1
    failed=$((failed + 1))
  fi
else
  echo "not run: a GPU test failed, or gpu_allreduce_bench was not built"
fi

echo "== summary: $passed passed, $failed failed, $skipped skipped"
if [[ $status -ne 0 || $failed -gt 0 ]]; then
  echo "gpu-check: FAIL"
  grep -B5 -A20 "Failure" "$log" | head -120
  exit 1
fi
if [[ $skipped -gt 0 ]]; then
  echo "gpu-check: CANNOT RUN: $skipped GPU tests skipped (no usable GPU here)"
  exit 2
fi
echo "gpu-check: PASS"
