#!/usr/bin/env bash
# install_docker_lint: docker does not run on the build machine, so the Dockerfiles are checked statically: every COPY
# source exists in the build context (the repository root), every directory the root CMakeLists.txt adds is copied
# into the build stage, every binary copied out of the build stage is a target the `cmake --build` line builds and a
# railyard_binary of the source tree, the runtime stage installs the Debian package of every shared library that
# binary links (from ldd of the binary built here; directly or as a dependency of a listed package), and the image
# runs as a numeric non-root user.
set -euo pipefail
NEED_MINIHELM=0 source "$(dirname "$0")/lib.sh"

# What every Debian 12 image has: the required and essential packages, apt, and what they depend on directly.
base=$(dpkg-query -W -f '${Package} ${Priority} ${Essential}\n' | awk '$2 == "required" || $3 == "yes" {print $1}')
base+=$'\n'apt
base+=$'\n'$(dpkg-query -W -f '${Depends}, ${Pre-Depends}\n' $base 2>/dev/null | tr ',|' '\n\n' | awk 'NF {print $1}' |
  sed 's/:any$//')

for df in "$src"/deploy/docker/Dockerfile.*; do
  name=$(basename "$df")
  # Join continuation lines so each instruction is one line.
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$df" | grep -v '^\s*#' >"$work/$name.flat"
  # Base images are build arguments (ARG NAME=default before the first FROM): check their defaults.
  while IFS='=' read -r arg default; do
    sed -i "s|^FROM \${$arg}|FROM $default|" "$work/$name.flat"
  done < <(sed -n 's/^ARG \([A-Z_]*\)=\(.*\)$/\1=\2/p' "$work/$name.flat")
  stages=$(grep -c '^FROM ' "$work/$name.flat")
  check "$name: a multi-stage build on Debian 12" test "$stages" -ge 2 -a \
    "$(grep '^FROM ' "$work/$name.flat" | grep -cE 'debian:12(-slim)?( |$)')" = "$stages"

  # COPY sources (not --from): relative to the context.
  missing=""
  while read -r -a words; do
    srcs=("${words[@]:1:${#words[@]}-2}")
    for s in "${srcs[@]}"; do [ -e "$src/$s" ] || missing+=" $s"; done
  done < <(grep -E '^COPY ' "$work/$name.flat" | grep -v -- '--from=')
  check "$name: every COPY source exists in the context${missing:+ (missing:$missing)}" test -z "$missing"

  copied=$(grep -E '^COPY ' "$work/$name.flat" | grep -v -- '--from=' | awk '{for (i = 2; i < NF; i++) print $i}')
  notcopied=""
  for d in $(grep -oE '^add_subdirectory\(([^)/ ]+)' "$src/CMakeLists.txt" | sed 's/add_subdirectory(//' | sort -u); do
    grep -qx "$d" <<<"$copied" || notcopied+=" $d"
  done
  check "$name: the build stage copies every directory CMakeLists.txt adds${notcopied:+ (not copied:$notcopied)}" \
    test -z "$notcopied"

  targets=$(grep -oE 'cmake --build .* --target .*' "$work/$name.flat" | sed 's/.*--target //' | tr ' ' '\n')
  runtime_pkgs=$(awk '/^FROM /{stage++} stage == '"$stages"' && /apt-get install/' "$work/$name.flat" |
    tr ' ' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vE '^(apt-get|install|rm|update)$' || true)
  # apt installs dependencies too: close the list over Depends/Pre-Depends (as installed on this Debian 12 machine).
  closure=$runtime_pkgs
  for _ in 1 2 3 4 5 6; do
    closure=$( (echo "$closure"; dpkg-query -W -f '${Depends}, ${Pre-Depends}\n' $closure 2>/dev/null |
      tr ',|' '\n\n' | awk 'NF {print $1}' | sed 's/:any$//') | sort -u)
  done
  for out in $(grep -E '^COPY --from=build ' "$work/$name.flat" | awk '{for (i = 3; i < NF; i++) print $i}'); do
    b=$(basename "$out")
    check "$name: $b is built by the cmake --build line" grep -qx "$b" <<<"$targets"
    check "$name: $b is a railyard_binary of the source tree" \
      grep -rqE "railyard_binary\($b( |$)" --include=CMakeLists.txt "$src"
    [ -x "$bin/$b" ] || fail "$bin/$b is not built: build the project first (cmake --build <dir> --target $b)"
    need=""
    # Owning packages of the linked libraries, in one dpkg call (merged /usr: a library may be registered under
    # /lib or /usr/lib, by its real name or its soname link).
    paths=$(ldd "$bin/$b" | awk '/=>/ {print $3}' | while read -r lib; do
      real=$(readlink -f "$lib")
      printf '%s\n' "$lib" "/usr$lib" "$real" "${real#/usr}"
    done | sort -u)
    for pkg in $(dpkg -S $paths 2>/dev/null | cut -d: -f1 | tr ',' '\n' | sed 's/^ *//' | sort -u); do
      grep -qx "$pkg" <<<"$base" && continue # in every Debian image
      grep -qx "$pkg" <<<"$closure" || need+=" $pkg"
    done
    need=$(tr ' ' '\n' <<<"$need" | sort -u | xargs)
    check "$name: the runtime stage installs the packages $b links against${need:+ (missing: $need)}" test -z "$need"
  done
  check "$name: runs as a numeric non-root user" grep -qE '^USER [1-9][0-9]*(:[0-9]+)?$' "$work/$name.flat"
done
finish
