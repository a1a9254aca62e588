# shellcheck shell=bash
# Sourced by the tests of the tree checks in tools/ (contracts_check_test.sh, layering_test.sh): they run $check on
# the source tree, then on a copy of it in $tmp with one file broken at a time, and expect each break to be found.
# The caller sets src and check before sourcing.
src=${src:?set src before sourcing tool_check_lib.sh}
check=${check:?set check before sourcing tool_check_lib.sh}

python3 "$check" "$src"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# copy_tree PATH...: the given paths of the source tree (. for all of it, build trees and .git left out) into $tmp.
copy_tree() {
  tar -C "$src" --exclude=./build --exclude='./build-*' --exclude=./.git -cf - "$@" | tar -C "$tmp" -xf -
}

# expect_check_fails NAME FILE WANTED-TEXT: with FILE of the copy edited by the caller (its original kept as
# FILE.orig), expects the check to fail naming WANTED-TEXT, then restores FILE.
expect_check_fails() {
  local name=$1 file=$2 want=$3 out rc=0
  out=$(python3 "$check" "$tmp" 2>&1) || rc=$?
  mv "$tmp/$file.orig" "$tmp/$file"
  if [[ $rc -eq 0 ]]; then
    echo "FAIL $name: the check passed"
    exit 1
  fi
  if ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name: no '$want' in:"
    echo "$out"
    exit 1
  fi
  echo "ok   $name"
}

# expect_edit_fails NAME FILE WANTED-TEXT ARG <<PROGRAM: edits FILE of the copy with the Python PROGRAM (read from
# stdin; its argv: the file's path in the copy, then ARG), expects the check to fail naming WANTED-TEXT, then restores
# FILE.
expect_edit_fails() {
  local name=$1 file=$2 want=$3 arg=$4
  cp "$tmp/$file" "$tmp/$file.orig"
  python3 - "$tmp/$file" "$arg"
  expect_check_fails "$name" "$file" "$want"
}
