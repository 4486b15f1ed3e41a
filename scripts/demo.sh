#!/usr/bin/env bash
# The README's main command: builds, then runs a local multi-node training demo on loopback:
# two collectived sidecars (two simulated nodes), four trainer processes (ranks 0,1 on node A,
# ranks 2,3 on node B) training a small model with DDP through the "collectived" backend. It
# prints the loss going down and a final check that every rank holds identical parameters,
# shows the sidecars' view of the group, and stops everything it started. The sidecars serve
# their TCP listeners with mutual TLS (certificates from scripts/gen-certs.sh in the temporary
# directory) and reach each other's rendezvous store over it; the trainers' groups carry a job
# token (a random secret in a file, as a mounted Secret would be).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
export BUILD_DIR=$build_dir
"$root/scripts/build.sh"
bin=$build_dir/bin
work=$(mktemp -d /tmp/collectived-demo.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n "${KEEP_DEMO:-}" ]] || rm -rf "$work"
}
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "== certificates for mutual TLS (scripts/gen-certs.sh)"
"$root/scripts/gen-certs.sh" "$work/certs"
tls=(--tls-cert "$work/certs/sidecar.crt" --tls-key "$work/certs/sidecar.key"
  --tls-ca "$work/certs/ca.crt")

echo "== starting two sidecars (node A, node B) on loopback, mutual TLS on TCP"
declare -A socket port
for node in A B; do
  socket[$node]=$work/node$node.sock
  port[$node]=$(free_port)
  "$bin/collectived" --socket "${socket[$node]}" --listen "127.0.0.1:${port[$node]}" \
    --advertise 127.0.0.1 --metrics "127.0.0.1:$(free_port)" "${tls[@]}" \
    >"$work/node$node.log" 2>&1 &
  pids+=($!)
done
for node in A B; do
  for _ in $(seq 100); do
    "$bin/collectivectl" --address "unix://${socket[$node]}" health >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$bin/collectivectl" --address "unix://${socket[$node]}" health
done
# A remote client over TCP presents a certificate of the same CA (here the plain client one).
"$bin/collectivectl" --address "127.0.0.1:${port[A]}" --tls-ca "$work/certs/ca.crt" \
  --tls-cert "$work/certs/client.crt" --tls-key "$work/certs/client.key" info |
  grep -E "^(listen|tcp security):"

echo "== training: 4 ranks, DDP, backend \"collectived\" (examples/ddp_train.py, unmodified)"
# The job's token: every rank presents it when it creates a group; a process with another token
# naming the job's groups is refused.
(umask 077 && openssl rand -hex 32 >"$work/job-token")
export COLLECTIVED_JOB_TOKEN_FILE=$work/job-token
echo "   every rank presents the job token in \$COLLECTIVED_JOB_TOKEN_FILE (32 random bytes, mode 0600)"
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) WORLD_SIZE=4 BACKEND=collectived
export PYTHONPATH=$build_dir/python${PYTHONPATH:+:$PYTHONPATH}
trainers=()
for rank in 0 1 2 3; do
  node=$([[ $rank -lt 2 ]] && echo A || echo B)
  RANK=$rank COLLECTIVED_JOB_NAME=demo COLLECTIVED_ADDRESS="unix://${socket[$node]}" \
    /usr/bin/python3 "$root/examples/ddp_train.py" >"$work/rank$rank.log" 2>&1 &
  trainers+=($!)
done
status=0
for i in "${!trainers[@]}"; do
  wait "${trainers[$i]}" || { status=1; echo "rank $i failed:"; cat "$work/rank$i.log"; }
done
cat "$work/rank0.log"

echo "== what the sidecars saw"
grep -h "joined group" "$work"/node*.log | sed 's/^ts=[^ ]* //' | head -4
echo "== stopping the sidecars (SIGTERM)"
for pid in "${pids[@]}"; do kill -TERM "$pid"; wait "$pid"; done
pids=()
[[ $status -eq 0 ]] && echo "demo OK" || echo "demo FAILED"
exit $status
