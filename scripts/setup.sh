#!/usr/bin/env bash
# Installs the Debian packages collectived needs, only when some are missing.
# Idempotent: when everything is present it returns in well under a second.
# CUDA/NCCL are never installed here: the build detects /usr/local/cuda on its own.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libgloo-dev libgtest-dev googletest libbenchmark-dev
  python3-torch python3-grpcio python3-protobuf python3-numpy python3-pytest
  # The Python client's wheel is built and installed offline with these (tests/python/test_wheel.py).
  python3-pip python3-setuptools python3-wheel python3-venv
  prometheus curl procps libssl-dev openssl
  # golang-google-grpc-dev also holds reflection.proto, which tests/python/test_reflection.py compiles.
  golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
  protoc-gen-go protoc-gen-go-grpc
  clang-14 libclang-rt-14-dev llvm-14
)

# The manifest validation runs on Node.js: use the machine's if it has one.
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} Debian packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
