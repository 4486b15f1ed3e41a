#!/usr/bin/env bash
# Installs what is missing, configures (once) and builds everything into build/ (or $BUILD_DIR).
# Extra arguments are passed to cmake at configure time, e.g. -DCOLLECTIVED_SANITIZE=ON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
if [[ ! -f "$build_dir/build.ninja" || $# -gt 0 ]]; then
  cmake -S "$root" -B "$build_dir" -G Ninja "$@"
fi
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
