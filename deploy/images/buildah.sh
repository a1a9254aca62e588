#!/usr/bin/env bash
# Builds deploy/docker/Dockerfile.operator and Dockerfile.worker as written, with buildah (Debian's package: no Docker
# daemon, no registry): the Dockerfiles' FROM images, debian:12 and debian:12-slim, are made here from debootstrap's
# minbase (deploy/images/build.sh --debian-base, built once and cached) and tagged with those names in buildah's own
# store, so nothing is ever pulled; the Dockerfiles' RUN steps fetch their packages from this machine's Debian mirror
# (the base's apt sources). Layers are cached between runs (buildah --layers) under ~/.cache/railyard/buildah.
# Output: OCI archives OUT/operator-buildah.tar and OUT/worker-buildah.tar (images localhost/railyard/NAME:TAG);
# --load SOCK imports them into a containerd (the local cluster's real nodes). docs/images.md "With buildah".
#
#   deploy/images/buildah.sh [--out OUT] [--tag TAG] [--load CONTAINERD_SOCK]... [--only operator|worker]
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="$REPO_ROOT/build/images"
TAG=buildah
LOADS=()
ONLY=(operator worker)
die() {
  echo "buildah.sh: error: $*" >&2
  exit 1
}
info() { echo "buildah.sh: $*" >&2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT_DIR="$(realpath -m -- "${2:?--out needs a value}")"; shift 2 ;;
    --tag) TAG="${2:?--tag needs a value}"; shift 2 ;;
    --load) LOADS+=("${2:?--load needs a containerd socket}"); shift 2 ;;
    --only)
      case "${2:-}" in operator | worker) ONLY=("$2") ;; *) die "--only: operator or worker" ;; esac
      shift 2 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
command -v buildah >/dev/null || bash "$REPO_ROOT/scripts/install-deps.sh" --with-buildah >&2
command -v buildah >/dev/null || die "buildah is not installed (scripts/install-deps.sh --with-buildah)"
CACHE="${RAILYARD_CACHE_DIR:-$HOME/.cache/railyard}/buildah"
mkdir -p "$CACHE" "$OUT_DIR"
# One store of our own (not /var/lib/containers), its run state under /tmp; overlay as root, vfs otherwise.
driver=overlay
[ "$(id -u)" -eq 0 ] || driver=vfs
bh() { buildah --root "$CACHE/storage" --runroot "/tmp/railyard-buildah-$(id -u)" --storage-driver "$driver" "$@"; }
t0=$SECONDS

# --- the FROM images ---------------------------------------------------------------------------------------------
base=$(bash "$REPO_ROOT/deploy/images/build.sh" --debian-base) || die "deploy/images/build.sh --debian-base failed"
base_id=$(cut -d: -f2 "$base.diffid" | cut -c1-16)
if [ "$(bh images --noheading --format '{{.Name}}:{{.Tag}}' "localhost/railyard/debian-base:$base_id" 2>/dev/null)" = "" ]; then
  info "FROM images: debian:12 and debian:12-slim from $base"
  c=$(bh from scratch)
  m=$(bh mount "$c")
  tar -xzf "$base" -C "$m"
  bh umount "$c" >/dev/null
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$c"
  bh commit -q "$c" "localhost/railyard/debian-base:$base_id" >/dev/null
  bh rm "$c" >/dev/null
fi
# The names the Dockerfiles' default build arguments give (BUILD_BASE, RUNTIME_BASE), in this store only.
bh tag "localhost/railyard/debian-base:$base_id" docker.io/library/debian:12 docker.io/library/debian:12-slim

# --- the Dockerfiles -----------------------------------------------------------------------------------------------
for name in "${ONLY[@]}"; do
  df="$REPO_ROOT/deploy/docker/Dockerfile.$name"
  image="localhost/railyard/$name:$TAG"
  t1=$SECONDS
  # chroot isolation: no user namespace or cgroup setup needed on the build machine; host network for apt.
  bh bud --isolation chroot --pull=never --layers -f "$df" -t "$image" "$REPO_ROOT" >"$CACHE/$name.log" 2>&1 ||
    die "buildah bud $df failed; last lines of $CACHE/$name.log:
$(tail -15 "$CACHE/$name.log")"
  rm -f "$OUT_DIR/$name-buildah.tar"
  bh push -q "$image" "oci-archive:$OUT_DIR/$name-buildah.tar:$image" >/dev/null
  info "$image built in $((SECONDS - t1)) s: $OUT_DIR/$name-buildah.tar ($(($(stat -c %s "$OUT_DIR/$name-buildah.tar") / 1048576)) MiB)"
  for sock in "${LOADS[@]}"; do
    ctr -a "$sock" -n k8s.io images import "$OUT_DIR/$name-buildah.tar" >/dev/null ||
      die "importing $OUT_DIR/$name-buildah.tar into containerd at $sock failed"
  done
done
info "done in $((SECONDS - t0)) s"
