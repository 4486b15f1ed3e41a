#!/usr/bin/env bash
# Builds the Go client offline: generates the Go stubs of proto/collectived/v1 into
# BUILD/go/src/collectived.io/go/api/collectived/v1, links the sources into that GOPATH and builds
# BUILD/bin/collectived-go-example and the client's test binary BUILD/bin/collectived_go_test.
# Usage: build-go.sh SOURCE_ROOT BUILD_DIR (GO, PROTOC, PROTOC_GEN_GO, PROTOC_GEN_GO_GRPC and
# GO_ROOT may name the tools and the GOPATH entry with Debian's Go sources).
set -euo pipefail
src=$1
build=$2
go=${GO:-go}
protoc=${PROTOC:-protoc}
gopath=$build/go
pkg=$gopath/src/collectived.io/go

rm -rf "$pkg/api"
mkdir -p "$pkg/api" "$pkg/examples" "$build/bin"
# The protos carry no go_package option: map each to the import path here (M options).
mapping=""
protos=()
for proto in "$src"/proto/collectived/v1/*.proto; do
  rel=${proto#"$src/proto/"}
  protos+=("$rel")
  mapping+="${mapping:+,}M$rel=collectived.io/go/api/collectived/v1;collectivedv1"
done
(cd "$src/proto" && "$protoc" -I . \
  --plugin=protoc-gen-go="${PROTOC_GEN_GO:-$(command -v protoc-gen-go)}" \
  --plugin=protoc-gen-go-grpc="${PROTOC_GEN_GO_GRPC:-$(command -v protoc-gen-go-grpc)}" \
  --go_out="$gopath/src" --go_opt="$mapping" \
  --go-grpc_out="$gopath/src" --go-grpc_opt="$mapping" "${protos[@]}")
ln -sfn "$src/clients/go/collectived" "$pkg/collectived"
ln -sfn "$src/examples/go" "$pkg/examples/mixed"

# Offline, always: GOPATH mode, no proxy, no checksum database, no toolchain downloads.
export GO111MODULE=off GOPROXY=off GOSUMDB=off GOFLAGS= GOTOOLCHAIN=local GOENV=off
export GOPATH="$gopath:${GO_ROOT:-/usr/share/gocode}" GOCACHE="$gopath/cache"
"$go" build -o "$build/bin/collectived-go-example" collectived.io/go/examples/mixed
"$go" test -c -o "$build/bin/collectived_go_test" collectived.io/go/collectived
