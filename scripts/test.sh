#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every test (ctest for the
# GoogleTest suites and the fuzz corpus replays, pytest for the Python ones, the offline manifest
# validation, a short libFuzzer run of each fuzz target) and prints a pass/fail summary.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
export BUILD_DIR=$build_dir
"$root/scripts/build.sh" || { echo "build failed"; echo "summary: 0 passed, 1 failed"; exit 1; }

reports=$build_dir/test-reports
rm -rf "$reports" && mkdir -p "$reports"

echo "== ctest (GoogleTest suites)"
(cd "$build_dir" && ctest -j "${JOBS:-2}" --output-on-failure --timeout 600 \
  --output-junit "$reports/ctest.xml")
ctest_rc=$?

echo "== pytest (Python client, daemon and torch integration)"
PYTHONPATH="$build_dir/python" COLLECTIVED_BUILD_DIR="$build_dir" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider "$root/tests/python" \
  --junitxml="$reports/pytest.xml"
pytest_rc=$?
[[ $pytest_rc -eq 5 ]] && echo "pytest collected no tests" && pytest_rc=1

echo "== offline validation of the Kubernetes manifests, Prometheus rules and dashboard"
K8S_JUNIT="$reports/k8s.xml" "$root/tests/k8s/validate.sh"
k8s_rc=$?

echo "== fuzz: every fuzz target for 8 s from its seed corpus (clang-14 build in build-fuzz/)"
"$root/scripts/fuzz.sh" --seconds 8 --junit "$reports/fuzz.xml"
fuzz_rc=$?

/usr/bin/python3 - "$reports" <<'PY'
import sys, xml.etree.ElementTree as ET, pathlib
passed = failed = skipped = 0
for name in ("ctest.xml", "pytest.xml", "k8s.xml", "fuzz.xml"):
    path = pathlib.Path(sys.argv[1]) / name
    if not path.exists():
        failed += 1
        print(f"{name}: missing report")
        continue
    for case in ET.parse(path).getroot().iter("testcase"):
        status = case.get("status", "")
        if case.find("failure") is not None or case.find("error") is not None or status == "fail":
            failed += 1
        elif case.find("skipped") is not None or status in ("notrun", "disabled"):
            skipped += 1
        else:
            passed += 1
print(f"summary: {passed} passed, {failed} failed, {skipped} skipped")
PY
if [[ $ctest_rc -ne 0 || $pytest_rc -ne 0 || $k8s_rc -ne 0 || $fuzz_rc -ne 0 ]]; then
  echo "FAILED (ctest rc=$ctest_rc, pytest rc=$pytest_rc, k8s validation rc=$k8s_rc," \
    "fuzz rc=$fuzz_rc)"
  exit 1
fi
echo "ALL TESTS PASSED"
