//! `kube-sim` binary: serves the simulator on loopback and writes a kubeconfig for it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use kube_sim::{Sim, SimConfig};

const AFTER_HELP: &str = "\
Point kubectl at it:  kubectl --kubeconfig PATH get pv
Default namespaces: default, kube-system, kube-public, kube-node-lease.

Admin routes (JSON; not counted, never paused):
  GET    /sim/counters          requests by verb, resource and code (byAgent: per User-Agent)
  POST   /sim/counters/reset    zero the counters
  GET    /sim/faults            list fault rules with their hit counts
  POST   /sim/faults            add a rule, answers {\"id\": N}; body fields (all optional):
           verb (get|list|watch|create|update|patch|delete|deletecollection),
           resource (plural, e.g. persistentvolumes or persistentvolumes/status),
           name, status (e.g. 500, 503, 429, 409), latencyMs, retryAfterSeconds,
           rate (0..1), count (stop after N hits), message
  DELETE /sim/faults            remove all rules
  DELETE /sim/faults/{id}       remove one rule
  POST   /sim/drop-watches      end all open watch streams
  POST   /sim/compact           forget watch history (resuming older watches gets 410 Gone)
  POST   /sim/pause             hold all API requests, watch delivery and controllers
  POST   /sim/resume            release them
  GET    /sim/dump              every stored object, the resourceVersion, open watches
Logs: RUST_LOG (default info; debug logs every request).";

/// A Kubernetes API server simulator (core storage resources, watch, controllers) for tests and demos.
#[derive(Parser, Debug)]
#[command(name = "kube-sim", version, after_help = AFTER_HELP)]
struct Args {
    /// Address to listen on; port 0 picks a free port (the kubeconfig names it).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write a kubeconfig for this server to PATH (JSON, readable by kubectl and kube-rs).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Do not run the control loops (PV binder, pv/pvc-protection, namespace deletion,
    /// selected-node, pods going Running).
    #[arg(long)]
    no_controllers: bool,
    /// Do not add kubernetes.io/pv-protection and pvc-protection finalizers on create.
    #[arg(long)]
    no_protection_finalizers: bool,
    /// Refuse streaming lists (sendInitialEvents) with 422, as Kubernetes 1.33 does by default.
    #[arg(long)]
    no_watch_list: bool,
    /// Watch events kept per resource for resuming; older resumes get 410 Gone.
    #[arg(long, default_value_t = 10_000)]
    history_window: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let cfg = SimConfig {
        controllers: !args.no_controllers,
        protection_finalizers: !args.no_protection_finalizers,
        history_window: args.history_window,
        watch_list: !args.no_watch_list,
        ..SimConfig::default()
    };
    let sim = Sim::start_on(args.listen, cfg).await?;
    if let Some(path) = &args.kubeconfig {
        sim.write_kubeconfig(path).map_err(|e| {
            anyhow::anyhow!(
                "cannot write kubeconfig {}: {e}; check the directory exists and is writable",
                path.display()
            )
        })?;
        tracing::info!(path = %path.display(), "kubeconfig written");
    }
    println!("kube-sim listening on {}", sim.url());
    wait_for_signal().await?;
    tracing::info!("shutting down");
    sim.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}
