# shellcheck shell=bash
# The start every e2e script on the real-node cluster wrote out by hand (sourced right after `set -euo pipefail`):
# src and bin from the paths ctest passes, state the real-node cluster's (RAILYARD_REAL_STATE_DIR), cluster the
# deploy/local/cluster.sh that drives it, the script's namespace ns=NAME and a fresh work dir /tmp/NAME.XXXXXX; and
# log, which prints a line behind the seconds since then (these runs take minutes a step).
#   source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/real_env.sh" NAME
# shellcheck disable=SC2034  # the variables are the sourcing script's
src=${RAILYARD_SOURCE_DIR:?}
bin=${RAILYARD_BIN_DIR:?}
state=${RAILYARD_REAL_STATE_DIR:?}
cluster="$src/deploy/local/cluster.sh"
ns=${1:?real_env.sh NAME}
work=$(mktemp -d "/tmp/$1.XXXXXX")
t_all=$SECONDS
log() { echo "[$((SECONDS - t_all))s] $*"; }
