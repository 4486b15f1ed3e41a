#!/usr/bin/env bash
# The clients' generated tables (the op table from engine/vocabulary/op_traits.h, the error kinds from
# rpc/error_table.h) are kept in the tree: fails, with the difference, when a committed file is
# not what its generator writes today.
# Usage: check-generated-tables.sh EXPORT_TOOL SOURCE_ROOT LANGUAGE:FILE...
#   e.g. check-generated-tables.sh build/bin/op_table_export . python:clients/python/collectived/op_table.py
set -euo pipefail
export_tool=$1
root=$2
shift 2
status=0
for pair in "$@"; do
  language=${pair%%:*}
  file=$root/${pair#*:}
  if ! diff -u "$file" <("$export_tool" "$language"); then
    echo "$file is out of date: run $export_tool $language > $file" >&2
    status=1
  fi
done
exit $status
