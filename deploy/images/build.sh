#!/usr/bin/env bash
# Builds Railyard's images on this machine, with no registry and no Docker daemon (docs/images.md):
#   1. the pod sandbox image localhost/railyard/pause:3.2 (deploy/images/pause.c, static),
#   2. a Debian 12 base root filesystem from debootstrap holding the packages the Dockerfiles' runtime stages install
#      (their union, so the one base layer is stored once per node), cached under ~/.cache/railyard/images,
#   3. localhost/railyard/operator:TAG and localhost/railyard/worker:TAG from deploy/docker/Dockerfile.* (the runtime
#      stage: base layer + this checkout's binaries at the COPY destinations, USER/ENTRYPOINT/CMD as written there),
#      and with --cuda localhost/railyard/worker-cuda:TAG (worker + librailyard_cuda.so + CUDA runtime and NCCL),
#   4. with --examples localhost/railyard/pytorch-example:TAG (deploy/examples/pytorch: a base of its own with
#      python3-torch, about 3 minutes the first time, and the script).
# Output: OCI image-layout tarballs in OUT (default BUILD/images); --load SOCK imports them into a containerd.
#
#   deploy/images/build.sh [--build-dir BUILD] [--out OUT] [--tag TAG] [--cuda] [--examples] [--load CONTAINERD_SOCK]...
#   deploy/images/build.sh --debian-base   (only prints the path of a plain Debian 12 minbase layer, .tar.gz, built
#                                           once: the FROM images of deploy/images/buildah.sh)
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="$REPO_ROOT/build"
OUT_DIR=""
TAG="0.1.0"
CUDA=0
EXAMPLES=0
DEBIAN_BASE=0
LOADS=()
die() {
  echo "images: error: $*" >&2
  exit 1
}
info() { echo "images: $*" >&2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir)
      BUILD_DIR="$(realpath -m -- "${2:?--build-dir needs a value}")"
      shift 2
      ;;
    --out)
      OUT_DIR="$(realpath -m -- "${2:?--out needs a value}")"
      shift 2
      ;;
    --tag)
      TAG="${2:?--tag needs a value}"
      shift 2
      ;;
    --cuda)
      CUDA=1
      shift
      ;;
    --examples)
      EXAMPLES=1
      shift
      ;;
    --debian-base)
      DEBIAN_BASE=1
      shift
      ;;
    --load)
      LOADS+=("${2:?--load needs a containerd socket}")
      shift 2
      ;;
    -h | --help)
      sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
OUT_DIR="${OUT_DIR:-$BUILD_DIR/images}"
CACHE="${RAILYARD_CACHE_DIR:-$HOME/.cache/railyard}/images"
mkdir -p "$OUT_DIR" "$CACHE"
oci() { python3 "$REPO_ROOT/deploy/images/oci_image.py" "$@"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
t0=$SECONDS

# --- 1. pause ----------------------------------------------------------------------------------------------
if [ ! -s "$OUT_DIR/pause.tar" ] || [ "$REPO_ROOT/deploy/images/pause.c" -nt "$OUT_DIR/pause.tar" ]; then
  gcc -Os -static -s -o "$OUT_DIR/pause" "$REPO_ROOT/deploy/images/pause.c" ||
    die "building pause.c statically failed (needs gcc and libc6-dev: scripts/install-deps.sh)"
  oci pause --binary "$OUT_DIR/pause" --name localhost/railyard/pause:3.2 --out "$OUT_DIR/pause.tar" >/dev/null
fi

# --- 2. base root filesystem -------------------------------------------------------------------------------
mapfile -t pkgs < <(for df in "$REPO_ROOT"/deploy/docker/Dockerfile.*; do
  oci parse "$df" | python3 -c 'import json,sys; print("\n".join(json.load(sys.stdin)["packages"]))'
done | sort -u)
[ ${#pkgs[@]} -gt 0 ] || die "no runtime packages found in deploy/docker/Dockerfile.*"
# ensure_base PKG...: sets base to the cached layer of debootstrap minbase + PKG... (built once per package set).
ensure_base() {
local pkgs=("$@")
key=$(printf '%s\n' bookworm minbase "${pkgs[@]}" | sha256sum | cut -c1-16)
base="$CACHE/base-$key.tar.gz"
if [ ! -s "$base" ] || [ ! -s "$base.diffid" ]; then
  exec 9>"$CACHE/.base.lock"
  flock 9
  if [ ! -s "$base" ] || [ ! -s "$base.diffid" ]; then
    # The machine's own Debian mirror (its apt sources), never a host named here.
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    [ -n "$mirror" ] || die "no Debian mirror found in the apt sources (/etc/apt/sources.list.d/debian.sources)"
    command -v debootstrap >/dev/null || bash "$REPO_ROOT/scripts/install-deps.sh" >&2
    rootfs="$CACHE/rootfs-$key"
    as_root rm -rf "$rootfs"
    info "base: debootstrap --variant=minbase bookworm${pkgs[*]:+ + ${pkgs[*]}} (once; cached in $CACHE)"
    # The machine's own package cache first: scripts/install-deps.sh has just fetched most of these packages (all of
    # python3-torch's) from the same mirror; debootstrap checks each file against the mirror's index and fetches only
    # what is missing or differs (issue #39: a cold test run paid the download twice).
    local debs=()
    [ -d /var/cache/apt/archives ] && debs=(--cache-dir=/var/cache/apt/archives)
    local include=()
    [ ${#pkgs[@]} -eq 0 ] || include=(--include="$(IFS=,; echo "${pkgs[*]}")")
    as_root debootstrap --variant=minbase "${debs[@]}" "${include[@]}" bookworm "$rootfs" "$mirror" \
      >"$CACHE/debootstrap.log" 2>&1 || die "debootstrap failed; last lines of $CACHE/debootstrap.log:
$(tail -5 "$CACHE/debootstrap.log")"
    # What a container never needs: package lists and caches, documentation, manuals, locales.
    as_root rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
      "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
      "$rootfs"/var/log/* "$rootfs"/tmp/* "$rootfs"/dev/*
    as_root tar --sort=name --mtime=@0 --numeric-owner -C "$rootfs" -cf "$CACHE/base.tar" .
    echo "sha256:$(sha256sum "$CACHE/base.tar" | cut -d' ' -f1)" >"$base.diffid.tmp"
    gzip -n -6 -c "$CACHE/base.tar" >"$base.tmp"
    rm -f "$CACHE/base.tar"
    as_root rm -rf "$rootfs"
    mv "$base.diffid.tmp" "$base.diffid"
    mv "$base.tmp" "$base"
  fi
  exec 9>&-
fi
}
if [ "$DEBIAN_BASE" = 1 ]; then
  ensure_base
  echo "$base"
  exit 0
fi
ensure_base "${pkgs[@]}"

# --- 3. operator, worker (and worker-cuda) -----------------------------------------------------------------
build_image() { # name dockerfile [extra...]
  local name="$1" df="$2" out="$OUT_DIR/$1.tar"
  shift 2
  local extras=()
  for e in "$@"; do extras+=(--extra "$e"); done
  # Rebuilt only when an input is newer than the tarball: a second run takes well under a second per image.
  local newest
  newest=$(python3 "$REPO_ROOT/deploy/images/oci_image.py" parse "$df" | python3 -c '
import json, sys; print("\n".join(s for s, _ in json.load(sys.stdin)["copies"]))' | sed "s|^build/|$BUILD_DIR/|")
  if [ -s "$out" ] && [ -z "$(find "$df" "$base" $newest "${@%%:*}" -newer "$out" 2>/dev/null | head -1)" ]; then
    return 0
  fi
  oci build --dockerfile "$df" --base-layer "$base" --build-dir "$BUILD_DIR" \
    --name "localhost/railyard/$name:$TAG" --out "$out" "${extras[@]}" >"$out.json"
}
build_image operator "$REPO_ROOT/deploy/docker/Dockerfile.operator"
build_image worker "$REPO_ROOT/deploy/docker/Dockerfile.worker"
if [ "$CUDA" = 1 ]; then
  module="$BUILD_DIR/lib/librailyard_cuda.so"
  [ -f "$module" ] || die "--cuda: $module missing (configure with CUDA and build the railyard_cuda target)"
  cuda_libs=()
  for pattern in libcudart.so.* libcublas.so.* libcublasLt.so.* libnccl.so.*; do
    f=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ /usr/lib/x86_64-linux-gnu/ \
      -maxdepth 1 -name "$pattern" ! -name '*.so.*.*.*' 2>/dev/null | head -1)
    [ -n "$f" ] || die "--cuda: no $pattern under /usr/local/cuda or /usr/lib/x86_64-linux-gnu"
    cuda_libs+=("$(readlink -f "$f"):/usr/local/lib/$(basename "$f")")
  done
  build_image worker-cuda "$REPO_ROOT/deploy/docker/Dockerfile.worker" "$module:/usr/local/lib/librailyard_cuda.so" \
    "${cuda_libs[@]}"
fi

# --- load ----------------------------------------------------------------------------------------------------
images=(pause operator worker)
[ "$CUDA" = 1 ] && images+=(worker-cuda)
if [ "$EXAMPLES" = 1 ]; then
  # The PyTorch example (deploy/examples/pytorch): its own base (python3-torch is large; the operator and worker
  # images do not carry it) and the script from the Dockerfile's directory.
  ex_df="$REPO_ROOT/deploy/examples/pytorch/Dockerfile"
  mapfile -t ex_pkgs < <(oci parse "$ex_df" | python3 -c 'import json,sys; print("\n".join(json.load(sys.stdin)["packages"]))')
  ensure_base "${ex_pkgs[@]}"
  out="$OUT_DIR/pytorch-example.tar"
  if [ ! -s "$out" ] || [ -n "$(find "$ex_df" "$base" "$REPO_ROOT/deploy/examples/pytorch/train_gpt.py" "$REPO_ROOT/deploy/examples/pytorch/torchrun" -newer "$out" | head -1)" ]; then
    oci build --dockerfile "$ex_df" --base-layer "$base" --build-dir "$BUILD_DIR" \
      --name "localhost/railyard/pytorch-example:$TAG" --out "$out" >"$out.json"
  fi
  images+=(pytorch-example)
fi
for sock in "${LOADS[@]}"; do
  for img in "${images[@]}"; do
    # Imports are content-addressed: an image already there costs a digest check, not a copy.
    ctr -a "$sock" -n k8s.io images import --no-unpack=false "$OUT_DIR/$img.tar" >/dev/null ||
      die "importing $OUT_DIR/$img.tar into containerd at $sock failed"
  done
done
info "images ready in $((SECONDS - t0)) s: $(for i in "${images[@]}"; do
  printf '%s %s MiB  ' "$i" "$(($(stat -c %s "$OUT_DIR/$i.tar") / 1048576))"
done)"
