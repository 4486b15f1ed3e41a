#!/usr/bin/env bash
# Offline validation of the Kubernetes manifests, Prometheus config/rules and the Grafana
# dashboard (no cluster needed):
#   tests/k8s/validate.sh                 # prints node's test report; exit 0 when all pass
#   K8S_JUNIT=path.xml tests/k8s/validate.sh   # also writes a JUnit report
# Needs node (>= 20) + npm, kubectl (for `kubectl kustomize`, offline) and promtool (Debian's
# "prometheus"). The first run installs the npm packages of package-lock.json into
# tests/k8s/node_modules (npm ci, a few seconds); later runs take seconds.
# What is checked, and how unknown fields are caught: tests/k8s/validate.test.mjs, lib.mjs,
# k8s/README.md ("Validation").
set -euo pipefail
here=$(cd "${BASH_SOURCE[0]%/*}" && pwd)
cd "$here"

for tool in node npm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "k8s validation: $tool not found (Node.js >= 20 with npm)"; exit 1; }
done
if ! command -v promtool >/dev/null 2>&1; then
  echo "k8s validation: promtool not found (apt-get install prometheus)"; exit 1
fi
command -v kubectl >/dev/null 2>&1 ||
  echo "k8s validation: kubectl not found: kustomizations are not rendered (only the files are validated)"

# Install (or refresh) node_modules when package-lock.json is newer than the last install.
stamp=node_modules/.package-lock.json
if [[ ! -f $stamp || package-lock.json -nt $stamp ]]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi

reporters=(--test-reporter=spec --test-reporter-destination=stdout)
if [[ -n "${K8S_JUNIT:-}" ]]; then
  reporters+=(--test-reporter=junit --test-reporter-destination="$K8S_JUNIT")
fi
exec node --test "${reporters[@]}" validate.test.mjs
