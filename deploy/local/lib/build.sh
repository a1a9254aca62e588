# shellcheck shell=bash
# `cluster.sh build`: Kubernetes v1.20.2 binaries from Debian's source package, cached outside the repo.
# Sourced by cluster.sh (which sets -euo pipefail and defines die/info/REPO_ROOT).

K8S_VERSION="1.20.2"
K8S_DEB_SOURCE_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
K8S_BINARIES=(kube-apiserver kube-controller-manager kubectl kubelet kube-proxy kube-scheduler)
CACHE_ROOT="${RAILYARD_CACHE_DIR:-$HOME/.cache/railyard}"
K8S_CACHE="$CACHE_ROOT/kubernetes/$K8S_VERSION"
CACHE_BIN="$K8S_CACHE/bin"
DEB_SRC_FILE=/etc/apt/sources.list.d/railyard-deb-src.sources
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2

k8s_binaries_cached() {
  local b
  for b in "${K8S_BINARIES[@]}"; do
    [ -x "$CACHE_BIN/$b" ] || return 1
  done
  return 0
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# A deb-src twin of the machine's own deb entries, so no mirror host is hard-coded here.
ensure_deb_src() {
  if [ -f "$DEB_SRC_FILE" ] || grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ ||
    grep -qs '^deb-src ' /etc/apt/sources.list; then
    return 0
  fi
  local src=/etc/apt/sources.list.d/debian.sources
  [ -f "$src" ] || die "build: $src not found; add a deb-src entry for Debian bookworm by hand and rerun"
  sed -e 's/^Types: deb$/Types: deb-src/' "$src" | as_root tee "$DEB_SRC_FILE" >/dev/null
  as_root apt-get update -qq >>"$BUILD_LOG" 2>&1 || die "build: apt-get update failed (see $BUILD_LOG)"
}

build_step() {
  info "build: $*"
}

cmd_build() {
  # Fast path without the lock: a warm cache must return immediately.
  if k8s_binaries_cached; then
    return 0
  fi
  mkdir -p "$K8S_CACHE" || die "build: cannot create cache dir $K8S_CACHE (set RAILYARD_CACHE_DIR)"
  exec 9>"$K8S_CACHE/.build.lock"
  if ! flock -n 9; then
    info "build: another build holds $K8S_CACHE/.build.lock, waiting"
    flock 9
  fi
  if k8s_binaries_cached; then # built by whoever held the lock
    exec 9>&-
    return 0
  fi
  BUILD_LOG="$K8S_CACHE/build.log"
  : >"$BUILD_LOG"
  local t0=$SECONDS
  info "build: Kubernetes v$K8S_VERSION binaries -> $CACHE_BIN (log: $BUILD_LOG)"

  build_step "1/6 dependencies (scripts/install-deps.sh, golang-github-modern-go-reflect2-dev)"
  bash "$REPO_ROOT/scripts/install-deps.sh" >>"$BUILD_LOG" 2>&1 || die "build: install-deps.sh failed (see $BUILD_LOG)"
  if [ ! -d "$REFLECT2_SRC" ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      golang-github-modern-go-reflect2-dev >>"$BUILD_LOG" 2>&1 ||
      die "build: installing golang-github-modern-go-reflect2-dev failed (see $BUILD_LOG)"
  fi
  [ -d "$REFLECT2_SRC" ] || die "build: $REFLECT2_SRC missing after installing golang-github-modern-go-reflect2-dev"

  build_step "2/6 source package (deb-src entry, apt-get source --download-only kubernetes)"
  ensure_deb_src
  local dl="$K8S_CACHE/download"
  mkdir -p "$dl"
  local orig
  orig=$(find "$dl" -maxdepth 1 -name 'kubernetes_*.orig.tar.*' | head -1)
  if [ -z "$orig" ]; then
    if ! (cd "$dl" && apt-get source --download-only "kubernetes=$K8S_DEB_SOURCE_VERSION") >>"$BUILD_LOG" 2>&1; then
      # The source index may be missing or stale (e.g. a deb-src entry added by hand without an update).
      as_root apt-get update -qq >>"$BUILD_LOG" 2>&1 || die "build: apt-get update failed (see $BUILD_LOG)"
      (cd "$dl" && apt-get source --download-only kubernetes) >>"$BUILD_LOG" 2>&1 ||
        die "build: apt-get source --download-only kubernetes failed (see $BUILD_LOG)"
    fi
    orig=$(find "$dl" -maxdepth 1 -name 'kubernetes_*.orig.tar.*' | head -1)
  fi
  [ -n "$orig" ] || die "build: no kubernetes_*.orig.tar.* in $dl after download"

  local src="$K8S_CACHE/src/kubernetes-$K8S_VERSION"
  if [ -f "$src/.railyard-unpacked" ]; then
    build_step "3/6 unpack: $src already there (keeps the Go build cache in _output/)"
  else
    build_step "3/6 unpack $(basename "$orig")"
    rm -rf "$K8S_CACHE/src"
    mkdir -p "$K8S_CACHE/src"
    tar -xf "$orig" -C "$K8S_CACHE/src" >>"$BUILD_LOG" 2>&1 || die "build: unpacking $orig failed"
    local top
    top=$(find "$K8S_CACHE/src" -mindepth 1 -maxdepth 1 -type d | head -1)
    [ -n "$top" ] || die "build: $orig unpacked to nothing"
    [ "$top" = "$src" ] || mv "$top" "$src"
    [ -f "$src/cmd/kube-apiserver/apiserver.go" ] || die "build: $src does not look like a Kubernetes source tree"
    touch "$src/.railyard-unpacked"
  fi

  # reflect2 1.0.1 (vendored) corrupts memory under Go >= 1.18; Debian's 1.0.2 is the fix.
  build_step "4/6 replace vendored reflect2 with Debian's copy"
  local vr="$src/vendor/github.com/modern-go/reflect2"
  [ -d "$vr" ] || die "build: $vr missing in the source tree"
  rm -f "$vr"/*.go
  cp "$REFLECT2_SRC"/*.go "$vr"/
  rm -f "$vr"/*_test.go

  build_step "5/6 go build kube-apiserver kube-controller-manager kubectl kubelet kube-proxy kube-scheduler (10-20 min cold on 2 cores, about 1 min with the Go cache)"
  mkdir -p "$src/.go/src/k8s.io" "$K8S_CACHE/go-home"
  ln -sfn ../../.. "$src/.go/src/k8s.io/kubernetes"
  (cd "$src" && env GOPATH="$src/.go" CGO_ENABLED=0 HOME="$K8S_CACHE/go-home" \
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kubectl cmd/kubelet cmd/kube-proxy cmd/kube-scheduler") >>"$BUILD_LOG" 2>&1 ||
    die "build: make failed; last lines of $BUILD_LOG:"$'\n'"$(tail -20 "$BUILD_LOG")"

  build_step "6/6 install into $CACHE_BIN"
  local out b
  out=$(find "$src/_output" -type d -path '*/bin' | head -1)
  [ -n "$out" ] || die "build: no _output/.../bin after make (see $BUILD_LOG)"
  mkdir -p "$CACHE_BIN.tmp"
  for b in "${K8S_BINARIES[@]}"; do
    [ -x "$out/$b" ] || die "build: $out/$b was not built (see $BUILD_LOG)"
    cp "$out/$b" "$CACHE_BIN.tmp/$b"
  done
  "$CACHE_BIN.tmp/kube-apiserver" --version 2>&1 | grep -q "v$K8S_VERSION" ||
    die "build: built kube-apiserver is not v$K8S_VERSION: $("$CACHE_BIN.tmp/kube-apiserver" --version 2>&1)"
  rm -rf "$CACHE_BIN"
  mv "$CACHE_BIN.tmp" "$CACHE_BIN"
  echo "$((SECONDS - t0))" >"$K8S_CACHE/build-seconds"
  info "build: done in $((SECONDS - t0)) s"
  exec 9>&-
}
