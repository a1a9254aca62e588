#!/usr/bin/env bash
# The local cluster's volume provisioner: StorageClass railyard-local (the default class of a cluster with real nodes;
# docs/storage.md "The local cluster"). Every node of this machine sees the host's filesystem, so a hostPath directory
# is a volume that all of them mount at once (ReadWriteMany), like the NFS or CephFS class of a real cluster.
#   - A claim of the class without a volume gets one: STATE/volumes/pvc-<claim uid>, world-writable with the sticky bit
#     (hostPath ignores fsGroup; the workers run as uid 65532), and a PersistentVolume bound to the claim by its uid.
#   - A volume of ours that its claim released (its job deleted it, or the garbage collector did) is deleted with its
#     directory (reclaimPolicy Delete).
# It watches claims and volumes (kubectl get --watch: no polling), lists again after any break (an API server restart,
# a watch timeout), and stops when its cluster's state dir goes or on SIGTERM (cluster.sh down stops it by pid).
# Usage: local_provisioner.sh STATE_DIR KUBECTL
set -u
state="$1" kubectl="$2"
readonly class=railyard-local provisioner=railyard.dev/local-hostpath
k() { "$kubectl" --kubeconfig "$state/kubeconfig" "$@"; }
log() { echo "$(date -u +%FT%TZ) $*"; }
# Started with setsid: this shell leads its process group, and the watches and loops below go with it.
trap 'trap - TERM INT; kill -- -$$ 2>/dev/null; exit 0' TERM INT
mkdir -p "$state/volumes"

provision() {
  local ns="$1" name="$2" uid="$3" size="$4" modes="$5"
  local pv="pvc-$uid" dir="$state/volumes/pvc-$uid" m list=""
  k get pv "$pv" >/dev/null 2>&1 && return 0
  mkdir -p "$dir" && chmod 1777 "$dir" || {
    log "cannot make $dir for $ns/$name"
    return 0
  }
  for m in ${modes//,/ }; do list+="${list:+, }$m"; done
  if k create -f - >/dev/null <<EOT; then log "provisioned $pv ($size, $list) for $ns/$name at $dir"; fi
apiVersion: v1
kind: PersistentVolume
metadata:
  name: $pv
  annotations: {pv.kubernetes.io/provisioned-by: $provisioner}
spec:
  storageClassName: $class
  capacity: {storage: "$size"}
  accessModes: [${list:-ReadWriteOnce}]
  persistentVolumeReclaimPolicy: Delete
  volumeMode: Filesystem
  hostPath: {path: "$dir", type: Directory}
  claimRef: {namespace: "$ns", name: "$name", uid: "$uid"}
EOT
}

reclaim() {
  local pv="$1" dir="$2"
  # Only the directory this provisioner made for this volume (STATE/volumes/<its name>, a name it gave): a path edited
  # to lie elsewhere (or to climb out with ..) is never removed.
  if [[ "$pv" =~ ^pvc-[0-9a-f-]+$ ]] && [ "$dir" = "$state/volumes/$pv" ]; then
    rm -rf -- "$dir"
  else
    log "not removing $dir of $pv: not a directory this provisioner made"
  fi
  k delete pv "$pv" --wait=false >/dev/null 2>&1 && log "deleted $pv and $dir (released)"
}

watch_claims() {
  while [ -f "$state/.railyard-cluster" ]; do
    k get pvc --all-namespaces --watch -o json 2>/dev/null |
      jq --unbuffered -r --arg class "$class" 'select(.spec.storageClassName == $class
          and (.spec.volumeName // "") == "" and .metadata.deletionTimestamp == null)
        | [.metadata.namespace, .metadata.name, .metadata.uid, .spec.resources.requests.storage,
           (.spec.accessModes // [] | join(","))] | @tsv' |
      while IFS=$'\t' read -r ns name uid size modes; do provision "$ns" "$name" "$uid" "$size" "$modes"; done
    sleep 1
  done
}

watch_volumes() {
  while [ -f "$state/.railyard-cluster" ]; do
    k get pv --watch -o json 2>/dev/null |
      jq --unbuffered -r --arg p "$provisioner" 'select(.metadata.annotations["pv.kubernetes.io/provisioned-by"] == $p
          and .status.phase == "Released") | [.metadata.name, .spec.hostPath.path] | @tsv' |
      while IFS=$'\t' read -r pv dir; do reclaim "$pv" "$dir"; done
    sleep 1
  done
}

log "watching claims of class $class (volumes under $state/volumes)"
watch_claims &
watch_volumes &
wait
