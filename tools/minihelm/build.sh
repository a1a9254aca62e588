#!/usr/bin/env bash
# Builds minihelm into OUT_DIR (default build/bin) from Debian's Go packages, offline, in GOPATH mode
# (tools/minihelm/README.md). Prints the binary's path. Safe to run concurrently (build to a temp name, then rename).
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
out=${1:-$src/../../build/bin}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for pkg in github.com/Masterminds/sprig sigs.k8s.io/yaml github.com/xeipuuv/gojsonschema; do
  if [ ! -d "/usr/share/gocode/src/$pkg" ]; then
    echo "minihelm: Go package $pkg is missing: run scripts/install-deps.sh (golang-github-masterminds-sprig-dev," \
      "golang-k8s-sigs-yaml-dev, golang-github-xeipuuv-gojsonschema-dev)" >&2
    exit 1
  fi
done
tmp=$(mktemp "$out/.minihelm.XXXXXX")
trap 'rm -f "$tmp"' EXIT
(cd "$src" && GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOPROXY=off GOCACHE="$out/../gocache" \
  go build -o "$tmp" .)
mv -f "$tmp" "$out/minihelm"
trap - EXIT
echo "$out/minihelm"
