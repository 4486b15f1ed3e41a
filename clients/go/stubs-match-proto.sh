#!/usr/bin/env bash
# Fails when the checked-in Go stubs (api/collectived/v1) differ from what generate.sh makes of
# proto/collectived/v1 now: a proto edit must come with `clients/go/generate.sh`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$here/generate.sh" "$scratch"
if ! diff -ru "$here/api" "$scratch/api"; then
  echo "clients/go/api is stale: run clients/go/generate.sh and commit the result" >&2
  exit 1
fi
echo "clients/go/api matches proto/collectived/v1 ($(ls "$here"/api/collectived/v1 | wc -l) files)"
