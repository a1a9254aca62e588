# shellcheck shell=bash
# The start every e2e script on the shared local cluster wrote out by hand (sourced right after `set -euo pipefail`):
# src, state and bin from the paths ctest passes, a check that each BINARY named is built in bin (before anything
# else, so a missing build is what the failure says), the cluster's env (KUBECONFIG, its ports) from
# deploy/local/cluster.sh, the script's namespace ns=NAME-<pid> and a fresh work dir /tmp/NAME.XXXXXX.
#   source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" NAME [BINARY...]
# shellcheck disable=SC2034  # the variables are the sourcing script's
src=${RAILYARD_SOURCE_DIR:?}
state=${RAILYARD_E2E_STATE_DIR:?}
bin=${RAILYARD_BIN_DIR:?}
for b in "${@:2}"; do
  [ -x "$bin/$b" ] || { echo "FAIL: no $b in $bin (build it)" >&2; exit 1; }
done
eval "$(bash "$src/deploy/local/cluster.sh" env --state-dir "$state")"
ns=${1:?cluster_env.sh NAME}-$$
work=$(mktemp -d "/tmp/$1.XXXXXX")
