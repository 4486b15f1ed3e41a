#!/usr/bin/env bash
# The Python and Go clients' op tables are generated from engine/op_traits.h (op_table_export):
# fails, with the difference, when a committed table is not what the generator writes today.
# Usage: check-op-tables.sh OP_TABLE_EXPORT SOURCE_ROOT
set -euo pipefail
export_tool=$1
root=$2
status=0
for pair in "python:clients/python/collectived/op_table.py" "go:clients/go/collectived/op_table.go"; do
  language=${pair%%:*}
  file=$root/${pair#*:}
  if ! diff -u "$file" <("$export_tool" "$language"); then
    echo "$file is out of date: run $export_tool $language > $file" >&2
    status=1
  fi
done
exit $status
