//! The differential suite: every scenario of `tests/differential/scenarios/` run on two fresh,
//! identical worlds (kube-sim, the mock driver, one provisioner binary each), and what each world
//! leaves behind compared field by field (`outcome`, `compare`). A difference fails the suite
//! unless `allow.yaml` names it as deliberate.
//!
//! - `UPSTREAM_PROVISIONER=/path/to/upstream/csi-provisioner cargo test --test differential`:
//!   live, ours beside upstream (docs/benchmarks.md says how to build that binary);
//!   `DIFF_RECORD=1` also writes upstream's outcomes to `recorded/`.
//! - Without it: ours against the recorded upstream outcomes, so CI needs no Go build. A
//!   scenario without a recording is reported and skipped.
//! - Metric families (name, type, label names; not values) are compared too, for the scenarios
//!   whose recording has them and always live (`compare::scope_metrics`).
//! - `DIFF_SCENARIO=text` runs the scenarios whose name contains `text`; `DIFF_JOBS=N` runs N at
//!   a time (default 4); `DIFF_KEEP=1` keeps every world's directory (logs, kubeconfig).
//! - `DIFF_WORLD=real` (live only): every world is a fresh real Kubernetes 1.20 control plane
//!   (`tests/real-cluster/build.sh`) instead of kube-sim; a scenario 1.20 cannot express is
//!   reported as not fitting, with why (`real`), and skipped. `DIFF_JOBS` defaults to 1 there.

#[path = "../common/mod.rs"]
mod common;
mod compare;
mod outcome;
mod real;
mod scenario;
mod world;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;

use compare::{AllowList, Difference, diff, scope_metrics};
use outcome::{Outcome, observe, observe_metrics, settle};
use scenario::Scenario;
use world::{Binary, WAIT_DEADLINE, World, real_world_wanted};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential")
}

/// What one world left behind, and where its logs are.
struct Run {
    outcome: Outcome,
    logs: Vec<PathBuf>,
}

async fn run_one(scenario: &Scenario, binary: &Binary) -> Result<Run, String> {
    let mut world = World::start(scenario, binary).await?;
    let result = world.run_steps().await;
    if let Err(e) = result {
        return Err(format!("{} ({}): {e}", scenario.name, binary.label));
    }
    let quiet = Duration::from_secs_f64(scenario.quiet);
    if !settle(&mut world, quiet, WAIT_DEADLINE).await {
        world.timeouts.push("final settle".into());
    }
    let mut outcome = observe(&mut world).await;
    outcome.extend(observe_metrics(&world).await);
    let logs = world.logs();
    if std::env::var_os("DIFF_KEEP").is_some() {
        let dir = world.dir().to_path_buf();
        eprintln!(
            "[{} {}] kept {}",
            scenario.name,
            binary.label,
            dir.display()
        );
        if world.is_real() {
            // The processes stop here; only the directory outlives the test.
            world.stop_processes().await;
        }
        // Leak the directory on purpose: it outlives the test for a look at the logs.
        std::mem::forget(world);
    }
    Ok(Run { outcome, logs })
}

fn recorded_path(name: &str) -> PathBuf {
    root().join("recorded").join(format!("{name}.json"))
}

fn read_recorded(name: &str) -> Option<Outcome> {
    let text = std::fs::read_to_string(recorded_path(name)).ok()?;
    let doc: serde_json::Value = serde_json::from_str(&text).ok()?;
    serde_json::from_value(doc["outcome"].clone()).ok()
}

fn write_recorded(name: &str, version: &str, outcome: &Outcome) -> Result<(), String> {
    let path = recorded_path(name);
    std::fs::create_dir_all(path.parent().expect("parent")).map_err(|e| e.to_string())?;
    let doc = serde_json::json!({ "upstream": version, "outcome": outcome });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n";
    std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))
}

/// How one scenario ended.
enum Verdict {
    Agrees {
        allowed: Vec<(Difference, String)>,
        /// `DIFF_WORLD=real`: waits that timed out on both sides alike, which an agreement
        /// would otherwise hide (a scenario the real control plane did not play out).
        both_timed_out: Vec<String>,
    },
    Differs {
        about: String,
        unallowed: Vec<Difference>,
        allowed: usize,
        logs: Vec<PathBuf>,
    },
    NotRecorded,
    /// `DIFF_WORLD=real`: the scenario needs what a Kubernetes 1.20 control plane lacks.
    DoesNotFit(String),
    Failed(String),
    /// Differed (or failed) once and agreed when run again: a race between a sidecar's cache and
    /// the scenario's timing, which a real difference never wins twice. Reported, not failed.
    AgreesOnRetry {
        first: Box<Verdict>,
    },
}

/// [`judge`], and once more when the first run differs or fails (see [`Verdict::AgreesOnRetry`]).
async fn judge_twice(
    scenario: &Scenario,
    ours: &Binary,
    upstream: Option<&Binary>,
    record: Option<&str>,
    allow: &AllowList,
) -> Verdict {
    if real_world_wanted()
        && let Some(why) = real::misfit(scenario)
    {
        return Verdict::DoesNotFit(why);
    }
    let first = judge(scenario, ours, upstream, record, allow).await;
    if !matches!(first, Verdict::Differs { .. } | Verdict::Failed(_)) {
        return first;
    }
    match judge(scenario, ours, upstream, record, allow).await {
        Verdict::Agrees { .. } => Verdict::AgreesOnRetry {
            first: Box::new(first),
        },
        second => second,
    }
}

async fn judge(
    scenario: &Scenario,
    ours: &Binary,
    upstream: Option<&Binary>,
    record: Option<&str>,
    allow: &AllowList,
) -> Verdict {
    let (ours_run, upstream_outcome) = match upstream {
        Some(up) => {
            let (o, u) = tokio::join!(run_one(scenario, ours), run_one(scenario, up));
            let u = match u {
                Ok(u) => u,
                Err(e) => return Verdict::Failed(e),
            };
            if let Some(version) = record
                && let Err(e) = write_recorded(&scenario.name, version, &u.outcome)
            {
                return Verdict::Failed(e);
            }
            (o, u.outcome)
        }
        None => {
            let Some(recorded) = read_recorded(&scenario.name) else {
                return Verdict::NotRecorded;
            };
            (run_one(scenario, ours).await, recorded)
        }
    };
    let ours_run = match ours_run {
        Ok(r) => r,
        Err(e) => return Verdict::Failed(e),
    };
    let mut allowed = Vec::new();
    let mut unallowed = Vec::new();
    let ours_outcome = scope_metrics(&upstream_outcome, ours_run.outcome);
    for d in diff(&upstream_outcome, &ours_outcome) {
        match allow.allows(&scenario.name, &d) {
            Some(entry) => allowed.push((d, entry.why.clone())),
            None => unallowed.push(d),
        }
    }
    if unallowed.is_empty() {
        let both_timed_out = if real_world_wanted() {
            ours_outcome
                .iter()
                .filter(|(k, _)| k.starts_with("timeout/"))
                .map(|(_, v)| v.clone())
                .collect()
        } else {
            Vec::new()
        };
        Verdict::Agrees {
            allowed,
            both_timed_out,
        }
    } else {
        Verdict::Differs {
            about: scenario.about.clone(),
            unallowed,
            allowed: allowed.len(),
            logs: ours_run.logs,
        }
    }
}

async fn version_of(bin: &Path) -> String {
    match tokio::process::Command::new(bin)
        .arg("--version")
        .output()
        .await
    {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_owned(),
        Err(e) => format!("(cannot run --version: {e})"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_scenario_leaves_what_upstream_leaves_outside_the_allow_list() {
    let filter = std::env::var("DIFF_SCENARIO").ok();
    let scenarios =
        scenario::load_all(&root().join("scenarios"), filter.as_deref()).expect("scenarios load");
    let allow_text = std::fs::read_to_string(root().join("allow.yaml")).expect("allow.yaml");
    let allow = AllowList::parse(&allow_text).expect("allow.yaml parses");
    let ours = Binary {
        label: "ours".into(),
        path: std::env::var_os("OURS_PROVISIONER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_csi-provisioner"))),
    };
    let upstream = std::env::var_os("UPSTREAM_PROVISIONER").map(|p| Binary {
        label: "upstream".into(),
        path: PathBuf::from(p),
    });
    let version = match &upstream {
        Some(up) => Some(version_of(&up.path).await),
        None => {
            eprintln!(
                "differential: UPSTREAM_PROVISIONER is not set; comparing ours with the recorded \
                 upstream outcomes in tests/differential/recorded (docs/differential.md)"
            );
            None
        }
    };
    let record = (std::env::var("DIFF_RECORD").as_deref() == Ok("1"))
        .then_some(version.as_deref())
        .flatten();
    let real = real_world_wanted();
    if real {
        // The recordings are kube-sim worlds': a real control plane adds its own finalizers,
        // annotations and events on both sides, so it compares only live, side by side.
        assert!(
            upstream.is_some(),
            "DIFF_WORLD=real compares live only: set UPSTREAM_PROVISIONER (docs/differential.md)"
        );
        assert!(
            record.is_none(),
            "DIFF_WORLD=real does not record: tests/differential/recorded holds kube-sim worlds"
        );
        if let Some(why) = common::real_cluster::missing() {
            panic!("DIFF_WORLD=real: the real control plane is not built here ({why})");
        }
    }
    let jobs: usize = std::env::var("DIFF_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or(if real { 1 } else { 4 });

    let verdicts: Vec<(String, Verdict)> = futures::stream::iter(scenarios.iter())
        .map(|s| {
            let ours = &ours;
            let upstream = upstream.as_ref();
            let allow = &allow;
            async move {
                let start = tokio::time::Instant::now();
                let verdict = judge_twice(s, ours, upstream, record, allow).await;
                if real && !matches!(verdict, Verdict::DoesNotFit(_)) {
                    eprintln!(
                        "[{}] {:.0}s on the real control plane",
                        s.name,
                        start.elapsed().as_secs_f64()
                    );
                }
                (s.name.clone(), verdict)
            }
        })
        .buffer_unordered(jobs)
        .collect()
        .await;
    let verdicts: BTreeMap<String, Verdict> = verdicts.into_iter().collect();

    let mut report = String::new();
    let (mut agree, mut agree_allowed, mut failed, mut unrecorded, mut retried) = (0, 0, 0, 0, 0);
    let mut misfits = 0;
    let mut used_reasons: BTreeMap<String, usize> = BTreeMap::new();
    for (name, v) in &verdicts {
        match v {
            Verdict::Agrees {
                allowed,
                both_timed_out,
            } if allowed.is_empty() => {
                agree += 1;
                let _ = writeln!(report, "agree            {name}");
                for t in both_timed_out {
                    let _ = writeln!(report, "    timed out on both sides: {t}");
                }
            }
            Verdict::Agrees {
                allowed,
                both_timed_out,
            } => {
                agree_allowed += 1;
                let _ = writeln!(
                    report,
                    "agree (allowed)  {name}: {} deliberate",
                    allowed.len()
                );
                for t in both_timed_out {
                    let _ = writeln!(report, "    timed out on both sides: {t}");
                }
                for (d, why) in allowed {
                    *used_reasons.entry(why.clone()).or_default() += 1;
                    if std::env::var_os("DIFF_VERBOSE").is_some() {
                        let _ = writeln!(report, "    {d}\n      why: {why}");
                    }
                }
            }
            Verdict::Differs {
                about,
                unallowed,
                allowed,
                logs,
            } => {
                failed += 1;
                let _ = writeln!(
                    report,
                    "DIFFER           {name}: {} difference(s) not in allow.yaml ({allowed} allowed)\n    ({about})",
                    unallowed.len()
                );
                for d in unallowed {
                    let _ = writeln!(report, "    {d}");
                }
                for l in logs {
                    let _ = writeln!(report, "    log: {}", l.display());
                }
            }
            Verdict::AgreesOnRetry { first } => {
                retried += 1;
                let _ = writeln!(report, "agree on retry   {name}: the first run differed:");
                match first.as_ref() {
                    Verdict::Differs { unallowed, .. } => {
                        for d in unallowed {
                            let _ = writeln!(report, "    {d}");
                        }
                    }
                    Verdict::Failed(e) => {
                        let _ = writeln!(report, "    {e}");
                    }
                    _ => {}
                }
            }
            Verdict::NotRecorded => {
                unrecorded += 1;
                let _ = writeln!(report, "not recorded     {name}");
            }
            Verdict::DoesNotFit(why) => {
                misfits += 1;
                let _ = writeln!(
                    report,
                    "does not fit     {name}: does not fit the real control plane: {why}"
                );
            }
            Verdict::Failed(e) => {
                failed += 1;
                let _ = writeln!(report, "FAILED           {name}: {e}");
            }
        }
    }
    let unused: Vec<&str> = allow
        .reasons()
        .into_iter()
        .filter(|w| !used_reasons.contains_key(*w))
        .collect();
    let _ = writeln!(
        report,
        "\n{} scenarios: {agree} agree, {agree_allowed} agree outside deliberate differences, \
         {retried} agree on a second run, {failed} differ or failed, {unrecorded} not recorded \
         (against {})",
        verdicts.len(),
        version
            .as_deref()
            .unwrap_or("the recorded upstream outcomes")
    );
    if real {
        let _ = writeln!(
            report,
            "on a real control plane (DIFF_WORLD=real): {} fit, {misfits} do not fit (skipped)",
            verdicts.len() - misfits
        );
    }
    if filter.is_none() && !real && !unused.is_empty() {
        let _ = writeln!(report, "allow-list entries no scenario needed: {unused:?}");
    }
    eprintln!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/differential");
    let _ = std::fs::create_dir_all(&out);
    let file = if real {
        "report-real.txt"
    } else {
        "report.txt"
    };
    let _ = std::fs::write(out.join(file), &report);
    assert_eq!(
        failed, 0,
        "differences from upstream outside allow.yaml:\n{report}"
    );
}
