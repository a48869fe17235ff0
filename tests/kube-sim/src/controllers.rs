//! Control loops standing in for kube-controller-manager 1.33+ (PV binder, pv/pvc-protection,
//! namespace deletion) and for the scheduler's volume binding (selected-node) and kubelet
//! (pods go Running). They react to every committed change and resync periodically; their
//! writes go through the same store path as client writes (new resourceVersion, watch events).

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

use crate::Inner;
use crate::ops::{self, Policy, Sub, annotation, finalizers, is_deleting, meta_str};
use crate::pv_index::{NsName, PvIndex, claim_ref};
use crate::resources::{self, NAMESPACES, NODES, PODS, PV, PVC, RESOURCES, STORAGE_CLASSES};
use crate::store::{EventType, Record, Store};
use crate::util::{now, quantity_at};

const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
const ANN_DYNAMICALLY_PROVISIONED: &str = "pv.kubernetes.io/provisioned-by";
const PV_CONTROLLER: &str = "persistentvolume-controller";
const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";

/// CSI migration, on for every in-tree plugin that has it (as kube-controller-manager 1.30+):
/// the CSI driver that took over an in-tree provisioner.
pub(crate) fn migrated_driver(in_tree: &str) -> Option<&'static str> {
    Some(match in_tree {
        "kubernetes.io/aws-ebs" => "ebs.csi.aws.com",
        "kubernetes.io/gce-pd" => "pd.csi.storage.gke.io",
        "kubernetes.io/azure-disk" => "disk.csi.azure.com",
        "kubernetes.io/azure-file" => "file.csi.azure.com",
        "kubernetes.io/cinder" => "cinder.csi.openstack.org",
        "kubernetes.io/vsphere-volume" => "csi.vsphere.vmware.com",
        "kubernetes.io/portworx-volume" => "pxd.portworx.com",
        _ => return None,
    })
}

/// kube-controller-manager's `updateMigrationAnnotations`: an object whose provisioner (a
/// claim's storage-provisioner annotation, a PV's provisioned-by) is a migrated in-tree plugin
/// gets `pv.kubernetes.io/migrated-to: <CSI driver>`; any other loses it. `None`: nothing to
/// change.
fn migration_annotation(obj: &Value, provisioner: Option<&str>) -> Option<Value> {
    let provisioner = provisioner?;
    let want = migrated_driver(provisioner);
    if annotation(obj, ANN_MIGRATED_TO) == want {
        return None;
    }
    Some(with_annotation(obj, ANN_MIGRATED_TO, want))
}

pub(crate) fn spawn(inner: Arc<Inner>, mut rx: UnboundedReceiver<Arc<Record>>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ctl = Controllers {
            protect: inner.policy.protection_finalizers,
            ..Controllers::default()
        };
        let mut resync = tokio::time::interval(
            inner
                .cfg
                .resync_interval
                .max(std::time::Duration::from_millis(50)),
        );
        loop {
            let mut dirty = Dirty::default();
            tokio::select! {
                rec = rx.recv() => match rec {
                    Some(r) => {
                        ctl.index.observe(&r);
                        dirty.add(&r);
                    }
                    None => return,
                },
                _ = resync.tick() => dirty.all = true,
            }
            inner.wait_unpaused().await;
            // Changes are queued under the store lock, so after this drain every change up
            // to `seen` is in `dirty`.
            let seen = {
                let st = inner.lock();
                while let Ok(r) = rx.try_recv() {
                    ctl.index.observe(&r);
                    dirty.add(&r);
                }
                if dirty.all {
                    ctl.index.rebuild(&st);
                }
                st.resource_version()
            };
            ctl.run(&inner, dirty);
            inner.controllers_seen.send_replace(seen);
            tokio::task::yield_now().await;
        }
    })
}

/// What changed since the last pass.
#[derive(Default)]
struct Dirty {
    all: bool,
    unbound_claims: bool,
    pvs: BTreeSet<String>,
    pvcs: BTreeSet<NsName>,
    pods: BTreeSet<NsName>,
    pod_namespaces: BTreeSet<String>,
    /// A Node changed: pods waiting for a node may fit now.
    nodes: bool,
    namespaces: BTreeSet<String>,
}

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn pod_claims(pod: &Value) -> Vec<String> {
    let pod_name = meta_str(pod, "name");
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .map(|vols| {
            vols.iter()
                .filter_map(|v| {
                    if let Some(c) = v
                        .pointer("/persistentVolumeClaim/claimName")
                        .and_then(Value::as_str)
                    {
                        Some(c.to_string())
                    } else if v.get("ephemeral").is_some() {
                        Some(format!("{pod_name}-{}", s(v, "/name")))
                    } else {
                        None
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

fn pod_terminated(pod: &Value) -> bool {
    matches!(s(pod, "/status/phase"), "Succeeded" | "Failed")
}

impl Dirty {
    fn add(&mut self, r: &Record) {
        let objs: Vec<&Value> = std::iter::once(&*r.obj).chain(r.prev.as_deref()).collect();
        let ns = meta_str(&r.obj, "namespace").to_string();
        let name = meta_str(&r.obj, "name").to_string();
        match r.storage {
            PV => {
                self.pvs.insert(name);
                for o in &objs {
                    match claim_ref(o) {
                        Some(c) => {
                            self.pvcs.insert(c);
                        }
                        // An unclaimed volume may satisfy a pending claim.
                        None if r.kind != EventType::Deleted => self.unbound_claims = true,
                        None => {}
                    }
                }
            }
            PVC => {
                self.pvcs.insert((ns.clone(), name));
                self.pod_namespaces.insert(ns.clone());
            }
            PODS => {
                for o in &objs {
                    for c in pod_claims(o) {
                        self.pvcs.insert((ns.clone(), c));
                    }
                }
                self.pods.insert((ns.clone(), name));
            }
            STORAGE_CLASSES => self.unbound_claims = true,
            NODES => self.nodes = true,
            NAMESPACES => {
                self.namespaces.insert(name);
            }
            _ => {}
        }
        if r.kind == EventType::Deleted && !ns.is_empty() {
            self.namespaces.insert(ns);
        }
    }
}

#[derive(Default)]
struct Controllers {
    /// (object uid, reason) already reported, so repeated syncs do not spam events.
    emitted: HashSet<(String, String)>,
    index: PvIndex,
    /// The pv/pvc-protection controllers run: they put their finalizer back on any live object
    /// that lost it, as kube-controller-manager does (not only at creation).
    protect: bool,
}

fn pv_rd() -> &'static resources::ResourceDef {
    resources::core(PV)
}
fn pvc_rd() -> &'static resources::ResourceDef {
    resources::core(PVC)
}

/// Writes `new` over `old` if anything changed; logs (does not fail) on rejection.
fn write(
    st: &mut Store,
    rd: &'static resources::ResourceDef,
    old: &Value,
    new: Value,
    sub: Sub,
) -> Option<Value> {
    if *old == new {
        return Some(old.clone());
    }
    match ops::apply_update(st, rd, old, new, sub, false) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(resource = rd.plural, name = meta_str(old, "name"), error = %e, "controller write rejected");
            None
        }
    }
}

fn with_annotation(v: &Value, key: &str, val: Option<&str>) -> Value {
    let mut n = v.clone();
    match val {
        Some(val) => ops::set_annotation(&mut n, key, val),
        None => {
            if let Some(a) = n
                .pointer_mut("/metadata/annotations")
                .and_then(Value::as_object_mut)
            {
                a.remove(key);
            }
        }
    }
    n
}

fn set_phase(
    st: &mut Store,
    rd: &'static resources::ResourceDef,
    ns: &str,
    name: &str,
    phase: &str,
) {
    let Some(cur) = st.get(rd.storage, ns, name) else {
        return;
    };
    if s(&cur, "/status/phase") == phase {
        return;
    }
    let mut n = (*cur).clone();
    if !n.get("status").is_some_and(Value::is_object) {
        n["status"] = json!({});
    }
    n["status"]["phase"] = json!(phase);
    write(st, rd, &cur, n, Sub::Status);
}

fn add_finalizer(st: &mut Store, rd: &'static resources::ResourceDef, obj: &Value, f: &str) {
    let mut n = obj.clone();
    let m = ops::meta_mut(&mut n);
    let list = m.entry("finalizers").or_insert_with(|| json!([]));
    if let Some(a) = list.as_array_mut() {
        a.push(json!(f));
    }
    write(st, rd, obj, n, Sub::Main);
}

fn remove_finalizer(st: &mut Store, rd: &'static resources::ResourceDef, obj: &Value, f: &str) {
    let mut n = obj.clone();
    if let Some(a) = n
        .pointer_mut("/metadata/finalizers")
        .and_then(Value::as_array_mut)
    {
        a.retain(|x| x != f);
    }
    write(st, rd, obj, n, Sub::Main);
}

fn access_modes(v: &Value) -> Vec<&str> {
    v.pointer("/spec/accessModes")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn volume_mode(v: &Value) -> &str {
    match s(v, "/spec/volumeMode") {
        "" => "Filesystem",
        m => m,
    }
}

fn selector_matches(pvc: &Value, pv: &Value) -> bool {
    let Some(ml) = pvc
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
    else {
        return pvc
            .pointer("/spec/selector")
            .is_none_or(|sel| sel.as_object().is_none_or(|m| m.is_empty()));
    };
    ml.iter()
        .all(|(k, v)| pv.pointer("/metadata/labels").and_then(|l| l.get(k)) == Some(v))
}

impl Controllers {
    fn run(&mut self, inner: &Inner, mut d: Dirty) {
        {
            let st = inner.lock();
            if d.all {
                d.pvs.extend(
                    st.list(PV, None)
                        .iter()
                        .map(|v| meta_str(v, "name").to_string()),
                );
                d.pods.extend(st.list(PODS, None).iter().map(|v| {
                    (
                        meta_str(v, "namespace").to_string(),
                        meta_str(v, "name").to_string(),
                    )
                }));
                d.namespaces.extend(
                    st.list(NAMESPACES, None)
                        .iter()
                        .map(|v| meta_str(v, "name").to_string()),
                );
                d.unbound_claims = true;
                d.pvcs.extend(st.list(PVC, None).iter().map(|v| {
                    (
                        meta_str(v, "namespace").to_string(),
                        meta_str(v, "name").to_string(),
                    )
                }));
            } else if d.unbound_claims {
                d.pvcs.extend(
                    st.list(PVC, None)
                        .iter()
                        .filter(|v| s(v, "/spec/volumeName").is_empty())
                        .map(|v| {
                            (
                                meta_str(v, "namespace").to_string(),
                                meta_str(v, "name").to_string(),
                            )
                        }),
                );
            }
            // PVs pointing at a changed claim must learn about it (Released, binding).
            let pointing: Vec<String> =
                d.pvcs.iter().flat_map(|c| self.index.claiming(c)).collect();
            d.pvs.extend(pointing);
            if d.nodes {
                d.pods.extend(
                    st.list(PODS, None)
                        .iter()
                        .filter(|p| s(p, "/spec/nodeName").is_empty())
                        .map(|v| {
                            (
                                meta_str(v, "namespace").to_string(),
                                meta_str(v, "name").to_string(),
                            )
                        }),
                );
            }
            for ns in &d.pod_namespaces {
                d.pods.extend(
                    st.list(PODS, Some(ns))
                        .iter()
                        .map(|v| (ns.clone(), meta_str(v, "name").to_string())),
                );
            }
        }
        for (ns, name) in &d.pods {
            self.sync_pod_volumes(&mut inner.lock(), ns, name);
        }
        for (ns, name) in &d.pvcs {
            self.sync_claim(&mut inner.lock(), ns, name);
        }
        let mut claims_again = BTreeSet::new();
        for name in &d.pvs {
            if let Some(c) = self.sync_volume(&mut inner.lock(), name) {
                claims_again.insert(c);
            }
        }
        for (ns, name) in &claims_again {
            self.sync_claim(&mut inner.lock(), ns, name);
        }
        for (ns, name) in &d.pods {
            sync_pod_phase(&mut inner.lock(), ns, name);
        }
        for ns in &d.namespaces {
            sync_namespace(&mut inner.lock(), &inner.policy, ns);
        }
    }

    fn event(&mut self, st: &mut Store, obj: &Value, ty: &str, reason: &str, message: &str) {
        let uid = meta_str(obj, "uid").to_string();
        if !self.emitted.insert((uid.clone(), reason.to_string())) {
            return;
        }
        let name = meta_str(obj, "name");
        let obj_ns = meta_str(obj, "namespace");
        let ns = if obj_ns.is_empty() { "default" } else { obj_ns };
        let nanos = jiff::Timestamp::now().as_nanosecond();
        let mut involved = json!({"kind": obj.get("kind").cloned().unwrap_or(Value::Null), "name": name, "uid": uid,
                                  "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
                                  "resourceVersion": meta_str(obj, "resourceVersion")});
        if !obj_ns.is_empty() {
            involved["namespace"] = json!(obj_ns);
        }
        let t = now();
        let ev = json!({
            "metadata": {"name": format!("{name}.{nanos:x}"), "namespace": ns},
            "involvedObject": involved, "reason": reason, "message": message,
            "source": {"component": PV_CONTROLLER}, "firstTimestamp": t, "lastTimestamp": t, "count": 1, "type": ty,
            "reportingComponent": PV_CONTROLLER, "reportingInstance": "",
        });
        let policy = Policy {
            protection_finalizers: false,
        };
        if let Err(e) = ops::create(
            st,
            &policy,
            resources::core(resources::EVENTS),
            ns,
            ev,
            false,
        ) {
            tracing::debug!(error = %e, "controller event not recorded");
        }
    }

    fn sync_claim(&mut self, st: &mut Store, ns: &str, name: &str) {
        let Some(pvc) = st.get(PVC, ns, name) else {
            return;
        };
        if is_deleting(&pvc) {
            pvc_protection(st, &pvc);
            return;
        }
        if self.protect && !finalizers(&pvc).iter().any(|f| f == ops::PVC_PROTECTION) {
            add_finalizer(st, pvc_rd(), &pvc, ops::PVC_PROTECTION);
        }
        let Some(pvc) = st.get(PVC, ns, name) else {
            return;
        };
        let provisioner = annotation(&pvc, ANN_STORAGE_PROVISIONER)
            .or_else(|| annotation(&pvc, ANN_BETA_STORAGE_PROVISIONER));
        if let Some(n) = migration_annotation(&pvc, provisioner) {
            write(st, pvc_rd(), &pvc, n, Sub::Main);
        }
        let Some(pvc) = st.get(PVC, ns, name) else {
            return;
        };
        let vol = s(&pvc, "/spec/volumeName").to_string();
        if vol.is_empty() {
            let prebound = self
                .index
                .claiming(&(ns.to_string(), name.to_string()))
                .iter()
                .filter_map(|n| st.get(PV, "", n))
                .find(|pv| claim_ref_matches(pv, &pvc));
            if let Some(pv) = prebound {
                bind(st, &pv, &pvc);
                return;
            }
            let class = s(&pvc, "/spec/storageClassName").to_string();
            let sc = if class.is_empty() {
                None
            } else {
                st.get(STORAGE_CLASSES, "", &class)
            };
            let delay = sc
                .as_ref()
                .is_some_and(|c| s(c, "/volumeBindingMode") == "WaitForFirstConsumer");
            if !delay && let Some(pv) = best_match(st, &self.index.unclaimed, &pvc) {
                bind(st, &pv, &pvc);
                return;
            }
            if delay && annotation(&pvc, ANN_SELECTED_NODE).is_none() {
                self.event(
                    st,
                    &pvc,
                    "Normal",
                    "WaitForFirstConsumer",
                    "waiting for first consumer to be created before binding",
                );
            } else if !class.is_empty() {
                match sc {
                    None => self.event(
                        st,
                        &pvc,
                        "Warning",
                        "ProvisioningFailed",
                        &format!("storageclass.storage.k8s.io {class:?} not found"),
                    ),
                    Some(sc) => {
                        let class_prov = s(&sc, "/provisioner").to_string();
                        // CSI migration: the claim goes to the CSI driver of the in-tree plugin.
                        let prov = migrated_driver(&class_prov).map_or(class_prov, str::to_owned);
                        if prov.starts_with("kubernetes.io/") {
                            self.event(
                                st,
                                &pvc,
                                "Warning",
                                "ProvisioningFailed",
                                &format!("no volume plugin matched name: {prov}"),
                            );
                        } else {
                            let n =
                                with_annotation(&pvc, ANN_BETA_STORAGE_PROVISIONER, Some(&prov));
                            let n = with_annotation(&n, ANN_STORAGE_PROVISIONER, Some(&prov));
                            // Named for the CSI driver itself: no migrated-to (kcm removes it).
                            let n = with_annotation(&n, ANN_MIGRATED_TO, None);
                            let written = write(st, pvc_rd(), &pvc, n, Sub::Main)
                                .unwrap_or_else(|| (*pvc).clone());
                            self.event(
                                st,
                                &written,
                                "Normal",
                                "ExternalProvisioning",
                                &format!("Waiting for a volume to be created either by the external provisioner '{prov}' or manually by the system administrator. If volume creation is delayed, please verify that your external provisioner is running and correctly registered."),
                            );
                        }
                    }
                }
            } else {
                self.event(
                    st,
                    &pvc,
                    "Normal",
                    "FailedBinding",
                    "no persistent volumes available for this claim and no storage class is set",
                );
            }
            set_phase(st, pvc_rd(), ns, name, "Pending");
            return;
        }
        let bound_before = annotation(&pvc, ANN_BIND_COMPLETED).is_some();
        match st.get(PV, "", &vol) {
            None => {
                if bound_before {
                    set_phase(st, pvc_rd(), ns, name, "Lost");
                    if let Some(p) = st.get(PVC, ns, name) {
                        self.event(st, &p, "Warning", "ClaimLost", "Bound claim has lost its PersistentVolume. Data on the volume is lost!");
                    }
                } else {
                    set_phase(st, pvc_rd(), ns, name, "Pending");
                }
            }
            Some(pv) => {
                if claim_ref(&pv).is_none() || claim_ref_matches(&pv, &pvc) {
                    bind(st, &pv, &pvc);
                } else if bound_before {
                    set_phase(st, pvc_rd(), ns, name, "Lost");
                    if let Some(p) = st.get(PVC, ns, name) {
                        self.event(st, &p, "Warning", "ClaimMisbound", "Two claims are bound to the same volume, this one is bound incorrectly");
                    }
                } else {
                    set_phase(st, pvc_rd(), ns, name, "Pending");
                }
            }
        }
    }

    /// Returns a claim that should be synced next (binding of a pre-bound volume).
    fn sync_volume(&mut self, st: &mut Store, name: &str) -> Option<NsName> {
        let pv = st.get(PV, "", name)?;
        if let Some(n) = migration_annotation(&pv, annotation(&pv, ANN_DYNAMICALLY_PROVISIONED)) {
            write(st, pv_rd(), &pv, n, Sub::Main);
        }
        let pv = st.get(PV, "", name)?;
        if is_deleting(&pv)
            && s(&pv, "/status/phase") != "Bound"
            && finalizers(&pv).iter().any(|f| f == ops::PV_PROTECTION)
        {
            remove_finalizer(st, pv_rd(), &pv, ops::PV_PROTECTION);
        }
        if self.protect
            && !is_deleting(&pv)
            && !finalizers(&pv).iter().any(|f| f == ops::PV_PROTECTION)
        {
            add_finalizer(st, pv_rd(), &pv, ops::PV_PROTECTION);
        }
        let pv = st.get(PV, "", name)?;
        let Some((cns, cname)) = claim_ref(&pv) else {
            if s(&pv, "/status/phase") != "Failed" {
                set_phase(st, pv_rd(), "", name, "Available");
            }
            return None;
        };
        let ref_uid = s(&pv, "/spec/claimRef/uid").to_string();
        if ref_uid.is_empty() {
            set_phase(st, pv_rd(), "", name, "Available");
            return Some((cns, cname));
        }
        let claim = st
            .get(PVC, &cns, &cname)
            .filter(|c| meta_str(c, "uid") == ref_uid);
        let Some(claim) = claim else {
            if !matches!(s(&pv, "/status/phase"), "Released" | "Failed") {
                set_phase(st, pv_rd(), "", name, "Released");
            }
            self.after_release(st, name);
            return None;
        };
        let claim_vol = s(&claim, "/spec/volumeName");
        if claim_vol.is_empty() {
            return Some((cns, cname));
        }
        if claim_vol == name {
            set_phase(st, pv_rd(), "", name, "Bound");
            return None;
        }
        // The claim is bound to another volume.
        let dynamic = annotation(&pv, ANN_DYNAMICALLY_PROVISIONED).is_some();
        if dynamic && s(&pv, "/spec/persistentVolumeReclaimPolicy") == "Delete" {
            set_phase(st, pv_rd(), "", name, "Released");
            return None;
        }
        let mut n = (*pv).clone();
        if annotation(&pv, ANN_BOUND_BY_CONTROLLER).is_some() {
            if let Some(spec) = n.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("claimRef");
            }
            n = with_annotation(&n, ANN_BOUND_BY_CONTROLLER, None);
        } else if let Some(c) = n
            .pointer_mut("/spec/claimRef")
            .and_then(Value::as_object_mut)
        {
            c.remove("uid");
        }
        write(st, pv_rd(), &pv, n, Sub::Main);
        set_phase(st, pv_rd(), "", name, "Available");
        None
    }

    /// Recycle is gone from Kubernetes; a Released volume with that policy fails as upstream.
    fn after_release(&mut self, st: &mut Store, name: &str) {
        let Some(pv) = st.get(PV, "", name) else {
            return;
        };
        if s(&pv, "/spec/persistentVolumeReclaimPolicy") == "Recycle"
            && s(&pv, "/status/phase") == "Released"
        {
            set_phase(st, pv_rd(), "", name, "Failed");
            if let Some(p) = st.get(PV, "", name) {
                self.event(
                    st,
                    &p,
                    "Warning",
                    "VolumeFailedRecycle",
                    "No recycler plugin found for the volume!",
                );
            }
        }
    }

    /// Scheduler stand-in: a pod on a node selects that node for its unbound delayed claims.
    fn sync_pod_volumes(&mut self, st: &mut Store, ns: &str, name: &str) {
        let Some(pod) = st.get(PODS, ns, name) else {
            return;
        };
        if pod_terminated(&pod) || is_deleting(&pod) {
            return;
        }
        let node = s(&pod, "/spec/nodeName").to_string();
        if node.is_empty() {
            schedule_pod(st, &pod);
            return;
        }
        for claim in pod_claims(&pod) {
            let Some(pvc) = st.get(PVC, ns, &claim) else {
                continue;
            };
            if !s(&pvc, "/spec/volumeName").is_empty()
                || annotation(&pvc, ANN_SELECTED_NODE).is_some()
                || is_deleting(&pvc)
            {
                continue;
            }
            let class = s(&pvc, "/spec/storageClassName");
            let delayed = !class.is_empty()
                && st
                    .get(STORAGE_CLASSES, "", class)
                    .is_some_and(|c| s(&c, "/volumeBindingMode") == "WaitForFirstConsumer");
            if delayed {
                let n = with_annotation(&pvc, ANN_SELECTED_NODE, Some(&node));
                write(st, pvc_rd(), &pvc, n, Sub::Main);
            }
        }
    }
}

/// Whether `labels` satisfy one node selector term (`matchExpressions`; `In`, `NotIn`,
/// `Exists`, `DoesNotExist`; the numeric operators never match here).
fn term_matches(term: &Value, labels: &Value) -> bool {
    let exprs = term.get("matchExpressions").and_then(Value::as_array);
    exprs.into_iter().flatten().all(|e| {
        let have = labels.get(s(e, "/key")).and_then(Value::as_str);
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match s(e, "/operator") {
            "In" => have.is_some_and(|h| values.contains(&h)),
            "NotIn" => have.is_none_or(|h| !values.contains(&h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    })
}

/// Whether a pod tolerates a node's NoSchedule/NoExecute taints.
fn tolerates(pod: &Value, node: &Value) -> bool {
    let tolerations = pod.pointer("/spec/tolerations").and_then(Value::as_array);
    let taints = node.pointer("/spec/taints").and_then(Value::as_array);
    taints
        .into_iter()
        .flatten()
        .filter(|t| s(t, "/effect") != "PreferNoSchedule")
        .all(|t| {
            tolerations.into_iter().flatten().any(|tol| {
                let key_ok = match s(tol, "/key") {
                    "" => s(tol, "/operator") == "Exists",
                    k => k == s(t, "/key"),
                };
                let value_ok =
                    s(tol, "/operator") == "Exists" || s(tol, "/value") == s(t, "/value");
                let effect_ok =
                    s(tol, "/effect").is_empty() || s(tol, "/effect") == s(t, "/effect");
                key_ok && value_ok && effect_ok
            })
        })
}

/// The scheduler's view of a pod without a node (kube-scheduler's filters that storage depends
/// on, simplified): a node fits when it is schedulable, matches the pod's `nodeSelector`,
/// carries no taint the pod does not tolerate, lies in the node affinity of every bound claim's
/// PV, and in the `allowedTopologies` of every unbound WaitForFirstConsumer claim's class. An
/// unbound Immediate claim, or a missing one, makes the pod unschedulable. Resources are not
/// counted. As kube-scheduler's volume binding does, the chosen node is written to the unbound
/// delayed claims as `volume.kubernetes.io/selected-node` first; the pod is bound to the node
/// only once all its claims are Bound. The first fitting node by name is chosen (the real one
/// scores nodes).
fn schedule_pod(st: &mut Store, pod: &Value) {
    let ns = meta_str(pod, "namespace");
    let mut claims = Vec::new();
    for name in pod_claims(pod) {
        let Some(c) = st.get(PVC, ns, &name) else {
            return;
        };
        claims.push(c);
    }
    let mut delayed = Vec::new();
    let mut bound_pvs = Vec::new();
    for c in &claims {
        let vol = s(c, "/spec/volumeName");
        if !vol.is_empty() {
            match st.get(PV, "", vol) {
                Some(pv) if s(c, "/status/phase") == "Bound" => bound_pvs.push(pv),
                _ => return,
            }
            continue;
        }
        let class = s(c, "/spec/storageClassName");
        let sc = (!class.is_empty())
            .then(|| st.get(STORAGE_CLASSES, "", class))
            .flatten();
        match sc {
            Some(sc) if s(&sc, "/volumeBindingMode") == "WaitForFirstConsumer" => {
                delayed.push((c.clone(), sc))
            }
            _ => return,
        }
    }
    let selector = pod.pointer("/spec/nodeSelector").and_then(Value::as_object);
    let fits = |node: &Value| -> bool {
        let labels = node
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(json!({}));
        let selected = selector
            .into_iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v));
        let pv_ok = bound_pvs.iter().all(|pv| {
            let terms = pv
                .pointer("/spec/nodeAffinity/required/nodeSelectorTerms")
                .and_then(Value::as_array);
            terms.is_none_or(|t| t.iter().any(|term| term_matches(term, &labels)))
        });
        let topology_ok = delayed.iter().all(|(_, sc)| {
            let allowed = sc.get("allowedTopologies").and_then(Value::as_array);
            allowed.is_none_or(|a| {
                a.is_empty()
                    || a.iter().any(|term| {
                        let reqs = term.get("matchLabelExpressions").and_then(Value::as_array);
                        reqs.into_iter().flatten().all(|r| {
                            let have = labels.get(s(r, "/key")).and_then(Value::as_str);
                            let values = r.get("values").and_then(Value::as_array);
                            have.is_some_and(|h| values.into_iter().flatten().any(|v| v == h))
                        })
                    })
            })
        });
        node.pointer("/spec/unschedulable") != Some(&json!(true))
            && selected
            && tolerates(pod, node)
            && pv_ok
            && topology_ok
    };
    // The node selected for one of the claims (by this loop, before the claim was bound) is
    // kept while it fits: the real scheduler binds the pod where it provisioned.
    let nodes = st.list(NODES, None);
    let preselected = claims
        .iter()
        .find_map(|c| annotation(c, ANN_SELECTED_NODE))
        .and_then(|n| nodes.iter().find(|node| meta_str(node, "name") == n));
    let Some(node) = preselected
        .filter(|n| fits(n))
        .or_else(|| nodes.iter().find(|n| fits(n)))
    else {
        return;
    };
    let node = meta_str(node, "name").to_string();
    if !delayed.is_empty() {
        for (c, _) in &delayed {
            if annotation(c, ANN_SELECTED_NODE) != Some(node.as_str()) {
                let n = with_annotation(c, ANN_SELECTED_NODE, Some(&node));
                write(st, pvc_rd(), c, n, Sub::Main);
            }
        }
        return;
    }
    let mut n = pod.clone();
    n["spec"]["nodeName"] = json!(node);
    write(st, resources::core(PODS), pod, n, Sub::Main);
}

fn claim_ref_matches(pv: &Value, pvc: &Value) -> bool {
    let uid = s(pv, "/spec/claimRef/uid");
    claim_ref(pv)
        .is_some_and(|(ns, name)| ns == meta_str(pvc, "namespace") && name == meta_str(pvc, "name"))
        && (uid.is_empty() || uid == meta_str(pvc, "uid"))
}

/// The smallest Available volume that satisfies the claim (class, mode, access modes, size, selector).
fn best_match(st: &Store, unclaimed: &BTreeSet<String>, pvc: &Value) -> Option<Arc<Value>> {
    let want = quantity_at(pvc, "/spec/resources/requests/storage").unwrap_or(0.0);
    let class = s(pvc, "/spec/storageClassName");
    let modes = access_modes(pvc);
    unclaimed
        .iter()
        .filter_map(|n| st.get(PV, "", n))
        .filter(|pv| {
            claim_ref(pv).is_none()
                && !is_deleting(pv)
                && s(pv, "/spec/storageClassName") == class
                && volume_mode(pv) == volume_mode(pvc)
                && modes.iter().all(|m| access_modes(pv).contains(m))
                && quantity_at(pv, "/spec/capacity/storage").unwrap_or(0.0) >= want
                && selector_matches(pvc, pv)
        })
        .min_by(|a, b| {
            let qa = quantity_at(a, "/spec/capacity/storage").unwrap_or(0.0);
            let qb = quantity_at(b, "/spec/capacity/storage").unwrap_or(0.0);
            qa.total_cmp(&qb)
        })
}

/// Binds volume and claim the way the PV controller does: PV claimRef, PV phase, PVC
/// volumeName and annotations, PVC status; each a separate write like the real API calls.
fn bind(st: &mut Store, pv: &Value, pvc: &Value) {
    let (ns, name) = (
        meta_str(pvc, "namespace").to_string(),
        meta_str(pvc, "name").to_string(),
    );
    let pv_name = meta_str(pv, "name").to_string();
    let want_ref = json!({"kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "uid": meta_str(pvc, "uid"),
                          "apiVersion": "v1", "resourceVersion": meta_str(pvc, "resourceVersion")});
    let same_ref = |r: Option<&Value>| {
        r.is_some_and(|r| {
            ["kind", "namespace", "name", "uid", "apiVersion"]
                .iter()
                .all(|k| r.get(*k) == want_ref.get(*k))
        })
    };
    if !same_ref(pv.pointer("/spec/claimRef")) {
        let mut n = pv.clone();
        let had_ref = claim_ref(pv).is_some();
        n["spec"]["claimRef"] = want_ref.clone();
        if !had_ref {
            n = with_annotation(&n, ANN_BOUND_BY_CONTROLLER, Some("yes"));
        }
        if write(st, pv_rd(), pv, n, Sub::Main).is_none() {
            return;
        }
    }
    set_phase(st, pv_rd(), "", &pv_name, "Bound");
    let Some(cur) = st.get(PVC, &ns, &name) else {
        return;
    };
    let mut n = (*cur).clone();
    if s(&cur, "/spec/volumeName").is_empty() {
        n["spec"]["volumeName"] = json!(pv_name);
        n = with_annotation(&n, ANN_BOUND_BY_CONTROLLER, Some("yes"));
    }
    n = with_annotation(&n, ANN_BIND_COMPLETED, Some("yes"));
    if write(st, pvc_rd(), &cur, n, Sub::Main).is_none() {
        return;
    }
    let Some(cur) = st.get(PVC, &ns, &name) else {
        return;
    };
    let Some(pv_now) = st.get(PV, "", &pv_name) else {
        return;
    };
    let mut n = (*cur).clone();
    if !n.get("status").is_some_and(Value::is_object) {
        n["status"] = json!({});
    }
    n["status"]["phase"] = json!("Bound");
    n["status"]["accessModes"] = pv_now
        .pointer("/spec/accessModes")
        .cloned()
        .unwrap_or(json!([]));
    n["status"]["capacity"] = pv_now
        .pointer("/spec/capacity")
        .cloned()
        .unwrap_or(json!({}));
    write(st, pvc_rd(), &cur, n, Sub::Status);
}

/// pvc-protection: drop the finalizer of a deleted claim once no running pod uses it.
fn pvc_protection(st: &mut Store, pvc: &Value) {
    if !finalizers(pvc).iter().any(|f| f == ops::PVC_PROTECTION) {
        return;
    }
    let (ns, name) = (meta_str(pvc, "namespace"), meta_str(pvc, "name"));
    let in_use = st
        .list(PODS, Some(ns))
        .iter()
        .any(|p| !pod_terminated(p) && pod_claims(p).iter().any(|c| c == name));
    if !in_use {
        remove_finalizer(st, pvc_rd(), pvc, ops::PVC_PROTECTION);
    }
}

/// kubelet stand-in: a pod on a node whose claims are all Bound goes Running.
fn sync_pod_phase(st: &mut Store, ns: &str, name: &str) {
    let Some(pod) = st.get(PODS, ns, name) else {
        return;
    };
    if s(&pod, "/spec/nodeName").is_empty()
        || s(&pod, "/status/phase") != "Pending"
        || is_deleting(&pod)
    {
        return;
    }
    let ready = pod_claims(&pod).iter().all(|c| {
        st.get(PVC, ns, c)
            .is_some_and(|p| s(&p, "/status/phase") == "Bound")
    });
    if ready {
        let mut n = (*pod).clone();
        n["status"]["phase"] = json!("Running");
        n["status"]["startTime"] = json!(now());
        write(st, resources::core(PODS), &pod, n, Sub::Status);
    }
}

/// Namespace controller: delete the contents of a terminating namespace, then the namespace.
fn sync_namespace(st: &mut Store, _policy: &Policy, name: &str) {
    let Some(nsobj) = st.get(NAMESPACES, "", name) else {
        return;
    };
    if !is_deleting(&nsobj) {
        return;
    }
    let mut remaining = 0;
    let storages: BTreeSet<&'static str> = RESOURCES
        .iter()
        .filter(|r| r.namespaced)
        .map(|r| r.storage)
        .collect();
    for storage in storages {
        let Some(rd) = resources::by_storage(storage) else {
            continue;
        };
        for obj in st.list(storage, Some(name)) {
            remaining += 1;
            if !is_deleting(&obj) {
                let _ = ops::delete(
                    st,
                    rd,
                    name,
                    meta_str(&obj, "name"),
                    &ops::DeleteOpts::default(),
                );
            }
        }
    }
    let left = RESOURCES
        .iter()
        .filter(|r| r.namespaced)
        .any(|r| !st.list(r.storage, Some(name)).is_empty());
    if !left || remaining == 0 {
        st.commit(NAMESPACES, "", name, None);
    }
}
