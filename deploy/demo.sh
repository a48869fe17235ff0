#!/usr/bin/env bash
# Demo: csi-provisioner on the API simulator with the mock CSI driver, all on this machine.
# Starts kube-sim, mock-csi-driver and csi-provisioner, creates a StorageClass and a PVC, shows the
# PV that appears, deletes the PVC and shows the volume going away. Ctrl-C (or the end) stops all.
#
#   deploy/demo.sh            # run the demo
#   KEEP=1 deploy/demo.sh     # leave everything running afterwards, to explore with kubectl
set -euo pipefail

cd "$(dirname "$0")/.."
cargo build -q --workspace --bins
bin=target/debug
work=$(mktemp -d /tmp/csi-provisioner-demo.XXXXXX)
export KUBECONFIG="$work/kubeconfig"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "logs were in $work"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# API calls go through kubectl when it is installed, else through curl with the same JSON.
api() { # api METHOD PATH [JSON]
  local server
  server=$(sed -n 's/.*"server": *"\([^"]*\)".*/\1/p' "$KUBECONFIG" | head -1)
  curl -sS -X "$1" -H 'Content-Type: application/json' "$server$2" ${3:+-d "$3"}
}
wait_until() { # wait_until DESCRIPTION COMMAND...
  local what=$1; shift
  for _ in $(seq 1 150); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "timed out waiting for $what" >&2; exit 1
}

say "starting kube-sim (the API server simulator)"
$bin/kube-sim --listen 127.0.0.1:0 --kubeconfig "$KUBECONFIG" >"$work/kube-sim.log" 2>&1 &
pids+=($!)
wait_until "kubeconfig" test -s "$KUBECONFIG"

say "starting mock-csi-driver on $work/csi.sock"
$bin/mock-csi-driver --endpoint "unix://$work/csi.sock" --drivername mock.csi.rs --nodeid demo-node \
  --state-file "$work/driver-state.json" >"$work/driver.log" 2>&1 &
pids+=($!)

say "starting csi-provisioner (same flags as the upstream sidecar)"
$bin/csi-provisioner --kubeconfig "$KUBECONFIG" --csi-address "$work/csi.sock" -v=2 \
  --http-endpoint 127.0.0.1:0 >"$work/csi-provisioner.log" 2>&1 &
pids+=($!)

say "creating StorageClass 'demo' and PVC 'data'"
api POST /apis/storage.k8s.io/v1/storageclasses '{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"demo"},"provisioner":"mock.csi.rs","reclaimPolicy":"Delete","volumeBindingMode":"Immediate","parameters":{"tier":"gold"}}' >/dev/null
api POST /api/v1/namespaces/default/persistentvolumeclaims '{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"data"},"spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"demo","resources":{"requests":{"storage":"1Gi"}}}}' >/dev/null

bound() { api GET /api/v1/namespaces/default/persistentvolumeclaims/data | grep -q '"phase": *"Bound"'; }
wait_until "PVC data to be Bound" bound
say "PVC is Bound; its PV:"
if command -v kubectl >/dev/null; then
  kubectl get pvc,pv
  kubectl get pv -o yaml | sed -n '/finalizers/,/^  [a-z]/p' | head -5
  kubectl describe pvc data | sed -n '/Events/,$p'
else
  api GET /api/v1/persistentvolumes | grep -E '"name"|"volumeHandle"|"phase"|finalizer'
fi

say "deleting the PVC: the volume is deleted on the driver and the PV disappears"
api DELETE /api/v1/namespaces/default/persistentvolumeclaims/data >/dev/null
pv_gone() { ! api GET /api/v1/persistentvolumes | grep -q '"volumeHandle"'; }
wait_until "the PV to disappear" pv_gone
echo "PV gone; the driver says:"
grep -a "DeleteVolume: volume deleted" "$work/driver.log" | sed 's/\x1b\[[0-9;]*m//g' | sed 's/^.*DeleteVolume/  DeleteVolume/' 

if [ -n "${KEEP:-}" ]; then
  say "still running; KUBECONFIG=$KUBECONFIG. Ctrl-C to stop."
  wait
fi
