#!/usr/bin/env bash
# Writes MODULE_DIR/vendor (and the matching requirements in MODULE_DIR/go.mod) from Debian's Go
# packages under /usr/share/gocode and from this collectived client, so that a Go module that
# imports github.com/collectived/collectived/clients/go builds in module mode with no module proxy
# and no network: `go build` uses vendor/ by itself (go >= 1.14). Run it again after changing
# imports. MODULE_DIR may be this client module itself (then only its dependencies are vendored).
#
# Usage: vendor-debian.sh MODULE_DIR
# Environment: GO (the go command), GO_ROOT (Debian's Go sources, default /usr/share/gocode).
#
# Each Debian module is vendored at the upstream version its package was made from (the table
# below, checked against dpkg at run time), so a module that later goes online with a real proxy
# resolves to the same code. Only the packages the module imports (tests included) are copied.
set -euo pipefail
module_dir=$(cd "$1" && pwd)
go=${GO:-go}
go_root=${GO_ROOT:-/usr/share/gocode}
client_dir=$(cd "$(dirname "$0")" && pwd)
client_module=$(sed -n 's/^module //p' "$client_dir/go.mod")
client_version=v$(sed -n 's/^project(collectived VERSION \([0-9.]*\).*/\1/p' "$client_dir/../../CMakeLists.txt")
program_module=$(sed -n 's/^module //p' "$module_dir/go.mod")
[[ -n $program_module ]] || { echo "vendor-debian.sh: $module_dir/go.mod names no module" >&2; exit 2; }

# module path | Debian package | upstream version of that package's source
debian_modules="
google.golang.org/grpc|golang-google-grpc-dev|v1.33.3
google.golang.org/protobuf|golang-google-protobuf-dev|v1.28.1
github.com/golang/protobuf|golang-github-golang-protobuf-1-5-dev|v1.5.2
golang.org/x/net|golang-golang-x-net-dev|v0.7.0
golang.org/x/sys|golang-golang-x-sys-dev|v0.3.0
golang.org/x/text|golang-golang-x-text-dev|v0.7.0
google.golang.org/genproto|golang-google-genproto-dev|v0.0.0-20200413115906-b5235f65be36
"

export GO111MODULE=off GOPROXY=off GOSUMDB=off GOFLAGS= GOTOOLCHAIN=local GOENV=off
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export GOCACHE=${GOCACHE:-$scratch/cache}

# The import graph, read in GOPATH mode from copies of the program and of the client.
copy_module() { # SOURCE IMPORT_PATH
  mkdir -p "$scratch/src/$2"
  (cd "$1" && find . -name vendor -prune -o -name '*.go' -exec cp --parents {} "$scratch/src/$2" \;)
}
copy_module "$client_dir" "$client_module"
[[ $program_module == "$client_module" ]] || copy_module "$module_dir" "$program_module"
if ! listed=$(cd "$scratch/src/$program_module" && GOPATH="$scratch:$go_root" "$go" list -deps -test \
    -f '{{if and (not .Standard) (not .ForTest)}}{{.ImportPath}}{{end}}' "$program_module/..." \
    2>"$scratch/list.err"); then
  echo "vendor-debian.sh: the imports of $program_module cannot all be found in this client or in" \
       "Debian's Go packages ($go_root):" >&2
  cat "$scratch/list.err" >&2
  exit 2
fi
packages=$(grep -v '\.test$' <<<"$listed" | sort -u)

rm -rf "$module_dir/vendor"
declare -A module_packages module_version module_source module_go
for package in $packages; do
  [[ $package == "$program_module" || $package == "$program_module"/* ]] && continue
  if [[ $package == "$client_module" || $package == "$client_module"/* ]]; then
    module=$client_module version=$client_version source=$client_dir
  else
    module=""
    while IFS='|' read -r path debian_package debian_version; do
      [[ -n $path && ( $package == "$path" || $package == "$path"/* ) ]] || continue
      module=$path source=$go_root/src/$path version=$debian_version
      [[ -n ${module_version[$module]:-} ]] && break  # its package was checked already
      installed=$(dpkg-query -W -f '${Version}' "$debian_package" 2>/dev/null || true)
      upstream=${installed#*:}
      if [[ ${version#v} != 0.0.0-* && ${upstream%%[+~-]*} != "${version#v}" ]]; then
        echo "vendor-debian.sh: $module: expected $debian_package ${version#v}, found '${installed:-nothing}'" >&2
        exit 2
      fi
    done <<<"$debian_modules"
    if [[ -z $module ]]; then
      echo "vendor-debian.sh: $package is imported but comes from no module this script knows" >&2
      exit 2
    fi
  fi
  [[ -d $source/${package#"$module"} ]] || { echo "vendor-debian.sh: $package not found in $source" >&2; exit 2; }
  module_packages[$module]+="$package "
  module_version[$module]=$version
  module_source[$module]=$source
  module_go[$module]=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$source/go.mod")
  mkdir -p "$module_dir/vendor/$package"
  find "$source/${package#"$module"}" -maxdepth 1 -type f ! -name '*_test.go' \
    -exec cp {} "$module_dir/vendor/$package/" \;
done

{
  for module in $(printf '%s\n' "${!module_packages[@]}" | sort); do
    echo "# $module ${module_version[$module]}"
    echo "## explicit${module_go[$module]:+; go ${module_go[$module]}}"
    printf '%s\n' ${module_packages[$module]} | sort
    for license in "${module_source[$module]}"/LICENSE*; do
      [[ -f $license ]] && cp "$license" "$module_dir/vendor/$module/"
    done
    (cd "$module_dir" && GO111MODULE=on "$go" mod edit -require="$module@${module_version[$module]}")
  done
} >"$scratch/modules.txt"
mv "$scratch/modules.txt" "$module_dir/vendor/modules.txt"
