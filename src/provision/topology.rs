//! Topology of a claim to provision: the CreateVolume accessibility requirements (reference §7.2,
//! upstream's table) and the StatefulSet spreading of preferred terms (§7.3); the per-claim pinned
//! requirement (§7.4) is `provision::controller`'s (`ClaimMemory`). The facts it builds on (terms,
//! `allowedTopologies`, the PV node affinity built from the driver's accessible topology (§7.5) and
//! its matching in node mode) are `model::topology`'s; the zone labels of the in-tree plugins are `migration::topology`'s.
//!
//! | node selected | strict | allowedTopologies | immediate | requisite | preferred |
//! |---|---|---|---|---|---|
//! | yes | yes | any | any | `[node term]` (must be inside allowedTopologies when set) | = requisite |
//! | yes | no | no | any | aggregated cluster terms | rotated to the first term ⊆ node term |
//! | yes | no | yes | any | flatten(allowedTopologies) | rotated likewise |
//! | no | – | yes | any | flatten(allowedTopologies) | StatefulSet-hash rotation |
//! | no | – | no | true | aggregated cluster terms | StatefulSet-hash rotation |
//! | no | – | no | false | none (field unset) | – |
//!
//! Cluster state is read through [`TopologyView`] (reflector stores in production, a
//! [`StaticTopology`] in tests and in node mode, where upstream also uses fixed objects). Retries
//! must send an identical request even if nodes change meanwhile: the shell keeps the computed
//! requirement per claim (`ClaimMemory`) while CreateVolume may still be in progress (upstream's
//! per-PVC cache).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, TopologySelectorTerm};
use k8s_openapi::api::storage::v1::CSINode;

use crate::csi::v1::{Topology, TopologyRequirement};
use crate::gofmt;
use crate::model::topology::{Term, driver_topology_keys, flatten, sort_and_dedupe, terms_fmt};

/// Read access to the cluster's nodes. `Vec<Arc<_>>` matches `reflector::Store::state()`.
pub(crate) trait TopologyView {
    /// The CSINode of `name`, if it exists.
    fn csinode(&self, name: &str) -> Option<Arc<CSINode>>;
    /// The Node of `name`, if it exists.
    fn node(&self, name: &str) -> Option<Arc<Node>>;
    /// Every CSINode (immediate binding takes topology keys from the first one listing the driver
    /// with keys, in this order).
    fn csinodes(&self) -> Vec<Arc<CSINode>>;
    /// Every Node.
    fn nodes(&self) -> Vec<Arc<Node>>;
}

/// A fixed set of objects: tests, and node mode (upstream gives its topology code a fake CSINode
/// and Node built from NodeGetInfo).
#[derive(Debug, Clone, Default)]
pub(crate) struct StaticTopology {
    /// CSINodes, in the order [`TopologyView::csinodes`] returns them.
    pub(crate) csinodes: Vec<Arc<CSINode>>,
    /// Nodes.
    pub(crate) nodes: Vec<Arc<Node>>,
}

impl StaticTopology {
    /// Node mode's view: a CSINode `node_name` registering `driver` with the keys of `segments`,
    /// and a Node of that name labelled with `segments`.
    pub(crate) fn single_node(
        node_name: &str,
        driver: &str,
        node_id: &str,
        segments: &HashMap<String, String>,
    ) -> Self {
        use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let mut keys: Vec<String> = segments.keys().cloned().collect();
        keys.sort();
        let meta = ObjectMeta {
            name: Some(node_name.to_owned()),
            ..ObjectMeta::default()
        };
        let csinode = CSINode {
            metadata: meta.clone(),
            spec: CSINodeSpec {
                drivers: vec![CSINodeDriver {
                    name: driver.to_owned(),
                    node_id: node_id.to_owned(),
                    topology_keys: Some(keys),
                    allocatable: None,
                }],
            },
        };
        let node = Node {
            metadata: ObjectMeta {
                labels: Some(segments.clone().into_iter().collect()),
                ..meta
            },
            ..Node::default()
        };
        StaticTopology {
            csinodes: vec![Arc::new(csinode)],
            nodes: vec![Arc::new(node)],
        }
    }
}

impl TopologyView for StaticTopology {
    fn csinode(&self, name: &str) -> Option<Arc<CSINode>> {
        self.csinodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .cloned()
    }
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .cloned()
    }
    fn csinodes(&self) -> Vec<Arc<CSINode>> {
        self.csinodes.clone()
    }
    fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.clone()
    }
}

/// Why no accessibility requirement could be built. `Display` is upstream's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TopologyError {
    /// The selected node has no CSINode object (node deleted, or the kubelet never registered):
    /// upstream answers with a reschedule, i.e. clears the selected node.
    #[error(
        "failed to get selected CSINode {node}: csinode.storage.k8s.io {} not found",
        gofmt::quote(.node)
    )]
    SelectedCsiNodeNotFound {
        /// Selected node name.
        node: String,
    },
    /// The selected node's CSINode lists no topology keys for the driver.
    #[error("no topology key found for node {node}")]
    NoTopologyKeys {
        /// Selected node name.
        node: String,
        /// Whether the driver is registered on the node at all (without keys) or missing.
        driver_registered: bool,
    },
    /// The selected Node lacks a label for one of the CSINode topology keys (or is gone).
    #[error(
        "topology labels from selected node {} does not match topology keys from CSINode {}",
        gofmt::map(.labels.as_ref()),
        gofmt::list(.keys)
    )]
    NodeLabelsMismatch {
        /// Selected node name.
        node: String,
        /// The Node's labels, `None` when the Node object does not exist.
        labels: Option<BTreeMap<String, String>>,
        /// The CSINode topology keys.
        keys: Vec<String>,
    },
    /// Strict topology: the selected node is outside allowedTopologies.
    #[error(
        "selected node '{}' topology '{}' is not in allowed topologies: {}",
        gofmt::quote(.node),
        .node_term,
        terms_fmt(.allowed)
    )]
    NotInAllowedTopologies {
        /// Selected node name.
        node: String,
        /// The node's term.
        node_term: Term,
        /// Flattened allowedTopologies.
        allowed: Vec<Term>,
    },
    /// The selected node's term is not in the requisite (allowedTopologies exclude the node).
    #[error(
        "topology {} from selected node {} is not in requisite: {}",
        .node_term,
        gofmt::quote(.node),
        terms_fmt(.requisite)
    )]
    NotInRequisite {
        /// Selected node name.
        node: String,
        /// The node's term.
        node_term: Term,
        /// The requisite terms.
        requisite: Vec<Term>,
    },
    /// Immediate binding: no CSINode lists topology keys for the driver yet.
    #[error("no available topology found")]
    NoAvailableTopology,
    /// No Node carries all topology keys.
    #[error("topologyKeys {} were not found on any nodes", gofmt::list(.keys))]
    KeysNotOnAnyNode {
        /// The keys looked for.
        keys: Vec<String>,
    },
}

impl TopologyError {
    /// Whether upstream answers this with a reschedule (clear the selected node) rather than a
    /// retry of the same request.
    pub(crate) fn is_reschedule(&self) -> bool {
        matches!(self, TopologyError::SelectedCsiNodeNotFound { .. })
    }
}

/// Inputs of [`generate_accessibility_requirements`] besides the cluster view.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TopologyParams<'a> {
    /// Our driver name (CSINode driver entries are matched on it).
    pub(crate) driver: &'a str,
    /// Claim name (StatefulSet spreading hashes it).
    pub(crate) claim_name: &'a str,
    /// The StorageClass allowedTopologies.
    pub(crate) allowed_topologies: &'a [TopologySelectorTerm],
    /// The selected node, when the claim has one.
    pub(crate) selected_node: Option<&'a str>,
    /// `--strict-topology`.
    pub(crate) strict: bool,
    /// `--immediate-topology`.
    pub(crate) immediate: bool,
}

/// The requisite and preferred terms; `None` when no requirement is sent.
pub(crate) type RequirementTerms = Option<(Vec<Term>, Vec<Term>)>;

/// The CreateVolume `accessibility_requirements`; `Ok(None)` leaves the field unset.
pub(crate) fn generate_accessibility_requirements(
    params: &TopologyParams<'_>,
    view: &dyn TopologyView,
) -> Result<Option<TopologyRequirement>, TopologyError> {
    Ok(
        requirement_terms(params, view)?.map(|(requisite, preferred)| {
            let to_csi = |terms: &[Term]| -> Vec<Topology> {
                terms
                    .iter()
                    .filter(|t| !t.0.is_empty())
                    .map(Term::to_csi)
                    .collect()
            };
            TopologyRequirement {
                requisite: to_csi(&requisite),
                preferred: to_csi(&preferred),
            }
        }),
    )
}

/// [`generate_accessibility_requirements`] as terms (for tests and logs).
pub(crate) fn requirement_terms(
    params: &TopologyParams<'_>,
    view: &dyn TopologyView,
) -> Result<RequirementTerms, TopologyError> {
    let mut selected: Option<(&str, Vec<String>, Term)> = None;
    let mut requisite: Vec<Term> = Vec::new();

    if let Some(node) = params.selected_node {
        let csinode = view
            .csinode(node)
            .ok_or_else(|| TopologyError::SelectedCsiNodeNotFound {
                node: node.to_owned(),
            })?;
        let keys = driver_topology_keys(&csinode, params.driver);
        let keys: Vec<String> = match keys {
            Some(keys) if !keys.is_empty() => keys.to_vec(),
            other => {
                return Err(TopologyError::NoTopologyKeys {
                    node: node.to_owned(),
                    driver_registered: other.is_some(),
                });
            }
        };
        let labels = view
            .node(node)
            .map(|n| n.metadata.labels.clone().unwrap_or_default());
        let node_term = labels
            .as_ref()
            .and_then(|labels| term_from_labels(labels, &keys))
            .ok_or_else(|| TopologyError::NodeLabelsMismatch {
                node: node.to_owned(),
                labels: labels.clone(),
                keys: keys.clone(),
            })?;
        if params.strict {
            if !params.allowed_topologies.is_empty() {
                let allowed = flatten(params.allowed_topologies);
                if !allowed.iter().any(|t| t.is_subset_of(&node_term)) {
                    return Err(TopologyError::NotInAllowedTopologies {
                        node: node.to_owned(),
                        node_term,
                        allowed,
                    });
                }
            }
            requisite.push(node_term.clone());
        }
        selected = Some((node, keys, node_term));
    }

    if requisite.is_empty() {
        if !params.allowed_topologies.is_empty() {
            requisite = flatten(params.allowed_topologies);
        } else {
            if selected.is_none() && !params.immediate {
                return Ok(None);
            }
            let keys = match &selected {
                Some((_, keys, _)) => keys.clone(),
                None => match first_registered_keys(view, params.driver) {
                    Some(keys) => keys,
                    None => return Err(TopologyError::NoAvailableTopology),
                },
            };
            requisite = aggregate(view, &keys)?;
        }
    }
    // allowedTopologies made only of empty expressions: behave as without topology.
    if requisite.is_empty() {
        return Ok(None);
    }
    sort_and_dedupe(&mut requisite);

    let preferred = match &selected {
        None => {
            let (hash, index) = claim_name_hash_and_index(params.claim_name);
            // `requisite` is non-empty here, and its length fits u32 in any real cluster.
            let len = u32::try_from(requisite.len()).unwrap_or(u32::MAX);
            let shift = hash.wrapping_add(index) % len;
            rotate(&requisite, shift as usize)
        }
        Some(_) if params.strict => requisite.clone(),
        Some((node, _, node_term)) => {
            match requisite.iter().position(|t| t.is_subset_of(node_term)) {
                Some(i) => rotate(&requisite, i),
                None => {
                    return Err(TopologyError::NotInRequisite {
                        node: (*node).to_owned(),
                        node_term: node_term.clone(),
                        requisite,
                    });
                }
            }
        }
    };
    Ok(Some((requisite, preferred)))
}

fn rotate(terms: &[Term], i: usize) -> Vec<Term> {
    terms[i..].iter().chain(&terms[..i]).cloned().collect()
}

/// The term of a node: the values of `keys` in its labels; `None` when a key is missing.
fn term_from_labels(labels: &BTreeMap<String, String>, keys: &[String]) -> Option<Term> {
    keys.iter()
        .map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
        .collect::<Option<Vec<_>>>()
        .map(Term::new)
}

fn first_registered_keys(view: &dyn TopologyView, driver: &str) -> Option<Vec<String>> {
    view.csinodes().iter().find_map(|csinode| {
        driver_topology_keys(csinode, driver)
            .filter(|keys| !keys.is_empty())
            .map(<[String]>::to_vec)
    })
}

/// One term per Node carrying all `keys`.
fn aggregate(view: &dyn TopologyView, keys: &[String]) -> Result<Vec<Term>, TopologyError> {
    let terms: Vec<Term> = view
        .nodes()
        .iter()
        .filter_map(|node| term_from_labels(node.metadata.labels.as_ref()?, keys))
        .collect();
    if terms.is_empty() {
        return Err(TopologyError::KeysNotOnAnyNode {
            keys: keys.to_vec(),
        });
    }
    Ok(terms)
}

/// 32-bit FNV-1 (multiply, then xor; not FNV-1a), as Go's `fnv.New32`.
pub(crate) fn fnv1_32(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5_u32, |hash, b| {
        hash.wrapping_mul(0x0100_0193) ^ u32::from(*b)
    })
}

/// The StatefulSet spreading inputs of a claim name (upstream `getPVCNameHashAndIndexOffset`):
/// for `claim-set-3` the hash of `set` and index 3; otherwise the hash of the whole name and 0.
/// Upstream uses a random hash for an empty name; we use 0 (claims always have names).
pub(crate) fn claim_name_hash_and_index(name: &str) -> (u32, u32) {
    if name.is_empty() {
        return (0, 0);
    }
    let mut hashed = name;
    let mut index = 0;
    if let Some(last_dash) = name.rfind('-') {
        let suffix = &name[last_dash + 1..];
        if let Some(id) = parse_go_uint32(suffix) {
            index = id;
            hashed = &name[..last_dash];
            if let Some(dash) = hashed.rfind('-') {
                hashed = &hashed[dash + 1..];
            }
        }
    }
    (fnv1_32(hashed.as_bytes()), index)
}

/// Go `strconv.ParseUint(s, 10, 32)`: decimal digits only, fitting u32.
fn parse_go_uint32(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "topology_props_tests.rs"]
mod props_tests;
