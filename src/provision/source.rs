//! Data sources (upstream `getPVCSource` / `getSnapshotSource`): which object a claim's
//! `dataSource` names, and the checks, in upstream's order and words, that turn the source objects
//! the shell fetched into the CreateVolume content source. Pure: the shell reads the objects.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::quantity::parse_quantity;
use super::request::{ContentSource, is_block, requested_bytes};
use crate::gofmt;
use crate::names::ANN_ALLOW_VOLUME_MODE_CHANGE as ALLOW_MODE_CHANGE;

/// API group of VolumeSnapshot and VolumeSnapshotContent.
pub(crate) const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
/// The annotation on a VolumeSnapshotContent that allows restoring into another volume mode.
/// Upstream's finalizer that keeps a VolumeSnapshot while a volume is restored from it.
pub(crate) const SNAPSHOT_SOURCE_FINALIZER: &str =
    crate::names::FINALIZER_SNAPSHOT_SOURCE_PROTECTION;

/// The API resources a data source involves, for dynamic clients (they are not k8s-openapi types).
pub(crate) mod apis {
    use kube::api::{ApiResource, GroupVersionKind};

    fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }
    /// `snapshot.storage.k8s.io/v1` VolumeSnapshot.
    pub(crate) fn volume_snapshots() -> ApiResource {
        resource(
            super::SNAPSHOT_GROUP,
            "v1",
            "VolumeSnapshot",
            "volumesnapshots",
        )
    }
    /// `snapshot.storage.k8s.io/v1` VolumeSnapshotContent.
    pub(crate) fn volume_snapshot_contents() -> ApiResource {
        resource(
            super::SNAPSHOT_GROUP,
            "v1",
            "VolumeSnapshotContent",
            "volumesnapshotcontents",
        )
    }
    /// `gateway.networking.k8s.io/v1beta1` ReferenceGrant.
    pub(crate) fn reference_grants() -> ApiResource {
        resource(
            "gateway.networking.k8s.io",
            "v1beta1",
            "ReferenceGrant",
            "referencegrants",
        )
    }
}

/// The object a claim's data source names, for the two kinds this sidecar resolves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SourceRef {
    /// A claim to clone.
    Claim { namespace: String, name: String },
    /// A VolumeSnapshot to restore.
    Snapshot { namespace: String, name: String },
}

/// The source to fetch: `dataSource`, else `dataSourceRef` (namespace: the ref's, else the
/// claim's). `None` for no source and for kinds or groups the plan refuses or leaves to a
/// populator by itself.
pub(crate) fn source_ref(pvc: &PersistentVolumeClaim) -> Option<SourceRef> {
    let spec = pvc.spec.as_ref()?;
    let own = pvc.metadata.namespace.clone().unwrap_or_default();
    let (kind, group, name, namespace) = match (&spec.data_source, &spec.data_source_ref) {
        (Some(r), _) => (&r.kind, &r.api_group, &r.name, own),
        (None, Some(r)) => (
            &r.kind,
            &r.api_group,
            &r.name,
            r.namespace.clone().filter(|n| !n.is_empty()).unwrap_or(own),
        ),
        (None, None) => return None,
    };
    if name.is_empty() {
        return None;
    }
    let group = group.as_deref().unwrap_or_default();
    match kind.as_str() {
        // Upstream clones any source of this kind, whatever its group says.
        "PersistentVolumeClaim" => Some(SourceRef::Claim {
            namespace,
            name: name.clone(),
        }),
        "VolumeSnapshot" if group == SNAPSHOT_GROUP => Some(SourceRef::Snapshot {
            namespace,
            name: name.clone(),
        }),
        _ => None,
    }
}

/// A data source the decision asks the shell to read ([`crate::provision::plan::source_to_read`]):
/// the object, to be checked against the class the plan reads (under CSI migration the translated
/// one, as upstream, whose translation names our driver as provisioner only for some plugins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceToRead {
    /// The object to read.
    pub(crate) source: SourceRef,
    /// The class's name, for messages.
    pub(crate) class_name: String,
    /// The class's provisioner, which a clone's PV and a snapshot's content must name.
    pub(crate) driver: String,
}

/// The claim's data source, as the shell read it ([`SourceToRead`]) and checked it here.
#[derive(Debug, Clone, Default)]
pub(crate) enum SourceLookup {
    /// Not read: no source, or the decision has not asked for it.
    #[default]
    NotResolved,
    /// Resolved to a content source.
    Resolved(ContentSource),
    /// Resolution failed with this error text.
    Failed(String),
    /// No ReferenceGrant lets the claim use a source in another namespace: upstream reports
    /// this text as it is, not as a handle error.
    Denied(String),
}

fn mode_name(block: bool) -> &'static str {
    if block { "Block" } else { "Filesystem" }
}

/// Upstream `getPVCSource`: `source` is the claim named by the data source (namespace `namespace`),
/// `source_pv` the PV it is bound to, `driver` the provisioner of the class the plan reads (ours,
/// or under CSI migration what the translation names).
pub(crate) fn clone_source(
    pvc: &PersistentVolumeClaim,
    namespace: &str,
    name: &str,
    source: Option<&PersistentVolumeClaim>,
    source_pv: Option<&PersistentVolume>,
    driver: &str,
) -> Result<ContentSource, String> {
    let Some(source) = source else {
        // Upstream reads its informer's cache, so the text is the lister's (singular resource)
        // and names the claim's own namespace, whatever the source's.
        return Err(format!(
            "error getting PVC {name} (namespace {}) from api server: persistentvolumeclaim {} not found",
            gofmt::quote(pvc.metadata.namespace.as_deref().unwrap_or_default()),
            gofmt::quote(name)
        ));
    };
    let phase = source.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some("Bound") {
        return Err(format!(
            "the PVC DataSource {name} must have a status of Bound.  Got {}",
            gofmt::claim_status(source.status.as_ref())
        ));
    }
    // Upstream refuses any source being deleted, so a clone whose first attempt did not finish
    // before the source's deletion never finishes, and its protection finalizer keeps the source
    // Terminating forever. As upstream does for snapshots, a source held by our clone-protection
    // finalizer is still whole and may be cloned.
    if source.metadata.deletion_timestamp.is_some() && !holds_clone_protection(source) {
        return Err(format!(
            "the PVC DataSource {name} is currently being deleted"
        ));
    }
    let class_of =
        |c: &PersistentVolumeClaim| c.spec.as_ref().and_then(|s| s.storage_class_name.clone());
    if class_of(source).is_none() {
        return Err(format!(
            "the source PVC ({name}) storageclass cannot be empty"
        ));
    }
    if class_of(pvc).is_none() {
        let own = pvc.metadata.name.as_deref().unwrap_or_default();
        return Err(format!(
            "the requested PVC ({own}) storageclass cannot be empty"
        ));
    }
    let (wanted, from) = (
        requested_bytes(pvc).unwrap_or(0),
        requested_bytes(source).unwrap_or(0),
    );
    if wanted < from {
        return Err(format!(
            "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {wanted} but source is {from}"
        ));
    }
    let volume_name = source
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    if volume_name.is_empty() {
        return Err(format!("volume name is empty in source PVC {name}"));
    }
    let handle = source_pv.and_then(|pv| {
        let spec = pv.spec.as_ref()?;
        let csi = spec.csi.as_ref()?;
        let claim: &ObjectReference = spec.claim_ref.as_ref()?;
        let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let same_claim = claim.uid == source.metadata.uid
            && claim.namespace.as_deref() == Some(namespace)
            && claim.name.as_deref() == Some(name);
        (csi.driver == driver && same_claim && bound).then(|| csi.volume_handle.clone())
    });
    let Some(volume_id) = handle else {
        return Err("claim in dataSource not bound or invalid".to_owned());
    };
    let (source_block, block) = (is_block(source), is_block(pvc));
    if source_block != block {
        return Err(format!(
            "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is {}, but new PVC requested {}",
            mode_name(source_block),
            mode_name(block)
        ));
    }
    Ok(ContentSource::Volume { volume_id })
}

/// Whether a pending claim of `claims` clones `source`, so the source's clone-protection
/// finalizer must stay. Upstream looks only at `dataSource` in the source's namespace; a
/// cross-namespace clone (`dataSourceRef` with a namespace) is protected here too, since the
/// finalizer is added for it as well.
pub(crate) fn clone_in_progress<'a>(
    source: &PersistentVolumeClaim,
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
) -> bool {
    let wanted = SourceRef::Claim {
        namespace: source.metadata.namespace.clone().unwrap_or_default(),
        name: source.metadata.name.clone().unwrap_or_default(),
    };
    claims.into_iter().any(|c| {
        let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
        source_ref(c).as_ref() == Some(&wanted) && phase.is_none_or(|p| p == "Pending")
    })
}

/// Whether `pvc` is a clone source being deleted that still carries the clone-protection finalizer.
pub(crate) fn holds_clone_protection(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata.deletion_timestamp.is_some()
        && pvc
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == crate::names::FINALIZER_CLONING_PROTECTION)
}

/// The fields of a `gateway.networking.k8s.io/v1beta1` ReferenceGrant the cross-namespace check
/// reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ReferenceGrant {
    #[serde(default)]
    pub(crate) spec: GrantSpec,
}

/// ReferenceGrant `spec`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct GrantSpec {
    #[serde(default)]
    pub(crate) from: Vec<GrantFrom>,
    #[serde(default)]
    pub(crate) to: Vec<GrantTo>,
}

/// One `from` entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct GrantFrom {
    #[serde(default)]
    pub(crate) group: String,
    #[serde(default)]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) namespace: String,
}

/// One `to` entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct GrantTo {
    #[serde(default)]
    pub(crate) group: String,
    #[serde(default)]
    pub(crate) kind: String,
    pub(crate) name: Option<String>,
}

/// Upstream's ReferenceGrant check for a claim in `claim_namespace` using the source `kind`/`name`
/// of API group `group` ("" for the core group) in the grants' namespace: some grant lets
/// PersistentVolumeClaims of that namespace refer to it (by name, or to every object of the kind).
pub(crate) fn grant_allows(
    grants: &[ReferenceGrant],
    claim_namespace: &str,
    group: &str,
    kind: &str,
    name: &str,
) -> bool {
    grants.iter().any(|g| {
        let from = g.spec.from.iter().any(|f| {
            f.group.is_empty()
                && f.kind == "PersistentVolumeClaim"
                && f.namespace == claim_namespace
        });
        let to = g.spec.to.iter().any(|t| {
            t.group == group
                && t.kind == kind
                && t.name.as_deref().is_none_or(|n| n.is_empty() || n == name)
        });
        from && to
    })
}

/// The fields of a `snapshot.storage.k8s.io/v1` VolumeSnapshot that restoring reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VolumeSnapshot {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    #[serde(default)]
    pub(crate) status: Option<SnapshotStatus>,
}

/// VolumeSnapshot `status`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SnapshotStatus {
    pub(crate) bound_volume_snapshot_content_name: Option<String>,
    pub(crate) ready_to_use: Option<bool>,
    pub(crate) restore_size: Option<Quantity>,
}

/// The fields of a VolumeSnapshotContent that restoring reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SnapshotContent {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    #[serde(default)]
    pub(crate) spec: ContentSpec,
    #[serde(default)]
    pub(crate) status: Option<ContentStatus>,
}

/// VolumeSnapshotContent `spec`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ContentSpec {
    #[serde(default)]
    pub(crate) driver: String,
    #[serde(default)]
    pub(crate) volume_snapshot_ref: ObjectReference,
    pub(crate) source_volume_mode: Option<String>,
}

/// VolumeSnapshotContent `status`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ContentStatus {
    pub(crate) snapshot_handle: Option<String>,
}

/// What the shell read for a snapshot source.
pub(crate) enum SnapshotRead<'a> {
    /// The VolumeSnapshot GET failed (not found included), with the error text.
    SnapshotFailed(&'a str),
    /// The snapshot, and its content's GET (error text on failure) once the snapshot names one.
    Read(
        &'a VolumeSnapshot,
        Option<Result<&'a SnapshotContent, &'a str>>,
    ),
}

/// Upstream `getSnapshotSource`, checks 1-10: `class` names the claim's StorageClass (for
/// messages), `driver` the provisioner of the class the plan reads (ours, or under CSI migration
/// what the translation names).
pub(crate) fn snapshot_source(
    pvc: &PersistentVolumeClaim,
    name: &str,
    read: SnapshotRead<'_>,
    class: &str,
    driver: &str,
    prevent_volume_mode_conversion: bool,
) -> Result<ContentSource, String> {
    let (snapshot, content) = match read {
        SnapshotRead::SnapshotFailed(e) => {
            return Err(format!(
                "error getting snapshot {name} from api server: {e}"
            ));
        }
        SnapshotRead::Read(snapshot, content) => (snapshot, content),
    };
    if snapshot.metadata.deletion_timestamp.is_some()
        && !snapshot
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == SNAPSHOT_SOURCE_FINALIZER)
    {
        return Err(format!("snapshot {name} is being deleted"));
    }
    let status = snapshot.status.clone().unwrap_or_default();
    let Some(content_name) = status
        .bound_volume_snapshot_content_name
        .filter(|n| !n.is_empty())
    else {
        return Err(format!("snapshot {name} not bound"));
    };
    let content = match content {
        Some(Ok(content)) => content,
        Some(Err(_)) | None => {
            return Err(format!(
                "error getting snapshotcontent {content_name} for snapshot {name}"
            ));
        }
    };
    let r = &content.spec.volume_snapshot_ref;
    if r.uid != snapshot.metadata.uid
        || r.namespace != snapshot.metadata.namespace
        || r.name != snapshot.metadata.name
    {
        return Err(format!(
            "snapshotcontent {content_name} for snapshot {name} is bound to a different snapshot"
        ));
    }
    if content.spec.driver != driver {
        return Err(format!(
            "snapshotcontent {content_name} for snapshot {name} is not handled by CSI driver of StorageClass {class}"
        ));
    }
    if status.ready_to_use != Some(true) {
        return Err(format!("snapshot {name} is not Ready"));
    }
    let Some(snapshot_id) = content
        .status
        .as_ref()
        .and_then(|s| s.snapshot_handle.clone())
        .filter(|h| !h.is_empty())
    else {
        // Upstream names the snapshot (the data source), not its content.
        return Err(format!("snapshot handle {name} is not available"));
    };
    if let Some(size) = &status.restore_size {
        let restore = parse_quantity(&size.0).unwrap_or(0);
        let wanted = requested_bytes(pvc).unwrap_or(0);
        if wanted < restore {
            return Err(format!(
                "requested volume size {wanted} is less than the size {restore} for the source snapshot {name}"
            ));
        }
    }
    if prevent_volume_mode_conversion {
        check_mode_change(pvc, content)?;
    }
    Ok(ContentSource::Snapshot { snapshot_id })
}

/// `--prevent-volume-mode-conversion`: a restore into another volume mode needs the content's
/// annotation saying so.
fn check_mode_change(pvc: &PersistentVolumeClaim, content: &SnapshotContent) -> Result<(), String> {
    let requested = pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref());
    let (Some(source), Some(requested)) = (content.spec.source_volume_mode.as_deref(), requested)
    else {
        return Ok(());
    };
    if source == requested {
        return Ok(());
    }
    let claim = format!(
        "{}/{}",
        pvc.metadata.namespace.as_deref().unwrap_or_default(),
        pvc.metadata.name.as_deref().unwrap_or_default()
    );
    let start = format!(
        "requested volume {claim} modifies the mode of the source volume but does not have permission to do so."
    );
    let annotation = content
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOW_MODE_CHANGE));
    let content_name = content.metadata.name.as_deref().unwrap_or_default();
    match annotation.map(|v| (v, crate::gofmt::parse_go_bool(v))) {
        None => Err(format!(
            "{start} {ALLOW_MODE_CHANGE} annotation is not present on snapshotcontent {content_name}"
        )),
        // Go's strconv error, as upstream prints it.
        Some((value, Err(_))) => Err(format!(
            "{start} failed to convert {ALLOW_MODE_CHANGE} annotation value to boolean with error: strconv.ParseBool: parsing {}: invalid syntax",
            crate::gofmt::quote(value)
        )),
        Some((_, Ok(false))) => Err(format!(
            "{start} {ALLOW_MODE_CHANGE} is set to false on snapshotcontent {content_name}"
        )),
        Some((_, Ok(true))) => Ok(()),
    }
}

#[cfg(test)]
#[path = "source_tests.rs"]
mod tests;
