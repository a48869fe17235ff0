//! Pure capacity decisions: which (class, segment) pairs need a CSIStorageCapacity object, how the
//! objects that exist map onto them, and what to write once the driver has answered GetCapacity.
//!
//! Everything here is a function of typed objects; the shell (`controller`) reads the caches, calls
//! the driver and sends the writes these functions return.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSelectorTerm, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use crate::names::{LABEL_DRIVER_NAME, LABEL_MANAGED_BY};
use crate::provision::quantity::{bytes_to_quantity, parse_quantity};

/// Topology labels of one segment (sorted by key); empty for a driver without topology keys, which
/// matches every node.
pub(crate) type Segment = BTreeMap<String, String>;

/// `generateName` of the objects we create (upstream's prefix).
pub(crate) const GENERATE_NAME: &str = "csisc-";
/// `managed-by` value of a central (Deployment) instance.
pub(crate) const MANAGED_BY_CENTRAL: &str = "external-provisioner";
/// Longest label value (DNS-1035 label length, as upstream bounds the node-mode id).
const MAX_LABEL_LENGTH: usize = 63;

/// One desired object: a StorageClass in a topology segment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Key {
    /// StorageClass name.
    pub(crate) class: String,
    /// Topology segment.
    pub(crate) segment: Segment,
}

/// Which objects this instance manages: the two labels every object it creates carries, and only
/// objects carrying both with these values are ever updated or deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    /// Our driver's name (label `csi.storage.k8s.io/drivername`).
    pub(crate) driver: String,
    /// This instance's id (label `csi.storage.k8s.io/managed-by`), see [`managed_by_id`].
    pub(crate) managed_by: String,
}

impl Identity {
    /// The label selector of our objects, for the watch.
    pub(crate) fn selector(&self) -> String {
        format!(
            "{LABEL_DRIVER_NAME}={},{LABEL_MANAGED_BY}={}",
            self.driver, self.managed_by
        )
    }

    /// Whether `object` carries both of our labels.
    pub(crate) fn manages(&self, object: &CSIStorageCapacity) -> bool {
        let labels = object.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        label(LABEL_DRIVER_NAME) == Some(self.driver.as_str())
            && label(LABEL_MANAGED_BY) == Some(self.managed_by.as_str())
    }
}

/// Upstream's `managed-by` id: `external-provisioner`, or in node-deployment mode
/// `external-provisioner-<node>`, shortened to 63 characters with an FNV-32a hash when longer, so
/// objects an upstream instance created are recognised as ours.
pub(crate) fn managed_by_id(node: Option<&str>) -> String {
    match node {
        None => MANAGED_BY_CENTRAL.to_owned(),
        Some(node) => name_with_max_length(MANAGED_BY_CENTRAL, node, MAX_LABEL_LENGTH),
    }
}

/// `<base>-<suffix>` when it fits in `max`; otherwise the base is cut and an 8-hex FNV-32a hash
/// added (`<base'>-<hash>-<suffix>`), or, when even the suffix does not fit, `<base'>-<hash>` cut
/// to `max`. Same result as upstream's naming helper for the same inputs.
fn name_with_max_length(base: &str, suffix: &str, max: usize) -> String {
    let name = if base.is_empty() {
        suffix.to_owned()
    } else {
        format!("{base}-{suffix}")
    };
    if name.len() <= max {
        return name;
    }
    let hash = format!("{:08x}", fnv1a32(name.as_bytes()));
    let room = max as isize - 10 - suffix.len() as isize;
    if room <= 0 {
        let prefix = &base[..base.len().min(max.saturating_sub(9))];
        let short = if prefix.is_empty() {
            hash
        } else {
            format!("{prefix}-{hash}")
        };
        return short[..short.len().min(max)].to_owned();
    }
    let prefix = &base[..room as usize];
    format!(
        "{prefix}-{:08x}-{suffix}",
        fnv1a32(base.as_bytes()) // upstream hashes the base alone in this branch
    )
}

/// FNV-1a, 32 bits.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// The segments of a central instance: for every CSINode listing our driver, the values of its
/// topology keys in the labels of the Node of the same name. A CSINode without its Node, or a Node
/// missing one of the keys (its labels not written yet), gives no segment; a driver without keys
/// gives the empty segment.
pub(crate) fn segments<'a>(
    driver: &str,
    csinodes: impl IntoIterator<Item = &'a CSINode>,
    node: impl Fn(&str) -> Option<Arc<Node>>,
) -> BTreeSet<Segment> {
    let mut out = BTreeSet::new();
    'csinodes: for csinode in csinodes {
        let Some(entry) = csinode.spec.drivers.iter().find(|d| d.name == driver) else {
            continue;
        };
        let Some(node) = csinode.metadata.name.as_deref().and_then(&node) else {
            continue;
        };
        let labels = node.metadata.labels.as_ref();
        let mut segment = Segment::new();
        for key in entry.topology_keys.iter().flatten() {
            match labels.and_then(|l| l.get(key)) {
                Some(value) => segment.insert(key.clone(), value.clone()),
                None => continue 'csinodes,
            };
        }
        out.insert(segment);
    }
    out
}

/// Names of the classes that get objects: our driver's, without `Immediate` binding unless
/// `for_immediate_binding` (a class without a mode counts as `Immediate`, as the API defaults it).
pub(crate) fn classes<'a>(
    driver: &str,
    for_immediate_binding: bool,
    all: impl IntoIterator<Item = &'a StorageClass>,
) -> BTreeSet<String> {
    all.into_iter()
        .filter(|c| c.provisioner == driver)
        .filter(|c| {
            for_immediate_binding
                || c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
        })
        .filter_map(|c| c.metadata.name.clone())
        .collect()
}

/// Every (class, segment) pair.
pub(crate) fn desired(classes: &BTreeSet<String>, segments: &BTreeSet<Segment>) -> BTreeSet<Key> {
    classes
        .iter()
        .flat_map(|class| {
            segments.iter().map(|segment| Key {
                class: class.clone(),
                segment: segment.clone(),
            })
        })
        .collect()
}

/// The (class, segment) an object describes; `None` for a node topology that is not plain
/// `matchLabels` (no segment of ours looks like that, so such an object is obsolete).
pub(crate) fn key_of(object: &CSIStorageCapacity) -> Option<Key> {
    let segment = match &object.node_topology {
        None => Segment::new(),
        Some(LabelSelector {
            match_expressions,
            match_labels,
        }) => {
            if match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
                return None;
            }
            match_labels.clone().unwrap_or_default()
        }
    };
    Some(Key {
        class: object.storage_class_name.clone(),
        segment,
    })
}

/// How the objects we manage map onto the desired keys.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Diff {
    /// The object kept for each desired key that has one (by name).
    pub(crate) existing: BTreeMap<Key, String>,
    /// Desired keys without an object: to create.
    pub(crate) missing: BTreeSet<Key>,
    /// Our objects that match no desired key, or duplicate the one kept: to delete (by name).
    pub(crate) obsolete: Vec<String>,
}

/// Maps the managed objects among `actual` onto `desired`. Of several objects for one key the
/// oldest is kept (then the first by name), so two instances or a restart never fight over which
/// one stays. Objects `identity` does not manage are ignored entirely.
pub(crate) fn diff(
    identity: &Identity,
    desired: &BTreeSet<Key>,
    actual: &[Arc<CSIStorageCapacity>],
) -> Diff {
    let mut ours: Vec<&CSIStorageCapacity> = actual
        .iter()
        .map(Arc::as_ref)
        .filter(|o| identity.manages(o) && o.metadata.deletion_timestamp.is_none())
        .collect();
    ours.sort_by(|a, b| {
        let age = |o: &CSIStorageCapacity| o.metadata.creation_timestamp.clone().map(|t| t.0);
        age(a)
            .cmp(&age(b))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    let mut out = Diff::default();
    for object in ours {
        let Some(name) = object.metadata.name.clone() else {
            continue;
        };
        match key_of(object).filter(|k| desired.contains(k)) {
            Some(key) if !out.existing.contains_key(&key) => {
                out.existing.insert(key, name);
            }
            _ => out.obsolete.push(name),
        }
    }
    out.missing = desired
        .iter()
        .filter(|k| !out.existing.contains_key(*k))
        .cloned()
        .collect();
    out.obsolete.sort();
    out
}

/// What the driver answered for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reported {
    /// `available_capacity` in bytes.
    pub(crate) available: i64,
    /// `maximum_volume_size` in bytes, when the driver reports it.
    pub(crate) maximum_volume_size: Option<i64>,
}

/// The write one sync needs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Write {
    /// Nothing changed: no request at all.
    Nothing,
    /// Create this object (named by `generateName`).
    Create(Box<CSIStorageCapacity>),
    /// Replace the existing object with this one (it carries the resourceVersion read).
    Update(Box<CSIStorageCapacity>),
}

/// The write for `key` after the driver reported `reported`: create when there is no object, update
/// when the capacity, the maximum volume size or our owner reference differ, and nothing otherwise
/// (the point of the feature's write budget: an unchanged value costs no request).
pub(crate) fn decide(
    identity: &Identity,
    namespace: &str,
    owner: Option<&OwnerReference>,
    key: &Key,
    reported: Reported,
    existing: Option<&CSIStorageCapacity>,
) -> Write {
    let capacity = Quantity(bytes_to_quantity(reported.available));
    let maximum = reported
        .maximum_volume_size
        .map(|b| Quantity(bytes_to_quantity(b)));
    let Some(existing) = existing else {
        return Write::Create(Box::new(CSIStorageCapacity {
            metadata: ObjectMeta {
                generate_name: Some(GENERATE_NAME.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([
                    (LABEL_DRIVER_NAME.to_owned(), identity.driver.clone()),
                    (LABEL_MANAGED_BY.to_owned(), identity.managed_by.clone()),
                ])),
                owner_references: owner.map(|o| vec![o.clone()]),
                ..Default::default()
            },
            storage_class_name: key.class.clone(),
            node_topology: Some(LabelSelector {
                match_labels: Some(key.segment.clone()),
                match_expressions: None,
            }),
            capacity: Some(capacity),
            maximum_volume_size: maximum,
        }));
    };
    let bytes = |q: Option<&Quantity>| q.map(|q| parse_quantity(&q.0).ok());
    let same_capacity = bytes(existing.capacity.as_ref()) == Some(Some(reported.available));
    let same_maximum =
        bytes(existing.maximum_volume_size.as_ref()) == reported.maximum_volume_size.map(Some);
    let owned = owner.is_none_or(|o| is_controlled_by(existing, o));
    if same_capacity && same_maximum && owned {
        return Write::Nothing;
    }
    let mut updated = existing.clone();
    updated.capacity = Some(capacity);
    updated.maximum_volume_size = maximum;
    if let Some(owner) = owner.filter(|_| !owned) {
        updated
            .metadata
            .owner_references
            .get_or_insert_with(Vec::new)
            .push(owner.clone());
    }
    Write::Update(Box::new(updated))
}

/// Whether `owner` (by UID) is the controlling owner of `object`.
fn is_controlled_by(object: &CSIStorageCapacity, owner: &OwnerReference) -> bool {
    object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == owner.uid)
}

/// The segment a node-selector term of a PV's affinity describes (`In` with exactly one value per
/// key, as we and upstream write them); `None` for any other shape.
pub(crate) fn segment_of_term(term: &NodeSelectorTerm) -> Option<Segment> {
    if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
        return None;
    }
    term.match_expressions
        .iter()
        .flatten()
        .map(|e| match (e.operator.as_str(), e.values.as_deref()) {
            ("In", Some([value])) => Some((e.key.clone(), value.clone())),
            _ => None,
        })
        .collect()
}

/// Which objects a volume created or deleted in may have changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Affected {
    /// Every class in these segments (the volume's node affinity).
    Segments(Vec<Segment>),
    /// Every segment of this class (a volume without node affinity).
    Class(String),
}

/// What a PV's change says of its volume's space, as the PV watch shows it (the controllers that
/// create and delete volumes tell the capacity controller nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum VolumeChange {
    /// A volume of our driver was just created: its PV is new (no phase yet, or `Pending`).
    Created(Affected),
    /// Released (or Failed) or being deleted, with reclaim policy Delete: a volume is deleted
    /// before its PV, so once the PV is gone from the cache, its space is back.
    Ending(Affected),
    /// Nothing to refresh: another driver's PV, one available or bound, or one whose volume is
    /// kept (Retain, the API server's default).
    Unchanged,
}

/// What `pv`'s change says to our driver's capacity objects.
pub(crate) fn volume_change(driver: &str, pv: &PersistentVolume) -> VolumeChange {
    // An in-tree PV of the plugin our driver took over has its affinity on the in-tree zone
    // labels, which match no segment of the driver: read it as the driver's, as migration does.
    let translated = crate::migration::as_csi(driver, pv).and_then(Result::ok);
    let csi_pv = translated.as_ref().unwrap_or(pv);
    let ours = csi_pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|c| c.driver == driver);
    let Some(affected) = ours.then(|| affected_of_csi(csi_pv)).flatten() else {
        return VolumeChange::Unchanged;
    };
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let deletes = csi_pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        == Some("Delete");
    match (pv.metadata.deletion_timestamp.is_some(), phase) {
        (true, _) | (false, Some("Released" | "Failed")) if deletes => {
            VolumeChange::Ending(affected)
        }
        (false, None | Some("Pending")) => VolumeChange::Created(affected),
        _ => VolumeChange::Unchanged,
    }
}

/// What a CreateVolume or DeleteVolume of `pv`'s volume (as the driver sees it: an in-tree one
/// translated) may have changed: the segments of its node affinity, or, without affinity, its
/// class everywhere; `None` when neither is known.
fn affected_of_csi(pv: &PersistentVolume) -> Option<Affected> {
    let spec = pv.spec.as_ref()?;
    let terms = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
        .map(|r| &r.node_selector_terms);
    match terms {
        Some(terms) if !terms.is_empty() => Some(Affected::Segments(
            terms.iter().filter_map(segment_of_term).collect(),
        )),
        _ => spec.storage_class_name.clone().map(Affected::Class),
    }
}

impl Affected {
    /// Whether `key` is among what changed.
    pub(crate) fn covers(&self, key: &Key) -> bool {
        match self {
            // A term may say more than the segment (a migrated PV's region beside its zone).
            Affected::Segments(segments) => segments
                .iter()
                .any(|s| key.segment.iter().all(|(k, v)| s.get(k) == Some(v))),
            Affected::Class(class) => &key.class == class,
        }
    }
}

/// The controlling owner among `refs` (at most one exists), as the owner chain follows it.
pub(crate) fn controller_of(refs: &[OwnerReference]) -> Option<&OwnerReference> {
    refs.iter().find(|r| r.controller == Some(true))
}

/// Node-deployment mode: the objects of our driver left by instances whose node no longer exists,
/// by `managed-by` id (each id's object names, sorted). An id is orphaned when it is neither the
/// central id nor the id of any node in `nodes` (the ids are computed, so shortened ids of long
/// node names are recognised too); objects of other drivers and of live nodes never are.
pub(crate) fn orphaned<'a>(
    driver: &str,
    objects: impl IntoIterator<Item = &'a CSIStorageCapacity>,
    nodes: impl IntoIterator<Item = &'a str>,
) -> BTreeMap<String, Vec<String>> {
    let live: BTreeSet<String> = nodes
        .into_iter()
        .map(|n| managed_by_id(Some(n)))
        .chain([MANAGED_BY_CENTRAL.to_owned()])
        .collect();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for object in objects {
        let labels = object.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k));
        if label(LABEL_DRIVER_NAME).map(String::as_str) != Some(driver) {
            continue;
        }
        let (Some(id), Some(name)) = (label(LABEL_MANAGED_BY), &object.metadata.name) else {
            continue;
        };
        if !live.contains(id) {
            out.entry(id.clone()).or_default().push(name.clone());
        }
    }
    out.values_mut().for_each(|names| names.sort());
    out
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
