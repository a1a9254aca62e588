# Shared helpers of the install tests (sourced). Needs RAILYARD_SOURCE_DIR and RAILYARD_BIN_DIR.
src=${RAILYARD_SOURCE_DIR:?set RAILYARD_SOURCE_DIR to the checkout}
bin=${RAILYARD_BIN_DIR:?set RAILYARD_BIN_DIR to the build tree bin/ directory}
chart=$src/charts/railyard
values_dir=$src/tests/e2e/install/values
work=$(mktemp -d "${TMPDIR:-/tmp}/railyard-install.XXXXXX")
failures=0

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# free_port, wait_for SECONDS WHAT COMMAND..., install_crd SRC (they call the script's fail()).
source "$src/tests/e2e/operator/lib.sh"
# check DESCRIPTION COMMAND...: records a failure and goes on, so one run lists every problem.
check() {
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what" >&2; failures=$((failures + 1)); fi
}
finish() {
  rm -rf "$work"
  [ "$failures" -eq 0 ] || fail "$failures check(s) failed"
  echo PASS
}

if [ "${NEED_MINIHELM:-1}" = 1 ]; then
  minihelm=$("$src/tools/minihelm/build.sh" "$bin") || fail "building minihelm (tools/minihelm/build.sh)"
fi

# render OUT.yaml [minihelm flags...]: the chart with release "railyard" in namespace railyard-system.
render() {
  local out=$1
  shift
  "$minihelm" template "$chart" --name railyard --namespace railyard-system "$@" >"$out"
}
# objects FILE.yaml: one compact JSON line per document.
objects() { "$minihelm" yaml2json "$1"; }
# Canonical form for comparing the chart with the kustomize output: Helm's bookkeeping labels and the CRD's keep
# annotation (Helm's alone) dropped, empty and null values dropped (yaml.v2 and kustomize's yaml.v3 disagree on a
# flow-mapping key without a value), sorted by kind,
# namespace and name; the Namespace object only exists in the kustomization.
canonical() {
  objects "$1" | jq -c 'walk(if type == "object" then del(."helm.sh/chart", ."app.kubernetes.io/managed-by",
      ."helm.sh/resource-policy") | with_entries(select(.value != null and .value != "" and .value != {})) else . end)
      | select(.kind != "Namespace")' |
    jq -s -c 'sort_by(.kind, .metadata.namespace // "", .metadata.name)[]'
}
# fresh_namespace NAME: creates NAME, first waiting for a deleted one of an earlier run to be gone.
fresh_namespace() {
  if [ "$(kubectl get namespace "$1" -o jsonpath='{.status.phase}' 2>/dev/null)" = Terminating ]; then
    wait_for 120 "namespace $1 of an earlier run to be deleted" bash -c "! kubectl get namespace $1"
  fi
  kubectl get namespace "$1" >/dev/null 2>&1 || kubectl create namespace "$1" >/dev/null
}
