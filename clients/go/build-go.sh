#!/usr/bin/env bash
# Builds the Go client and examples/go in module mode, offline: each module is copied under
# BUILD/go, given a vendor tree from Debian's Go packages (vendor-debian.sh) and built with
# GOFLAGS=-mod=vendor, no proxy and no checksum database. Produces BUILD/bin/collectived-go-example
# and the client's test binary BUILD/bin/collectived_go_test.
# Usage: build-go.sh SOURCE_ROOT BUILD_DIR (GO and GO_ROOT may name the go command and the folder
# of Debian's Go sources).
set -euo pipefail
src=$1
build=$(mkdir -p "$2" && cd "$2" && pwd)
go=${GO:-go}
work=$build/go
mkdir -p "$work" "$build/bin"

export GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local GOENV=off GOFLAGS=-mod=vendor
export GOPATH="$work/gopath" GOCACHE="$work/cache"
for module in client:clients/go example:examples/go; do
  copy=$work/${module%%:*}
  rm -rf "$copy"
  mkdir -p "$copy"
  (cd "$src/${module#*:}" && find . -name vendor -prune -o \( -name '*.go' -o -name go.mod \) \
     -exec cp --parents {} "$copy" \;)
  GO=$go "$src/clients/go/vendor-debian.sh" "$copy"
done
(cd "$work/client" && "$go" vet ./... && "$go" test -c -o "$build/bin/collectived_go_test" ./collectived)
(cd "$work/example" && "$go" build -o "$build/bin/collectived-go-example" .)
