#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every test (ctest for the
# GoogleTest suites and the fuzz corpus replays, pytest for the Python ones, the offline manifest
# validation, a short libFuzzer run of each fuzz target), then prints the slowest 20 tests and a
# pass/fail summary.
#
#   scripts/test.sh            everything (CI runs this)
#   scripts/test.sh --quick    the developer's loop, after a build: the engine, rpc and services
#                              suites, one sidecar topology (one sidecar, four ranks) and the
#                              Python client's core; about a minute on 2 cores
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
export BUILD_DIR=$build_dir
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "test.sh: unknown option $1 (--quick, or nothing)" >&2; exit 2 ;;
esac
"$root/scripts/build.sh" || { echo "build failed"; echo "summary: 0 passed, 1 failed"; exit 1; }

reports=$build_dir/test-reports
rm -rf "$reports" && mkdir -p "$reports"
jobs=${JOBS:-2}

# The Python files of the quick tier: the client, its wire and store, one sidecar's daemon.
quick_python=(test_client.py test_wire.py test_store.py)

echo "== ctest (GoogleTest suites)"
ctest_filter=()
((quick)) && ctest_filter=(-L quick)
(cd "$build_dir" && ctest -j "$jobs" --output-on-failure --timeout 600 "${ctest_filter[@]}" \
  --output-junit "$reports/ctest.xml")
ctest_rc=$?

echo "== pytest (Python client, daemon and torch integration)"
python_tests=("$root/tests/python")
((quick)) && python_tests=("${quick_python[@]/#/$root/tests/python/}")
PYTHONPATH="$build_dir/python" COLLECTIVED_BUILD_DIR="$build_dir" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider "${python_tests[@]}" \
  --junitxml="$reports/pytest.xml"
pytest_rc=$?
[[ $pytest_rc -eq 5 ]] && echo "pytest collected no tests" && pytest_rc=1

k8s_rc=0
fuzz_rc=0
report_files=(ctest.xml pytest.xml)
if ((!quick)); then
  echo "== offline validation of the Kubernetes manifests, Prometheus rules and dashboard"
  K8S_JUNIT="$reports/k8s.xml" "$root/tests/k8s/validate.sh"
  k8s_rc=$?

  echo "== fuzz: every fuzz target for 8 s from its seed corpus (clang-14 build in build-fuzz/)"
  "$root/scripts/fuzz.sh" --seconds 8 --junit "$reports/fuzz.xml"
  fuzz_rc=$?
  report_files+=(k8s.xml fuzz.xml)
fi

/usr/bin/python3 "$root/scripts/test-report.py" "$reports" "${report_files[@]}"
report_rc=$?
if [[ $ctest_rc -ne 0 || $pytest_rc -ne 0 || $k8s_rc -ne 0 || $fuzz_rc -ne 0 || $report_rc -ne 0 ]]
then
  echo "FAILED (ctest rc=$ctest_rc, pytest rc=$pytest_rc, k8s validation rc=$k8s_rc," \
    "fuzz rc=$fuzz_rc, reports rc=$report_rc)"
  exit 1
fi
echo "ALL TESTS PASSED"
