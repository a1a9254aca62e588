#!/usr/bin/env bash
# One real node: runs inside `unshare --mount --propagation private` (started by lib/real_nodes.sh). Gives the node its
# own /var/log/pods and /var/log/containers (the kubelet's fixed log paths; shared, each kubelet's garbage collector
# would delete the other nodes' pod logs), starts the node's containerd, waits for its socket, then becomes the kubelet.
#   real_node_run.sh NODE_DIR KUBELET_BINARY KUBELET_ARGS...
set -euo pipefail
dir="$1"
kubelet="$2"
shift 2
state_dir="$(cd "$dir/../.." && pwd)"
name="$(basename "$dir")"
mkdir -p /var/log/pods /var/log/containers "$dir/logs/pods" "$dir/logs/containers"
mount --bind "$dir/logs/pods" /var/log/pods
mount --bind "$dir/logs/containers" /var/log/containers
# A kubelet restarted over a containerd that outlived it (cluster.sh kill-kubelet, then start-node) finds its
# containers there, as a kubelet restarted on a real machine does.
old_containerd=$(cat "$state_dir/pids/$name-containerd.pid" 2>/dev/null || true)
if [ -n "$old_containerd" ] && [ -S "$dir/run/containerd.sock" ] &&
  grep -qF -- "--config $dir/containerd.toml" <<<"$(tr '\0' ' ' <"/proc/$old_containerd/cmdline" 2>/dev/null)"; then
  echo "containerd (pid $old_containerd) still runs: starting the kubelet only" >&2
else
  containerd --config "$dir/containerd.toml" >>"$state_dir/logs/$name-containerd.log" 2>&1 </dev/null &
  echo $! >"$state_dir/pids/$name-containerd.pid"
  for _ in $(seq 1 300); do
    [ -S "$dir/run/containerd.sock" ] && break
    kill -0 "$!" 2>/dev/null || { echo "containerd exited (log: $state_dir/logs/$name-containerd.log)" >&2; exit 1; }
    sleep 0.1
  done
fi
exec "$kubelet" "$@"
