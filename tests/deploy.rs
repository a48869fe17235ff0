//! The shipped manifests and image recipe, checked as a user would meet them: every file in
//! `deploy/` applies to an API server with kubectl and creates the objects it promises; every flag
//! the Deployment and DaemonSet pass to the sidecar is one it accepts; the Dockerfile builds the
//! binary that exists under the name its ENTRYPOINT runs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Container;
use kube::Api;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy"))
        .expect("deploy/")
        .map(|e| e.expect("deploy/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// (kind, name, namespace) of every object a manifest file declares.
fn declared(file: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(file).expect("read manifest");
    let mut out = Vec::new();
    for doc in text.split("\n---") {
        let (mut kind, mut name, mut in_meta) = (None, None, false);
        let mut namespace = "default".to_string();
        for line in doc.lines() {
            if let Some(k) = line.strip_prefix("kind: ") {
                kind = Some(k.trim().to_string());
            }
            if line.starts_with("metadata:") {
                in_meta = true;
            } else if in_meta && !line.starts_with(' ') {
                in_meta = false;
            } else if in_meta && line.starts_with("  ") && !line.starts_with("   ") {
                if let Some(n) = line.trim_start().strip_prefix("name: ") {
                    name = Some(n.trim().to_string());
                }
                if let Some(n) = line.trim_start().strip_prefix("namespace: ") {
                    namespace = n.trim().to_string();
                }
            }
        }
        if let (Some(k), Some(n)) = (kind, name) {
            out.push((k, n, namespace));
        }
    }
    out
}

fn kubectl(kubeconfig: &Path, home: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .output()
        .map_err(|e| format!("kubectl: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// The long flag names `csi-provisioner --help` lists.
fn accepted_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .arg("--help")
        .output()
        .expect("csi-provisioner --help");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| {
            w.split(['=', ' ', '[', '<', ','])
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

fn sidecar(containers: &[Container]) -> &Container {
    containers
        .iter()
        .find(|c| c.name == "csi-provisioner")
        .expect("a container named csi-provisioner")
}

fn assert_flags_accepted(what: &str, container: &Container, accepted: &BTreeSet<String>) {
    for arg in container.args.iter().flatten() {
        let name = arg
            .trim_start_matches('-')
            .split('=')
            .next()
            .unwrap_or_default();
        assert!(
            accepted.contains(name),
            "{what} passes {arg:?}, which csi-provisioner does not accept"
        );
    }
}

// Multi-threaded: the in-process API server keeps answering while kubectl blocks this thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_manifest_applies_with_kubectl_and_creates_its_objects() {
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        println!("skipped: kubectl is not installed (.ci/run installs Debian's kubernetes-client)");
        return;
    }
    let sim = kube_sim::Sim::start(kube_sim::SimConfig::default())
        .await
        .expect("start kube-sim");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");

    let files = manifests();
    assert!(files.len() >= 4, "deploy/ lost manifests: {files:?}");
    for file in &files {
        let path = file.to_str().expect("utf-8 path");
        let out = kubectl(&kubeconfig, dir.path(), &["apply", "-f", path])
            .unwrap_or_else(|e| panic!("kubectl apply -f {path} failed:\n{e}"));
        for (kind, name, namespace) in declared(file) {
            let resource = kind.to_lowercase();
            assert!(
                out.contains(&format!("/{name} created")),
                "{path}: kubectl did not create {kind} {name}:\n{out}"
            );
            kubectl(
                &kubeconfig,
                dir.path(),
                &["get", &resource, &name, "-n", &namespace],
            )
            .unwrap_or_else(|e| panic!("{kind} {name} from {path} is not there:\n{e}"));
        }
    }

    // What the controller and node manifests run is what this binary accepts.
    let accepted = accepted_flags();
    assert!(
        accepted.contains("csi-address"),
        "--help lists no flags: {accepted:?}"
    );
    let deployment = Api::<Deployment>::namespaced(sim.client(), "default")
        .get("csi-provisioner")
        .await
        .expect("the controller Deployment");
    let pod = deployment
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod spec");
    assert_flags_accepted(
        "deploy/deployment.yaml",
        sidecar(&pod.containers),
        &accepted,
    );
    let daemonset = Api::<DaemonSet>::namespaced(sim.client(), "default")
        .get("csi-provisioner-node")
        .await
        .expect("the node DaemonSet");
    let pod = daemonset
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod spec");
    let node = sidecar(&pod.containers);
    assert_flags_accepted("deploy/daemonset.yaml", node, &accepted);
    assert!(
        node.args
            .iter()
            .flatten()
            .any(|a| a.contains("node-deployment")),
        "the DaemonSet must run the sidecar with --node-deployment"
    );
    assert!(
        node.env
            .iter()
            .flatten()
            .any(|e| e.name == "NODE_NAME" && e.value_from.is_some()),
        "the DaemonSet must pass NODE_NAME from the downward API (the sidecar refuses to start without it)"
    );
}

/// Image builds are not possible on these machines; this checks what can go stale in the recipe.
#[test]
fn dockerfile_builds_the_binary_its_entrypoint_runs() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile");
    let build = dockerfile
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build step");
    let words: Vec<&str> = build.split_whitespace().collect();
    let after = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1))
            .copied()
            .unwrap_or_else(|| panic!("the build step names no {flag}: {build}"))
    };
    assert!(
        words.contains(&"--release") && words.contains(&"--locked"),
        "{build}"
    );
    let (package, bin) = (after("--package"), after("--bin"));

    // --locked fails the image build when Cargo.lock is stale: check the lock file is current.
    let metadata = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--locked",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata");
    assert!(
        metadata.status.success(),
        "cargo metadata --locked failed (Cargo.lock out of date?):\n{}",
        String::from_utf8_lossy(&metadata.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&metadata.stdout).expect("metadata JSON");
    let target_exists = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .any(|p| {
            p["name"] == package
                && p["targets"]
                    .as_array()
                    .is_some_and(|ts| ts.iter().any(|t| t["name"] == bin && t["kind"][0] == "bin"))
        });
    assert!(target_exists, "no bin {bin} in package {package}");

    assert!(
        dockerfile.contains(&format!("target/release/{bin} /{bin}")),
        "the build stage does not copy target/release/{bin}"
    );
    assert!(
        dockerfile.contains(&format!("ENTRYPOINT [\"/{bin}\"]")),
        "the ENTRYPOINT does not run /{bin}"
    );
    assert!(
        !dockerfile.contains("protobuf-compiler"),
        "the image build needs no protoc: build.rs compiles the proto with protox"
    );
}
