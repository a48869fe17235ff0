//! Where a volume lives: the node a PV's affinity pins ([`pin_of`]), the keys that identify a single
//! node ([`PerNodeKeys`]), how to look that node up ([`NodeQuery`]) and what the answer means
//! ([`NodeLookup`]: only a 404 or an empty label-selected list is absence), and the annotations that
//! record the provisioning node on new PVs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{PersistentVolume, VolumeNodeAffinity};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::meta::non_empty_annotation;
use crate::names;
use crate::retry::{ApiErrorClass, classify as classify_api_error, describe};

/// The well-known label every kubelet sets to its host name.
pub(crate) const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// How the sidecar is deployed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `--node-deployment`: one instance per node.
    Node,
    /// One (leader-elected) instance beside the controller plugin.
    Controller,
}

/// Node-affinity keys whose single `In` value identifies exactly one node: always
/// `kubernetes.io/hostname`, plus driver topology keys whose value is the node's name or host name
/// (e.g. `topology.hostpath.csi/node`). Zone or region keys never qualify, so zonal volumes are
/// never taken for node-local ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PerNodeKeys(BTreeSet<String>);

impl Default for PerNodeKeys {
    fn default() -> Self {
        Self([HOSTNAME_LABEL.to_owned()].into())
    }
}

impl PerNodeKeys {
    /// `kubernetes.io/hostname` plus `extra`.
    pub(crate) fn new<I, S>(extra: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut keys = Self::default();
        keys.0.extend(extra.into_iter().map(Into::into));
        keys
    }

    /// Derives the per-node keys from one node running our driver: its name, its
    /// `kubernetes.io/hostname` label, and its topology segments (node mode: our `NodeGetInfo`
    /// segments; controller mode: any CSINode's topology keys resolved against that Node's labels).
    pub(crate) fn from_node<'a, I>(node_name: &str, hostname: Option<&str>, segments: I) -> Self
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        Self::new(
            segments
                .into_iter()
                .filter(|(_, value)| {
                    value.as_str() == node_name || Some(value.as_str()) == hostname
                })
                .map(|(key, _)| key.clone()),
        )
    }

    /// Controller mode: the per-node keys of `driver` across the cluster. A topology key the
    /// driver registers in CSINodes counts when, on every node whose Node carries it, its value is
    /// that node's name or host name; a single node where it is shared (a zone) rules it out.
    /// `labels_of` returns a Node's labels by name.
    pub(crate) fn from_cluster<'a, C, L>(driver: &str, csinodes: C, labels_of: L) -> Self
    where
        C: IntoIterator<Item = &'a CSINode>,
        L: Fn(&str) -> Option<&'a BTreeMap<String, String>>,
    {
        let mut verdicts: BTreeMap<&'a str, bool> = BTreeMap::new();
        for csinode in csinodes {
            let Some(name) = csinode.metadata.name.as_deref() else {
                continue;
            };
            let Some(labels) = labels_of(name) else {
                continue;
            };
            let hostname = labels.get(HOSTNAME_LABEL).map(String::as_str);
            let keys = csinode
                .spec
                .drivers
                .iter()
                .filter(|d| d.name == driver)
                .flat_map(|d| d.topology_keys.iter().flatten());
            for key in keys {
                let Some(value) = labels.get(key) else {
                    continue;
                };
                let per_node = value == name || Some(value.as_str()) == hostname;
                *verdicts.entry(key.as_str()).or_insert(true) &= per_node;
            }
        }
        Self::new(
            verdicts
                .into_iter()
                .filter(|(_, per_node)| *per_node)
                .map(|(key, _)| key.to_owned()),
        )
    }

    /// Whether `key` identifies a single node.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.0.contains(key)
    }
}

/// How to find the node a volume lives on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum NodeQuery {
    /// The Node named `name` (GET); with `uid`, a Node of that name with another UID is a new node.
    ByName {
        /// Node name.
        name: String,
        /// UID recorded at provisioning, when known.
        uid: Option<String>,
    },
    /// Any Node labelled `key=value` (label-selected LIST): PVs without our annotations.
    ByLabel {
        /// A [`PerNodeKeys`] key.
        key: String,
        /// Its value in the PV's node affinity.
        value: String,
    },
}

impl NodeQuery {
    /// The node's name as far as we know it (the label value for label lookups): for messages,
    /// logs, and the scoping label.
    pub(crate) fn node_name(&self) -> &str {
        match self {
            Self::ByName { name, .. } => name,
            Self::ByLabel { value, .. } => value,
        }
    }

    /// Whether this query finds the node called `name` (by its name, or by a label valued with
    /// it, as a per-node topology key or the host name usually is).
    pub(crate) fn names(&self, name: &str) -> bool {
        self.node_name() == name
    }

    /// Label selector of the live LIST for [`NodeQuery::ByLabel`] (`None`: GET by name instead).
    pub(crate) fn label_selector(&self) -> Option<String> {
        match self {
            Self::ByName { .. } => None,
            Self::ByLabel { key, value } => Some(format!("{key}={value}")),
        }
    }

    /// Looks the node up in a synced Node cache (metadata is enough: readiness is never read).
    pub(crate) fn lookup_in<'a, I>(&self, nodes: I) -> NodeLookup
    where
        I: IntoIterator<Item = &'a ObjectMeta>,
    {
        let found = nodes.into_iter().find(|meta| match self {
            Self::ByName { name, .. } => meta.name.as_deref() == Some(name.as_str()),
            Self::ByLabel { key, value } => meta
                .labels
                .as_ref()
                .and_then(|l| l.get(key))
                .is_some_and(|v| v == value),
        });
        match found {
            Some(meta) => NodeLookup::Found {
                uid: meta.uid.clone(),
            },
            None => NodeLookup::NotFound,
        }
    }
}

impl fmt::Display for NodeQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ByName {
                name,
                uid: Some(uid),
            } => write!(f, "node {name:?} (UID {uid})"),
            Self::ByName { name, uid: None } => write!(f, "node {name:?}"),
            Self::ByLabel { key, value } => write!(f, "node labelled {key}={value}"),
        }
    }
}

/// The answer to a node lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NodeLookup {
    /// A matching Node exists (whatever its readiness), with its UID when known.
    Found {
        /// `metadata.uid`.
        uid: Option<String>,
    },
    /// No matching Node: absent from the synced cache, a live GET answered 404, or a live
    /// label-selected LIST came back empty.
    NotFound,
    /// Anything else: never evidence of absence.
    Failed {
        /// What went wrong, for the log.
        reason: String,
    },
}

impl NodeLookup {
    /// Maps a live `Api::get_opt` / `Api::get` result for [`NodeQuery::ByName`]. Only a 404 is
    /// absence; every other error is [`NodeLookup::Failed`].
    pub(crate) fn from_get<K: kube::Resource>(result: &Result<Option<K>, kube::Error>) -> Self {
        match result {
            Ok(Some(node)) => Self::Found {
                uid: node.meta().uid.clone(),
            },
            Ok(None) => Self::NotFound,
            Err(e) if classify_api_error(e) == ApiErrorClass::NotFound => Self::NotFound,
            Err(e) => Self::Failed {
                reason: format!("{} error: {}", classify_api_error(e), describe(e)),
            },
        }
    }

    /// Maps a live label-selected LIST (`Api::list_metadata` items) for [`NodeQuery::ByLabel`]: an
    /// empty list is absence, an error never is.
    pub(crate) fn from_list<K: kube::Resource>(result: &Result<Vec<K>, kube::Error>) -> Self {
        match result {
            Ok(items) => match items.first() {
                Some(node) => Self::Found {
                    uid: node.meta().uid.clone(),
                },
                None => Self::NotFound,
            },
            Err(e) => Self::Failed {
                reason: format!("{} error: {}", classify_api_error(e), describe(e)),
            },
        }
    }
}

/// What a node affinity says about where a volume lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pin {
    /// No required node affinity.
    NoAffinity,
    /// Every term pins the same single node (query without a UID).
    Node(NodeQuery),
    /// Some term can be satisfied by more than one node (zonal, or several nodes): not node-local.
    Spread,
}

/// Reads the single node a volume's affinity pins, if any. A term pins a node when it has
/// `matchFields metadata.name In [x]`, or a `matchExpressions` entry `k In [v]` with one value where
/// `k` is a [`PerNodeKeys`] key or `v` is the `recorded` node name. Every term must pin the same
/// node (terms are ORed: one unpinned term lets other nodes satisfy the affinity).
pub(crate) fn pin_of(
    affinity: Option<&VolumeNodeAffinity>,
    keys: &PerNodeKeys,
    recorded: Option<&str>,
) -> Pin {
    let terms = match affinity.and_then(|a| a.required.as_ref()) {
        Some(selector) if !selector.node_selector_terms.is_empty() => &selector.node_selector_terms,
        _ => return Pin::NoAffinity,
    };
    let mut pinned: Option<NodeQuery> = None;
    for term in terms {
        let by_name = term.match_fields.iter().flatten().find_map(|r| {
            (r.key == "metadata.name" && r.operator == "In")
                .then(|| single(r.values.as_deref()))
                .flatten()
                .map(|name| NodeQuery::ByName {
                    name: name.to_owned(),
                    uid: None,
                })
        });
        let mut by_label: Vec<NodeQuery> = term
            .match_expressions
            .iter()
            .flatten()
            .filter(|r| r.operator == "In")
            .filter_map(|r| {
                let value = single(r.values.as_deref())?;
                (keys.contains(&r.key) || recorded == Some(value)).then(|| NodeQuery::ByLabel {
                    key: r.key.clone(),
                    value: value.to_owned(),
                })
            })
            .collect();
        // Deterministic preference: the hostname label, then keys in order.
        by_label.sort_by_key(|q| match q {
            NodeQuery::ByLabel { key, .. } => (key != HOSTNAME_LABEL, key.clone()),
            NodeQuery::ByName { .. } => (false, String::new()),
        });
        let Some(this) = by_name.or_else(|| by_label.into_iter().next()) else {
            return Pin::Spread;
        };
        match &pinned {
            None => pinned = Some(this),
            Some(previous) if *previous == this => {}
            Some(_) => return Pin::Spread,
        }
    }
    pinned.map_or(Pin::NoAffinity, Pin::Node)
}

fn single(values: Option<&[String]>) -> Option<&str> {
    match values {
        Some([one]) if !one.is_empty() => Some(one.as_str()),
        _ => None,
    }
}

/// Why a PV's node cannot be looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unlocated {
    /// The affinity can be satisfied by more than one node (zonal volume), or in controller mode a
    /// volume without affinity: other nodes or the controller plugin can still reach it.
    NotNodeLocal,
    /// No node recorded and no affinity: where it lived is unknown.
    NoNodeKnown,
}

/// How to find the node `pv` lives on, or why it is not node-local.
pub(crate) fn node_query(
    pv: &PersistentVolume,
    mode: Mode,
    keys: &PerNodeKeys,
) -> Result<NodeQuery, Unlocated> {
    let recorded = non_empty_annotation(&pv.metadata, names::ANN_NODE_NAME);
    let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
    let by_record = |name: &str| NodeQuery::ByName {
        name: name.to_owned(),
        uid: non_empty_annotation(&pv.metadata, names::ANN_NODE_UID).map(str::to_owned),
    };
    match (recorded, pin_of(affinity, keys, recorded)) {
        (_, Pin::Spread) => Err(Unlocated::NotNodeLocal),
        (Some(name), Pin::Node(query)) if query.names(name) => Ok(by_record(name)),
        // Node mode records the instance's own node, where its driver made the volume; that
        // node's host name label may differ from its name.
        (Some(name), Pin::Node(NodeQuery::ByLabel { key, .. }))
            if mode == Mode::Node && key == HOSTNAME_LABEL =>
        {
            Ok(by_record(name))
        }
        // The affinity pins another node than the one recorded (a claim selected for one node
        // whose volume the driver placed on another): where the volume is wins over where it was
        // asked to be.
        (_, Pin::Node(query)) => Ok(query),
        // Without affinity every instance may reach the volume in controller mode (one controller
        // plugin serves all nodes), so only node mode trusts the record alone.
        (Some(name), Pin::NoAffinity) if mode == Mode::Node => Ok(by_record(name)),
        (Some(_), Pin::NoAffinity) => Err(Unlocated::NotNodeLocal),
        (None, Pin::NoAffinity) => Err(Unlocated::NoNodeKnown),
    }
}

#[cfg(test)]
#[path = "locate_tests.rs"]
mod tests;
