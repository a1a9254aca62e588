#!/usr/bin/env bash
# tools/contracts_check on the source tree passes, and on a copy of it fails for each kind of break it exists to find:
# a second definition or type of a metric name, a name literal outside common/, a consumer naming a metric that is
# not one or using it as another type, an undefined environment name where a program's environment is described.
set -euo pipefail
src=${RAILYARD_SOURCE_DIR:?}
check="$src/tools/contracts_check/contracts.py"
# shellcheck source=tool_check_lib.sh
source "$(dirname "$0")/tool_check_lib.sh"
copy_tree .

# expect_failure NAME FILE PYTHON-EXPR-ON-s WANTED-TEXT: edits FILE of the copy, expects the check to fail naming
# WANTED-TEXT, then restores FILE.
expect_failure() {
  expect_edit_fails "$1" "$2" "$4" "$3" <<'PY'
import sys
p, edit = sys.argv[1], sys.argv[2]
s = open(p).read()
t = eval(edit)
assert t != s, "the edit changed nothing: " + edit
open(p, "w").write(t)
PY
}

expect_failure "a metric name defined twice with two types" common/metrics/names.h \
  "s.replace('inline constexpr GaugeName kUp{', 'inline constexpr CounterName kDup{\"railyard_worker_loss\"};\ninline constexpr GaugeName kUp{')" \
  "railyard_worker_loss defined twice"
expect_failure "a metric name as a literal in C++" worker/train/train_metrics.cc \
  "s.replace('metrics::names::kWorkerLoss', '\"railyard_worker_loss\"', 1)" \
  '"railyard_worker_loss" literal'
expect_failure "an environment name as a literal in C++" worker/agent/pod_agent.cc \
  "s.replace('pod_env::kPodName', '\"RAILYARD_POD_NAME\"', 1)" \
  '"RAILYARD_POD_NAME" literal'
expect_failure "a torch.distributed world name as a literal in C++" worker/cmd/train_options.cc \
  "s.replace('pod_env::kWorldSize', '\"WORLD_SIZE\"', 1)" \
  '"WORLD_SIZE" literal'
expect_failure "an environment name defined twice" common/torchrun.h \
  "s.replace('inline constexpr const char* kLauncherEnv', 'inline constexpr const char* kTwice = \"RAILYARD_POD_NAME\";\ninline constexpr const char* kLauncherEnv', 1)" \
  "RAILYARD_POD_NAME defined twice"
expect_failure "a rule naming an unknown metric" deploy/prometheus/rules/railyard.rules.yml \
  "s.replace('railyard_checkpoint_last_timestamp_seconds)', 'railyard_checkpoint_last_timestmp_seconds)', 1)" \
  "railyard_checkpoint_last_timestmp_seconds is not a metric"
expect_failure "rate() of a gauge" deploy/prometheus/rules/railyard.rules.yml \
  "s.replace('rate(railyard_worker_steps_total[5m])', 'rate(railyard_worker_step[5m])', 1)" \
  "rate/increase of railyard_worker_step, a gauge"
expect_failure "the _bucket of a gauge" docs/monitor.md \
  "s + '\nhistogram_quantile(0.9, railyard_worker_loss_bucket)\n'" \
  "railyard_worker_loss is a gauge, not a histogram"
expect_failure "a program's environment naming an undefined variable" docs/programs.md \
  "s + '\nRAILYARD_NO_SUCH_VARIABLE\n'" \
  "RAILYARD_NO_SUCH_VARIABLE is not an environment name"
expect_failure "a name missing from kAll" common/metrics/names.h \
  "s.replace('    any(kUp),\n', '', 1)" \
  "kUp appears 0 times in kAll"
echo "contracts_check_test: all passed"
