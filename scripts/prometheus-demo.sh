#!/usr/bin/env bash
# Starts two sidecars, Debian's Prometheus scraping them, and a 4-rank DDP job through them;
# then queries Prometheus' HTTP API for the op counters, latency quantiles, bus bandwidth and
# stragglers it collected, and stops everything. Pass --keep to leave Prometheus and the
# sidecars running afterwards (it prints their addresses).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
export BUILD_DIR=$build_dir
"$root/scripts/build.sh" >/dev/null
bin=$build_dir/bin
work=$(mktemp -d /tmp/collectived-prom.XXXXXX)
pids=()
keep=${1:-}
cleanup() {
  [[ "$keep" == "--keep" ]] && return
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

targets=()
declare -A socket
# Mutual TLS between the sidecars, as in scripts/demo.sh.
"$root/scripts/gen-certs.sh" "$work/certs" >/dev/null
tls=(--tls-cert "$work/certs/sidecar.crt" --tls-key "$work/certs/sidecar.key"
  --tls-ca "$work/certs/ca.crt")
for node in A B; do
  socket[$node]=$work/node$node.sock
  metrics=$(free_port)
  "$bin/collectived" --socket "${socket[$node]}" --listen "127.0.0.1:$(free_port)" \
    --advertise 127.0.0.1 --metrics "127.0.0.1:$metrics" "${tls[@]}" >"$work/node$node.log" 2>&1 &
  pids+=($!)
  targets+=("\"127.0.0.1:$metrics\"")
done
prom_port=$(free_port)
cat >"$work/prometheus.yml" <<YAML
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: collectived
    static_configs: [{targets: [$(IFS=,; echo "${targets[*]}")]}]
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
pids+=($!)
for node in A B; do
  for _ in $(seq 100); do "$bin/collectivectl" --address "unix://${socket[$node]}" health >/dev/null 2>&1 && break; sleep 0.1; done
done

echo "== 4-rank DDP job through the sidecars (Prometheus on http://127.0.0.1:$prom_port)"
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) WORLD_SIZE=4 BACKEND=collectived STEPS=40
export PYTHONPATH=$build_dir/python
for rank in 0 1 2 3; do
  node=$([[ $rank -lt 2 ]] && echo A || echo B)
  RANK=$rank COLLECTIVED_ADDRESS="unix://${socket[$node]}" \
    /usr/bin/python3 "$root/examples/ddp_train.py" >"$work/rank$rank.log" 2>&1 &
  trainers+=($!)
done
wait "${trainers[@]}"
tail -n 2 "$work/rank0.log"
sleep 3  # a few more scrapes

query() {
  curl -s -G --data-urlencode "query=$1" "http://127.0.0.1:$prom_port/api/v1/query" |
    /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]
for s in r: print("   ", {k:v for k,v in s["metric"].items() if k not in ("__name__","job")}, s["value"][1])'
}
echo "== ops completed, by sidecar, group and op: collectived_ops_total"
query 'sum by (instance, op, status) (collectived_ops_total)'
echo "== p50 / p99 allreduce latency (s): histogram_quantile over collectived_op_latency_seconds"
query 'histogram_quantile(0.5, sum by (le) (collectived_op_latency_seconds_bucket{op="allreduce"}))'
query 'histogram_quantile(0.99, sum by (le) (collectived_op_latency_seconds_bucket{op="allreduce"}))'
echo "== last allreduce bus bandwidth (bytes/s): collectived_busbw_bytes_per_second"
query 'collectived_busbw_bytes_per_second{op="allreduce"}'
echo "== stragglers (which rank arrived last, how often): collectived_straggler_total"
query 'sum by (rank) (collectived_straggler_total)'
if [[ "$keep" == "--keep" ]]; then
  echo "left running: Prometheus http://127.0.0.1:$prom_port, sidecars ${socket[A]} ${socket[B]} (pids ${pids[*]})"
fi
