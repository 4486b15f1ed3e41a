#!/usr/bin/env bash
# Builds the Python client's wheel offline: stages pyproject.toml, setup.py and the assembled
# package of BUILD_DIR/python (sources, generated stubs, native libraries) and runs Debian's pip
# without an index or build isolation. Writes BUILD_DIR/dist/collectived-VERSION-py3-none-PLATFORM.whl.
# Usage: build-wheel.sh SOURCE_ROOT BUILD_DIR (PYTHON names the interpreter, default /usr/bin/python3).
set -euo pipefail
src=$1
build=$(mkdir -p "$2" && cd "$2" && pwd)
python=${PYTHON:-/usr/bin/python3}
stage=$build/python-wheel
rm -rf "$stage" "$build"/dist/collectived-*.whl
mkdir -p "$stage" "$build/dist"
cp "$src/clients/python/pyproject.toml" "$src/clients/python/setup.py" "$stage/"
(cd "$build/python" && find collectived \( -name '*.py' -o -name 'libcollectived_*.so' \) \
   -exec cp --parents {} "$stage" \;)
# Debugging symbols stay in the build tree; the wheel gets stripped copies.
find "$stage" -name 'libcollectived_*.so' -exec strip --strip-unneeded {} \;
PIP_NO_INDEX=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "$python" -m pip wheel --no-build-isolation --no-deps --quiet -w "$build/dist" "$stage"
rm -rf "$stage"
ls "$build"/dist/collectived-*.whl
