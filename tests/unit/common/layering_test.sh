#!/usr/bin/env bash
# tools/layering on the source tree passes, and on a copy of it fails for each kind of break it exists to find: an
# include loop, an upward include inside worker/ and inside operator/, and a component including one it must not.
set -euo pipefail
src=${RAILYARD_SOURCE_DIR:?}
check="$src/tools/layering/layering.py"
# shellcheck source=tool_check_lib.sh
source "$(dirname "$0")/tool_check_lib.sh"
copy_tree operator worker monitor cli common planner checkpoint deploy/local/node_agent tools

# expect_failure NAME FILE LINE WANTED-TEXT: adds LINE after the first #include of FILE in the copy, expects the check
# to fail naming WANTED-TEXT, then restores FILE.
expect_failure() {
  expect_edit_fails "$1" "$2" "$4" "$3" <<'PY'
import re, sys
p, line = sys.argv[1], sys.argv[2]
s = open(p).read()
m = re.search(r'^#include .*\n', s, re.M)
assert m, "no #include in " + p
open(p, "w").write(s[:m.end()] + line + "\n" + s[m.end():])
PY
}

expect_failure "an include loop" worker/cmd/config_file.h '#include "worker/cmd/command_line.h"' \
  'include loop: worker/cmd/command_line -> worker/cmd/config_file'
expect_failure "worker/parallel including worker/train" worker/parallel/data_parallel.h \
  '#include "worker/train/trainer.h"' 'worker/train is not below worker/parallel'
expect_failure "the scheduler including the controller" operator/scheduler/placement.h \
  '#include "operator/controller/controller.h"' 'operator/controller is not below operator/scheduler'
expect_failure "the monitor including the operator" monitor/flags.h '#include "operator/api.h"' \
  'monitor/ must not depend on operator/'
mkdir -p "$tmp/worker/newdir" && echo '#pragma once' >"$tmp/worker/newdir/x.h"
expect_failure "a new worker folder without a layer" worker/train/trainer.h '#include "worker/newdir/x.h"' \
  'has no layer'
echo "layering: all checks"
