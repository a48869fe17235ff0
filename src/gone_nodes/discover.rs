//! Where the dead-node clean-up finds PVs in node-deployment mode, where each instance watches
//! only its own node's PVs: label-selected lists of the PVs of missing nodes
//! ([`scope::node_pv_selector`]). A node is suspect when it vanished from (or was replaced in) the
//! Node cache since the last pass, or when a metadata-only sweep of the driver's PVs
//! ([`scope::driver_pv_selector`], nothing kept) finds PVs recorded on a node that is not there;
//! the sweep also labels our PVs written without our labels that no instance labelled (see
//! `node_mode::labeller`: those of nodes without an instance, or missed while it was down). A suspect
//! is listed at every pass until none of its PVs has a missing node.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use super::tracker::{Verdict, judge};
use crate::model::locate::{HOSTNAME_LABEL, Mode, NodeLookup, NodeQuery, PerNodeKeys};
use crate::model::meta::label;
use crate::names;
use crate::node_mode::scope;
use crate::retry::describe;
use crate::runtime::Context;

/// Each Node: name -> (UID, its [`scope::node_label_values`]).
type KnownNodes = HashMap<String, (Option<String>, BTreeSet<String>)>;

/// Node mode: what the label-selected lists need to remember between passes.
#[derive(Default)]
pub(crate) struct Lists {
    /// [`names::LABEL_PV_NODE`] values of missing nodes whose PVs are listed each pass (never
    /// [`names::LABEL_VALUE_ANY_NODE`]: that would list every unpinned PV).
    suspects: BTreeSet<String>,
    /// PVs of no single node whose recorded node is missing (found by the sweep), read one by one.
    suspect_pvs: BTreeSet<String>,
    /// Each Node at the last pass: name -> (UID, its label values).
    known: Option<KnownNodes>,
    /// When the next metadata sweep is due (`None`: at the next ranked pass).
    next_sweep: Option<Instant>,
}

/// What one pass over the suspects found still missing (to keep listing it).
#[derive(Default)]
pub(crate) struct StillMissing {
    values: BTreeSet<String>,
    pvs: BTreeSet<String>,
}

impl StillMissing {
    /// Notes `pv` if its node is missing from the cache.
    pub(crate) fn note(&mut self, pv: &PersistentVolume, keys: &PerNodeKeys, view: &NodeView<'_>) {
        if node_missing(pv, keys, view) {
            self.add(&pv.metadata);
        }
    }

    /// Adds a PV whose node is missing: by its node label value, by name when of no single node.
    fn add(&mut self, meta: &ObjectMeta) {
        match label(meta, names::LABEL_PV_NODE) {
            Some(v) if v != names::LABEL_VALUE_ANY_NODE => {
                self.values.insert(v.to_owned());
            }
            _ => self.pvs.extend(meta.name.clone()),
        }
    }
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
            (None, None) => self
                .nodes
                .iter()
                .any(|n| label(&n.metadata, HOSTNAME_LABEL) == Some(name)),
        }
    }
}

/// Whether the node `pv` lives on is missing from the cache (gone, or replaced by a Node of the
/// same name with another UID), whatever the PV's phase. `false` for PVs of no single node.
fn node_missing(pv: &PersistentVolume, keys: &PerNodeKeys, view: &NodeView<'_>) -> bool {
    let Ok(query) = crate::model::locate::node_query(pv, Mode::Node, keys) else {
        return false;
    };
    matches!(judge(&query, &view.lookup(&query)), Verdict::Absent(_))
}

impl Lists {
    /// Records the current Nodes; label values of Nodes gone (or replaced) since the last call
    /// become suspects.
    pub(crate) fn remember_nodes(&mut self, nodes: &[Arc<Node>], keys: &PerNodeKeys) {
        let current: KnownNodes = nodes
            .iter()
            .filter_map(|n| {
                let meta = &n.metadata;
                let values = scope::node_label_values(meta, keys);
                Some((meta.name.clone()?, (meta.uid.clone(), values)))
            })
            .collect();
        if let Some(known) = &self.known {
            self.suspects.extend(vanished(known, &current));
        }
        self.known = Some(current);
    }

    /// This instance stopped running the clean-up: forget the suspects, sweep again when it
    /// takes over.
    pub(crate) fn stand_down(&mut self) {
        self.suspects.clear();
        self.suspect_pvs.clear();
        self.next_sweep = None;
    }

    /// Runs the metadata sweep when it is due (first ranked pass, then every
    /// [`scope::SWEEP_INTERVAL`]).
    pub(crate) async fn sweep_if_due(
        &mut self,
        ctx: &Context,
        view: &NodeView<'_>,
        keys: &PerNodeKeys,
        now: Instant,
    ) {
        if self.next_sweep.is_some_and(|due| due > now) {
            return;
        }
        match sweep(ctx, view, keys).await {
            Ok(found) => {
                self.suspects.extend(found.values);
                self.suspect_pvs.extend(found.pvs);
                self.next_sweep = Some(now + scope::SWEEP_INTERVAL);
            }
            Err(e) => {
                warn!(error = %describe(&e), "sweeping the driver's PVs for deleted nodes failed; retrying at the next pass");
                self.next_sweep = Some(now);
            }
        }
    }

    /// The label selector of the suspect nodes' PVs, if there are any.
    pub(crate) fn selector(&self, driver: &str) -> Option<String> {
        (!self.suspects.is_empty())
            .then(|| scope::node_pv_selector(driver, self.suspects.iter().map(String::as_str)))
    }

    /// The suspect PVs of no single node, read one by one.
    pub(crate) fn suspect_pvs(&self) -> Vec<String> {
        self.suspect_pvs.iter().cloned().collect()
    }

    /// After a complete pass: keep listing only what still has a missing node (all answered, or
    /// the node is back: stop).
    pub(crate) fn keep(&mut self, still: StillMissing) {
        self.suspects.retain(|s| still.values.contains(s));
        self.suspect_pvs = still.pvs;
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

/// A paginated LIST of the objects matching a label selector, [`scope::PAGE_SIZE`] at a time
/// (memory stays at one page).
pub(crate) struct Pages(Option<ListParams>);

impl Pages {
    pub(crate) fn new(selector: &str) -> Self {
        Self(Some(
            ListParams::default()
                .labels(selector)
                .limit(scope::PAGE_SIZE),
        ))
    }

    /// The parameters of the next page; `None` once the last one was read.
    pub(crate) fn params(&self) -> Option<&ListParams> {
        self.0.as_ref()
    }

    /// Moves past the page that came with `meta`.
    pub(crate) fn advance(&mut self, meta: &ListMeta) {
        let token = meta.continue_.as_deref().filter(|c| !c.is_empty());
        self.0 = self.0.take().zip(token).map(|(p, t)| p.continue_token(t));
    }
}

/// The metadata sweep: the label values (and, for PVs of no single node, the names) of PVs whose
/// node is missing, from a paginated metadata-only list of the driver's PVs (nothing else is kept);
/// also labels our PVs that lack our labels.
async fn sweep(
    ctx: &Context,
    view: &NodeView<'_>,
    keys: &PerNodeKeys,
) -> Result<StillMissing, kube::Error> {
    label_unlabelled(ctx, keys).await?;
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let mut suspects = StillMissing::default();
    let mut pages = Pages::new(&scope::driver_pv_selector(&ctx.driver.name));
    let mut listed = 0usize;
    while let Some(params) = pages.params() {
        let page = api.list_metadata(params).await?;
        pages.advance(&page.metadata);
        listed += page.items.len();
        for meta in page.items.iter().map(|p| &p.metadata) {
            if scope::sweep_suspect(meta, |name, uid| view.present(name, uid)) {
                suspects.add(meta);
            }
        }
    }
    debug!(
        listed,
        suspect_nodes = suspects.values.len(),
        suspect_pvs = suspects.pvs.len(),
        "swept the driver's PVs for deleted nodes"
    );
    Ok(suspects)
}

/// Labels our driver's PVs that carry no [`names::LABEL_PV_DRIVER`], so node-mode instances see
/// them in their scoped watches. Each instance's `node_mode::labeller` labels them as they come;
/// the sweep catches the rest: PVs of nodes without an instance, or whose labeller was down or
/// failed to patch.
async fn label_unlabelled(ctx: &Context, keys: &PerNodeKeys) -> Result<usize, kube::Error> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let mut pages = Pages::new(&scope::unlabelled_pv_selector());
    let mut labelled = 0;
    while let Some(params) = pages.params() {
        let page = api.list(params).await?;
        pages.advance(&page.metadata);
        for pv in &page.items {
            let Some(labels) = scope::existing_pv_labels(pv, &ctx.driver.name, keys) else {
                continue;
            };
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
    }
    if labelled > 0 {
        info!(
            labelled,
            "labelled PVs of the driver written without our labels"
        );
    }
    Ok(labelled)
}

/// An order-independent fingerprint of the Nodes (names and UIDs) and of the CSINodes that list
/// `driver`: any node coming, going or being replaced changes it.
pub(crate) fn fingerprint(
    nodes: &[Arc<Node>],
    csinodes: &[Arc<k8s_openapi::api::storage::v1::CSINode>],
    driver: &str,
) -> u64 {
    let nodes: BTreeSet<_> = nodes
        .iter()
        .map(|n| (&n.metadata.name, &n.metadata.uid))
        .collect();
    let live = crate::model::topology::live_instances(csinodes.iter().map(AsRef::as_ref), driver);
    let mut hasher = DefaultHasher::new();
    (nodes, live).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
#[path = "discover_tests.rs"]
mod tests;
