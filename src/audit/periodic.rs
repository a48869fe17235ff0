//! `--audit-interval`: the audit inside the running sidecar (the leader; in node mode every
//! instance for its node), exporting counts as gauges so that an alert fires on a leak. PVs and
//! claims come from the caches; each round costs one ListVolumes walk and one Lease LIST.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use super::{Listing, Observation, Report, Scope, collect, confirm, observe};
use crate::runtime::{Context, Shutdown};

/// Labels of `csi_provisioner_audit_findings`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FindingLabels {
    /// `leaked`, `unconfirmed`, `lost`, `stuck`, `missing_finalizer`, `unresolved_intent`.
    pub(crate) finding: String,
}

/// The audit's gauges.
#[derive(Clone, Default)]
pub(crate) struct AuditMetrics {
    findings: Family<FindingLabels, Gauge>,
    last_run: Gauge,
}

impl AuditMetrics {
    /// Registers the families in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "csi_provisioner_audit_findings",
            "Findings of the last periodic audit (--audit-interval), by kind: leaked (a volume with no PV), lost (a PV without its volume), stuck, missing_finalizer, unresolved_intent, unconfirmed.",
            m.findings.clone(),
        );
        registry.register(
            "csi_provisioner_audit_last_run_timestamp_seconds",
            "When the last periodic audit finished (unix seconds).",
            m.last_run.clone(),
        );
        m
    }

    /// Publishes `report`.
    pub(crate) fn publish(&self, report: &Report) {
        let counts = [
            ("leaked", report.leaked.len()),
            ("unconfirmed", report.unconfirmed.len()),
            ("lost", report.lost.len()),
            ("stuck", report.stuck.len()),
            ("missing_finalizer", report.missing_finalizer.len()),
            ("unresolved_intent", report.unresolved_intents.len()),
        ];
        for (finding, n) in counts {
            self.findings
                .get_or_create(&FindingLabels {
                    finding: finding.to_owned(),
                })
                .set(n as i64);
        }
        self.last_run.set(jiff::Timestamp::now().as_second());
    }
}

/// One observation from the caches (PVs and claims unpacked one at a time).
async fn observation(ctx: &Context, ledger: Option<&(String, String)>) -> Option<Observation> {
    let driver = ctx.driver.name.as_str();
    let listed_at = jiff::Timestamp::now();
    let listing: Listing =
        collect::list_volumes(ctx.csi.as_ref(), ctx.driver.controller.list_volumes, driver).await;
    let intents = match ledger {
        Some((namespace, base)) => {
            match collect::ledger_intents(&ctx.client, namespace, base).await {
                Ok(intents) => intents,
                Err(e) => {
                    warn!("periodic audit skipped: {e}");
                    return None;
                }
            }
        }
        None => Vec::new(),
    };
    let node = ctx
        .config
        .node_deployment
        .as_ref()
        .map(|n| n.node_name.as_str());
    let scope = Scope {
        driver,
        node,
        listed_at,
        now: jiff::Timestamp::now(),
        unused_for: Duration::ZERO,
        stuck_after: crate::metrics::STUCK_AFTER,
    };
    let pvs = ctx.stores.pvs.state();
    let claims = ctx.stores.pvcs.state();
    Some(observe(
        &scope,
        &listing,
        pvs.iter().map(|pv| pv.full()),
        claims.iter().map(|c| c.full()),
        &intents,
    ))
}

/// Audits every `every` until shutdown; each report confirms the previous round's observation.
pub(crate) async fn run(
    ctx: Arc<Context>,
    every: Duration,
    metrics: AuditMetrics,
    shutdown: Shutdown,
) {
    let ledger = ctx.config.node_deployment.is_none().then(|| {
        (
            crate::leader::ledger_namespace(&ctx.config),
            crate::leader::decide::lease_name(&ctx.driver.name),
        )
    });
    let mut previous: Option<Observation> = None;
    loop {
        if let Some(current) = observation(&ctx, ledger.as_ref()).await {
            let mut report = confirm(
                &ctx.driver.name,
                previous.as_ref().unwrap_or(&current),
                &current,
            );
            // The first round has nothing to confirm against: it publishes only what needs no
            // second look (stuck, unused), so a volume being created is never counted as leaked.
            if previous.is_none() {
                report.leaked.clear();
                report.unconfirmed.clear();
                report.lost.clear();
                report.missing_finalizer.clear();
                report.unresolved_intents.clear();
            }
            if !report.leaked.is_empty() || !report.lost.is_empty() {
                warn!(
                    leaked = ?report.leaked,
                    lost = ?report.lost.iter().map(|l| &l.pv).collect::<Vec<_>>(),
                    "periodic audit: volumes without a PV or PVs without a volume; run `csi-provisioner audit` for details"
                );
            } else {
                info!(pvs = report.pvs, volumes = ?report.volumes, "periodic audit: no leaked or lost volume");
            }
            metrics.publish(&report);
            previous = Some(current);
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.clone().requested() => return,
        }
    }
}
