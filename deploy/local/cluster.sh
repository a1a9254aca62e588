#!/usr/bin/env bash
# Railyard's local Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver (TLS, token auth, RBAC),
# kube-controller-manager and, when built, railyard-node-agent (simulated GPU nodes). A local/test runtime,
# not a production cluster. See docs/local-cluster.md.
#
#   cluster.sh build
#   cluster.sh up [--state-dir DIR] [--nodes N | --topology FILE] [--node-agent PATH | --no-node-agent]
#                 [--real-nodes N] [--prometheus] [--node-monitor-grace SECONDS] [--controller-manager-qps Q]
#   cluster.sh down|status|env|restart-apiserver|restart-etcd [--state-dir DIR]
#   cluster.sh stop-node|start-node|kill-kubelet NAME [--state-dir DIR]   (real nodes: lose one like a machine, or
#                 only its kubelet while its containers run on; bring it back)
#   cluster.sh share NAMESPACE [--state-dir DIR]             (PVC railyard-shared over STATE/shared, for the examples)
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PROG="cluster.sh"

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}
info() { echo "$PROG: $*" >&2; }

# shellcheck source=lib/build.sh
source "$REPO_ROOT/deploy/local/lib/build.sh"
# shellcheck source=lib/control_plane.sh
source "$REPO_ROOT/deploy/local/lib/control_plane.sh"
# shellcheck source=lib/prometheus.sh
source "$REPO_ROOT/deploy/local/lib/prometheus.sh"
# shellcheck source=lib/real_nodes.sh
source "$REPO_ROOT/deploy/local/lib/real_nodes.sh"
# shellcheck source=lib/services.sh
source "$REPO_ROOT/deploy/local/lib/services.sh"

usage() {
  cat <<EOF
usage: $PROG COMMAND [options]
  build                 build kube-apiserver, kube-controller-manager and kubectl v$K8S_VERSION into
                        \${RAILYARD_CACHE_DIR:-\$HOME/.cache/railyard}/kubernetes/$K8S_VERSION/bin (once)
  up                    start a cluster (idempotent); options:
      --state-dir DIR   where state, logs and kubeconfigs live
                        (default \${RAILYARD_STATE_DIR:-\$HOME/.local/state/railyard/cluster})
      --nodes N         simulated nodes the node agent registers (default 4)
      --topology FILE   topology file for the node agent (instead of --nodes)
      --node-agent PATH railyard-node-agent binary (default: <repo>/build/bin/railyard-node-agent if present)
      --no-node-agent   control plane only
      --real-nodes N    also start N real nodes: kubelet + containerd + runc + CNI bridge each, pods as containers
                        from images built here (deploy/images/build.sh); alone (no simulated nodes) unless
                        --nodes or --topology is given too; binaries from \$RAILYARD_BUILD_DIR (default build/).
                        Services work in pods (kube-proxy in the cluster's own network namespace, DNS
                        *.svc.cluster.local); such clusters run side by side. See docs/local-cluster.md
                        "Real nodes"
      --node-monitor-grace S
                        seconds without a lease renewal before a node is NotReady (default 4, for fast
                        failure tests; Kubernetes' default is 40). The node agent renews every S/4 s (>= 1)
      --controller-manager-qps Q
                        the controller manager's client limit (QPS Q, burst 2Q; default 20 / 30, Kubernetes'
                        own). Raise it for thousands of simulated nodes: the node controller lifts each new
                        node's not-ready taint through it (10,000 nodes at 20 QPS: half an hour)
      --prometheus      also start Prometheus on 127.0.0.1 (PROMETHEUS_URL in 'env'), scraping the
                        file-SD lists STATE/prometheus/targets/*.json (see docs/monitor.md)
  down                  stop what 'up' started (by pid) and remove the state dir
  status                show components, pids, ports and health (exit 0 only if healthy)
  env                   print shell exports (KUBECONFIG, PATH with the matching kubectl)
  restart-apiserver     restart the API server (same flags, ports and data), then the controller manager
  restart-etcd          restart etcd (same data dir and ports); the API server reconnects by itself
  stop-node NAME        real node NAME: stop its kubelet, containerd and containers, as if the machine were lost
  start-node NAME       real node NAME: start it again (its pods are gone; the node turns Ready again); after
                        kill-kubelet, only the kubelet starts, over the containerd and containers that ran on
  kill-kubelet NAME     real node NAME: SIGKILL its kubelet only; containerd and the containers run on (a half-alive
                        node: NotReady to the API server, its pods' processes still on the pod network)
  share NAMESPACE       create the PersistentVolumeClaim railyard-shared in NAMESPACE (ReadWriteMany, a hostPath volume
                        over STATE/shared that all nodes of this machine see; the examples mount it at /shared);
                        prints the host directory (put the data under its data/)
EOF
}

[ $# -ge 1 ] || {
  usage >&2
  exit 2
}
command="$1"
shift
case "$command" in
  build | up | down | status | env | restart-apiserver | restart-etcd | stop-node | start-node | kill-kubelet | share) ;;
  help | -h | --help)
    usage
    exit 0
    ;;
  *) die "unknown command '$command' (known: build, up, down, status, env, restart-apiserver, restart-etcd, stop-node, start-node, kill-kubelet, share, help)" ;;
esac

STATE_DIR="${RAILYARD_STATE_DIR:-$HOME/.local/state/railyard/cluster}"
NODES=""
TOPOLOGY=""
NODE_AGENT=""
NO_NODE_AGENT=0
PROMETHEUS=0
NODE_MONITOR_GRACE=""
CONTROLLER_MANAGER_QPS=""
REAL_NODES=0
NODE_NAME=""

need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see '$PROG help')"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --state-dir)
      need_value "$@"
      STATE_DIR="$2"
      shift 2
      ;;
    --state-dir=*)
      STATE_DIR="${1#*=}"
      shift
      ;;
    --node-monitor-grace)
      [ "$command" = up ] || die "$1 is an option of 'up' only"
      need_value "$@"
      [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge 2 ] && [ "$2" -le 600 ] ||
        die "--node-monitor-grace '$2': give whole seconds from 2 to 600 (default 4)"
      NODE_MONITOR_GRACE="$2"
      shift 2
      ;;
    --controller-manager-qps)
      [ "$command" = up ] || die "$1 is an option of 'up' only"
      need_value "$@"
      [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] && [ "$2" -le 5000 ] ||
        die "--controller-manager-qps '$2': give a whole number of requests per second from 1 to 5000 (default 20)"
      CONTROLLER_MANAGER_QPS="$2"
      shift 2
      ;;
    --real-nodes)
      [ "$command" = up ] || die "$1 is an option of 'up' only"
      need_value "$@"
      [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -le 16 ] || die "--real-nodes '$2': give a whole number from 0 to 16"
      REAL_NODES="$2"
      shift 2
      ;;
    --prometheus)
      [ "$command" = up ] || die "$1 is an option of 'up' only"
      PROMETHEUS=1
      shift
      ;;
    --nodes | --topology | --node-agent | --no-node-agent)
      [ "$command" = up ] || die "$1 is an option of 'up' only"
      case "$1" in
        --nodes)
          need_value "$@"
          NODES="$2"
          shift 2
          ;;
        --topology)
          need_value "$@"
          TOPOLOGY="$2"
          shift 2
          ;;
        --node-agent)
          need_value "$@"
          NODE_AGENT="$2"
          shift 2
          ;;
        --no-node-agent)
          NO_NODE_AGENT=1
          shift
          ;;
      esac
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    -*) die "unknown option '$1' for '$command' (see '$PROG help')" ;;
    *)
      case "$command" in stop-node | start-node | kill-kubelet | share) ;; *) die "unexpected argument '$1' for '$command' (see '$PROG help')" ;; esac
      [ -z "$NODE_NAME" ] || die "$command takes one node name"
      NODE_NAME="$1"
      shift
      ;;
  esac
done

[ -n "$STATE_DIR" ] || die "--state-dir is empty"
STATE_DIR="$(realpath -m -- "$STATE_DIR")"
[ "$STATE_DIR" != "/" ] && [ "$STATE_DIR" != "$HOME" ] && [ "$STATE_DIR" != "$REPO_ROOT" ] ||
  die "--state-dir $STATE_DIR is not a dedicated directory; pick a new one (it is removed by 'down')"

case "$command" in
  build) cmd_build ;;
  up)
    cmd_up
    if [ "$PROMETHEUS" = 1 ]; then prometheus_up; fi
    ;;
  down)
    prometheus_down
    cmd_down
    ;;
  status) cmd_status ;;
  env)
    cmd_env
    prometheus_env
    ;;
  restart-apiserver) cmd_restart_apiserver ;;
  restart-etcd) cmd_restart_etcd ;;
  stop-node | start-node | kill-kubelet) cmd_real_node "$command" "$NODE_NAME" ;;
  share) cmd_share "$NODE_NAME" ;;
esac
