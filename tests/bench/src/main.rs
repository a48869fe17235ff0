//! Benchmark: starts kube-sim, the mock CSI driver and provisioner binaries as separate processes,
//! runs the burst, restart, node, capacity and other scenarios against each binary, and writes
//! `report.md` and `report.json`. Exits 1 when a volume leaked, was created twice, or a claim
//! never bound (correctness, never timings); 2 when it could not run at all.

mod cluster;
mod procs;
mod report;
mod scenarios;
mod wait;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};

use report::{Binary, Report, Scenario};
use scenarios::{Bin, CapacityParams, Env, Qps};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ScenarioName {
    Burst,
    Restart,
    Node,
    /// Claims restored at once from one VolumeSnapshot (`--claims` sizes).
    Restore,
    /// Burst under CSI migration: claims of an in-tree `kubernetes.io/portworx-volume` class
    /// handed to a driver named `pxd.portworx.com` (`--claims` sizes).
    Migrated,
    /// Ours only: the cost of --track-unused-claims with `--pods` Pods (the first binary, with
    /// and without the flag).
    Unused,
    /// Storage capacity (`--enable-capacity`, default flags): `--nodes` nodes, `--classes`
    /// classes, `--churn-per-min` changes, a node added at `--add-node-at`, for `--duration`.
    Capacity,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum QpsName {
    /// --kube-api-qps 5 --kube-api-burst 10 (both sidecars' defaults)
    Default,
    /// --kube-api-qps 1000 --kube-api-burst 2000
    Raised,
}

/// Benchmark one or two csi-provisioner binaries side by side on kube-sim and the mock CSI driver.
#[derive(Debug, Parser)]
#[command(
    name = "bench",
    after_help = "\
Build first: cargo build --release --workspace. Then e.g.
  cargo run -p bench --release -- --scenario burst --qps default --claims 200 \\
      --provisioner-bin ours=target/release/csi-provisioner --provisioner-bin upstream=/path/to/csi-provisioner
A provisioner counts as ready when a log line contains one of the --ready-log strings."
)]
struct Args {
    /// Provisioner binary to measure, as PATH or LABEL=PATH; give it twice to compare two
    /// (the report's ratio is first / second). Default: csi-provisioner next to this binary.
    #[arg(long = "provisioner-bin", value_name = "[LABEL=]PATH")]
    provisioner_bins: Vec<String>,
    /// A second binary to compare with (same as a second --provisioner-bin).
    #[arg(long, value_name = "[LABEL=]PATH")]
    baseline_bin: Option<String>,
    /// Scenarios to run (comma-separated or repeated).
    #[arg(long = "scenario", value_enum, value_delimiter = ',', default_values = ["burst", "restart", "node"])]
    scenarios: Vec<ScenarioName>,
    /// QPS settings to run each scenario at.
    #[arg(long = "qps", value_enum, value_delimiter = ',', default_values = ["default", "raised"])]
    qps: Vec<QpsName>,
    /// Burst: claims created at once; several sizes comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1000usize])]
    claims: Vec<usize>,
    /// Restart: bound claims with PVs when the provisioner restarts.
    #[arg(long, default_value_t = 10_000)]
    restart_claims: usize,
    /// Node mode: nodes, each with a driver and a --node-deployment provisioner. Capacity:
    /// nodes, one mock driver standing for all of them.
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    /// Capacity: WaitForFirstConsumer StorageClasses of the driver.
    #[arg(long, default_value_t = 2)]
    classes: usize,
    /// Capacity: capacity changes a minute, each on a random node (a volume created on it or
    /// deleted from it directly on the driver).
    #[arg(long, default_value_t = 0)]
    churn_per_min: u32,
    /// Capacity: length of the run from the sidecar's start, e.g. 30m.
    #[arg(long, default_value = "5m", value_parser = scenarios::parse_duration)]
    duration: Duration,
    /// Capacity: when a node is added, from the sidecar's start (default: half the duration;
    /// at or past the duration: none).
    #[arg(long, value_parser = scenarios::parse_duration)]
    add_node_at: Option<Duration>,
    /// Capacity: --capacity-poll-interval of the sidecar (Go syntax).
    #[arg(long, default_value = "1m")]
    poll_interval: String,
    /// Capacity: create every object before the sidecar starts, as a previous instance of the
    /// same Deployment left them (current values, same owner): the run starts in steady state.
    #[arg(long)]
    seed_objects: bool,
    /// Capacity: seconds between two samples (queue depth, objects, RSS, writes).
    #[arg(long, default_value_t = 2.0)]
    sample_every: f64,
    /// Capacity: run the binaries at the same time, each with its own kube-sim, driver and work
    /// directory, instead of one after the other (ours waits on the write budget, not on CPU;
    /// upstream takes a core at 2,000 nodes, so only on an otherwise idle machine there). Other
    /// scenarios always run one after the other.
    #[arg(long)]
    sides_at_once: bool,
    /// With two binaries: run each scenario (but capacity and unused) this many times, the
    /// binary run first alternating from round to round, and report each round and the geometric
    /// mean of its ratios. Which of two binaries runs first can move their ratio by more than the
    /// difference between them (docs/benchmarks.md); an even count weighs both orders equally.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Node mode: WaitForFirstConsumer claims spread over the nodes.
    #[arg(long, default_value_t = 1000)]
    node_claims: usize,
    /// Node mode: bound PV/PVC pairs seeded on another node (one without the driver).
    #[arg(long, default_value_t = 0)]
    node_seeded: usize,
    /// Unused: Pods in the cluster.
    #[arg(long, default_value_t = 100_000)]
    pods: usize,
    /// Unused: Pods (of `--pods`) using a bound claim each.
    #[arg(long, default_value_t = 1000)]
    pod_claims: usize,
    /// Longest wait for any one condition, in seconds.
    #[arg(long, default_value_t = 1800)]
    timeout: u64,
    /// Seconds without a provisioner request that end start-up; also the idle window.
    #[arg(long, default_value_t = 10)]
    idle: u64,
    /// Where report.md, report.json and the work directories go. Default: target/bench.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Directory holding the kube-sim and mock-csi-driver binaries. Default: this binary's.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Extra flag for every provisioner (repeatable), e.g. --provisioner-arg=--v=0.
    #[arg(long = "provisioner-arg", allow_hyphen_values = true)]
    provisioner_args: Vec<String>,
    /// Log text that means "ready" (repeatable). Defaults: this project's and upstream's.
    #[arg(long = "ready-log", default_values = ["starting controllers", "Started provisioner controller"])]
    ready_log: Vec<String>,
}

/// How long a run waits for the machine to be idle before it starts ([`wait::machine_idle`]).
const IDLE_WAIT: Duration = Duration::from_secs(60);

fn label_and_path(spec: &str) -> (Option<String>, PathBuf) {
    match spec.split_once('=') {
        Some((l, p)) if !l.is_empty() && !l.contains('/') => (Some(l.to_string()), p.into()),
        _ => (None, spec.into()),
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn write_report(out: &Path, report: &Report) -> Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("report.md"), report.markdown())?;
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    Ok(())
}

async fn run(args: Args) -> Result<Report> {
    let exe = std::env::current_exe()?;
    let exe_dir = exe
        .parent()
        .context("bench binary directory")?
        .to_path_buf();
    let bin_dir = args.bin_dir.clone().unwrap_or_else(|| exe_dir.clone());
    let out = args.out.clone().unwrap_or_else(|| {
        exe_dir
            .parent()
            .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
            .join("bench")
    });
    // Absolute, since socket paths under it are handed to other processes.
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let out = std::fs::canonicalize(&out)?;
    let mut specs = args.provisioner_bins.clone();
    specs.extend(args.baseline_bin.clone());
    if specs.is_empty() {
        specs.push(bin_dir.join("csi-provisioner").display().to_string());
    }
    if specs.len() > 2 {
        bail!(
            "give at most two provisioner binaries (--provisioner-bin twice, or once with --baseline-bin)"
        );
    }
    let mut binaries = Vec::new();
    for spec in &specs {
        let (label, path) = label_and_path(spec);
        let path = std::fs::canonicalize(&path).with_context(|| {
            format!("provisioner binary {} not found; build it (cargo build --release --workspace) or fix the path", path.display())
        })?;
        let mut label = label.unwrap_or_else(|| {
            path.file_name()
                .map_or("provisioner".into(), |f| f.to_string_lossy().into_owned())
        });
        if binaries.iter().any(|b: &Binary| b.label == label) {
            label.push_str("-2");
        }
        binaries.push(Binary {
            version: procs::version_of(&path).await,
            label,
            path: path.display().to_string(),
        });
    }
    for tool in ["kube-sim", "mock-csi-driver"] {
        if !bin_dir.join(tool).exists() {
            bail!(
                "{} not found; build the workspace (cargo build --release --workspace) or pass --bin-dir",
                bin_dir.join(tool).display()
            );
        }
    }
    let env = Env {
        kube_sim: bin_dir.join("kube-sim"),
        driver: bin_dir.join("mock-csi-driver"),
        work: out.join("work"),
        extra_args: args.provisioner_args.clone(),
        ready_log: args.ready_log.clone(),
        timeout: Duration::from_secs(args.timeout),
        idle: Duration::from_secs(args.idle),
    };
    let mut report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        date: jiff::Timestamp::now().to_string(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average_start: load_average(),
        load_average_end: String::new(),
        binaries: binaries.clone(),
        scenarios: Vec::new(),
        notes: vec![
            "kube-sim, the mock driver(s), the provisioner(s) and the bench itself share the machine; \
             compare ratios rather than absolute times"
                .into(),
            "requests are those not sent by the bench (User-Agent kube-bench), i.e. the provisioner's; \
             Event requests are counted apart"
                .into(),
        ],
    };
    let qps: Vec<Qps> = args
        .qps
        .iter()
        .map(|q| match q {
            QpsName::Default => Qps::DEFAULT,
            QpsName::Raised => Qps::RAISED,
        })
        .collect();
    let poll = scenarios::parse_duration(&args.poll_interval)
        .map_err(|e| anyhow::anyhow!("--poll-interval: {e}"))?;
    let capacity = CapacityParams {
        nodes: args.nodes,
        classes: args.classes,
        churn_per_min: args.churn_per_min,
        duration: args.duration,
        add_node_at: args.add_node_at.unwrap_or(args.duration / 2),
        poll_interval: args.poll_interval.clone(),
        poll,
        seed_objects: args.seed_objects,
        sample_every: Duration::from_secs_f64(args.sample_every.max(0.1)),
    };
    if args.sides_at_once && args.scenarios.contains(&ScenarioName::Capacity) {
        report.notes.push(
            "capacity: the binaries ran at the same time, each with its own kube-sim, mock driver and \
             work directory (--sides-at-once)"
                .into(),
        );
    }
    let mut plan: Vec<(ScenarioName, usize)> = Vec::new();
    for s in &args.scenarios {
        match s {
            ScenarioName::Burst | ScenarioName::Restore | ScenarioName::Migrated => {
                plan.extend(args.claims.iter().map(|n| (*s, *n)));
            }
            _ => plan.push((*s, 0)),
        }
    }
    for (scenario, size) in plan {
        // Capacity runs at the default flags only: its figures are those of the write budget.
        let qps_of: &[Qps] = if scenario == ScenarioName::Capacity {
            &[Qps::DEFAULT]
        } else {
            &qps
        };
        for q in qps_of {
            let (key, title) = match scenario {
                ScenarioName::Burst => (
                    "burst",
                    format!("burst of {size} claims, Immediate binding"),
                ),
                ScenarioName::Migrated => (
                    "migrated",
                    format!(
                        "burst of {size} claims of an in-tree class under CSI migration, Immediate binding"
                    ),
                ),
                ScenarioName::Restore => (
                    "restore",
                    format!("{size} claims restored at once from one VolumeSnapshot"),
                ),
                ScenarioName::Restart => (
                    "restart",
                    format!(
                        "restart with {} bound claims (provisioned at QPS 1000), restarted at this QPS",
                        args.restart_claims
                    ),
                ),
                ScenarioName::Unused => (
                    "unused",
                    format!(
                        "--track-unused-claims with {} Pods, {} of them using a claim (first binary with the flag vs without)",
                        args.pods, args.pod_claims
                    ),
                ),
                ScenarioName::Capacity => (
                    "capacity",
                    format!(
                        "capacity: {} nodes, {} classes, {} changes a minute, poll {}, {} s, a node added at {} s{}{}",
                        capacity.nodes,
                        capacity.classes,
                        capacity.churn_per_min,
                        capacity.poll_interval,
                        report::num(capacity.duration.as_secs_f64()),
                        report::num(capacity.add_node_at.as_secs_f64()),
                        if capacity.seed_objects {
                            ", every object seeded"
                        } else {
                            ""
                        },
                        if args.sides_at_once {
                            ", sides at the same time"
                        } else {
                            ""
                        },
                    ),
                ),
                ScenarioName::Node => (
                    "node",
                    format!(
                        "node mode: {} nodes, {} WaitForFirstConsumer claims, {} bound pairs on another node",
                        args.nodes, args.node_claims, args.node_seeded
                    ),
                ),
            };
            let mut sc = Scenario {
                scenario: key.into(),
                title,
                qps: if scenario == ScenarioName::Capacity {
                    format!("{}, capacity QPS 1 / burst 5: the defaults", q.title())
                } else {
                    q.title()
                },
                runs: Vec::new(),
                round: None,
            };
            if scenario == ScenarioName::Capacity && args.sides_at_once {
                eprintln!(
                    "bench: {} with {} at once ...",
                    sc.title,
                    binaries
                        .iter()
                        .map(|b| b.label.as_str())
                        .collect::<Vec<_>>()
                        .join(" and ")
                );
                let runs = binaries.iter().map(|b| {
                    let (env, capacity) = (&env, &capacity);
                    async move {
                        let bin = Bin {
                            label: &b.label,
                            path: Path::new(&b.path),
                        };
                        scenarios::capacity(env, &bin, capacity).await
                    }
                });
                sc.runs = futures::future::join_all(runs).await;
                report.scenarios.push(sc);
                report.load_average_end = load_average();
                write_report(&out, &report)?;
                continue;
            }
            if scenario == ScenarioName::Unused {
                let b = &binaries[0];
                let bin = Bin {
                    label: &b.label,
                    path: Path::new(&b.path),
                };
                for track in [true, false] {
                    eprintln!(
                        "bench: {} with {} (tracking {track}) ...",
                        sc.title, b.label
                    );
                    sc.runs.push(
                        scenarios::unused(&env, &bin, args.pods, args.pod_claims, track).await,
                    );
                }
                report.scenarios.push(sc);
                write_report(&out, &report)?;
                continue;
            }
            let rounds = if binaries.len() == 2 && scenario != ScenarioName::Capacity {
                args.rounds.max(1)
            } else {
                1
            };
            for round in 0..rounds {
                let mut order: Vec<usize> = (0..binaries.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                let mut runs = Vec::new();
                for &i in &order {
                    let b = &binaries[i];
                    let bin = Bin {
                        label: &b.label,
                        path: Path::new(&b.path),
                    };
                    let waited = wait::machine_idle(IDLE_WAIT).await;
                    eprintln!("bench: {} [{}] with {} ...", sc.title, sc.qps, b.label);
                    let mut run = match scenario {
                        ScenarioName::Burst => scenarios::burst(&env, &bin, *q, size).await,
                        ScenarioName::Migrated => scenarios::migrated(&env, &bin, *q, size).await,
                        ScenarioName::Restore => scenarios::restore(&env, &bin, *q, size).await,
                        ScenarioName::Restart => {
                            scenarios::restart(&env, &bin, *q, args.restart_claims).await
                        }
                        ScenarioName::Unused => unreachable!("run above"),
                        ScenarioName::Capacity => scenarios::capacity(&env, &bin, &capacity).await,
                        ScenarioName::Node => {
                            scenarios::node(
                                &env,
                                &bin,
                                *q,
                                args.nodes,
                                args.node_claims,
                                args.node_seeded,
                            )
                            .await
                        }
                    };
                    run.metric(
                        "idle_wait_s",
                        "waited for an idle machine before the run (s)",
                        waited.as_secs_f64(),
                    );
                    runs.push((i, run));
                }
                // Columns stay in the order the binaries were given, whichever ran first.
                runs.sort_by_key(|(i, _)| *i);
                let mut sc = sc.clone();
                sc.runs = runs.into_iter().map(|(_, run)| run).collect();
                if rounds > 1 {
                    sc.round = Some(report::Round {
                        number: round + 1,
                        of: rounds,
                        first: binaries[order[0]].label.clone(),
                    });
                }
                report.scenarios.push(sc);
                report.load_average_end = load_average();
                // Written after every scenario, so a long run that is cut short still leaves a report.
                write_report(&out, &report)?;
            }
        }
    }
    report.load_average_end = load_average();
    write_report(&out, &report)?;
    eprintln!("bench: wrote {}", out.join("report.md").display());
    Ok(report)
}

async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    // On Ctrl-C or SIGTERM the run is dropped, which kills every child process it started.
    let result = tokio::select! {
        r = run(args) => r,
        _ = interrupted() => {
            eprintln!("bench: interrupted; child processes stopped");
            std::process::exit(130);
        }
    };
    let _ = std::fs::remove_dir_all(procs::socket_root());
    match result {
        Ok(report) => {
            let failures = report.failures();
            if !failures.is_empty() {
                eprintln!("bench: {} correctness failure(s):", failures.len());
                for f in failures {
                    eprintln!("  {f}");
                }
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("bench: {e:#}");
            std::process::exit(2);
        }
    }
}
