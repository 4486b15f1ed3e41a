#!/usr/bin/env bash
# Packs a GPU build's test programs, benchmark, sidecar and Python package, with the Debian
# shared libraries they load, into one folder, so that scripts/gpu-check.sh can run them on a GPU
# machine that has a driver, CUDA 13 and NCCL but none of our build dependencies (gRPC, Gloo,
# prometheus-cpp). Binaries are stripped; NCCL itself is not packed (hundreds of MiB): the GPU
# machine's own libnccl.so.2 is used.
#
#   scripts/gpu-bundle.sh OUT_DIR [BUILD_DIR]     # BUILD_DIR defaults to build/
# and on the GPU machine:
#   OUT_DIR/run-gpu-check.sh                       # sets the library path, runs gpu-check.sh
#   source OUT_DIR/env.sh                          # only the library path, for one program
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: gpu-bundle.sh OUT_DIR [BUILD_DIR]}
build=${2:-$root/build}
grep -q 'COLLECTIVED_NCCL_LIBRARY:FILEPATH=/' "$build/CMakeCache.txt" ||
  { echo "gpu-bundle: $build has no GPU backend" >&2; exit 1; }

programs=(collectived collectivectl gpu_inventory_test device_kernels_test nccl_backend_test
          ipc_mapping_cache_test client_unit_test cuda_vmm_export_test
          cuda_ipc_export_test sidecar_gpu_collectives_test gpu_allreduce_bench)
rm -rf "$out"
mkdir -p "$out/build/bin" "$out/lib" "$out/libstd"
for program in "${programs[@]}"; do
  strip -o "$out/build/bin/$program" "$build/bin/$program"
done
cp -r "$build/python" "$out/build/python"
cp -r "$build/test-certs" "$out/build/test-certs"  # the sidecar tests' TLS peers
find "$out/build/python" -name __pycache__ -prune -exec rm -rf {} +
strip "$out"/build/python/collectived/libcollectived_*.so
grep -E 'COLLECTIVED_(NCCL_LIBRARY|WITH_GPU)' "$build/CMakeCache.txt" >"$out/build/CMakeCache.txt"

# Every shared library the programs load, except the C library's own, NCCL and the driver. The
# C++ runtime goes apart (libstd/): it is used only where the machine's own is older than ours.
for library in $(ldd "$out"/build/bin/* "$out"/build/python/collectived/libcollectived_*.so |
                 awk '$3 ~ /^\// {print $3}' | sort -u); do
  case $(basename "$library") in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux*) ;;
    libnccl.so.* | libcuda.so.*) ;;
    libstdc++.so.* | libgcc_s.so.*) cp -L "$library" "$out/libstd/" ;;
    *) cp -L "$library" "$out/lib/" ;;
  esac
done

cat >"$out/env.sh" <<'EOF'
# Sourced: the library path for the bundle's programs (NCCL from this machine).
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
nccl=${NCCL_LIB_DIR:-$(dirname "$(find / -xdev -name 'libnccl.so.2' -not -path '/proc/*' \
                                    2>/dev/null | head -1)")}
export LD_LIBRARY_PATH=$bundle/lib:$nccl:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ldd "$bundle/build/bin/collectived" | grep -q "GLIBCXX.*not found\|libstdc++.*not found"; then
  export LD_LIBRARY_PATH=$bundle/libstd:$LD_LIBRARY_PATH
fi
echo "== bundle: NCCL from $nccl"
missing=$(ldd "$bundle"/build/bin/* 2>&1 | grep "not found" | sort -u)
[[ -n $missing ]] && echo "gpu-bundle: missing libraries: $missing"
EOF

cat >"$out/run-gpu-check.sh" <<'EOF'
#!/usr/bin/env bash
# Runs scripts/gpu-check.sh on this bundle (see scripts/gpu-bundle.sh). Needs the repository
# checkout as the working directory (for the scripts and the Python tests).
set -uo pipefail
source "$(dirname "$0")/env.sh"
SKIP_BUILD=1 BUILD_DIR=$bundle/build exec scripts/gpu-check.sh "$@"
EOF
chmod +x "$out/run-gpu-check.sh"
du -sh "$out"
