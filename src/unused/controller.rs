//! The shell of unused-claim tracking: one Pod watch decoded as [`PodLite`] (in node mode only this
//! node's Pods), the claims from the sidecar's cache, one PATCH per transition, and the
//! `csi_provisioner_unused_claims` gauge counted at scrape.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::runtime::watcher;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{debug, info, warn};

use super::{PodLite, Transition, Usage, transition};
use crate::k8s::cache::Lean;
use crate::k8s::patch;
use crate::names;
use crate::runtime::{Context, Shutdown};

/// Labels of `csi_provisioner_unused_claims`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AgeLabels {
    /// `lt_1d`, `1d_7d`, `7d_30d`, `ge_30d`.
    pub(crate) age: String,
}

/// Unused-claim age buckets: (label, upper bound in days).
pub(crate) const BUCKETS: [(&str, u64); 4] = [
    ("lt_1d", 1),
    ("1d_7d", 7),
    ("7d_30d", 30),
    ("ge_30d", u64::MAX),
];

/// Claims per bucket of unused ages (in seconds).
pub(crate) fn buckets(ages: impl IntoIterator<Item = u64>) -> [(&'static str, i64); 4] {
    let mut counts = BUCKETS.map(|(label, _)| (label, 0));
    for age in ages {
        let days = age / 86_400;
        if let Some(i) = BUCKETS.iter().position(|(_, upper)| days < *upper) {
            counts[i].1 += 1;
        }
    }
    counts
}

/// `csi_provisioner_unused_claims{age}`.
#[derive(Clone, Default)]
pub(crate) struct UnusedGauge(Family<AgeLabels, Gauge>);

impl UnusedGauge {
    /// Registers the family in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let g = Self::default();
        registry.register(
            "csi_provisioner_unused_claims",
            "Claims of this driver no Pod uses, by how long (the --track-unused-claims annotation, or the Kubernetes Unused condition).",
            g.0.clone(),
        );
        g
    }

    /// Counts the cached claims of `driver` (one unpacked at a time).
    pub(crate) fn refresh(&self, claims: &[Arc<Lean<PersistentVolumeClaim>>], driver: &str) {
        let now = jiff::Timestamp::now();
        let ages = claims.iter().filter_map(|c| {
            let c = c.full();
            if !crate::model::claim::is_ours(&c, driver) {
                return None;
            }
            let (since, _) = crate::model::claim::unused_since(&c)?;
            Some(now.duration_since(since).as_secs().max(0) as u64)
        });
        for (label, n) in buckets(ages) {
            self.0
                .get_or_create(&AgeLabels {
                    age: label.to_owned(),
                })
                .set(n);
        }
    }
}

/// How often failed writes are tried again.
const RETRY_EVERY: Duration = Duration::from_secs(10);

/// Runs until shutdown. `claims`: the claim cache's change stream.
pub(crate) async fn run(
    ctx: Arc<Context>,
    claims: impl Stream<Item = Arc<Lean<PersistentVolumeClaim>>> + Send + 'static,
    shutdown: Shutdown,
) {
    let node = ctx
        .config
        .node_deployment
        .as_ref()
        .map(|n| n.node_name.clone());
    let mut config = watcher::Config::default();
    if let Some(node) = &node {
        config = config.fields(&format!("spec.nodeName={node}"));
    }
    let pods =
        crate::k8s::cache::watch_events(Api::<PodLite>::all(ctx.client.clone()), config, "pods");
    tokio::pin!(pods);
    let claims = claims.fuse();
    tokio::pin!(claims);
    let mut retry = tokio::time::interval(RETRY_EVERY);
    let mut usage = Usage::default();
    let mut listing: Vec<(String, Vec<String>)> = Vec::new();
    let mut synced = false;
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut failed: BTreeSet<String> = BTreeSet::new();
    let mut recent = Recent::default();
    let stop = shutdown.clone().requested();
    tokio::pin!(stop);
    // One write at a time, polled beside the streams: a write waits on the rate limiter (a first
    // pass over 10,000 claims takes half an hour at QPS 5), and the Pods and claims that change
    // meanwhile are taken in as they come.
    let mut writing: Option<BoxFuture<'static, (String, Option<bool>)>> = None;
    loop {
        if synced && writing.is_none() {
            while let Some(claim) = pending.pop_first() {
                if let Some((pvc, change)) =
                    decide(&ctx, &usage, &mut recent, &claim, node.as_deref())
                {
                    writing = Some(Box::pin(apply(ctx.clone(), claim, pvc, change)));
                    break;
                }
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            event = pods.next() => match event {
                Some(watcher::Event::Init) => listing.clear(),
                Some(watcher::Event::InitApply(pod)) => {
                    let claims = pod.claims();
                    if !claims.is_empty() {
                        listing.push((pod.key(), claims));
                    }
                }
                Some(watcher::Event::InitDone) => {
                    let flipped = usage.replace(std::mem::take(&mut listing));
                    if synced {
                        pending.extend(flipped);
                    } else {
                        synced = true;
                        info!(pods_using_claims = usage.pods(), "Pods listed; tracking unused claims");
                        pending.extend(ctx.stores.pvcs.state().iter().map(|c| {
                            c.key().to_owned()
                        }));
                    }
                }
                Some(watcher::Event::Apply(pod)) => pending.extend(usage.set(&pod.key(), pod.claims())),
                Some(watcher::Event::Delete(pod)) => pending.extend(usage.set(&pod.key(), Vec::new())),
                None => return,
            },
            Some(claim) = claims.next() => {
                pending.insert(claim.key().to_owned());
            }
            (claim, written) = async { writing.as_mut().expect("guarded").await }, if writing.is_some() => {
                writing = None;
                match written {
                    Some(set) => {
                        recent.0.insert(claim, (set, std::time::Instant::now()));
                    }
                    None => {
                        failed.insert(claim);
                    }
                }
            }
            _ = retry.tick() => pending.append(&mut failed),
        }
    }
}

/// How long a write of ours may be missing from the cache before the cache is believed again.
const CACHE_GRACE: Duration = Duration::from_secs(30);

/// The annotation state this process wrote last per claim, so a cache that has not caught up yet
/// does not cause the same write twice (with a later time).
#[derive(Default)]
struct Recent(std::collections::HashMap<String, (bool, std::time::Instant)>);

impl Recent {
    /// Whether the cache lags behind our last write for `claim` (`marked`: what the cache shows).
    fn lagging(&mut self, claim: &str, marked: bool) -> bool {
        let Some((wrote, at)) = self.0.get(claim).copied() else {
            return false;
        };
        if wrote == marked || at.elapsed() > CACHE_GRACE {
            self.0.remove(claim);
            return false;
        }
        true
    }
}

/// The write the claim `namespace/name` needs, if any, with the claim as cached.
fn decide(
    ctx: &Context,
    usage: &Usage,
    recent: &mut Recent,
    claim: &str,
    node: Option<&str>,
) -> Option<(PersistentVolumeClaim, Transition)> {
    let pvc = ctx.stores.pvcs.get(claim)?.full();
    // Node mode: this instance sees only its node's Pods, so it judges only its node's claims.
    if node.is_some() && crate::model::claim::selected_node(&pvc) != node {
        return None;
    }
    let marked = crate::model::meta::annotation(&pvc.metadata, names::ANN_UNUSED_SINCE).is_some();
    if recent.lagging(claim, marked) {
        return None;
    }
    let change = transition(
        &pvc,
        &ctx.driver.name,
        usage.is_used(claim),
        jiff::Timestamp::now(),
    )?;
    Some((pvc, change))
}

/// Writes `change` to the claim `namespace/name`: whether the annotation is set afterwards,
/// `None` when the write failed (retried later).
async fn apply(
    ctx: Arc<Context>,
    claim: String,
    pvc: PersistentVolumeClaim,
    change: Transition,
) -> (String, Option<bool>) {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(
        ctx.client.clone(),
        pvc.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let written = match &change {
        Transition::Unused(since) => {
            patch::set_annotation(&api, &pvc, names::ANN_UNUSED_SINCE, since).await
        }
        Transition::Used => {
            patch::patch_fresh(&api, &pvc, "clear unused-since", |m| {
                patch::remove_annotation_step(m, names::ANN_UNUSED_SINCE)
            })
            .await
        }
    };
    match written {
        Ok(_) => {
            debug!(claim, ?change, "unused-claim annotation written");
            let set = matches!(change, Transition::Unused(_));
            (claim, Some(set))
        }
        Err(e) => {
            warn!(
                claim,
                "writing {} failed, retrying: {e}",
                names::ANN_UNUSED_SINCE
            );
            (claim, None)
        }
    }
}
