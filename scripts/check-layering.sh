#!/usr/bin/env bash
# Checks the layering of the C++ tree from its #include lines (etcd's api/server/client split):
#   engine/   no gRPC, protobuf or generated API headers (grpc/, grpcpp/, grpc++/,
#             google/protobuf/, collectived/v1/, *.pb.h), nothing from services/, clients/, rpc/,
#             tools/
#   rpc/      nothing from services/, clients/ or tools/ (what both sides of the wire share)
#   services/ nothing from clients/ or tools/
#   clients/  nothing from services/ or tools/; of engine/, only what clients link: the
#             vocabulary (engine/vocabulary/, engine/concurrency/, engine/cuda/) and the store
#             interface (engine/store/), never the sidecar's runtime (engine/group/,
#             engine/sidecar/, engine/memory/)
#   tools/    nothing from services/ (command-line tools such as collectivectl are clients: they
#             may include clients/, rpc/, the generated API headers and what clients may of
#             engine/)
# and inside engine/:
#   engine/{vocabulary,memory,concurrency,cuda}/  (collectived_engine, which clients link) nothing
#             from the runtime: engine/group/, engine/sidecar/, engine/store/
#   engine/group/{core,algorithms,rendezvous}/, engine/sidecar/  no concrete transport
#             (engine/group/transport/{socket,gloo,nccl,in_process}/): they work over the seams
#             of engine/group/transport/ (ControlChannel, MessageTransport, DataBackend,
#             TransportFactory)
# Prints every violation as "file:line: <include> (rule)" and exits 1 if there is any.
# Usage: scripts/check-layering.sh [repository root]   (default: the checkout of this script)
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || { echo "check-layering: cannot enter $root" >&2; exit 2; }

violations=0

# check DIR RULE PATTERN: reports the #include lines of C/C++ files under DIR whose included path
# matches the extended regex PATTERN.
check() {
  local dir=$1 rule=$2 pattern=$3
  [[ -d $dir ]] || return 0
  local hits
  hits=$(grep -rnE --include='*.h' --include='*.hh' --include='*.hpp' --include='*.cc' \
           --include='*.cpp' --include='*.cu' --include='*.cuh' \
           "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($pattern)" "$dir")
  if [[ -n $hits ]]; then
    while IFS= read -r hit; do
      local location=${hit%%:*}
      local rest=${hit#*:}
      local line=${rest%%:*}
      local text=${rest#*:}
      text=$(sed -E 's/^[[:space:]]+//; s/[[:space:]]+$//' <<<"$text")
      echo "layering violation: $location:$line: $text ($rule)"
      violations=$((violations + 1))
    done <<<"$hits"
  fi
}

check engine "engine/ must not include gRPC headers" 'grpc/|grpcpp/|grpc\+\+/'
check engine "engine/ must not include protobuf headers" 'google/protobuf/'
check engine "engine/ must not include generated API headers" 'collectived/v1/|[^">]*\.pb\.h'
check engine "engine/ must not include services/, clients/, rpc/ or tools/" \
  'services/|clients/|rpc/|tools/'
check rpc "rpc/ must not include services/, clients/ or tools/" 'services/|clients/|tools/'
check services "services/ must not include clients/ or tools/" 'clients/|tools/'
check clients "clients/ must not include services/ or tools/" 'services/|tools/'
check tools "tools/ must not include services/" 'services/'
check clients "clients/ may include of engine/ only the vocabulary and the store interface" \
  'engine/(group|sidecar|memory)/'
check tools "tools/ may include of engine/ only the vocabulary and the store interface" \
  'engine/(group|sidecar|memory)/'
for shared in vocabulary memory concurrency cuda; do
  check "engine/$shared" "engine/$shared/ (linked by clients) must not include the runtime" \
    'engine/(group|sidecar|store)/'
done
for over_seams in group/core group/algorithms group/rendezvous sidecar; do
  check "engine/$over_seams" "engine/$over_seams/ works over the transport seams only" \
    'engine/group/transport/(socket|gloo|nccl|in_process)/'
done

if ((violations > 0)); then
  echo "check-layering: $violations violation(s) (see the rules at the top of scripts/check-layering.sh)"
  exit 1
fi
echo "check-layering: OK (engine/ and its folders, rpc/, services/, clients/, tools/)"
