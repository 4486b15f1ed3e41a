#!/usr/bin/env bash
# Regenerates the Go stubs of proto/collectived/v1 into MODULE_ROOT/api/collectived/v1 (default:
# this module, clients/go). The stubs are checked in so that `go build` needs no protoc; the test
# Go.stubs_match_proto regenerates them into a scratch folder and fails on any difference.
# Uses Debian's protoc-gen-go and protoc-gen-go-grpc (PROTOC, PROTOC_GEN_GO and PROTOC_GEN_GO_GRPC
# may name others).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
proto_root=$here/../../proto
module=$(sed -n 's/^module //p' "$here/go.mod")
mkdir -p "$out/api/collectived/v1"
rm -f "$out"/api/collectived/v1/*.pb.go
cd "$proto_root"
"${PROTOC:-protoc}" -I . \
  --plugin=protoc-gen-go="${PROTOC_GEN_GO:-$(command -v protoc-gen-go)}" \
  --plugin=protoc-gen-go-grpc="${PROTOC_GEN_GO_GRPC:-$(command -v protoc-gen-go-grpc)}" \
  --go_out="$out" --go_opt=module="$module" \
  --go-grpc_out="$out" --go-grpc_opt=module="$module" \
  collectived/v1/*.proto
