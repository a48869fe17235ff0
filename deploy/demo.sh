#!/usr/bin/env bash
# Demo: csi-provisioner on the API simulator with the mock CSI driver, all on this machine, in four
# steps that show what this sidecar does beyond upstream's:
#   1. a claim is provisioned: the PV carries the deletion-protection finalizer;
#   2. the PV is deleted before its claim: the backend volume is still deleted (KEP-2644);
#   3. the claim is deleted while a slow CreateVolume is in flight: nothing leaks;
#   4. node-deployment mode: a node is deleted with a volume on it, and the volume's PV is answered
#      by a surviving instance after the grace period instead of hanging forever.
# Each step prints what happened and how many volumes the driver holds.
#
#   deploy/demo.sh            # run the demo (builds the binaries first)
#   KEEP=1 deploy/demo.sh     # leave everything running afterwards, to explore with kubectl
#   DEMO_BIN=DIR deploy/demo.sh   # use already built csi-provisioner, kube-sim, mock-csi-driver
set -euo pipefail

cd "$(dirname "$0")/.."
if [ -z "${DEMO_BIN:-}" ]; then
  "${CARGO:-cargo}" build -q --workspace --bins
  bin=target/debug
else
  bin=$DEMO_BIN
fi
work=$(mktemp -d /tmp/csi-provisioner-demo.XXXXXX)
export KUBECONFIG="$work/kubeconfig"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "logs were in $work"
}
trap cleanup EXIT

started=$SECONDS
say() { printf '\n\033[1m== [%2ds] %s\033[0m\n' "$((SECONDS - started))" "$*"; }
fail() { echo "DEMO FAILED: $*" >&2; echo "logs are in $work" >&2; exit 1; }

# API calls go through curl (always there); kubectl output is shown when kubectl is installed.
server() { sed -n 's/.*"server": *"\([^"]*\)".*/\1/p' "$KUBECONFIG" | head -1; }
api() { # api METHOD PATH [JSON]
  curl -sS -X "$1" -H 'Content-Type: application/json' "$(server)$2" ${3:+-d "$3"}
}
create() { # create PATH JSON: fails the demo on an error answer
  local out
  out=$(api POST "$1" "$2")
  if grep -q '"kind": *"Status"' <<<"$out"; then fail "creating at $1: $out"; fi
}
wait_until() { # wait_until DESCRIPTION COMMAND...   (polls for up to 30 s)
  local what=$1; shift
  for _ in $(seq 1 150); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  fail "timed out waiting for $what"
}
show() { if command -v kubectl >/dev/null; then kubectl "$@" 2>&1 | sed 's/^/    /'; fi; }

# What the driver holds: volumes it created minus volumes it deleted, from its own log.
strip() { sed 's/\x1b\[[0-9;]*m//g' "$@"; }
created() { strip "$@" | grep -c "CreateVolume: volume created" || true; }
held() { # held LOG...
  local d
  d=$(strip "$@" | grep -c "DeleteVolume: volume deleted" || true)
  echo $(($(created "$@") - d))
}
created_since() { [ "$(created "$2")" -gt "$1" ]; } # created_since COUNT LOG
holds_none() { [ "$(held "$@")" -eq 0 ]; }
holds() { echo "    the driver holds $(held "$@") volume(s)"; }

claim_json() { # claim_json NAME CLASS
  printf '{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"%s"},"spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"%s","resources":{"requests":{"storage":"1Gi"}}}}' "$1" "$2"
}
class_json() { # class_json NAME BINDING-MODE
  printf '{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"%s"},"provisioner":"mock.csi.rs","reclaimPolicy":"Delete","volumeBindingMode":"%s"}' "$1" "$2"
}
claim_phase() { api GET "/api/v1/namespaces/default/persistentvolumeclaims/$1" | grep -q "\"phase\": *\"$2\""; }
claim_volume() { api GET "/api/v1/namespaces/default/persistentvolumeclaims/$1" | sed -n 's/.*"volumeName": *"\([^"]*\)".*/\1/p' | head -1; }
gone() { api GET "$1" | grep -q '"code": *404'; }
event_seen() { api GET /api/v1/namespaces/default/events | grep -q "$1"; }

start_driver() { # start_driver NAME NODE [FLAGS...]: socket $work/NAME.sock, log $work/NAME.log
  local name=$1 node=$2; shift 2
  $bin/mock-csi-driver --endpoint "unix://$work/$name.sock" --drivername mock.csi.rs --nodeid "$node" \
    --state-file "$work/$name-state.json" "$@" >>"$work/$name.log" 2>&1 &
  pids+=($!)
  eval "${name//-/_}_pid=$!"
}
start_sidecar() { # start_sidecar NAME DRIVER-SOCKET-NAME [FLAGS...]: log $work/NAME.log
  local name=$1 sock=$2; shift 2
  $bin/csi-provisioner --kubeconfig "$KUBECONFIG" --csi-address "$work/$sock.sock" -v=2 \
    --http-endpoint 127.0.0.1:0 "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  eval "${name//-/_}_pid=$!"
}

say "starting kube-sim (the API server simulator), the mock CSI driver and csi-provisioner"
$bin/kube-sim --listen 127.0.0.1:0 --kubeconfig "$KUBECONFIG" >"$work/kube-sim.log" 2>&1 &
pids+=($!)
wait_until "kubeconfig" test -s "$KUBECONFIG"
start_driver driver demo-node
start_sidecar provisioner driver
echo "    kube-sim at $(server); logs in $work"

# -- 1 ---------------------------------------------------------------------------------------------
say "1. StorageClass 'demo' and claim 'data': provisioned, the PV carries our finalizer"
create /apis/storage.k8s.io/v1/storageclasses "$(class_json demo Immediate)"
create /api/v1/namespaces/default/persistentvolumeclaims "$(claim_json data demo)"
wait_until "claim data to be Bound" claim_phase data Bound
pv=$(claim_volume data)
api GET "/api/v1/persistentvolumes/$pv" | grep -q 'external-provisioner.volume.kubernetes.io/finalizer' ||
  fail "PV $pv lacks the deletion-protection finalizer"
echo "    claim data is Bound to $pv, finalizers:"
api GET "/api/v1/persistentvolumes/$pv" | tr -d ' \n' | grep -o '"finalizers":\[[^]]*\]' | sed 's/^/    /'
show get pvc,pv
holds "$work/driver.log"

# -- 2 ---------------------------------------------------------------------------------------------
say "2. the PV is deleted BEFORE its claim; then the claim is deleted"
api DELETE "/api/v1/persistentvolumes/$pv" >/dev/null
echo "    PV $pv is Terminating (pv-protection holds it while bound); the volume is still there:"
holds "$work/driver.log"
api DELETE /api/v1/namespaces/default/persistentvolumeclaims/data >/dev/null
wait_until "PV $pv to disappear" gone "/api/v1/persistentvolumes/$pv"
echo "    PV gone, and the backend volume with it (upstream without the finalizer would leak it):"
strip "$work/driver.log" | grep "DeleteVolume: volume deleted" | sed 's/^.*DeleteVolume/    DeleteVolume/'
holds "$work/driver.log"
holds_none "$work/driver.log" || fail "the driver still holds a volume after step 2"

# -- 3 ---------------------------------------------------------------------------------------------
say "3. a slow driver (CreateVolume takes 4 s): claim 'slow' is deleted while CreateVolume is in flight"
kill "$driver_pid"; wait "$driver_pid" 2>/dev/null || true
start_driver driver demo-node --latency CreateVolume=4s
before=$(created "$work/driver.log")
create /api/v1/namespaces/default/persistentvolumeclaims "$(claim_json slow demo)"
wait_until "the Provisioning event of claim slow" event_seen 'provisioning volume for claim \\"default/slow\\"'
echo "    CreateVolume sent; deleting claim slow now"
api DELETE /api/v1/namespaces/default/persistentvolumeclaims/slow >/dev/null
wait_until "the slow CreateVolume to finish" created_since "$before" "$work/driver.log"
wait_until "claim slow to disappear" gone /api/v1/namespaces/default/persistentvolumeclaims/slow
wait_until "the volume created for the deleted claim to be deleted" holds_none "$work/driver.log"
echo "    the driver answered after the claim was gone; the sidecar deleted the volume it made:"
strip "$work/driver.log" | grep -E "CreateVolume: volume created|DeleteVolume: volume deleted" | tail -2 |
  sed -E 's/^.*(CreateVolume|DeleteVolume)/    \1/'
holds "$work/driver.log"
show get pvc,pv

# -- 4 ---------------------------------------------------------------------------------------------
say "4. node-deployment mode: nodes a and b, one driver and one sidecar each; node a is lost"
kill "$provisioner_pid"; wait "$provisioner_pid" 2>/dev/null || true
for n in a b; do
  create /api/v1/nodes "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"node-$n\",\"labels\":{\"kubernetes.io/hostname\":\"node-$n\",\"topology.mock.csi/node\":\"node-$n\"}}}"
  create /apis/storage.k8s.io/v1/csinodes "{\"apiVersion\":\"storage.k8s.io/v1\",\"kind\":\"CSINode\",\"metadata\":{\"name\":\"node-$n\"},\"spec\":{\"drivers\":[{\"name\":\"mock.csi.rs\",\"nodeID\":\"node-$n\",\"topologyKeys\":[\"topology.mock.csi/node\"]}]}}"
  start_driver "driver-$n" "node-$n" --topology
  NODE_NAME=node-$n start_sidecar "sidecar-$n" "driver-$n" --node-deployment --feature-gates=Topology=true \
    --node-deployment-base-delay=100ms --node-deployment-max-delay=1s --deleted-node-grace-period=5s
done
create /apis/storage.k8s.io/v1/storageclasses "$(class_json local WaitForFirstConsumer)"
create /api/v1/namespaces/default/persistentvolumeclaims "$(claim_json local-data local)"
create /api/v1/namespaces/default/pods '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"app"},"spec":{"nodeName":"node-a","containers":[{"name":"app","image":"busybox"}],"volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"local-data"}}]}}'
wait_until "claim local-data to be Bound" claim_phase local-data Bound
pv=$(claim_volume local-data)
echo "    a pod on node-a uses claim local-data: bound to $pv on node-a"
holds "$work/driver-a.log" | sed 's/driver/driver on node-a/'
echo "    the pod ends, node-a is deleted (its driver and sidecar with it), then the claim is deleted"
api DELETE /api/v1/namespaces/default/pods/app >/dev/null
kill "$sidecar_a_pid" "$driver_a_pid"
api DELETE /api/v1/nodes/node-a >/dev/null
api DELETE /apis/storage.k8s.io/v1/csinodes/node-a >/dev/null
api DELETE /api/v1/namespaces/default/persistentvolumeclaims/local-data >/dev/null
wait_until "claim local-data to disappear" gone /api/v1/namespaces/default/persistentvolumeclaims/local-data
echo "    PV $pv is Released; no instance runs on its node. Waiting out the 5 s grace period..."
wait_until "PV $pv to be answered by node-b's instance" gone "/api/v1/persistentvolumes/$pv"
echo "    PV gone after the grace period (upstream leaves it for an admin to force-delete):"
strip "$work/sidecar-b.log" | grep -o "Volume answered as deleted.*grace period[^)]*" | tail -1 | sed 's/^/    node-b: /' || true
holds "$work/driver-b.log" | sed 's/driver/driver on node-b/'

say "done in $((SECONDS - started)) s: no PV or claim is left, and no volume leaked on a live node"
show get pvc,pv
if [ -n "$(api GET /api/v1/persistentvolumes | grep '"volumeHandle"')" ]; then fail "a PV is left"; fi

if [ -n "${KEEP:-}" ]; then
  say "still running; KUBECONFIG=$KUBECONFIG. Ctrl-C to stop."
  wait
fi
