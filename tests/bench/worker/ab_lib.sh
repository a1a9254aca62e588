# shellcheck shell=bash
# Shared by the side-by-side A/B benches of two railyard-worker binaries (device_ab.sh, startup_ab.sh), sourced with
# the script's arguments: A and Bbin are the two binaries (its first two), work a temporary directory removed on exit,
# and `alternate_ab ROUNDS RUN` calls `RUN BIN SIDE ROUND` for A and then for B, ROUNDS times, so that both sides meet
# the same load.
# shellcheck disable=SC2034  # A, Bbin and work are the script's
A=${1:?binary A}
Bbin=${2:?binary B}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

alternate_ab() {
  local r
  for r in $(seq 1 "$1"); do
    "$2" "$A" A "$r"
    "$2" "$Bbin" B "$r"
  done
}
