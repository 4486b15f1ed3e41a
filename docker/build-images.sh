#!/usr/bin/env bash
# Builds the container images of collectived from the repository root, with podman (default) or
# docker, entirely from local sources and the Debian mirror: no registry is needed when the base
# image was made by docker/build-base-image.sh (this script runs it first, for podman).
#
#   docker/build-images.sh                  # sidecar + trainer
#   docker/build-images.sh sidecar          # only the sidecar image
#   docker/build-images.sh --cuda nvidia/cuda:12.4.1-devel-ubuntu22.04 sidecar
#                                           # the CUDA variant: collectived:VERSION-cuda
#   docker/build-images.sh --cuda-local [DIR] sidecar
#                                           # the CUDA variant from this machine's CUDA toolkit
#                                           # (DIR, default /usr/local/cuda, with NCCL in it):
#                                           # first makes localhost/cuda-local:<version>
#
# Images (VERSION from CMakeLists.txt; REGISTRY=registry.example.com/team/ prefixes the names):
#   collectived:VERSION, :latest                    docker/Dockerfile
#   collectived:VERSION-cuda, :latest-cuda          docker/Dockerfile with --cuda IMAGE
#   collectived-trainer:VERSION, :latest            docker/Dockerfile.trainer
#
# Environment: ENGINE=podman|docker, REGISTRY (name prefix, e.g. ghcr.io/acme/), JOBS (compile
# jobs in the build stage), EXTRA_BUILD_ARGS (more arguments for `build`), SKIP_BASE=1 (do not
# run docker/build-base-image.sh, e.g. when debian:bookworm-slim comes from a registry).
# Prints how long each image took.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

ENGINE=${ENGINE:-podman}
REGISTRY=${REGISTRY:-}
cuda_image=""
cuda_local=""
targets=()
while (($#)); do
  case $1 in
    --cuda) cuda_image=${2:?--cuda needs an image with /usr/local/cuda and NCCL}; shift 2 ;;
    --cuda-local)
      cuda_local=/usr/local/cuda
      if [[ $# -gt 1 && $2 == /* ]]; then cuda_local=$2; shift; fi
      shift ;;
    sidecar|trainer) targets+=("$1"); shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "build-images: unknown argument '$1' (sidecar, trainer, --cuda IMAGE)" >&2; exit 2 ;;
  esac
done
((${#targets[@]})) || targets=(sidecar trainer)

version=$(sed -n 's/^project(collectived VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[[ -n "$version" ]] || { echo "build-images: no version in CMakeLists.txt" >&2; exit 1; }

if [[ "$ENGINE" == podman && -z "${SKIP_BASE:-}" ]]; then
  "$root/docker/build-base-image.sh"
fi

common=(--build-arg "VERSION=$version")
[[ -n "${JOBS:-}" ]] && common+=(--build-arg "JOBS=$JOBS")
if [[ "$ENGINE" == podman ]]; then
  # Docker's image format keeps HEALTHCHECK (OCI drops it); never pull: the base is local.
  common+=(--format docker --pull=never)
fi
# shellcheck disable=SC2206
[[ -n "${EXTRA_BUILD_ARGS:-}" ]] && common+=(${EXTRA_BUILD_ARGS})

# --cuda-local: an image holding only what the build needs of a local CUDA toolkit (headers,
# nvcc, cudart, NCCL; not cuBLAS/cuDNN/...), on the same Debian base.
make_local_cuda_image() {
  local dir
  dir=$(readlink -f "$1")
  [[ -e $dir/include/cuda_runtime.h ]] || { echo "build-images: no CUDA toolkit in $1" >&2; exit 1; }
  [[ -e $dir/include/nccl.h ]] || { echo "build-images: no nccl.h in $dir/include (NCCL is needed)" >&2; exit 1; }
  local cuda_version
  cuda_version=$(basename "$dir" | sed -n 's/^cuda-//p')
  cuda_image=localhost/cuda-local:${cuda_version:-latest}
  if "$ENGINE" image exists "$cuda_image" 2>/dev/null && [[ -z "${FORCE_CUDA_IMAGE:-}" ]]; then
    echo "== $cuda_image exists (FORCE_CUDA_IMAGE=1 remakes it)" >&2
    return
  fi
  local ctx
  ctx=$(mktemp -d /var/tmp/cuda-local.XXXXXX)
  mkdir -p "$ctx/cuda/lib"
  (cd "$dir" && cp -a --parents include bin nvvm dist-info version.json version.txt "$ctx/cuda/" 2>/dev/null || true)
  local libdir=lib
  [[ -d $dir/lib && ! -L $dir/lib ]] || libdir=lib64
  [[ -d $dir/targets ]] && cp -a "$dir/targets" "$ctx/cuda/" 2>/dev/null || true
  # libcudart_static.a: CMake's CUDA compiler check links it (enable_language(CUDA)).
  cp -a "$dir/$libdir"/libcudart.so* "$dir/$libdir"/libcudart_static.a "$dir/$libdir"/libnccl.so* \
    "$dir/$libdir"/libcudadevrt.a "$dir/$libdir"/libculibos.a "$ctx/cuda/$libdir/" 2>/dev/null || true
  [[ -d $dir/$libdir/cmake ]] && cp -a "$dir/$libdir/cmake" "$ctx/cuda/$libdir/"
  [[ $libdir == lib ]] && ln -sfn lib "$ctx/cuda/lib64"
  printf 'FROM debian:bookworm-slim
COPY cuda /usr/local/%s
RUN ln -sfn %s /usr/local/cuda
' \
    "$(basename "$dir")" "$(basename "$dir")" >"$ctx/Dockerfile"
  echo "== making $cuda_image from $dir ($(du -sh "$ctx/cuda" | cut -f1))" >&2
  "$ENGINE" build -t "$cuda_image" "$ctx" >&2
  rm -rf "$ctx"
}

build() {  # build DOCKERFILE TAG... -- ARGS...
  local dockerfile=$1; shift
  local tags=()
  while [[ $1 != -- ]]; do tags+=(-t "$1"); shift; done
  shift
  local ignore=()
  # podman does not look for <Dockerfile>.dockerignore by itself (BuildKit does).
  [[ "$ENGINE" == podman ]] && ignore=(--ignorefile "$dockerfile.dockerignore")
  local start=$SECONDS
  echo "== $ENGINE build -f $dockerfile ${tags[*]} $*" >&2
  "$ENGINE" build "${common[@]}" "${ignore[@]}" -f "$dockerfile" "${tags[@]}" "$@" .
  echo "== built ${tags[1]} in $((SECONDS - start)) s" >&2
}

if [[ -n "$cuda_local" ]]; then make_local_cuda_image "$cuda_local"; fi

for target in "${targets[@]}"; do
  case $target in
    sidecar)
      if [[ -n "$cuda_image" ]]; then
        build docker/Dockerfile "${REGISTRY}collectived:$version-cuda" "${REGISTRY}collectived:latest-cuda" -- \
          --build-arg "CUDA_IMAGE=$cuda_image" --build-arg REQUIRE_GPU=1
      else
        build docker/Dockerfile "${REGISTRY}collectived:$version" "${REGISTRY}collectived:latest" --
      fi
      ;;
    trainer)
      build docker/Dockerfile.trainer "${REGISTRY}collectived-trainer:$version" \
        "${REGISTRY}collectived-trainer:latest" --
      ;;
  esac
done
"$ENGINE" images --filter "reference=*collectived*" >&2
