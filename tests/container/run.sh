#!/usr/bin/env bash
# Container test: builds the sidecar and trainer images with podman (from a locally made
# debian:bookworm-slim), runs two sidecar containers on the host network (two "nodes"), runs
# collectives through them from the host with collectivectl (shared memory over the Unix
# sockets, 4 ranks = 2 per sidecar; then inline tensors over TCP), trains with DDP from two
# trainer containers (one per sidecar, backend "collectived"), scrapes both /metrics endpoints,
# runs the image's HEALTHCHECK, stops the sidecars with SIGTERM (clean exit expected) and
# removes everything it made (the images stay, as a build cache).
#
#   tests/container/run.sh          # as root; installs podman/runc/debootstrap if missing
#
# Not part of scripts/test.sh: from nothing it takes about 10 minutes (measured 566 s with
# podman installed: base image 32 s, sidecar image 359 s, trainer image 160 s, checks ~15 s) and
# about 5 minutes after any source change (the sidecar image recompiles); 16-40 s when the
# images are cached and the sources unchanged.
# Environment: BUILD_DIR (host build with collectivectl, default build/), SKIP_IMAGE_BUILD=1
# (use the existing images), NO_TRAINER=1 (skip the trainer image and the DDP step),
# KEEP=1 (leave containers and logs).
# Prints "container: N passed, M failed" and exits non-zero on any failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
image=localhost/collectived:latest
trainer_image=localhost/collectived-trainer:latest
uid=10001  # the image's user and the socket's group
t0=$SECONDS
passed=0
failed=0
work=$(mktemp -d /tmp/collectived-container-test.XXXXXX)
chmod 0755 "$work"
containers=()

step() { echo "== [$((SECONDS - t0)) s] $*"; }
ok() { echo "PASS: $*"; passed=$((passed + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
cleanup() {
  for c in "${containers[@]}"; do podman rm -f -t 2 "$c" >/dev/null 2>&1; done
  if [[ -n "${KEEP:-}" ]]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

if [[ $(id -u) -ne 0 ]]; then echo "tests/container/run.sh needs root (podman, debootstrap)"; exit 1; fi

missing=()
for tool in podman runc debootstrap setpriv curl; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  step "installing podman runc debootstrap (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends \
    podman runc debootstrap util-linux curl >/dev/null || { echo "apt-get failed"; exit 1; }
fi

# ---- images --------------------------------------------------------------------------------------
if [[ -z "${SKIP_IMAGE_BUILD:-}" ]]; then
  step "base image (docker/build-base-image.sh)"
  s=$SECONDS
  if "$root/docker/build-base-image.sh"; then
    ok "base image debian:bookworm-slim ($((SECONDS - s)) s)"
  else
    bad "docker/build-base-image.sh"; echo "container: $passed passed, $failed failed"; exit 1
  fi
  step "sidecar image (docker/build-images.sh sidecar)"
  s=$SECONDS
  if SKIP_BASE=1 "$root/docker/build-images.sh" sidecar >"$work/image-build.log" 2>&1; then
    ok "sidecar image built ($((SECONDS - s)) s)"
  else
    tail -n 40 "$work/image-build.log"
    bad "sidecar image build (log above)"; echo "container: $passed passed, $failed failed"; exit 1
  fi
  if [[ -z "${NO_TRAINER:-}" ]]; then
    step "trainer image (docker/build-images.sh trainer)"
    s=$SECONDS
    if SKIP_BASE=1 "$root/docker/build-images.sh" trainer >"$work/trainer-build.log" 2>&1; then
      ok "trainer image built ($((SECONDS - s)) s)"
    else
      tail -n 40 "$work/trainer-build.log"; bad "trainer image build (log above)"
    fi
  fi
fi
podman image exists "$image" || { bad "no image $image"; echo "container: $passed passed, $failed failed"; exit 1; }
size=$(podman image inspect "$image" --format '{{.Size}}')
echo "image $image: $((size / 1000000)) MB, user $(podman image inspect "$image" --format '{{.Config.User}}')"
[[ $(podman image inspect "$image" --format '{{.Config.User}}') == 10001:10001 ]] &&
  ok "image runs as non-root 10001:10001" || bad "image user is not 10001:10001"

# ---- host client ---------------------------------------------------------------------------------
step "host collectivectl ($build_dir)"
if [[ -f "$build_dir/build.ninja" ]]; then
  cmake --build "$build_dir" --target collectivectl >"$work/host-build.log" 2>&1
else
  BUILD_DIR=$build_dir "$root/scripts/build.sh" >"$work/host-build.log" 2>&1
fi || { tail -n 30 "$work/host-build.log"; bad "host build of collectivectl"; echo "container: $passed passed, $failed failed"; exit 1; }
ctl=$build_dir/bin/collectivectl

# ---- two sidecars on the host network ------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The two sidecars run with the two security set-ups of k8s/:
#   a: as the native sidecar: the image's user 10001:10001, read-only root, no capabilities;
#      its socket directory belongs to 10001 (an emptyDir with fsGroup 10001);
#   b: as the DaemonSet: root with only CAP_DAC_OVERRIDE, group 10001, read-only root; its
#      socket directory belongs to root (the hostPath kubelet creates), so that trainers of any
#      uid in group 10001 can use it.
declare -A port metrics sock name security
security[a]="--cap-drop ALL"
security[b]="--user 0:10001 --cap-drop ALL --cap-add DAC_OVERRIDE"
for node in a b; do
  port[$node]=$(free_port)
  metrics[$node]=$(free_port)
  mkdir -p "$work/$node"
  sock[$node]=$work/$node/collectived.sock
  name[$node]=collectived-ctest-$node-$$
done
chown "$uid:$uid" "$work/a" && chmod 0750 "$work/a"
chown root:root "$work/b" && chmod 0755 "$work/b"
step "starting two sidecar containers (host network, runc, ulimits)"
for node in a b; do
  # /run/collectived: the socket and its .fd channel, on a host directory (as with the k8s
  # DaemonSet's hostPath). No /dev/shm: clients hand their memory over as file descriptors.
  # shellcheck disable=SC2086
  if podman run -d --name "${name[$node]}" --runtime runc \
      --ulimit nofile=1024:1024 --ulimit nproc=1000:1000 --read-only ${security[$node]} \
      --network host -v "$work/$node:/run/collectived" \
      "$image" --listen "127.0.0.1:${port[$node]}" --advertise 127.0.0.1 \
      --trust-plaintext-peers --metrics "127.0.0.1:${metrics[$node]}" >"$work/run-$node.log" 2>&1; then
    containers+=("${name[$node]}")
  else
    cat "$work/run-$node.log"; bad "podman run ${name[$node]}"
  fi
done
for node in a b; do
  up=0
  for _ in $(seq 100); do
    "$ctl" --address "127.0.0.1:${port[$node]}" --timeout-ms 1000 health >/dev/null 2>&1 && { up=1; break; }
    sleep 0.1
  done
  if ((up)); then ok "sidecar $node SERVING on 127.0.0.1:${port[$node]}"; else
    podman logs "${name[$node]}" 2>&1 | tail -n 20; bad "sidecar $node never became healthy"; fi
done
declare -A want_owner=([a]="$uid:$uid 660" [b]="0:$uid 660")
for node in a b; do
  if [[ -S ${sock[$node]} && $(stat -c '%u:%g %a' "${sock[$node]}") == "${want_owner[$node]}" ]]; then
    ok "socket of $node: ${want_owner[$node]% *}, mode 0660"
  else
    bad "socket of $node: $(stat -c '%u:%g %a' "${sock[$node]}" 2>&1), want ${want_owner[$node]}"
  fi
done

# ---- collectives from the host -------------------------------------------------------------------
step "collectivectl smoke: 4 ranks (2 per sidecar), shared memory, Unix sockets, as uid $uid"
s=$SECONDS
ranks="unix://${sock[a]},unix://${sock[a]},unix://${sock[b]},unix://${sock[b]}"
if setpriv --reuid "$uid" --regid "$uid" --clear-groups \
    "$ctl" --timeout-ms 30000 smoke --ranks "$ranks" --count 4096 >"$work/smoke-shm.log" 2>&1; then
  cat "$work/smoke-shm.log"; ok "smoke over shared memory ($((SECONDS - s)) s)"
else
  cat "$work/smoke-shm.log"; bad "smoke over shared memory"
fi
other=20000  # a trainer of another tenant: its own uid, in the socket's group 10001
step "DaemonSet set-up: 2 ranks on sidecar b as uid $other (group $uid), shared memory"
if setpriv --reuid "$other" --regid "$other" --groups "$uid" \
    "$ctl" --timeout-ms 30000 smoke --ranks "unix://${sock[b]},unix://${sock[b]}" \
    >"$work/smoke-other.log" 2>&1; then
  tail -n 1 "$work/smoke-other.log"; ok "uid $other hands its memory to the sidecar as file descriptors"
else
  cat "$work/smoke-other.log"; bad "smoke as uid $other on sidecar b"
fi
if setpriv --reuid "$other" --regid "$other" --clear-groups \
    "$ctl" --timeout-ms 3000 --address "unix://${sock[b]}" health >"$work/denied.log" 2>&1; then
  bad "uid $other without group $uid could use the socket (mode 0660)"
else
  ok "uid $other without group $uid is refused: $(head -c 120 "$work/denied.log" | tr '\n' ' ')"
fi

step "collectivectl smoke: 2 ranks over TCP, inline tensors"
s=$SECONDS
if "$ctl" --timeout-ms 30000 smoke --ranks "127.0.0.1:${port[a]},127.0.0.1:${port[b]}" --inline \
    >"$work/smoke-tcp.log" 2>&1; then
  cat "$work/smoke-tcp.log"; ok "smoke over TCP, inline ($((SECONDS - s)) s)"
else
  cat "$work/smoke-tcp.log"; bad "smoke over TCP, inline"
fi

# ---- DDP from trainer containers -----------------------------------------------------------------
if [[ -z "${NO_TRAINER:-}" ]] && podman image exists "$trainer_image"; then
  step "trainer containers: DDP, 2 ranks (rank 0 on sidecar a, rank 1 on sidecar b)"
  s=$SECONDS
  master_port=$(free_port)
  trainers=()
  for rank in 0 1; do
    node=$([[ $rank == 0 ]] && echo a || echo b)
    tname=collectived-ctest-trainer$rank-$$
    # As in the k8s native-sidecar pod: the sidecar's socket directory; the trainer's own shm.
    if podman run -d --name "$tname" --runtime runc \
        --ulimit nofile=1024:1024 --ulimit nproc=1000:1000 --network host \
        -v "$work/$node:/run/collectived" --shm-size 1g \
        -e RANK=$rank -e WORLD_SIZE=2 -e MASTER_ADDR=127.0.0.1 -e MASTER_PORT="$master_port" \
        -e STEPS=30 "$trainer_image" >"$work/run-trainer$rank.log" 2>&1; then
      containers+=("$tname"); trainers+=("$tname")
    else
      cat "$work/run-trainer$rank.log"; bad "podman run $tname"
    fi
  done
  for tname in "${trainers[@]}"; do
    code=$(timeout 300 podman wait "$tname" 2>/dev/null | tail -n 1)
    podman logs "$tname" >"$work/$tname.log" 2>&1
    if [[ "$code" == 0 ]]; then ok "$tname exited 0"; else
      tail -n 30 "$work/$tname.log"; bad "$tname exit code '${code:-timeout}'"; fi
  done
  rank0=$work/collectived-ctest-trainer0-$$.log
  [[ -f $rank0 ]] && sed 's/^/  /' "$rank0"
  if grep -q "identical parameters: True" "$rank0" 2>/dev/null; then
    ok "DDP through the sidecar containers: every rank holds identical parameters ($((SECONDS - s)) s)"
  else
    bad "DDP through the sidecar containers: no 'identical parameters: True' from rank 0"
  fi
fi

# ---- metrics -------------------------------------------------------------------------------------
step "scraping /metrics"
for node in a b; do
  url=http://127.0.0.1:${metrics[$node]}/metrics
  if curl -fsS --max-time 5 "$url" >"$work/metrics-$node.txt"; then
    ok "scraped $url ($(grep -c '^collectived_' "$work/metrics-$node.txt") collectived_ samples)"
  else
    bad "scrape $url"; continue
  fi
  grep -q '^collectived_build_info{' "$work/metrics-$node.txt" &&
    ok "$node: collectived_build_info" || bad "$node: no collectived_build_info"
  # Ops metrics (observability issue): the smoke runs above must have been counted, if the
  # sidecar exports them.
  if grep -q '^collectived_ops_total{' "$work/metrics-$node.txt"; then
    total=$(awk '/^collectived_ops_total\{/ && /status="ok"/ {s += $NF} END {print s + 0}' "$work/metrics-$node.txt")
    if awk -v t="$total" 'BEGIN {exit !(t > 0)}'; then
      ok "$node: collectived_ops_total{status=\"ok\"} = $total"
    else
      bad "$node: collectived_ops_total{status=\"ok\"} is $total after the smoke runs"
    fi
    grep -q '^collectived_op_latency_seconds_bucket{' "$work/metrics-$node.txt" &&
      ok "$node: collectived_op_latency_seconds histogram" || bad "$node: no latency histogram"
  else
    echo "note: $node exports no collectived_ops_total yet (observability work): not checked"
  fi
done

# ---- HEALTHCHECK and clean shutdown --------------------------------------------------------------
step "image HEALTHCHECK (podman healthcheck run)"
for node in a b; do
  if podman healthcheck run "${name[$node]}" >"$work/hc-$node.log" 2>&1; then
    ok "$node: HEALTHCHECK healthy"
  else
    cat "$work/hc-$node.log"; bad "$node: HEALTHCHECK"
  fi
done
step "SIGTERM (podman stop)"
for node in a b; do
  podman stop -t 15 "${name[$node]}" >/dev/null 2>&1
  code=$(podman inspect "${name[$node]}" --format '{{.State.ExitCode}}' 2>/dev/null)
  if [[ "$code" == 0 && ! -e ${sock[$node]} ]]; then
    ok "$node: exit 0 on SIGTERM, socket removed"
  else
    podman logs "${name[$node]}" 2>&1 | tail -n 10
    bad "$node: exit code '$code' on SIGTERM$([[ -e ${sock[$node]} ]] && echo ', socket left behind')"
  fi
  podman logs "${name[$node]}" >"$work/sidecar-$node.log" 2>&1
done

echo "container test took $((SECONDS - t0)) s"
echo "container: $passed passed, $failed failed"
((failed == 0))
