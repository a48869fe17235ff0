//! What each node-deployment instance lists and watches, so that its memory stays flat as the
//! cluster grows: selectors, watcher configurations, metadata stripping, PV scoping labels, and which
//! claims an instance may act on. [`crate::node_mode::watches`] wires them.
//!
//! Upstream gives every instance of a DaemonSet a full cache of every PVC, PV, StorageClass and
//! VolumeAttachment of the cluster (hundreds of MiB per node on large clusters, upstream issue
//! 712). Here each instance holds only what it may act on (as wired):
//!
//! | resource | how | kept in memory | why |
//! |---|---|---|---|
//! | PersistentVolumeClaims | full objects, all namespaces, paginated list ([`PAGE_SIZE`]) and watch, filtered before caching by [`cached_claim`] | claims selected to this node (bound ones too: the claims of this node's volumes), claims of our driver that are still pending, unselected (immediate binding) or selected to another node, and the rare claims carrying our intent with no node, or being deleted with an intent for another node | the selected-node and provisioner annotations decide ownership; the provisioning and reclaim controllers read full claims from this cache |
//! | PersistentVolumes | full watch with label selector [`own_pv_selector`] | this node's PVs and PVs not pinned to any single node | each instance deletes only volumes its node can reach; PVs we create carry [`names::LABEL_PV_DRIVER`] and [`names::LABEL_PV_NODE`] ([`new_pv_labels`]) |
//! | StorageClasses | full watch | all (a handful of small objects) | binding mode and allowed topologies of unselected claims |
//! | CSINodes | full watch, stripped to our driver's entry ([`strip_csinode`]) | a few dozen bytes per node | the live instances (rendezvous) and "does the selected node run our driver?" |
//! | Nodes | full watch, stripped before caching to name, UID and the per-node labels ([`strip_node_metadata`]; no spec, no status) | a few dozen bytes per node | the UID recorded on new PVs; first notice that a volume's node is gone (always confirmed by a live GET) |
//! | VolumeAttachments | only when the driver attaches (`PUBLISH_UNPUBLISH_VOLUME`), as upstream, through the PV→node index | two names per attachment | the "still attached" delete guard |
//!
//! Per-node state is a name, a UID and a few labels (tens of bytes): against upstream's full
//! objects of every kind, memory now grows with this node's own volumes and the pending claims, not
//! with the cluster's. Claims and Nodes still stream through every instance in full (the API server
//! cannot filter claims by annotation).
//!
//! The dead-node clean-up runs in at most [`crate::gone_nodes::tracker::MAX_ACTOR_RANKS`] instances (the
//! first ones in rendezvous order for [`crate::gone_nodes::tracker::janitor_key`]; in controller mode the one
//! instance, which reads its full PV cache instead). They list the PVs of a Node that disappears
//! ([`node_pv_selector`]), and when they take over and every [`SWEEP_INTERVAL`] sweep the driver's
//! PVs for nodes that vanished while no instance was watching: a metadata-only, paginated list
//! ([`driver_pv_selector`]) of which nothing is kept ([`sweep_suspect`]).
//!
//! PVs of our driver written by anyone else (an admin's static PV, a restore tool, upstream or an
//! older version before an upgrade; with CSI migration, in-tree PVs of the plugin our driver took
//! over) carry no labels of ours. Each instance watches the PVs without
//! our driver label ([`unlabelled_pv_watch`]; full objects, since a static PV names its driver only
//! in its spec; nothing kept) and labels those it is the one writer for ([`labels_written_here`],
//! [`existing_pv_labels`], [`label_patch`]; `node_mode::labeller`), within seconds of their creation
//! and, through its initial list, at start-up. The PVs of other drivers stream through it too, one
//! event each per instance. The sweep labels the rest (PVs of nodes without an instance) with a
//! paginated list of the same selector ([`unlabelled_pv_selector`]).
//!
//! Labels only narrow what is watched; every decision still reads the PV's affinity and
//! annotations, so a wrong or missing label can delay work but never misdirect it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, VolumeNodeAffinity};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::model::locate::{Mode, PerNodeKeys, Pin, node_query, pin_of};
use crate::model::meta::{has_finalizer, label, non_empty_annotation as annotation};
use crate::names;

/// Page size of every list (initial watch lists and sweeps): bounded memory while listing.
pub(crate) const PAGE_SIZE: u32 = 500;
/// How often the clean-up instance sweeps all of the driver's PVs for nodes that vanished unseen.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(30 * 60);

// === Label values ===

/// Whether `s` is a valid label value: at most 63 characters of `[A-Za-z0-9._-]`, starting and
/// ending with an alphanumeric (empty is valid too).
pub(crate) fn is_valid_label_value(s: &str) -> bool {
    let bytes = s.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_none_or(u8::is_ascii_alphanumeric);
    s.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && edge_ok(bytes.first())
        && edge_ok(bytes.last())
}

/// The label value standing for a node (or driver) name: the name itself when it is a valid label
/// value (every node name of up to 63 characters is), else `hash_` and 16 hex digits of its
/// FNV-1a 64-bit hash. The underscore keeps it apart from real names; a collision could only add a
/// PV to an instance's watch, never remove one.
pub(crate) fn label_value(name: &str) -> String {
    if is_valid_label_value(name) {
        name.to_owned()
    } else {
        format!("hash_{:016x}", crate::rendezvous::fnv1a64_str(name))
    }
}

/// The [`names::LABEL_PV_NODE`] values an instance watches: its node name, its host name label
/// when different (PVs pinned by `kubernetes.io/hostname` are labelled with it), and
/// [`names::LABEL_VALUE_ANY_NODE`].
pub(crate) fn instance_label_values(node_name: &str, hostname: Option<&str>) -> Vec<String> {
    let mut values = vec![label_value(node_name)];
    if let Some(h) = hostname.map(label_value).filter(|h| !values.contains(h)) {
        values.push(h);
    }
    values.push(names::LABEL_VALUE_ANY_NODE.to_owned());
    values
}

/// The [`names::LABEL_PV_NODE`] values under which a Node's PVs may be labelled: its name, its
/// host name, and its values of the per-node keys (legacy PVs pinned by such a key are labelled
/// with that value). When the Node disappears, the clean-up lists the PVs under these values.
pub(crate) fn node_label_values(meta: &ObjectMeta, keys: &PerNodeKeys) -> BTreeSet<String> {
    let labels = meta
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| keys.contains(k));
    let names = meta.name.iter().chain(labels.map(|(_, v)| v));
    names.map(|v| label_value(v)).collect()
}

// === PV labels ===

/// Labels for a PV this node-mode instance creates: our driver, and our node when the PV's
/// affinity pins it to one node (otherwise [`names::LABEL_VALUE_ANY_NODE`]: every instance may
/// reach it, as upstream).
pub(crate) fn new_pv_labels(
    driver: &str,
    node_name: &str,
    affinity: Option<&VolumeNodeAffinity>,
    keys: &PerNodeKeys,
) -> BTreeMap<String, String> {
    let node = match pin_of(affinity, keys, Some(node_name)) {
        Pin::Node(_) => label_value(node_name),
        Pin::NoAffinity | Pin::Spread => names::LABEL_VALUE_ANY_NODE.to_owned(),
    };
    pv_labels(driver, node)
}

/// Our two labels of a PV: `driver` and the label value of its node.
fn pv_labels(driver: &str, node: String) -> BTreeMap<String, String> {
    [
        (names::LABEL_PV_DRIVER.to_owned(), label_value(driver)),
        (names::LABEL_PV_NODE.to_owned(), node),
    ]
    .into()
}

/// Adds the [`new_pv_labels`] to a PV this node-mode instance is about to create (`segments`: our
/// `NodeGetInfo` segments, which tell which affinity keys name our node).
pub(crate) fn label_new_pv<'a, I>(
    pv: &mut PersistentVolume,
    driver: &str,
    node_name: &str,
    segments: I,
) where
    I: IntoIterator<Item = (&'a String, &'a String)>,
{
    let keys = PerNodeKeys::from_node(node_name, None, segments);
    let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
    let labels = new_pv_labels(driver, node_name, affinity, &keys);
    pv.metadata.labels.get_or_insert_default().extend(labels);
}

/// For the labeller and the sweep: the labels an existing PV of `driver` should carry, or `None` when it is
/// not ours or already carries them. The node comes from our node-name annotation, else the node
/// pinned by its affinity; volumes of no single node get [`names::LABEL_VALUE_ANY_NODE`]. An
/// in-tree PV of the plugin our driver took over is ours too, read as the CSI PV it translates to;
/// one that does not translate is every instance's, so that its deletion fails in the open as
/// upstream's does, instead of it never being seen.
pub(crate) fn existing_pv_labels(
    pv: &PersistentVolume,
    driver: &str,
    keys: &PerNodeKeys,
) -> Option<BTreeMap<String, String>> {
    let translated = crate::migration::as_csi(driver, pv);
    let node = match &translated {
        Some(Err(_)) => names::LABEL_VALUE_ANY_NODE.to_owned(),
        Some(Ok(csi)) => node_label_value(csi, driver, keys)?,
        None => node_label_value(pv, driver, keys)?,
    };
    let wanted = pv_labels(driver, node);
    let done = wanted
        .iter()
        .all(|(k, v)| label(&pv.metadata, k) == Some(v));
    (!done).then_some(wanted)
}

/// The node label value of CSI PV `pv` of `driver` ([`existing_pv_labels`]); `None`: another
/// driver's, or no CSI PV.
fn node_label_value(pv: &PersistentVolume, driver: &str, keys: &PerNodeKeys) -> Option<String> {
    if pv.spec.as_ref()?.csi.as_ref()?.driver != driver {
        return None;
    }
    Some(node_query(pv, Mode::Node, keys).map_or_else(
        |_| names::LABEL_VALUE_ANY_NODE.to_owned(),
        |q| label_value(q.node_name()),
    ))
}

/// Node mode, for the watch of PVs without our labels ([`crate::node_mode::labeller`]): the
/// [`existing_pv_labels`] this instance writes on `pv`, or `None` when it is not ours, or another
/// instance (or the sweep) labels it. One writer per PV, so a PV made while the fleet runs costs one
/// patch, not one per node: a PV of one node is labelled by that node's instance (`own`: its
/// [`instance_label_values`] other than [`names::LABEL_VALUE_ANY_NODE`]); a PV of no single node by
/// the first of the `live` instances in rendezvous order of its name, as a claim's selected node is
/// checked by one instance ([`crate::node_mode::ownership::checks_selected_node`]). A PV of a node
/// without an instance is left to the sweep.
pub(crate) fn labels_written_here(
    pv: &PersistentVolume,
    driver: &str,
    keys: &PerNodeKeys,
    own: &[String],
    me: &str,
    live: impl FnOnce() -> Vec<String>,
) -> Option<BTreeMap<String, String>> {
    let labels = existing_pv_labels(pv, driver, keys)?;
    let node = labels.get(names::LABEL_PV_NODE)?;
    let here = if node == names::LABEL_VALUE_ANY_NODE {
        let name = pv.metadata.name.as_deref()?;
        // Read only here: most events are of other drivers' PVs or pinned ones.
        let live = live();
        crate::rendezvous::rank_of(name, me, live.iter().map(String::as_str)) == Some(0)
    } else {
        own.contains(node)
    };
    here.then_some(labels)
}

/// Merge patch setting `labels` (only those keys; nobody else writes them).
pub(crate) fn label_patch(labels: &BTreeMap<String, String>) -> Value {
    json!({ "metadata": { "labels": labels } })
}

/// For the clean-up sweep over PV metadata: whether this PV may belong to a node that no longer
/// exists, so that its node's PVs are worth a full list. The node is our node-name annotation (with
/// the recorded UID, so a node name reused by a new machine is suspect too), else the node label.
/// `node_present(name, recorded_uid)` answers from the Node cache: a Node of that name (or host
/// name, for label values) exists, with `recorded_uid` when one is given. PVs of no single node are
/// never suspects; hashed label values (overlong names) always are.
pub(crate) fn sweep_suspect(
    meta: &ObjectMeta,
    node_present: impl Fn(&str, Option<&str>) -> bool,
) -> bool {
    if let Some(name) = annotation(meta, names::ANN_NODE_NAME) {
        return !node_present(name, annotation(meta, names::ANN_NODE_UID));
    }
    match label(meta, names::LABEL_PV_NODE) {
        None => false,
        Some(v) if v == names::LABEL_VALUE_ANY_NODE => false,
        Some(v) if v.starts_with("hash_") => true,
        Some(v) => !node_present(v, None),
    }
}

// === Selectors and watcher configurations ===

/// The PVs an instance watches: its driver's PVs labelled with one of `values`
/// ([`instance_label_values`]).
pub(crate) fn own_pv_selector(driver: &str, values: &[String]) -> String {
    // Label values are their own label value.
    node_pv_selector(driver, values.iter().map(String::as_str))
}

/// The PVs of some (dead) nodes, by their node names (label-selected LIST or watch).
pub(crate) fn node_pv_selector<'a, I>(driver: &str, node_names: I) -> String
where
    I: IntoIterator<Item = &'a str>,
{
    let mut values: Vec<String> = node_names.into_iter().map(label_value).collect();
    values.sort();
    values.dedup();
    let driver = driver_pv_selector(driver);
    format!(
        "{driver},{} in ({})",
        names::LABEL_PV_NODE,
        values.join(",")
    )
}

/// All PVs of the driver (the clean-up sweep).
pub(crate) fn driver_pv_selector(driver: &str) -> String {
    format!("{}={}", names::LABEL_PV_DRIVER, label_value(driver))
}

/// PVs without our labels (written by upstream, an older version, an admin or any other tool):
/// each node-mode instance watches these ([`crate::node_mode::labeller`]) and the sweep lists them,
/// to label those of our driver.
pub(crate) fn unlabelled_pv_selector() -> String {
    format!("!{}", names::LABEL_PV_DRIVER)
}

/// Watcher configuration of this instance's PV watch.
pub(crate) fn own_pv_watch(
    driver: &str,
    node_name: &str,
    hostname: Option<&str>,
) -> watcher::Config {
    let values = instance_label_values(node_name, hostname);
    paged_watch().labels(&own_pv_selector(driver, &values))
}

/// Watcher configuration of the watch of PVs without our labels (full objects: a static PV names
/// its driver only in its spec, which no selector reaches).
pub(crate) fn unlabelled_pv_watch() -> watcher::Config {
    paged_watch().labels(&unlabelled_pv_selector())
}

/// Watcher configuration of the paginated watches: as is for the claim, Node and CSINode watches
/// (no selector: the API cannot filter them by annotation), with a label selector for PVs.
pub(crate) fn paged_watch() -> watcher::Config {
    watcher::Config::default().page_size(PAGE_SIZE)
}

// === Stripping before caching ===

/// Keeps a Node's name, UID, resourceVersion, deletion time and the labels in `keys` (the per-node
/// keys the dead-node lookups match on). Readiness is deliberately not kept: NotReady is not gone.
pub(crate) fn strip_node_metadata(meta: &mut ObjectMeta, keys: &PerNodeKeys) {
    let labels = meta.labels.take().map(|mut l| {
        l.retain(|k, _| keys.contains(k));
        l
    });
    *meta = ObjectMeta {
        name: meta.name.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
        labels: labels.filter(|l| !l.is_empty()),
        ..ObjectMeta::default()
    };
}

/// Keeps a CSINode's identity and our driver's entry only (without allocatable counts).
pub(crate) fn strip_csinode(csinode: &mut CSINode, driver: &str) {
    let meta = &mut csinode.metadata;
    *meta = ObjectMeta {
        name: meta.name.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        ..ObjectMeta::default()
    };
    csinode.spec.drivers.retain(|d| d.name == driver);
    for d in &mut csinode.spec.drivers {
        d.allocatable = None;
    }
}

// === Claims an instance may act on ===

/// Whether the node-mode claim cache keeps this claim, from its metadata alone (`driver`: ours;
/// `me`: `NODE_NAME`). Memory follows this node's volumes and the pending claims, not all claims:
/// - every claim selected to this node, even once bound (the claims of this node's own volumes:
///   the deletion checks read them from the cache instead of the API server);
/// - our driver's pending claims, unselected (maybe compete: immediate binding) or selected to
///   another node (the rendezvous-chosen instance checks that node runs our driver,
///   [`crate::model::topology::selected_node_check`]);
/// - claims carrying our provisioning intent but no selected node any more (cleared for a
///   reschedule after a final CreateVolume error): no instance owns them, so every instance keeps
///   them, and the resolver of whichever sees one deleted drops the record (else it would stay
///   Terminating forever);
/// - claims being deleted with our provisioning intent for another node: that node's instance
///   cleans up; if the node no longer exists, the resolver of the instance that checks other
///   nodes' claims drops the record after the deleted-node grace period. Rare (deleted
///   mid-provisioning), so every instance keeps them.
pub(crate) fn cached_claim(meta: &ObjectMeta, driver: &str, me: &str) -> bool {
    let selected = annotation(meta, names::ANN_SELECTED_NODE);
    let provisioner = annotation(meta, names::ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(meta, names::ANN_BETA_STORAGE_PROVISIONER));
    let deleting = meta.deletion_timestamp.is_some();
    // Every driver running this sidecar uses the same intent finalizer: only our driver's count.
    let our_intent = has_finalizer(meta, names::FINALIZER_PROVISIONING_INTENT)
        && (provisioner == Some(driver)
            || annotation(meta, names::ANN_MIGRATED_TO) == Some(driver));
    let pending = annotation(meta, names::ANN_BIND_COMPLETED).is_none() && !deleting;
    selected == Some(me)
        || (our_intent && (selected.is_none() || deleting))
        || (provisioner == Some(driver) && pending)
}

#[cfg(test)]
#[path = "scope_tests.rs"]
mod tests;
