# shellcheck shell=bash
# A local Prometheus for cluster.sh (`up --prometheus`, stopped by `down`), on 127.0.0.1 and a free port, scraping
# the file-SD target lists in STATE/prometheus/targets/*.json. Sourced by cluster.sh after lib/control_plane.sh
# (uses STATE_DIR, REPO_ROOT, die, info, start_component, stop_component, component_alive, component_gone, port_in_use).
# Also runnable on its own for tests, with a dedicated directory as the state dir:
#   bash deploy/local/lib/prometheus.sh up|down|write-targets DIR [NAME JSON]|pod-targets DIR NAME [NAMESPACE]

PROMETHEUS_READY_SECONDS=30

# Prints a free port in 20000-32767 (below the ephemeral range).
prometheus_pick_port() {
  local p tries=0
  while :; do
    tries=$((tries + 1))
    [ $tries -le 200 ] || die "prometheus: no free port found on 127.0.0.1 in 20000-32767"
    p=$((20000 + SRANDOM % 12768))
    port_in_use "$p" || break
  done
  echo "$p"
}

prometheus_up() {
  local dir="$STATE_DIR/prometheus"
  if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    die "prometheus: 'prometheus' and 'promtool' are not installed (apt-get install prometheus)"
  fi
  if component_alive prometheus && [ -f "$dir/prometheus.env" ]; then
    info "prometheus: already running ($(sed -n 's/^export PROMETHEUS_URL=//p' "$dir/prometheus.env"))"
    return 0
  fi
  mkdir -p "$dir/targets" "$dir/data" "$dir/rules"
  cp "$REPO_ROOT/deploy/prometheus/rules/railyard.rules.yml" "$dir/rules/"
  sed -e "s|@TARGETS_DIR@|$dir/targets|g" -e "s|@RULES_DIR@|$dir/rules|g" \
    "$REPO_ROOT/deploy/prometheus/prometheus-local.yml" >"$dir/prometheus.yml"
  promtool check config "$dir/prometheus.yml" >"$dir/check.log" 2>&1 ||
    die "prometheus: promtool check config $dir/prometheus.yml failed: $(tail -n 3 "$dir/check.log")"
  local port
  port=$(prometheus_pick_port)
  # The state dir is in every argument, which is what pid_is_ours checks before a kill.
  start_component prometheus prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
    --web.listen-address="127.0.0.1:$port" --web.enable-lifecycle
  local deadline=$((SECONDS + PROMETHEUS_READY_SECONDS))
  until curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1; do
    if component_gone prometheus || [ $SECONDS -ge $deadline ]; then
      log_tail prometheus
      stop_component prometheus 10
      die "prometheus: not ready on 127.0.0.1:$port within ${PROMETHEUS_READY_SECONDS}s"
    fi
    sleep 0.1
  done
  {
    printf 'export PROMETHEUS_URL=%q\n' "http://127.0.0.1:$port"
    printf 'export PROMETHEUS_TARGETS_DIR=%q\n' "$dir/targets"
  } >"$dir/prometheus.env"
  if [ -f "$STATE_DIR/cluster.env" ]; then
    sed -i '/^export PROMETHEUS_/d' "$STATE_DIR/cluster.env"
    cat "$dir/prometheus.env" >>"$STATE_DIR/cluster.env"
  fi
  info "prometheus: http://127.0.0.1:$port (targets: $dir/targets/*.json)"
}

# For `cluster.sh env`: PROMETHEUS_URL and PROMETHEUS_TARGETS_DIR when this cluster has a Prometheus.
prometheus_env() {
  if [ -f "$STATE_DIR/prometheus/prometheus.env" ] && component_alive prometheus; then
    cat "$STATE_DIR/prometheus/prometheus.env"
  fi
  return 0
}

prometheus_down() {
  [ -d "$STATE_DIR/prometheus" ] || return 0
  stop_component prometheus 10
  rm -f "$STATE_DIR/prometheus/prometheus.env"
  [ -f "$STATE_DIR/cluster.env" ] && sed -i '/^export PROMETHEUS_/d' "$STATE_DIR/cluster.env"
  return 0
}

# prometheus_write_targets NAME JSON: replaces targets/NAME.json atomically (Prometheus reads a half-written file
# as an error otherwise); the temp name does not match the *.json glob.
prometheus_write_targets() {
  local name="$1" json="$2" dir="$STATE_DIR/prometheus/targets"
  [[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || die "prometheus: target list name '$name' must be [A-Za-z0-9_.-]+"
  mkdir -p "$dir"
  printf '%s\n' "$json" >"$dir/.$name.json.tmp"
  mv -f "$dir/.$name.json.tmp" "$dir/$name.json"
}

# prometheus_pod_targets NAME [NAMESPACE]: targets/NAME.json from the Running worker pods (label railyard.dev/job)
# of NAMESPACE (all namespaces without one), relabelled as deploy/prometheus/prometheus.yml's kubernetes_sd_configs
# does in a real cluster: one target podIP:containerPort per container port named metrics or metrics-N (one per local
# rank), with the pod's metadata as namespace, trainingjob, pod and node; no rank or
# generation (the process serves those, and railyard-monitor checks the rank against the pod's place in the world).
# Debian's Prometheus has no Kubernetes discovery: callers run this every second or so.
# Needs kubectl and KUBECONFIG.
prometheus_pod_targets() {
  local name="$1" json where=(-A)
  [ -n "${2:-}" ] && where=(-n "$2")
  json=$(kubectl get pods "${where[@]}" -l railyard.dev/job -o json | python3 -c '
import json, re, sys
out = []
for p in json.load(sys.stdin)["items"]:
    md, st = p["metadata"], p.get("status", {})
    if st.get("phase") != "Running" or not st.get("podIP") or md.get("deletionTimestamp"):
        continue
    lab = md.get("labels", {})
    for c in p["spec"].get("containers", []):
        for port in c.get("ports", []):
            if not re.fullmatch(r"metrics(-[0-9]+)?", port.get("name", "")):
                continue
            out.append({"targets": [st["podIP"] + ":" + str(port["containerPort"])],
                        "labels": {"namespace": md["namespace"], "trainingjob": lab["railyard.dev/job"],
                                   "node": p["spec"].get("nodeName", ""), "pod": md["name"]}})
print(json.dumps(out))') || return 1
  prometheus_write_targets "$name" "$json"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  PROG="prometheus.sh"
  die() {
    echo "$PROG: error: $*" >&2
    exit 1
  }
  info() { echo "$PROG: $*" >&2; }
  REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
  # shellcheck disable=SC1091
  source "$REPO_ROOT/deploy/local/lib/control_plane.sh"
  [ $# -ge 2 ] || die "usage: $PROG up|down|write-targets DIR [NAME JSON]|pod-targets DIR NAME [NAMESPACE]"
  cmd="$1"
  STATE_DIR="$(realpath -m -- "$2")"
  mkdir -p "$STATE_DIR"
  case "$cmd" in
    up) prometheus_up ;;
    down) prometheus_down ;;
    write-targets)
      [ $# -eq 4 ] || die "usage: $PROG write-targets DIR NAME JSON"
      prometheus_write_targets "$3" "$4"
      ;;
    pod-targets)
      [ $# -ge 3 ] && [ $# -le 4 ] || die "usage: $PROG pod-targets DIR NAME [NAMESPACE]"
      prometheus_pod_targets "$3" "${4:-}"
      ;;
    *) die "unknown command '$cmd' (up, down, write-targets, pod-targets)" ;;
  esac
fi
