//! Where a volume lives: the node a PV's affinity pins ([`pin_of`]), the keys that identify a single
//! node ([`PerNodeKeys`]), how to look that node up ([`NodeQuery`]) and what the answer means
//! ([`NodeLookup`]: only a 404 or an empty label-selected list is absence), and the annotations that
//! record the provisioning node on new PVs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::VolumeNodeAffinity;
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::k8s::errors::{ApiErrorClass, classify as classify_api_error};
use crate::names;

/// The well-known label every kubelet sets to its host name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// How the sidecar is deployed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
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
pub struct PerNodeKeys(BTreeSet<String>);

impl Default for PerNodeKeys {
    fn default() -> Self {
        Self([HOSTNAME_LABEL.to_owned()].into())
    }
}

impl PerNodeKeys {
    /// `kubernetes.io/hostname` plus `extra`.
    pub fn new<I, S>(extra: I) -> Self
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
    pub fn from_node<'a, I>(node_name: &str, hostname: Option<&str>, segments: I) -> Self
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
    pub fn from_cluster<'a, C, L>(driver: &str, csinodes: C, labels_of: L) -> Self
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
    pub fn contains(&self, key: &str) -> bool {
        self.0.contains(key)
    }

    /// The keys (for the Node metadata stripping in [`crate::node::scope`]).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

/// How to find the node a volume lives on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NodeQuery {
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
    pub fn node_name(&self) -> &str {
        match self {
            Self::ByName { name, .. } => name,
            Self::ByLabel { value, .. } => value,
        }
    }

    /// Label selector of the live LIST for [`NodeQuery::ByLabel`] (`None`: GET by name instead).
    pub fn label_selector(&self) -> Option<String> {
        match self {
            Self::ByName { .. } => None,
            Self::ByLabel { key, value } => Some(format!("{key}={value}")),
        }
    }

    /// Looks the node up in a synced Node cache (metadata is enough: readiness is never read).
    pub fn lookup_in<'a, I>(&self, nodes: I) -> NodeLookup
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
pub enum NodeLookup {
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
    pub fn from_get<K: kube::Resource>(result: &Result<Option<K>, kube::Error>) -> Self {
        match result {
            Ok(Some(node)) => Self::Found {
                uid: node.meta().uid.clone(),
            },
            Ok(None) => Self::NotFound,
            Err(e) if classify_api_error(e) == ApiErrorClass::NotFound => Self::NotFound,
            Err(e) => Self::Failed {
                reason: format!("{} error: {e}", classify_api_error(e)),
            },
        }
    }

    /// Maps a live label-selected LIST (`Api::list_metadata` items) for [`NodeQuery::ByLabel`]: an
    /// empty list is absence, an error never is.
    pub fn from_list<K: kube::Resource>(result: &Result<Vec<K>, kube::Error>) -> Self {
        match result {
            Ok(items) => match items.first() {
                Some(node) => Self::Found {
                    uid: node.meta().uid.clone(),
                },
                None => Self::NotFound,
            },
            Err(e) => Self::Failed {
                reason: format!("{} error: {e}", classify_api_error(e)),
            },
        }
    }
}

/// What a node affinity says about where a volume lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pin {
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
pub fn pin_of(
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

/// The annotations recording the provisioning node on a new PV ([`names::ANN_NODE_NAME`],
/// [`names::ANN_NODE_UID`]). Node mode: our own Node; controller mode: the selected Node when it is
/// in the cache. They serve the node-name-reuse check and PVs without node affinity.
pub fn provisioning_node_annotations(
    node_name: &str,
    node_uid: Option<&str>,
) -> Vec<(&'static str, String)> {
    let mut out = vec![(names::ANN_NODE_NAME, node_name.to_owned())];
    if let Some(uid) = node_uid.filter(|u| !u.is_empty()) {
        out.push((names::ANN_NODE_UID, uid.to_owned()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{node, pv};
    use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
    use kube::core::Status;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Status::failure("boom", "").with_code(code).boxed())
    }

    #[test]
    fn an_empty_label_list_is_absence_and_a_failed_list_is_not() {
        let found: Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> =
            Ok(vec![node("n1").build()]);
        assert!(matches!(
            NodeLookup::from_list(&found),
            NodeLookup::Found { .. }
        ));
        let empty: Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> = Ok(vec![]);
        assert_eq!(NodeLookup::from_list(&empty), NodeLookup::NotFound);
        let failed: Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> =
            Err(api_error(503));
        assert!(matches!(
            NodeLookup::from_list(&failed),
            NodeLookup::Failed { .. }
        ));
    }

    #[test]
    fn driver_topology_keys_count_as_per_node_only_when_their_value_names_the_node() {
        let segments: std::collections::BTreeMap<String, String> = [
            ("topology.hostpath.csi/node".to_owned(), "n1".to_owned()),
            ("topology.kubernetes.io/zone".to_owned(), "z1".to_owned()),
        ]
        .into();
        let keys = PerNodeKeys::from_node("n1", Some("n1.example"), &segments);
        assert!(keys.contains("topology.hostpath.csi/node"));
        assert!(keys.contains(HOSTNAME_LABEL));
        assert!(!keys.contains("topology.kubernetes.io/zone"));

        let by_topology = pv("pv-1")
            .node_affinity([
                ("topology.hostpath.csi/node", "n7"),
                ("topology.kubernetes.io/zone", "z1"),
            ])
            .build();
        let affinity = by_topology.spec.as_ref().unwrap().node_affinity.as_ref();
        assert_eq!(
            pin_of(affinity, &keys, None),
            Pin::Node(NodeQuery::ByLabel {
                key: "topology.hostpath.csi/node".into(),
                value: "n7".into()
            })
        );
        assert_eq!(pin_of(affinity, &PerNodeKeys::default(), None), Pin::Spread);
    }

    #[test]
    fn controller_mode_takes_a_driver_key_as_per_node_only_if_every_node_agrees() {
        use crate::testing::csinode;
        let csinodes = [
            csinode("n1")
                .driver("d", "n1", ["topo/node", "topo/zone"])
                .build(),
            csinode("n2")
                .driver("d", "n2", ["topo/node", "topo/zone"])
                .driver("other", "n2", ["other/key"])
                .build(),
        ];
        let labels: BTreeMap<String, BTreeMap<String, String>> = [
            (
                "n1".to_owned(),
                [
                    ("topo/node", "n1"),
                    ("topo/zone", "z1"),
                    ("other/key", "n1"),
                ]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
            ),
            (
                "n2".to_owned(),
                [
                    ("topo/node", "host-2"),
                    ("topo/zone", "n2"),
                    (HOSTNAME_LABEL, "host-2"),
                    ("other/key", "n2"),
                ]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
            ),
        ]
        .into();
        let keys = PerNodeKeys::from_cluster("d", &csinodes, |n| labels.get(n));
        assert!(keys.contains("topo/node"), "name on n1, host name on n2");
        assert!(!keys.contains("topo/zone"), "shared on n1 rules it out");
        assert!(!keys.contains("other/key"), "another driver's key");
        assert!(keys.contains(HOSTNAME_LABEL));
    }

    #[test]
    fn affinities_with_several_nodes_or_match_fields_pin_accordingly() {
        let keys = PerNodeKeys::default();
        let two = pv("pv")
            .node_affinity([(HOSTNAME_LABEL, "a")])
            .node_affinity([(HOSTNAME_LABEL, "b")])
            .build();
        assert_eq!(
            pin_of(
                two.spec.as_ref().unwrap().node_affinity.as_ref(),
                &keys,
                None
            ),
            Pin::Spread
        );
        let same = pv("pv")
            .node_affinity([(HOSTNAME_LABEL, "a")])
            .node_affinity([(HOSTNAME_LABEL, "a"), ("zone", "z")])
            .build();
        assert!(matches!(
            pin_of(
                same.spec.as_ref().unwrap().node_affinity.as_ref(),
                &keys,
                None
            ),
            Pin::Node(_)
        ));
        let fields = VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec!["n3".into()]),
                    }]),
                }],
            }),
        };
        assert_eq!(
            pin_of(Some(&fields), &keys, None),
            Pin::Node(NodeQuery::ByName {
                name: "n3".into(),
                uid: None
            })
        );
        let multi_value = pv("pv").build();
        assert_eq!(
            pin_of(
                multi_value.spec.as_ref().unwrap().node_affinity.as_ref(),
                &keys,
                None
            ),
            Pin::NoAffinity
        );
    }

    #[test]
    fn provisioning_annotations_record_name_and_uid() {
        assert_eq!(
            provisioning_node_annotations("n1", Some("u1")),
            vec![
                ("csi-provisioner.rs/node-name", "n1".to_owned()),
                ("csi-provisioner.rs/node-uid", "u1".to_owned())
            ]
        );
        assert_eq!(provisioning_node_annotations("n1", Some("")).len(), 1);
    }
}
