//! Every crash point, not a random sample (issue 29). For each scenario of
//! `tests/crash_points/scenarios/`, a clean run records the sequence of API writes the sidecar
//! sends (kube-sim's write log) and of effectful CSI calls its driver receives; then the scenario
//! is replayed once per (point, before/after): kube-sim or the mock driver holds that request or
//! call (before it is applied, or applied and not yet answered), the sidecar is SIGKILLed at
//! exactly that moment, the scenario's `while_down` steps run, the hold is released (a request
//! held before its effect is dropped, as one that never left), the sidecar restarts, and once the
//! world is quiet every invariant is checked: the fault suite's no-leak rules, no DeleteVolume of
//! a volume whose PV was Retain, none while its claim existed.
//!
//! - `cargo test --test crash_points`: the short form (CI): every point of `CRASH_SHORT` scenarios.
//! - `CRASH_POINTS=full cargo test --test crash_points -- --nocapture`: every scenario, every point.
//! - `CRASH_SCENARIO=text` runs the scenarios whose name contains `text`; `CRASH_POINT="after
//!   create persistentvolumes #1"` replays one point (as the report names it); `CRASH_JOBS=N`
//!   replays N at a time (default 4); `CRASH_KEEP=1` keeps the directory of a violating replay.

#[path = "../common/mod.rs"]
mod common;
#[path = "../differential/outcome.rs"]
mod outcome;
#[path = "../differential/scenario.rs"]
mod scenario;
#[path = "../differential/world.rs"]
mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use mock_csi_driver::invariants;
use scenario::Scenario;
use serde_json::Value;
use world::{Binary, Point, SIDECAR_AGENT, Side, WAIT_DEADLINE, World};

/// The scenarios the short form (CI) enumerates in full.
const CRASH_SHORT: &[&str] = &["immediate", "retain-pv-deleted-while-down"];
/// CSI methods the sidecar calls with an effect on the storage backend: their calls are crash
/// points. (CreateSnapshot is the harness's own, for restores: holding it would stop the test.)
const EFFECTFUL: &[&str] = &["CreateVolume", "DeleteVolume", "ControllerModifyVolume"];
/// One replay may take this long at most (a hold that stops the harness itself, say).
const REPLAY_DEADLINE: Duration = Duration::from_secs(240);
/// API resources whose writes are no state of the flow.
const NOT_STATE: &[&str] = &[
    "events",
    "selfsubjectaccessreviews",
    "selfsubjectrulesreviews",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crash_points")
}

fn ours() -> Binary {
    Binary {
        label: "ours".into(),
        path: PathBuf::from(env!("CARGO_BIN_EXE_csi-provisioner")),
    }
}

/// The crash points of a finished clean run, in the order the flow reaches them. The driver's
/// calls are told from the harness's own only by method, so crash scenarios make no volumes of
/// their own (`volume` steps).
async fn points_of(world: &mut World) -> Vec<Point> {
    let mut out = Vec::new();
    let mut api: Vec<(String, String)> = Vec::new();
    for w in world.cluster.sim().holds().writes() {
        if w.agent.starts_with(SIDECAR_AGENT) && !NOT_STATE.contains(&w.resource.as_str()) {
            api.push((w.verb, w.resource));
        }
    }
    let mut seen: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (verb, resource) in api {
        let nth = seen.entry((verb.clone(), resource.clone())).or_default();
        *nth += 1;
        for side in [Side::Before, Side::After] {
            out.push(Point::Api {
                verb: verb.clone(),
                resource: resource.clone(),
                nth: *nth,
                side,
            });
        }
    }
    for (node, driver) in &world.drivers {
        let Ok(c) = mock_csi_driver::ControlClient::connect(&driver.control).await else {
            continue;
        };
        let Ok(state) = c.state().await else {
            continue;
        };
        let mut seen: BTreeMap<String, u64> = BTreeMap::new();
        for method in state
            .call_log
            .iter()
            .filter(|m| EFFECTFUL.contains(&m.as_str()))
        {
            let nth = seen.entry(method.clone()).or_default();
            *nth += 1;
            for side in [Side::Before, Side::After] {
                out.push(Point::Csi {
                    node: node.clone(),
                    method: method.clone(),
                    nth: *nth,
                    side,
                });
            }
        }
    }
    out
}

/// Volume names the sidecar reported keeping (its `volume kept` log lines).
fn reported_kept(logs: &[PathBuf]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("volume kept")) {
            if let Some(rest) = line.split("volume=").nth(1) {
                out.insert(
                    rest.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .trim_matches('"')
                        .to_owned(),
                );
            }
        }
    }
    out
}

/// Every broken invariant of a quiet world.
async fn violations(world: &mut World) -> Vec<String> {
    let states = world.states().await;
    let sim = world.cluster.sim();
    let mut volumes = Vec::new();
    let mut concurrent = Vec::new();
    let mut delete_calls = Vec::new();
    for s in states {
        volumes.extend(s.volumes);
        concurrent.extend(s.concurrent_creates);
        delete_calls.extend(s.delete_calls);
    }
    let pvs: Vec<Value> = sim.objects("persistentvolumes");
    let pvcs: Vec<Value> = sim.objects("persistentvolumeclaims");
    let pods: Vec<Value> = sim.objects("pods");
    let events: Vec<Value> = sim.objects("events");
    let (volume_claims, claim_removals) = sim.claim_history();
    let policies = sim.volume_policies();
    let kept = reported_kept(&world.logs());
    invariants::check(&invariants::World {
        driver: common::DRIVER,
        volumes: &volumes,
        pvs: &pvs,
        pvcs: &pvcs,
        pods: &pods,
        events: &events,
        max_events_per_object: 20,
        concurrent_creates: &concurrent,
        delete_calls: &delete_calls,
        volume_claims: &volume_claims,
        claim_removals: &claim_removals,
        volume_policies: &policies,
        reported_kept: &kept,
    })
    .iter()
    .map(ToString::to_string)
    .collect()
}

/// How one replay ended.
enum Replay {
    /// The point fired and every invariant holds.
    Holds,
    /// The flow never reached the point (timing: a write the clean run made and this one did not).
    NotReached,
    /// Invariants broken after the restart.
    Violated(Vec<String>, Vec<PathBuf>),
    /// The scenario could not run.
    Failed(String),
}

async fn replay(scenario: &Scenario, point: Option<Point>) -> (Replay, Option<World>) {
    let what = point
        .as_ref()
        .map_or("the clean run".to_owned(), ToString::to_string);
    match tokio::time::timeout(REPLAY_DEADLINE, replay_inner(scenario, point)).await {
        Ok(done) => done,
        Err(_) => (
            Replay::Failed(format!("{what} did not finish within {REPLAY_DEADLINE:?}")),
            None,
        ),
    }
}

async fn replay_inner(scenario: &Scenario, point: Option<Point>) -> (Replay, Option<World>) {
    let mut world = match World::start_with(scenario, &ours(), point.clone()).await {
        Ok(w) => w,
        Err(e) => return (Replay::Failed(e), None),
    };
    if let Err(e) = world.run_steps().await {
        return (Replay::Failed(e), Some(world));
    }
    let quiet = Duration::from_secs_f64(scenario.quiet);
    if !outcome::settle(&mut world, quiet, WAIT_DEADLINE).await {
        world.timeouts.push("final settle".into());
    }
    if point.is_some() && !world.crash_fired() {
        return (Replay::NotReached, Some(world));
    }
    let broken = violations(&mut world).await;
    if broken.is_empty() {
        (Replay::Holds, Some(world))
    } else {
        let logs = world.logs();
        (Replay::Violated(broken, logs), Some(world))
    }
}

struct ScenarioResult {
    points: usize,
    reached: usize,
    violations: Vec<(String, Vec<String>, Vec<PathBuf>)>,
    failures: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_crash_point_of_every_flow_keeps_every_invariant() {
    let full = std::env::var("CRASH_POINTS").as_deref() == Ok("full");
    let filter = std::env::var("CRASH_SCENARIO").ok();
    let only_point = std::env::var("CRASH_POINT").ok();
    let jobs: usize = std::env::var("CRASH_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or(4);
    let mut scenarios =
        scenario::load_all(&root().join("scenarios"), filter.as_deref()).expect("scenarios load");
    if !full && filter.is_none() {
        scenarios.retain(|s| CRASH_SHORT.contains(&s.name.as_str()));
    }
    let started = std::time::Instant::now();
    let mut results: BTreeMap<String, ScenarioResult> = BTreeMap::new();
    for s in &scenarios {
        let (clean, world) = replay(s, None).await;
        let Some(mut world) = world else {
            panic!("{}: the clean run could not start", s.name);
        };
        match &clean {
            Replay::Violated(v, _) => panic!("{}: the clean run breaks invariants: {v:?}", s.name),
            Replay::Failed(e) => panic!("{}: the clean run fails: {e}", s.name),
            Replay::Holds | Replay::NotReached => {}
        }
        let mut points = points_of(&mut world).await;
        drop(world);
        if let Some(p) = &only_point {
            points.retain(|x| x.to_string() == *p);
        }
        let outcomes: Vec<(Point, Replay)> = futures::stream::iter(points.clone())
            .map(|p| async move {
                let (r, w) = replay(s, Some(p.clone())).await;
                // A world is dropped (its processes killed) as soon as it is judged, unless a
                // violation's directory is to be kept for a look.
                if let (Replay::Violated(..), Some(w)) = (&r, w)
                    && std::env::var_os("CRASH_KEEP").is_some()
                {
                    eprintln!("[{} {p}] kept {}", s.name, w.dir().display());
                    std::mem::forget(w);
                }
                (p, r)
            })
            .buffer_unordered(jobs)
            .collect()
            .await;
        let mut result = ScenarioResult {
            points: points.len(),
            reached: 0,
            violations: Vec::new(),
            failures: Vec::new(),
        };
        for (p, r) in outcomes {
            match r {
                Replay::Holds => result.reached += 1,
                Replay::NotReached => {}
                Replay::Violated(v, logs) => {
                    result.reached += 1;
                    result.violations.push((p.to_string(), v, logs));
                }
                Replay::Failed(e) => result.failures.push(format!("{p}: {e}")),
            }
        }
        eprintln!(
            "crash points: {} {} points, {} reached, {} violated ({:.0} s so far)",
            s.name,
            result.points,
            result.reached,
            result.violations.len(),
            started.elapsed().as_secs_f64()
        );
        results.insert(s.name.clone(), result);
    }
    let mut report = String::new();
    let _ = writeln!(
        report,
        "| Scenario | Crash points | Reached | Violations |\n|---|---|---|---|"
    );
    let mut bad = 0;
    for (name, r) in &results {
        let _ = writeln!(
            report,
            "| `{name}` | {} | {} | {} |",
            r.points,
            r.reached,
            r.violations.len()
        );
        bad += r.violations.len() + r.failures.len();
    }
    for (name, r) in &results {
        for (p, v, logs) in &r.violations {
            let _ = writeln!(
                report,
                "\nVIOLATED {name} at {p} (replay: CRASH_SCENARIO={name} CRASH_POINT=\"{p}\"):"
            );
            for line in v {
                let _ = writeln!(report, "  - {line}");
            }
            for l in logs {
                let _ = writeln!(report, "  log (kept with CRASH_KEEP=1): {}", l.display());
            }
        }
        for f in &r.failures {
            let _ = writeln!(report, "\nFAILED {name}: {f}");
        }
    }
    let _ = writeln!(
        report,
        "\n{} scenarios, {} crash points in {:.0} s",
        results.len(),
        results.values().map(|r| r.points).sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    eprintln!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/crash_points");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(out.join("report.md"), &report);
    assert_eq!(bad, 0, "crash points broke invariants:\n{report}");
}
