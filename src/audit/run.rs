//! `csi-provisioner audit`: connects as the sidecar does, observes twice `--min-age` apart,
//! prints the report, and with `--delete-orphans --confirm` deletes the leaked volumes.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::{Api, Client};

use super::args::{AuditArgs, split};
use super::{Listing, Observation, Report, Scope, collect, confirm, observe};
use crate::cli::Args;
use crate::config::Config;
use crate::csi::{self, ConnectOptions, CsiController, Endpoint, GrpcCsi, HandshakeOptions};

/// Runs the subcommand; `argv` is everything after `audit`.
pub async fn main(argv: Vec<OsString>) -> ExitCode {
    let (audit, sidecar) = split(argv);
    let audit = AuditArgs::try_parse_from(audit).unwrap_or_else(|e| e.exit());
    let args = Args::try_parse_go_style(
        std::iter::once(OsString::from(crate::cli::PROGRAM)).chain(sidecar),
    )
    .unwrap_or_else(|e| e.exit());
    let namespace = Some(args.leader_election_namespace.clone()).filter(|ns| !ns.is_empty());
    let config = match Config::from_args(args, |name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Logs go to stderr, the report to stdout: `-o json | jq` works.
    if let Err(e) = crate::telemetry::init(&config.logging) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    match audit_once(&config, &audit, namespace).await {
        Ok(report) => {
            print!("{}", super::render::render(&report, audit.output));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Sources {
    client: Client,
    csi: Arc<dyn CsiController>,
    driver: String,
    can_list: bool,
    ledger: (String, String),
    node: Option<String>,
}

async fn audit_once(
    config: &Config,
    audit: &AuditArgs,
    namespace: Option<String>,
) -> anyhow::Result<Report> {
    let client = crate::k8s::client::build_clients(&config.kube)
        .await
        .context("building the Kubernetes client")?
        .workers;
    let (_stop, never) = tokio::sync::watch::channel(false);
    let endpoint = Endpoint::parse(&config.csi.address)?;
    let channel = csi::connect(endpoint, ConnectOptions::new(never.clone())).await?;
    let mut handshake = HandshakeOptions::new(config.csi.timeout, never);
    handshake.node_deployment = config.node_deployment.is_some();
    let driver = csi::handshake(channel.clone(), handshake).await?;
    let sources = Sources {
        client,
        csi: Arc::new(GrpcCsi::new(
            channel,
            config.csi.timeout,
            csi::OperationMetrics::new(),
        )),
        can_list: driver.controller.list_volumes,
        ledger: (
            namespace.unwrap_or_else(|| crate::leader::ledger_namespace(config)),
            crate::leader::decide::lease_name(&driver.name),
        ),
        node: config.node_deployment.as_ref().map(|n| n.node_name.clone()),
        driver: driver.name,
    };
    let first = observation(&sources, audit).await?;
    let second = if audit.min_age.is_zero() {
        first.clone()
    } else {
        tracing::info!(
            "first observation done; observing again in {:?} (--min-age) before reporting",
            audit.min_age
        );
        tokio::time::sleep(audit.min_age).await;
        observation(&sources, audit).await?
    };
    let mut report = confirm(&sources.driver, &first, &second);
    let stuck: Vec<String> = report.stuck.iter().map(|s| s.pv.clone()).collect();
    let warnings = collect::last_warnings(&sources.client, &stuck).await;
    for s in &mut report.stuck {
        s.last_warning = warnings.get(&s.pv).cloned();
    }
    if audit.delete_orphans {
        report.deleted =
            collect::delete_orphans(sources.csi.as_ref(), &report.leaked, audit.confirm).await;
    }
    Ok(report)
}

/// One observation: the volumes first, then the ledger, then PVs and claims, so that a volume the
/// driver listed is either still under its intent or has its PV in the later lists.
async fn observation(sources: &Sources, audit: &AuditArgs) -> anyhow::Result<Observation> {
    let listed_at = jiff::Timestamp::now();
    let listing: Listing =
        collect::list_volumes(sources.csi.as_ref(), sources.can_list, &sources.driver).await;
    let ledger = collect::ledger_intents(&sources.client, &sources.ledger.0, &sources.ledger.1)
        .await
        .map_err(anyhow::Error::msg)?;
    let pvs = collect::list_all(&Api::<PersistentVolume>::all(sources.client.clone()))
        .await
        .map_err(anyhow::Error::msg)?;
    let claims = collect::list_all(&Api::<PersistentVolumeClaim>::all(sources.client.clone()))
        .await
        .map_err(anyhow::Error::msg)?;
    let scope = Scope {
        driver: &sources.driver,
        node: sources.node.as_deref(),
        listed_at,
        now: jiff::Timestamp::now(),
        unused_for: audit.unused_for,
        stuck_after: audit.stuck_after,
    };
    Ok(observe(&scope, &listing, &pvs, &claims, &ledger))
}
