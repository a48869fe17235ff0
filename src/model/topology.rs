//! Topology facts shared by every concern, where volumes may live and where our driver runs:
//! terms (the AND of `key=value` segments) and their ordering, `allowedTopologies` flattening,
//! PV node affinity (built from the driver's accessible topology, and matched against a node's
//! segments in node mode), and what CSINodes say: the topology keys a driver registered, which
//! drivers run on a node, the nodes that run ours, and (in both modes) the claim whose selected
//! node runs no instance of ours, to be rescheduled (upstream issue 544).

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::fmt;

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaim,
    TopologySelectorTerm, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::CSINode;

use crate::csi::v1::Topology;
use crate::model::claim::selected_node;
use crate::names;

/// One topology term: the AND of `key=value` segments, kept sorted by key then value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Term(pub(crate) Vec<(String, String)>);

impl Term {
    /// A term from segments (sorted on construction).
    pub(crate) fn new<K: Into<String>, V: Into<String>>(
        segments: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        let mut v: Vec<(String, String)> = segments
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        v.sort();
        Term(v)
    }

    /// Upstream's ordering: shorter terms first, then by key, then by value.
    pub(crate) fn compare(&self, other: &Term) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.cmp(&other.0))
    }

    /// Whether every segment of `self` appears in `other` (both sorted), with upstream's
    /// single-pass walk: a segment of `other` with a matching key but another value is a miss.
    pub(crate) fn is_subset_of(&self, other: &Term) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let mut j = 0;
        for (key, value) in &other.0 {
            let (want_key, want_value) = &self.0[j];
            if want_key != key {
                continue;
            }
            if want_value != value {
                return false;
            }
            j += 1;
            if j == self.0.len() {
                return true;
            }
        }
        false
    }

    /// The term as a CSI topology.
    pub(crate) fn to_csi(&self) -> Topology {
        Topology {
            segments: self.0.iter().cloned().collect(),
        }
    }

    /// The term of a CSI topology.
    pub(crate) fn from_csi(topology: &Topology) -> Term {
        Term::new(
            topology
                .segments
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        )
    }
}

/// Go `%v` of upstream's term type: `[{key value} {key2 value2}]`.
impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let segments: Vec<String> = self.0.iter().map(|(k, v)| format!("{{{k} {v}}}")).collect();
        write!(f, "[{}]", segments.join(" "))
    }
}

/// Go `%v` of a list of terms.
pub(crate) fn terms_fmt(terms: &[Term]) -> String {
    let parts: Vec<String> = terms.iter().map(Term::to_string).collect();
    format!("[{}]", parts.join(" "))
}

/// Expands allowedTopologies into terms: each selector term (an OR) becomes the cartesian
/// product of its expressions' values (an AND of ORs); the results are concatenated.
pub(crate) fn flatten(allowed: &[TopologySelectorTerm]) -> Vec<Term> {
    let mut out = Vec::new();
    for selector in allowed {
        let mut acc: Vec<Vec<(String, String)>> = Vec::new();
        for expr in selector.match_label_expressions.iter().flatten() {
            let mut next = Vec::new();
            for value in &expr.values {
                let segment = (expr.key.clone(), value.clone());
                // Upstream restarts from scratch after an expression with no values; kept as is.
                if acc.is_empty() {
                    next.push(vec![segment]);
                } else {
                    for old in &acc {
                        let mut term = old.clone();
                        term.push(segment.clone());
                        next.push(term);
                    }
                }
            }
            acc = next;
        }
        out.extend(acc.into_iter().map(Term::new));
    }
    out
}

/// Sorts with [`Term::compare`] and drops duplicates.
pub(crate) fn sort_and_dedupe(terms: &mut Vec<Term>) {
    terms.sort_by(Term::compare);
    terms.dedup();
}

/// The topology keys `driver` registered on `csinode`: `None` when the driver is not on that
/// node at all, `Some(empty)` when it registered without topology.
pub(crate) fn driver_topology_keys<'a>(csinode: &'a CSINode, driver: &str) -> Option<&'a [String]> {
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .map(|d| d.topology_keys.as_deref().unwrap_or_default())
}

/// The PV node affinity for the driver's `accessible_topology`: one required term per topology
/// with segments, one `key In [value]` expression per segment, sorted by key (upstream's order is
/// random). `None` when no topology has segments (an empty term list would be rejected by the
/// API server).
pub(crate) fn volume_node_affinity(accessible_topology: &[Topology]) -> Option<VolumeNodeAffinity> {
    let terms: Vec<NodeSelectorTerm> = accessible_topology
        .iter()
        .filter(|t| !t.segments.is_empty())
        .map(|t| NodeSelectorTerm {
            match_expressions: Some(
                Term::from_csi(t)
                    .0
                    .into_iter()
                    .map(|(key, value)| NodeSelectorRequirement {
                        key,
                        operator: "In".to_owned(),
                        values: Some(vec![value]),
                    })
                    .collect(),
            ),
            match_fields: None,
        })
        .collect();
    if terms.is_empty() {
        return None;
    }
    Some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    })
}

/// A node selector requirement that cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid node selector requirement {key} {operator}: {reason}")]
pub(crate) struct AffinityError {
    /// Requirement key.
    pub(crate) key: String,
    /// Requirement operator.
    pub(crate) operator: String,
    /// What is wrong with it.
    pub(crate) reason: &'static str,
}

/// Whether a PV with `affinity` is accessible from a node whose topology is `node_segments`
/// (node mode: the segments from NodeGetInfo). No affinity, no required selector or no node
/// topology means accessible, as upstream. Terms are ORed, expressions ANDed; a term without
/// expressions and fields matches nothing. Errors only when no term matched and one was invalid.
pub(crate) fn volume_is_accessible(
    affinity: Option<&VolumeNodeAffinity>,
    node_segments: Option<&HashMap<String, String>>,
) -> Result<bool, AffinityError> {
    let (Some(segments), Some(required)) =
        (node_segments, affinity.and_then(|a| a.required.as_ref()))
    else {
        return Ok(true);
    };
    let mut first_error = None;
    for term in &required.node_selector_terms {
        match term_matches(term, segments) {
            Ok(true) => return Ok(true),
            Ok(false) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(false), Err)
}

fn term_matches(
    term: &NodeSelectorTerm,
    labels: &HashMap<String, String>,
) -> Result<bool, AffinityError> {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return Ok(false);
    }
    let mut all = true;
    for expr in exprs {
        all &= requirement_matches(expr, labels.get(&expr.key).map(String::as_str))?;
    }
    for field in fields {
        if field.key != "metadata.name" {
            return Err(bad(field, "only metadata.name is supported in matchFields"));
        }
        if field.values.as_ref().map_or(0, Vec::len) != 1 {
            return Err(bad(field, "matchFields needs exactly one value"));
        }
        // The node of node mode is known only by its topology, not by name.
        all &= requirement_matches(field, Some(""))?;
    }
    Ok(all)
}

fn bad(req: &NodeSelectorRequirement, reason: &'static str) -> AffinityError {
    AffinityError {
        key: req.key.clone(),
        operator: req.operator.clone(),
        reason,
    }
}

fn requirement_matches(
    req: &NodeSelectorRequirement,
    value: Option<&str>,
) -> Result<bool, AffinityError> {
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" | "NotIn" => {
            if values.is_empty() {
                return Err(bad(req, "values must not be empty for In and NotIn"));
            }
            let found = value.is_some_and(|v| values.iter().any(|x| x == v));
            Ok(if req.operator == "In" { found } else { !found })
        }
        "Exists" | "DoesNotExist" => {
            if !values.is_empty() {
                return Err(bad(req, "values must be empty for Exists and DoesNotExist"));
            }
            Ok(value.is_some() == (req.operator == "Exists"))
        }
        "Gt" | "Lt" => {
            let [bound] = values else {
                return Err(bad(req, "Gt and Lt need exactly one value"));
            };
            let bound: i64 = bound
                .parse()
                .map_err(|_| bad(req, "Gt and Lt need an integer value"))?;
            let Some(actual) = value.and_then(|v| v.parse::<i64>().ok()) else {
                return Ok(false);
            };
            Ok(if req.operator == "Gt" {
                actual > bound
            } else {
                actual < bound
            })
        }
        _ => Err(bad(req, "unknown operator")),
    }
}

/// Whether a class's `allowedTopologies` admit a node with these segments: the outcome of upstream
/// running `GenerateAccessibilityRequirements` against its own node, where some flattened allowed
/// term must be a subset of the node's term. Flattening is upstream's, quirks included
/// ([`flatten`]); when it yields no term at all there is no requirement and every node
/// is admitted.
pub(crate) fn allowed_topologies_admit(
    allowed: &[TopologySelectorTerm],
    segments: &HashMap<String, String>,
) -> bool {
    let terms = flatten(allowed);
    let node_term = Term::new(segments.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    terms.is_empty() || terms.iter().any(|t| t.is_subset_of(&node_term))
}

/// Whether a CSINode lists `driver` (an instance of our driver runs on that node).
pub(crate) fn csinode_lists_driver(csinode: &CSINode, driver: &str) -> bool {
    csinode.spec.drivers.iter().any(|d| d.name == driver)
}

/// The names of the nodes whose CSINode lists `driver`, sorted and without duplicates: the
/// instances of a node-deployment DaemonSet that are alive.
pub(crate) fn live_instances<'a, I>(csinodes: I, driver: &str) -> Vec<String>
where
    I: IntoIterator<Item = &'a CSINode>,
{
    let set: BTreeSet<String> = csinodes
        .into_iter()
        .filter(|c| csinode_lists_driver(c, driver))
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    set.into_iter().collect()
}

/// Whether a node runs an instance of our driver, as its CSINode says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum CsiNodeLookup {
    /// Not looked up, cache not synced, or the lookup failed: never clear on this.
    #[default]
    Unknown,
    /// The CSINode lists our driver.
    HasDriver,
    /// The CSINode exists but does not list our driver.
    LacksDriver,
    /// No CSINode object for that node.
    NotFound,
}

impl CsiNodeLookup {
    /// Classifies a CSINode from a synced cache or a live GET (`None` = absent / 404).
    pub(crate) fn of(csinode: Option<&CSINode>, driver: &str) -> Self {
        match csinode {
            None => Self::NotFound,
            Some(c) if csinode_lists_driver(c, driver) => Self::HasDriver,
            Some(_) => Self::LacksDriver,
        }
    }
}

/// The decision to clear a claim's selected node, with its event and patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClearSelectedNode {
    /// The selected node being cleared.
    pub(crate) node: String,
    /// Warning event reason on the PVC: upstream's `ProvisioningFailed` where upstream
    /// reschedules too, else [`names::EVENT_SELECTED_NODE_CLEARED`].
    pub(crate) reason: &'static str,
    /// Event message: which node and why.
    pub(crate) message: String,
}

/// In either mode: a claim whose selected node has no instance of `driver` gets its selected node
/// cleared so the scheduler picks again (upstream issue 544). `None` when a node is not selected,
/// the node runs our driver, or nothing is known ([`CsiNodeLookup::Unknown`]).
///
/// The shell removes the annotation only while it still names that node
/// ([`crate::k8s::patch::remove_annotation_if_step`]) and records the Warning event on the PVC.
pub(crate) fn selected_node_check(
    pvc: &PersistentVolumeClaim,
    driver: &str,
    lookup: CsiNodeLookup,
) -> Option<ClearSelectedNode> {
    let node = selected_node(pvc)?;
    let why = match lookup {
        CsiNodeLookup::Unknown | CsiNodeLookup::HasDriver => return None,
        // Upstream reschedules this one too, with its own words: the same event here.
        CsiNodeLookup::NotFound => {
            return Some(ClearSelectedNode {
                node: node.to_owned(),
                reason: names::EVENT_PROVISIONING_FAILED,
                message: format!(
                    "failed to get selected CSINode {node}: csinode.storage.k8s.io {} not found",
                    crate::gofmt::quote(node)
                ),
            });
        }
        // Upstream never reschedules this one (the claim waits for ever, its issue 544).
        CsiNodeLookup::LacksDriver => "the node's CSINode does not list the driver",
    };
    Some(ClearSelectedNode {
        node: node.to_owned(),
        reason: names::EVENT_SELECTED_NODE_CLEARED,
        message: format!(
            "selected node {node:?} has no instance of driver {driver:?} ({why}); removed the {} \
             annotation so that the scheduler picks another node",
            names::ANN_SELECTED_NODE
        ),
    })
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
