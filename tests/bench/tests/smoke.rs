//! CI smoke runs of the benchmark at a tiny size, against this project's debug binaries: the
//! correctness checks hold, the capacity scenario reports its figures, and both report files are
//! written. Never asserts a timing.

use std::path::Path;
use std::process::Command;

/// The directory of the bench and the binaries it starts, built if missing.
fn bin_dir() -> &'static Path {
    let bench = Path::new(env!("CARGO_BIN_EXE_bench"));
    let bin_dir = bench.parent().expect("target dir");
    // The binaries the bench starts. `cargo test --workspace` builds them (each has integration
    // tests); building them here otherwise would change feature unification and rebuild half the
    // workspace on every switch between `cargo build` and `cargo test`, so only when missing.
    let tools = ["kube-sim", "mock-csi-driver", "csi-provisioner"];
    if tools.iter().any(|t| !bin_dir.join(t).exists()) {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "kube-sim", "-p", "mock-csi-driver"])
            .args(["-p", "csi-provisioner", "--bins"])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the benchmarked binaries failed");
    }
    bin_dir
}

/// The value of metric `key` of the first run of `scenario` (`None` when it is text).
fn metric(scenario: &serde_json::Value, key: &str) -> serde_json::Value {
    scenario["runs"][0]["metrics"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["key"] == key))
        .map(|m| m["value"].clone())
        .unwrap_or_else(|| panic!("metric {key} missing in {scenario}"))
}

#[test]
fn small_run_passes_its_correctness_checks_and_writes_the_report() {
    let out = tempfile::tempdir().expect("tempdir");
    let output = bench_against_ours(out.path())
        .args(["--scenario=burst,restart,node", "--qps=raised"])
        .args(["--claims=20", "--restart-claims=200"])
        .args(["--nodes=3", "--node-claims=12", "--node-seeded=20"])
        .args(["--idle=1", "--timeout=120"])
        .output()
        .expect("run the bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed:\n{stderr}");

    let md = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("report.json")).expect("report.json"),
    )
    .expect("report.json is JSON");
    assert!(
        md.contains("no leaked or doubled volume, every claim bound"),
        "{md}"
    );
    let scenarios = json["scenarios"].as_array().expect("scenarios");
    let names: Vec<&str> = scenarios
        .iter()
        .filter_map(|s| s["scenario"].as_str())
        .collect();
    assert_eq!(names, ["burst", "restart", "node"]);
    for s in scenarios {
        let run = &s["runs"][0];
        assert_eq!(run["failures"], serde_json::json!([]), "{s}");
        let metric = |key: &str| metric(s, key);
        match s["scenario"].as_str() {
            // The provisioner's own requests were counted: at least a PV create per claim.
            Some("burst") => {
                assert!(metric("req_per_provisioned").as_f64() >= Some(1.0), "{s}");
                assert!(metric("peak_rss_mib").as_f64() > Some(0.0), "{s}");
                // Every claim got its events (queued behind the work, never dropped).
                assert_eq!(
                    metric("claims_with_provisioning_event").as_f64(),
                    Some(20.0),
                    "{s}"
                );
                assert_eq!(
                    metric("claims_with_succeeded_event").as_f64(),
                    Some(20.0),
                    "{s}"
                );
            }
            Some("restart") => {
                assert_eq!(metric("bound_claims").as_f64(), Some(200.0));
                assert!(metric("startup_requests").as_f64() >= Some(1.0), "{s}");
            }
            _ => assert!(metric("total_rss_mib").as_f64() > Some(0.0), "{s}"),
        }
    }
}

/// The capacity scenario at a tiny size (the default capacity QPS; only the poll interval is
/// short): every object is reported, and the node added mid-run gets its objects.
#[test]
fn capacity_run_reports_objects_and_the_added_node() {
    let out = tempfile::tempdir().expect("tempdir");
    let output = bench_against_ours(out.path())
        .args(["--scenario=capacity", "--nodes=5", "--classes=2"])
        .args(["--churn-per-min=60", "--duration=25s", "--add-node-at=10s"])
        .args(["--poll-interval=1s", "--sample-every=1", "--timeout=120"])
        .output()
        .expect("run the bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed:\n{stderr}");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("report.json")).expect("report.json"),
    )
    .expect("report.json is JSON");
    let s = &json["scenarios"][0];
    assert_eq!(s["scenario"], "capacity", "{s}");
    assert_eq!(s["runs"][0]["failures"], serde_json::json!([]), "{s}");
    // 10 objects at 1 write a second after a burst of 5, 2 more for the node added at 10 s.
    assert!(metric(s, "all_exist_s").as_f64() > Some(0.0), "{s}");
    assert!(metric(s, "added_node_s").as_f64() >= Some(0.0), "{s}");
    assert_eq!(metric(s, "objects_end").as_f64(), Some(12.0), "{s}");
    assert!(metric(s, "changes").as_f64() > Some(0.0), "{s}");
    assert!(
        metric(s, "getcapacity_per_poll").as_f64() > Some(0.0),
        "{s}"
    );
    assert!(metric(s, "queue_max").as_f64() >= Some(0.0), "{s}");
    assert!(metric(s, "peak_rss_mib").as_f64() > Some(0.0), "{s}");
    assert!(
        !s["runs"][0]["samples"]
            .as_array()
            .expect("samples")
            .is_empty(),
        "{s}"
    );
    let md = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(md.contains("time until its 2 objects exist"), "{md}");
}

/// The bench binary writing to `out`, with the debug binaries of this workspace and our
/// provisioner as the one under test.
fn bench_against_ours(out: &Path) -> Command {
    let bin_dir = bin_dir();
    let mut command = Command::new(Path::new(env!("CARGO_BIN_EXE_bench")));
    command
        .arg(format!("--out={}", out.display()))
        .arg(format!("--bin-dir={}", bin_dir.display()))
        .arg(format!(
            "--provisioner-bin=ours={}",
            bin_dir.join("csi-provisioner").display()
        ));
    command
}
