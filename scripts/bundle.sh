#!/usr/bin/env bash
# A self-contained copy of a build for another Linux host (x86-64, glibc >= Debian 12's): the
# binaries, every shared library they load except the C runtime's, and the Python package.
# It lets the Python suites run where Debian's packages are not installed, for example against
# a newer torch:
#
#   scripts/bundle.sh /tmp/bundle            # here
#   export COLLECTIVED_BUILD_DIR=/tmp/bundle PYTHONPATH=/tmp/bundle/python   # there
#   python3 -m pytest tests/python/test_torch_backend.py tests/python/test_ddp.py
#
# bin/ holds wrappers that point the loader at lib/ for our programs alone: a process-wide
# LD_LIBRARY_PATH would hand the host's Python (and its torch) our older libstdc++.
#
# Usage: scripts/bundle.sh OUTPUT_DIR   (BUILD_DIR: the build to copy, default build/)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
out="${1:?usage: scripts/bundle.sh OUTPUT_DIR}"

for binary in collectived collectivectl; do
  [[ -x "$build/bin/$binary" ]] || { echo "bundle: $build/bin/$binary is missing; build first" >&2; exit 1; }
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/libexec" "$out/lib"
# Without debug information: the bundle must stay small enough to copy around.
for binary in collectived collectivectl; do
  strip --strip-debug -o "$out/libexec/$binary" "$build/bin/$binary"
  printf '%s\n' '#!/bin/sh' 'here="$(cd "$(dirname "$0")/.." && pwd)"' \
    "LD_LIBRARY_PATH=\"\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\" exec \"\$here/libexec/$binary\" \"\$@\"" \
    >"$out/bin/$binary"
  chmod +x "$out/bin/$binary"
done
cp -r "$build/python" "$out/python"

# The C runtime comes from the host (a copied loader or libc would not match it).
runtime='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv)\.so'
ldd "$build/bin/collectived" "$build/bin/collectivectl" |
  awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  while read -r lib; do
    name="$(basename "$lib")"
    [[ "$name" =~ $runtime ]] || cp -L "$lib" "$out/lib/$name"
  done

echo "bundle: $(du -sh "$out" | cut -f1) in $out ($(ls "$out/lib" | wc -l) libraries)"
