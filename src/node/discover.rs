//! Where the dead-node clean-up finds PVs in node-deployment mode, where each instance watches
//! only its own node's PVs: label-selected lists of the PVs of missing nodes
//! ([`scope::node_pv_selector`]). A node is suspect when it vanished from (or was replaced in) the
//! Node cache since the last pass, or when a metadata-only sweep of the driver's PVs
//! ([`scope::driver_pv_selector`], nothing kept) finds PVs recorded on a node that is not there;
//! the sweep also labels our PVs written without our labels (upstream, older versions). A suspect
//! is listed at every pass until none of its PVs has a missing node.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use super::gone;
use super::locate::{HOSTNAME_LABEL, Mode, NodeLookup, NodeQuery, PerNodeKeys};
use super::scope;
use crate::app::Context;
use crate::names;

/// Each Node: name -> (UID, its [`scope::node_label_values`]).
type KnownNodes = HashMap<String, (Option<String>, BTreeSet<String>)>;

/// Node mode: what the label-selected lists need to remember between passes.
#[derive(Default)]
pub(crate) struct Lists {
    /// [`names::LABEL_PV_NODE`] values of missing nodes whose PVs are listed each pass.
    pub(crate) suspects: BTreeSet<String>,
    /// Each Node at the last pass: name -> (UID, its label values).
    known: Option<KnownNodes>,
    /// When the next metadata sweep is due (`None`: at the next ranked pass).
    pub(crate) next_sweep: Option<Instant>,
}

/// The Node cache as the lookups read it.
pub(crate) struct NodeView<'a> {
    nodes: &'a [Arc<Node>],
    by_name: HashMap<&'a str, &'a Node>,
}

impl<'a> NodeView<'a> {
    pub(crate) fn new(nodes: &'a [Arc<Node>]) -> Self {
        let by_name = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n.as_ref())))
            .collect();
        Self { nodes, by_name }
    }

    pub(crate) fn lookup(&self, query: &NodeQuery) -> NodeLookup {
        match query {
            NodeQuery::ByName { name, .. } => match self.by_name.get(name.as_str()) {
                Some(node) => NodeLookup::Found {
                    uid: node.metadata.uid.clone(),
                },
                None => NodeLookup::NotFound,
            },
            NodeQuery::ByLabel { .. } => query.lookup_in(self.nodes.iter().map(|n| &n.metadata)),
        }
    }

    /// Whether a Node named (or host-named) `name` exists, with `uid` when given.
    pub(crate) fn present(&self, name: &str, uid: Option<&str>) -> bool {
        match (self.by_name.get(name), uid) {
            (Some(node), Some(uid)) => node.metadata.uid.as_deref() == Some(uid),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => self.nodes.iter().any(|n| {
                n.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(HOSTNAME_LABEL))
                    .map(String::as_str)
                    == Some(name)
            }),
        }
    }
}

/// Whether the node `pv` lives on is missing from the cache (gone, or replaced by a Node of the
/// same name with another UID), whatever the PV's phase. `false` for PVs of no single node.
fn node_missing(pv: &PersistentVolume, keys: &PerNodeKeys, view: &NodeView<'_>) -> bool {
    let Ok(query) = gone::node_query(pv, Mode::Node, keys) else {
        return false;
    };
    match (&query, view.lookup(&query)) {
        (_, NodeLookup::NotFound) => true,
        (
            NodeQuery::ByName {
                uid: Some(recorded),
                ..
            },
            NodeLookup::Found { uid: Some(current) },
        ) => *recorded != current,
        _ => false,
    }
}

impl Lists {
    /// Records the current Nodes; label values of Nodes gone (or replaced) since the last call
    /// become suspects.
    pub(crate) fn remember_nodes(&mut self, nodes: &[Arc<Node>], keys: &PerNodeKeys) {
        let current: KnownNodes = nodes
            .iter()
            .filter_map(|n| {
                let name = n.metadata.name.clone()?;
                Some((
                    name,
                    (
                        n.metadata.uid.clone(),
                        scope::node_label_values(&n.metadata, keys),
                    ),
                ))
            })
            .collect();
        if let Some(known) = &self.known {
            self.suspects.extend(vanished(known, &current));
        }
        self.known = Some(current);
    }

    /// The PVs of the suspect nodes (after a metadata sweep when one is due); `None` when a list
    /// failed.
    pub(crate) async fn collect(
        &mut self,
        ctx: &Context,
        view: &NodeView<'_>,
        keys: &PerNodeKeys,
        now: Instant,
    ) -> Option<Vec<Arc<PersistentVolume>>> {
        if self.next_sweep.is_none_or(|due| due <= now) {
            match sweep(ctx, view, keys).await {
                Ok(found) => {
                    self.suspects.extend(found);
                    self.next_sweep = Some(now + scope::SWEEP_INTERVAL);
                }
                Err(e) => {
                    warn!(error = %e, "sweeping the driver's PVs for deleted nodes failed; retrying at the next pass");
                    self.next_sweep = Some(now);
                }
            }
        }
        if self.suspects.is_empty() {
            return Some(Vec::new());
        }
        let selector =
            scope::node_pv_selector(&ctx.driver.name, self.suspects.iter().map(String::as_str));
        let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
        match list_all(&api, &selector).await {
            Ok(pvs) => Some(pvs.into_iter().map(Arc::new).collect()),
            Err(e) => {
                warn!(error = %e, %selector, "listing the PVs of deleted nodes failed; retrying at the next pass");
                None
            }
        }
    }

    /// Stops listing a suspect once none of its PVs has a missing node (all answered, or the node
    /// is back).
    pub(crate) fn prune(
        &mut self,
        pvs: &[Arc<PersistentVolume>],
        keys: &PerNodeKeys,
        view: &NodeView<'_>,
    ) {
        let still: BTreeSet<&str> = pvs
            .iter()
            .filter(|pv| node_missing(pv, keys, view))
            .filter_map(|pv| {
                pv.metadata
                    .labels
                    .as_ref()?
                    .get(names::LABEL_PV_NODE)
                    .map(String::as_str)
            })
            .collect();
        self.suspects.retain(|s| still.contains(s.as_str()));
    }
}

/// Label values of Nodes in `before` that are not in `after` with the same UID.
fn vanished(before: &KnownNodes, after: &KnownNodes) -> BTreeSet<String> {
    before
        .iter()
        .filter(|(name, (uid, _))| after.get(*name).is_none_or(|(now, _)| now != uid))
        .flat_map(|(_, (_, values))| values.iter().cloned())
        .collect()
}

/// Lists every PV matching `selector`, page by page (full objects: they are few, the PVs of
/// missing nodes).
async fn list_all(
    api: &Api<PersistentVolume>,
    selector: &str,
) -> Result<Vec<PersistentVolume>, kube::Error> {
    let mut out = Vec::new();
    let mut params = ListParams::default()
        .labels(selector)
        .limit(scope::PAGE_SIZE);
    loop {
        let page = api.list(&params).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// The metadata sweep: label values of PVs whose node is missing, from a paginated metadata-only
/// list of the driver's PVs (nothing is kept); also labels our PVs that lack our labels.
async fn sweep(
    ctx: &Context,
    view: &NodeView<'_>,
    keys: &PerNodeKeys,
) -> Result<BTreeSet<String>, kube::Error> {
    label_unlabelled(ctx, keys, None).await?;
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let mut suspects = BTreeSet::new();
    let mut params = ListParams::default()
        .labels(&scope::driver_pv_selector(&ctx.driver.name))
        .limit(scope::PAGE_SIZE);
    let mut listed = 0usize;
    loop {
        let page = api.list_metadata(&params).await?;
        listed += page.items.len();
        for meta in page.items.iter().map(|p| &p.metadata) {
            if scope::sweep_suspect(meta, |name, uid| view.present(name, uid))
                && let Some(value) = meta
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(names::LABEL_PV_NODE))
            {
                suspects.insert(value.clone());
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    debug!(
        listed,
        suspects = suspects.len(),
        "swept the driver's PVs for deleted nodes"
    );
    Ok(suspects)
}

/// Labels our driver's PVs that carry no [`names::LABEL_PV_DRIVER`] (written by upstream or an
/// older version), so node-mode instances see them in their scoped watches. With `only`, just the
/// PVs whose node label would be one of these values: each instance labels its own node's PVs at
/// start-up (no herd of identical patches), the clean-up instances label the rest in their sweeps.
pub async fn label_unlabelled(
    ctx: &Context,
    keys: &PerNodeKeys,
    only: Option<&BTreeSet<String>>,
) -> Result<usize, kube::Error> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let mut params = ListParams::default()
        .labels(&scope::unlabelled_pv_selector())
        .limit(scope::PAGE_SIZE);
    let mut labelled = 0;
    loop {
        let page = api.list(&params).await?;
        for pv in &page.items {
            let Some(labels) = scope::existing_pv_labels(pv, &ctx.driver.name, keys) else {
                continue;
            };
            let node = labels.get(names::LABEL_PV_NODE);
            if only.is_some_and(|values| node.is_none_or(|n| !values.contains(n))) {
                continue;
            }
            let name = pv.name_any();
            match api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&scope::label_patch(&labels)),
                )
                .await
            {
                Ok(_) => labelled += 1,
                // Deleted meanwhile: nothing to label.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    if labelled > 0 {
        info!(
            labelled,
            "labelled PVs of the driver written without our labels"
        );
    }
    Ok(labelled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{node, pv};

    fn known(entries: &[(&str, &str, &[&str])]) -> KnownNodes {
        entries
            .iter()
            .map(|(name, uid, values)| {
                (
                    (*name).to_owned(),
                    (
                        Some((*uid).to_owned()),
                        values.iter().map(|v| (*v).to_owned()).collect(),
                    ),
                )
            })
            .collect()
    }

    #[test]
    fn vanished_and_replaced_nodes_make_their_label_values_suspect() {
        let before = known(&[
            ("a", "u1", &["a", "host-a"]),
            ("b", "u2", &["b"]),
            ("c", "u3", &["c"]),
        ]);
        let after = known(&[("b", "u2", &["b"]), ("c", "u4", &["c"])]);
        let gone: Vec<String> = vanished(&before, &after).into_iter().collect();
        assert_eq!(gone, vec!["a", "c", "host-a"]);
        assert!(vanished(&after, &after).is_empty());
    }

    #[test]
    fn a_node_is_missing_when_absent_or_replaced_and_present_by_name_or_host_name() {
        let nodes = vec![
            Arc::new(node("n1").build()),
            Arc::new(node("n2").labels([(HOSTNAME_LABEL, "host-2")]).build()),
        ];
        let view = NodeView::new(&nodes);
        let keys = PerNodeKeys::default();
        let recorded = |name: &str, uid: &str| {
            pv("p")
                .node_affinity([(HOSTNAME_LABEL, name)])
                .annotation(names::ANN_NODE_NAME, name)
                .annotation(names::ANN_NODE_UID, uid)
                .build()
        };
        assert!(!node_missing(&recorded("n1", "uid-n1"), &keys, &view));
        assert!(
            node_missing(&recorded("n1", "uid-old"), &keys, &view),
            "replaced"
        );
        assert!(
            node_missing(&recorded("n3", "uid-n3"), &keys, &view),
            "gone"
        );
        let legacy = pv("p").node_affinity([(HOSTNAME_LABEL, "host-2")]).build();
        assert!(!node_missing(&legacy, &keys, &view));
        let shared = pv("p").build();
        assert!(!node_missing(&shared, &keys, &view), "no single node");

        assert!(view.present("n1", Some("uid-n1")));
        assert!(!view.present("n1", Some("uid-old")));
        assert!(view.present("host-2", None));
        assert!(!view.present("n3", None));
    }
}
