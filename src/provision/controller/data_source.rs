//! The data source's shell, doing what the decision says: reads the source it asks for
//! ([`crate::provision::plan::source_to_read`]) for the checks of [`crate::provision::source`] (the
//! source claim and its PV from the caches, a live GET where a node-mode cache does not hold them;
//! the VolumeSnapshot and its VolumeSnapshotContent with GETs, they are not cached); and keeps
//! upstream's source-protection finalizers on the source the plan names while a volume is made
//! from it: added before CreateVolume, a snapshot's removed once the PV exists, a clone source's
//! once it is being deleted and no pending claim clones it.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;

use super::Provisioner;
use crate::k8s::patch::PatchOutcome;
use crate::provision::request::ContentSource;
use crate::provision::source::{
    self, SNAPSHOT_GROUP, SnapshotContent, SnapshotRead, SourceLookup, SourceRef, SourceToRead,
    VolumeSnapshot,
};
use crate::retry::describe;

/// The content source of the data source the decision asked for, or why there is none.
pub(super) async fn read(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    need: &SourceToRead,
) -> SourceLookup {
    let own_namespace = pvc.namespace().unwrap_or_default();
    let result = match &need.source {
        SourceRef::Claim { namespace, name } | SourceRef::Snapshot { namespace, name }
            if *namespace != own_namespace
                && !granted(state, &own_namespace, &need.source).await =>
        {
            let kind = match need.source {
                SourceRef::Claim { .. } => "PersistentVolumeClaim",
                SourceRef::Snapshot { .. } => "VolumeSnapshot",
            };
            return SourceLookup::Denied(format!(
                "accessing {namespace}/{name} of {kind} dataSource from {own_namespace}/{} isn't allowed",
                pvc.name_any()
            ));
        }
        SourceRef::Claim { namespace, name } => {
            read_clone(state, pvc, &need.driver, namespace, name).await
        }
        SourceRef::Snapshot { namespace, name } => {
            read_snapshot(state, pvc, need, namespace, name).await
        }
    };
    match result {
        Ok(content) => SourceLookup::Resolved(content),
        Err(reason) => SourceLookup::Failed(reason),
    }
}

/// Whether a ReferenceGrant in the source's namespace lets claims of `claim_namespace` use it
/// (the gate is checked by the plan; without it such a claim never gets this far). A failed
/// LIST counts as no grant: the claim is refused with the denial and retried.
async fn granted(state: &Provisioner, claim_namespace: &str, found: &SourceRef) -> bool {
    let (namespace, name, group, kind) = match found {
        SourceRef::Claim { namespace, name } => (namespace, name, "", "PersistentVolumeClaim"),
        SourceRef::Snapshot { namespace, name } => {
            (namespace, name, SNAPSHOT_GROUP, "VolumeSnapshot")
        }
    };
    let grants = source::apis::reference_grants();
    let api = Api::<DynamicObject>::namespaced_with(state.ctx.client.clone(), namespace, &grants);
    let Ok(list) = api.list(&kube::api::ListParams::default()).await else {
        return false;
    };
    let grants: Vec<source::ReferenceGrant> = list
        .items
        .iter()
        .filter_map(|g| serde_json::from_value(serde_json::to_value(g).ok()?).ok())
        .collect();
    source::grant_allows(&grants, claim_namespace, group, kind, name)
}

/// `driver`: the provisioner of the class the plan reads, which the source PV's driver must be.
async fn read_clone(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    driver: &str,
    namespace: &str,
    name: &str,
) -> Result<ContentSource, String> {
    let stores = &state.ctx.stores;
    let cached = stores
        .pvcs
        .get(&crate::k8s::cache::key(Some(namespace), name))
        .map(|c| c.full());
    let claim = match cached {
        Some(c) => Some(c),
        None => Api::<PersistentVolumeClaim>::namespaced(state.ctx.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| {
                format!(
                    "error getting PVC {name} (namespace {namespace:?}) from api server: {}",
                    describe(&e)
                )
            })?,
    };
    let volume = claim
        .as_ref()
        .and_then(|c| c.spec.as_ref()?.volume_name.clone())
        .filter(|v| !v.is_empty());
    let pv = match volume {
        None => None,
        Some(volume) => match stores.pvs.get(&volume) {
            Some(pv) => Some(pv.full()),
            // Unreadable counts as missing: the check below names it invalid, and it is retried.
            None => Api::<PersistentVolume>::all(state.ctx.client.clone())
                .get_opt(&volume)
                .await
                .ok()
                .flatten(),
        },
    };
    source::clone_source(pvc, namespace, name, claim.as_ref(), pv.as_ref(), driver)
}

async fn read_snapshot(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    class: &SourceToRead,
    namespace: &str,
    name: &str,
) -> Result<ContentSource, String> {
    let client = &state.ctx.client;
    let snapshots = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &source::apis::volume_snapshots(),
    );
    let snapshot: VolumeSnapshot = match get_as(&snapshots, name).await {
        Ok(s) => s,
        Err(e) => {
            let read = SnapshotRead::SnapshotFailed(&e);
            return snapshot_source(state, pvc, class, name, read);
        }
    };
    let content_name = snapshot
        .status
        .as_ref()
        .and_then(|s| s.bound_volume_snapshot_content_name.clone())
        .filter(|n| !n.is_empty());
    let content = match content_name {
        None => None,
        Some(content_name) => {
            let contents = Api::<DynamicObject>::all_with(
                client.clone(),
                &source::apis::volume_snapshot_contents(),
            );
            Some(get_as::<SnapshotContent>(&contents, &content_name).await)
        }
    };
    let content = content.as_ref().map(|r| r.as_ref().map_err(String::as_str));
    snapshot_source(
        state,
        pvc,
        class,
        name,
        SnapshotRead::Read(&snapshot, content),
    )
}

fn snapshot_source(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    class: &SourceToRead,
    name: &str,
    read: SnapshotRead<'_>,
) -> Result<ContentSource, String> {
    let prevent = state.ctx.config.provisioning.prevent_volume_mode_conversion;
    source::snapshot_source(pvc, name, read, &class.class_name, &class.driver, prevent)
}

/// GETs one object and reads the fields `T` names; the error is the API server's message.
async fn get_as<T: DeserializeOwned>(api: &Api<DynamicObject>, name: &str) -> Result<T, String> {
    let object = api.get(name).await.map_err(|e| describe(&e))?;
    let value = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map_err(|e| format!("unexpected {name}: {e}"))
}

/// Upstream's source protection before CreateVolume: the clone source claim gets the
/// clone-protection finalizer, a VolumeSnapshot the snapshot-source one, so the source is not
/// deleted while the volume is made from it. `Err`: the message for the claim's event.
pub(super) async fn protect(state: &Provisioner, source: &SourceRef) -> Result<(), String> {
    match source {
        SourceRef::Claim { namespace, name } => {
            let api = Api::<PersistentVolumeClaim>::namespaced(state.ctx.client.clone(), namespace);
            let cached = state
                .ctx
                .stores
                .pvcs
                .get(&crate::k8s::cache::key(Some(namespace), name))
                .map(|c| c.full());
            let finalizer = crate::names::FINALIZER_CLONING_PROTECTION;
            if cached
                .as_ref()
                .is_some_and(|c| c.finalizers().iter().any(|f| f == finalizer))
            {
                return Ok(());
            }
            let seed = cached.unwrap_or_else(|| PersistentVolumeClaim {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                },
                ..Default::default()
            });
            match crate::k8s::patch::add_finalizer(&api, &seed, finalizer).await {
                Ok(PatchOutcome::Patched(_) | PatchOutcome::Unchanged(_)) => Ok(()),
                Ok(PatchOutcome::Deleting(_)) => Err(format!(
                    "the PVC DataSource {name} is currently being deleted"
                )),
                // Upstream's lister text, unwrapped (setCloneFinalizer).
                Ok(PatchOutcome::Gone) => Err(format!(
                    "persistentvolumeclaim {} not found",
                    crate::gofmt::quote(name)
                )),
                Err(e) => Err(e.to_string()),
            }
        }
        SourceRef::Snapshot { namespace, name } => {
            snapshot_finalizer(state, namespace, name, true).await
        }
    }
}

/// After the PV exists: the snapshot-source finalizer comes off (errors are only logged, as
/// upstream; the orphan sweep retries). Unlike upstream, not while another pending claim restores
/// from the same snapshot: it needs the finalizer too, and removing and re-adding it per volume
/// cost a GET and an Update each, plus conflicts between concurrent restores.
pub(super) async fn release_snapshot(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    source: &SourceRef,
) {
    let SourceRef::Snapshot { namespace, name } = source else {
        return;
    };
    // Others still waiting for their volume: pending, and no PV of theirs in the cache yet.
    let stores = &state.ctx.stores;
    let has_pv = |c: &PersistentVolumeClaim| {
        crate::provision::plan::claim_volume_name(c, &state.settings)
            .is_ok_and(|v| stores.pvs.get(&v).is_some())
    };
    let others: Vec<PersistentVolumeClaim> = stores
        .pvcs
        .state()
        .iter()
        .filter(|c| c.namespace() == Some(namespace.as_str()))
        .filter(|c| Some(c.uid()) != pvc.metadata.uid.as_deref())
        .map(|c| c.full())
        .filter(|c| !has_pv(c))
        .collect();
    let key = format!("{namespace}/{name}");
    if crate::provision::snapshot_sweep::referenced(&others).contains(&key) {
        return;
    }
    if let Err(e) = snapshot_finalizer(state, namespace, name, false).await {
        tracing::warn!(snapshot = %format!("{namespace}/{name}"), error = %e, "removing the snapshot-source finalizer failed");
    }
}

/// Adds (`add`) or removes our finalizer on a VolumeSnapshot with an Update (upstream's role grants
/// `update`, not `patch`), guarded by the resourceVersion read. Forbidden is ignored, as upstream.
async fn snapshot_finalizer(
    state: &Provisioner,
    namespace: &str,
    name: &str,
    add: bool,
) -> Result<(), String> {
    let finalizer = source::SNAPSHOT_SOURCE_FINALIZER;
    let api = Api::<DynamicObject>::namespaced_with(
        state.ctx.client.clone(),
        namespace,
        &source::apis::volume_snapshots(),
    );
    let mut snapshot = match api.get_opt(name).await {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(()),
        Err(e) => {
            return Err(format!(
                "error getting snapshot {name} from api server: {}",
                describe(&e)
            ));
        }
    };
    let finalizers = snapshot.metadata.finalizers.get_or_insert_with(Vec::new);
    if finalizers.iter().any(|f| f == finalizer) == add {
        return Ok(());
    }
    if add {
        finalizers.push(finalizer.to_owned());
    } else {
        finalizers.retain(|f| f != finalizer);
    }
    match api
        .replace(name, &kube::api::PostParams::default(), &snapshot)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => Ok(()),
        Err(e) => Err(format!(
            "updating the finalizers of snapshot {name}: {}",
            describe(&e)
        )),
    }
}

/// A clone source being deleted (asked only of a claim that [`source::holds_clone_protection`]):
/// whether a pending claim of its namespace still clones it, so its clone-protection finalizer
/// stays (checked again every [`CLONE_WAIT`]).
pub(super) fn clones_pending(state: &Provisioner, pvc: &PersistentVolumeClaim) -> bool {
    let namespace = pvc.namespace().unwrap_or_default();
    // Other namespaces too where a cross-namespace clone (dataSourceRef) may be in progress.
    let cross = state.settings.cross_namespace_data_source;
    let claims: Vec<PersistentVolumeClaim> = state
        .ctx
        .stores
        .pvcs
        .state()
        .iter()
        .filter(|c| cross || c.namespace() == Some(namespace.as_str()))
        .map(|c| c.full())
        .collect();
    source::clone_in_progress(pvc, &claims)
}

/// No pending claim clones `pvc` any more: its clone-protection finalizer comes off.
pub(super) async fn release_clone_source(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
) -> Result<(), crate::k8s::patch::PatchError> {
    let namespace = pvc.namespace().unwrap_or_default();
    let api = Api::<PersistentVolumeClaim>::namespaced(state.ctx.client.clone(), &namespace);
    let finalizer = crate::names::FINALIZER_CLONING_PROTECTION;
    crate::k8s::patch::remove_finalizer(&api, pvc, finalizer)
        .await
        .map(|_| ())
}

/// How often a clone source being deleted looks again for clones still in progress.
pub(super) const CLONE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
