//! Node mode: the intent ledgers of nodes gone for good, whose instances never resolve them. The
//! clean-up instance (rank 0) waits out the grace period plus one fallback delay, confirms the
//! Node's absence with a live GET, deletes the ledger as listed and logs its volumes as gone (see
//! docs/intent-ledger.md).
//! Cost: one label-selected LIST of Leases when this instance becomes the clean-up instance, when
//! a node leaves the cache, while a gone node's ledger waits, and every [`SWEEP_INTERVAL`]; none
//! otherwise, so an idle cluster sees no requests.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::{Api, Client};
use tracing::{debug, info, warn};

use crate::model::locate::NodeLookup;
use crate::model::meta::annotation;
use crate::names::{LEDGER_ENTRIES_ANNOTATION, LEDGER_NODE_ANNOTATION, LEDGER_NODE_LABEL};
use crate::node_mode::scope::SWEEP_INTERVAL;
use crate::retry::describe;

/// What the log names of a gone node's ledger entry (the full entry is `intents::ledger`'s,
/// which this concern does not depend on: the provisioning controller uses its grace rule).
#[derive(Debug, serde::Deserialize)]
struct Logged {
    volume: String,
    namespace: String,
    claim: String,
}

/// One ledger Lease as listed.
#[derive(Debug)]
struct Shard {
    name: String,
    /// Deleted with this resourceVersion as precondition, so a shard its node's instance wrote
    /// meanwhile (the node is back) is kept.
    version: String,
    /// Its entries at that version: logged once that version is deleted.
    entries: Vec<Logged>,
}

/// A node's ledger Leases as last listed.
#[derive(Debug)]
struct Shards {
    leases: Vec<Shard>,
    /// When the node was first seen missing.
    missing_since: Instant,
}

/// What the clean-up remembers between passes.
#[derive(Debug, Default)]
pub(crate) struct GoneLedgers {
    /// Nodes with a ledger and no Node object, by node name.
    waiting: BTreeMap<String, Shards>,
    /// The nodes in the cache at the last list.
    nodes_at_list: BTreeSet<String>,
    /// When the last list was made (`None`: not since this instance took the role).
    listed_at: Option<Instant>,
    /// The ledgers' namespace.
    namespace: String,
}

impl GoneLedgers {
    /// Nothing known yet about the ledgers in `namespace`.
    pub(crate) fn new(namespace: String) -> Self {
        Self {
            namespace,
            ..Self::default()
        }
    }

    /// This instance no longer does the clean-up: forget everything (a successor starts over).
    pub(crate) fn stand_down(&mut self) {
        *self = Self::new(std::mem::take(&mut self.namespace));
    }

    /// Whether to list the ledgers now: first pass in the role, a node left the cache, a gone
    /// node's grace period may be over, or the periodic sweep.
    fn list_due(&self, nodes: &BTreeSet<String>, now: Instant, grace: Duration) -> bool {
        self.listed_at.is_none_or(|at| {
            !self.nodes_at_list.is_subset(nodes)
                || now.duration_since(at) >= SWEEP_INTERVAL
                || self
                    .waiting
                    .values()
                    .any(|s| now >= s.missing_since + grace)
        })
    }

    /// One pass; returns when the next is due (`None`: only on a change).
    pub(crate) async fn pass(
        &mut self,
        client: &Client,
        nodes: BTreeSet<String>,
        grace: Duration,
    ) -> Option<Instant> {
        let now = Instant::now();
        if self.list_due(&nodes, now, grace) {
            let api: Api<Lease> = Api::namespaced(client.clone(), &self.namespace);
            let params = ListParams::default().labels(LEDGER_NODE_LABEL);
            match api.list(&params).await {
                Ok(list) => {
                    self.remember(list.items, &nodes, now);
                    self.nodes_at_list = nodes;
                    self.listed_at = Some(now);
                }
                Err(e) => {
                    warn!(
                        namespace = self.namespace.as_str(),
                        "listing the intent ledgers of nodes failed, retrying: {}",
                        describe(&e)
                    );
                    return Some(now + grace.min(Duration::from_secs(30)));
                }
            }
        }
        let due: Vec<String> = self
            .waiting
            .iter()
            .filter(|(_, s)| now >= s.missing_since + grace)
            .map(|(node, _)| node.clone())
            .collect();
        for node in due {
            self.finish(client, &node).await;
        }
        self.waiting.values().map(|s| s.missing_since + grace).min()
    }

    /// Takes in the listed ledgers: those of nodes absent from the cache wait (keeping the time
    /// they were first seen missing), the others are forgotten.
    fn remember(&mut self, leases: Vec<Lease>, nodes: &BTreeSet<String>, now: Instant) {
        let mut waiting = BTreeMap::new();
        for lease in leases {
            let Some(node) = annotation(&lease.metadata, LEDGER_NODE_ANNOTATION).map(str::to_owned)
            else {
                continue;
            };
            if nodes.contains(&node) {
                continue;
            }
            // As far as the log needs them; an unreadable shard logs none.
            let entries: Vec<Logged> = annotation(&lease.metadata, LEDGER_ENTRIES_ANNOTATION)
                .and_then(|text| serde_json::from_str(text).ok())
                .unwrap_or_default();
            let meta = lease.metadata;
            let shards = waiting.entry(node).or_insert_with_key(|node| {
                let known = self.waiting.get(node);
                if known.is_none() {
                    info!(%node, "the intent ledger of a missing node waits for the grace period");
                }
                let missing_since = known.map_or(now, |s| s.missing_since);
                Shards {
                    leases: Vec::new(),
                    missing_since,
                }
            });
            shards.leases.push(Shard {
                name: meta.name.unwrap_or_default(),
                version: meta.resource_version.unwrap_or_default(),
                entries,
            });
        }
        self.waiting = waiting;
    }

    /// The grace period is over: a live GET must answer 404, then the ledger is deleted as listed
    /// and every entry of it logged (not when the delete answers 409: its node wrote it again).
    async fn finish(&mut self, client: &Client, node: &str) {
        let nodes: Api<Node> = Api::all(client.clone());
        match NodeLookup::from_get(&nodes.get_metadata_opt(node).await) {
            NodeLookup::NotFound => {}
            NodeLookup::Found { .. } => {
                debug!(%node, "the node of an intent ledger exists; its instance resolves it");
                self.waiting.remove(node);
                return;
            }
            NodeLookup::Failed { reason } => {
                warn!(%node, %reason, "could not confirm that the node of an intent ledger is gone (never counts as absence); asking again later");
                return;
            }
        }
        let Some(shards) = self.waiting.remove(node) else {
            return;
        };
        let api: Api<Lease> = Api::namespaced(client.clone(), &self.namespace);
        for shard in shards.leases {
            let params = DeleteParams::default().preconditions(Preconditions {
                resource_version: Some(shard.version),
                uid: None,
            });
            let name = shard.name;
            let outcome = api.delete(&name, &params).await;
            if matches!(&outcome, Err(kube::Error::Api(s)) if s.code == 409) {
                debug!(%node, lease = %name, "the intent ledger of a missing node was written again (the node is back): kept");
                continue;
            }
            // Named whatever else the answer: a delete applied whose answer was lost reads as an
            // error, and a second log line costs less than a volume never named.
            for entry in shard.entries {
                let claim = format!("{}/{}", entry.namespace, entry.claim);
                warn!(%node, %claim, volume = %entry.volume,
                    "node {node:?} no longer exists: the CreateVolume sent there for this claim is considered gone with the node, without DeleteVolume; check the node's storage if it comes back");
            }
            match outcome {
                Ok(_) => info!(%node, lease = %name, "intent ledger of a deleted node removed"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    warn!(%node, lease = %name, "could not remove the intent ledger of a deleted node (tried again by the next sweep): {}", describe(&e))
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "ledgers_tests.rs"]
mod tests;
