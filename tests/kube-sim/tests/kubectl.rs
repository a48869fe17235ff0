//! Drives the standalone `kube-sim` binary with a real kubectl (Debian's, installed if
//! missing; `KUBECTL=/path` picks another). Skips with a clear message only when kubectl
//! cannot be installed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const WAIT: Duration = Duration::from_secs(30);

fn find_on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|c| c.is_file())
    })
}

/// kubectl to use, installing Debian's `kubernetes-client` when none is present.
fn kubectl() -> Result<PathBuf, String> {
    if let Some(k) = std::env::var_os("KUBECTL") {
        return Ok(PathBuf::from(k));
    }
    if let Some(k) = find_on_path("kubectl") {
        return Ok(k);
    }
    let run = |args: &[&str]| -> Result<(), String> {
        let out = std::process::Command::new(args[0])
            .args(&args[1..])
            .output()
            .map_err(|e| format!("{}: {e}", args.join(" ")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    run(&["apt-get", "update", "-qq"])?;
    run(&["apt-get", "install", "-y", "-qq", "kubernetes-client"])?;
    find_on_path("kubectl")
        .ok_or_else(|| "kubernetes-client installed but kubectl is not on PATH".to_string())
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: PathBuf,
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        // A private HOME keeps kubectl's discovery cache out of the user's.
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.home)
            .kill_on_drop(true);
        c
    }

    async fn run(&self, args: &[&str]) -> Out {
        let out = tokio::time::timeout(WAIT, self.command(args).output())
            .await
            .expect("kubectl timed out")
            .expect("kubectl runs");
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        }
    }

    async fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args).await;
        assert!(
            o.ok,
            "kubectl {} failed:\n{}\n{}",
            args.join(" "),
            o.stdout,
            o.stderr
        );
        o.stdout
    }

    async fn apply(&self, dir: &Path, name: &str, yaml: &str) -> String {
        let p = dir.join(name);
        std::fs::write(&p, yaml).unwrap();
        self.ok(&["apply", "-f", p.to_str().unwrap()]).await
    }

    /// Polls `kubectl args` until `pred(stdout or stderr)` holds.
    async fn wait_until(&self, what: &str, args: &[&str], pred: impl Fn(&Out) -> bool) -> Out {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let o = self.run(args).await;
            if pred(&o) {
                return o;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; last output:\n{}\n{}",
                o.stdout,
                o.stderr
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Reads lines of a running `kubectl ... -w` until one satisfies `pred`.
async fn read_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(Ok(Some(l))) if pred(&l) => return l,
            Ok(Ok(Some(_))) => {}
            other => panic!("kubectl watch ended or timed out before {what}: {other:?}"),
        }
    }
}

async fn start_sim(kubeconfig: &Path) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kube-sim starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("kube-sim announces itself")
        .unwrap()
        .unwrap();
    assert!(
        first.starts_with("kube-sim listening on http://127.0.0.1:"),
        "{first}"
    );
    child
}

const OBJECTS: &str = "\
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: manual
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: Immediate
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
  namespace: default
spec:
  storageClassName: manual
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-data
spec:
  storageClassName: manual
  capacity:
    storage: 2Gi
  accessModes: [ReadWriteOnce]
  csi:
    driver: d.example.com
    volumeHandle: h1
";

#[tokio::test]
async fn kubectl_drives_the_standalone_binary() {
    let bin = match kubectl() {
        Ok(b) => b,
        Err(why) => {
            println!("skipped: kubectl not installable: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl {
        bin,
        kubeconfig: dir.path().join("kubeconfig"),
        home: dir.path().to_path_buf(),
    };
    let mut sim = start_sim(&k.kubeconfig).await;
    let version = k.run(&["version", "--client"]).await;
    println!(
        "using {}: {}",
        k.bin.display(),
        version.stdout.lines().next().unwrap_or("")
    );

    let applied = k.apply(dir.path(), "objs.yaml", OBJECTS).await;
    for line in [
        "storageclass.storage.k8s.io/manual created",
        "persistentvolumeclaim/data created",
        "persistentvolume/pv-data created",
    ] {
        assert!(applied.contains(line), "{applied}");
    }
    k.wait_until(
        "claim bound",
        &["get", "pvc", "data", "-o", "jsonpath={.status.phase}"],
        |o| o.stdout == "Bound",
    )
    .await;
    let again = k.apply(dir.path(), "objs.yaml", OBJECTS).await;
    assert!(
        again.contains("persistentvolume/pv-data unchanged"),
        "{again}"
    );

    let yaml = k.ok(&["get", "pv", "pv-data", "-o", "yaml"]).await;
    for want in [
        "kind: PersistentVolume",
        "claimRef:",
        "name: data",
        "phase: Bound",
        "- kubernetes.io/pv-protection",
        "storage: 2Gi",
    ] {
        assert!(yaml.contains(want), "missing {want:?} in\n{yaml}");
    }

    let mut watch = k
        .command(&["get", "pv", "pv-data", "-w", "--show-labels"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut wl = BufReader::new(watch.stdout.take().unwrap()).lines();
    read_until(&mut wl, "the initial row", |l| l.starts_with("pv-data")).await;

    k.ok(&[
        "patch",
        "pv",
        "pv-data",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"color":"blue"}}}"#,
    ])
    .await;
    read_until(&mut wl, "the merge-patched label", |l| {
        l.contains("color=blue")
    })
    .await;
    k.ok(&[
        "patch",
        "pv",
        "pv-data",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/size","value":"big"}]"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "pv",
        "pv-data",
        "--type=strategic",
        "-p",
        r#"{"metadata":{"labels":{"tier":"gold"}}}"#,
    ])
    .await;
    let labels = k
        .ok(&["get", "pv", "pv-data", "-o", "jsonpath={.metadata.labels}"])
        .await;
    for l in [r#""color":"blue""#, r#""size":"big""#, r#""tier":"gold""#] {
        assert!(labels.contains(l), "{labels}");
    }
    let failed = k
        .run(&[
            "patch",
            "pv",
            "pv-data",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/metadata/name","value":"other"}]"#,
        ])
        .await;
    // kubectl 1.20 prints only "The request is invalid" for a 422 without causes.
    assert!(
        !failed.ok && failed.stderr.contains("The request is invalid"),
        "{}",
        failed.stderr
    );

    let deleted = k.ok(&["delete", "pv", "pv-data", "--wait=false"]).await;
    assert!(
        deleted.contains(r#"persistentvolume "pv-data" deleted"#),
        "{deleted}"
    );
    read_until(&mut wl, "Terminating in the watch", |l| {
        l.contains("Terminating")
    })
    .await;
    let row = k.ok(&["get", "pv", "pv-data", "--no-headers"]).await;
    assert!(
        row.contains("Terminating"),
        "a bound PV stays Terminating: {row}"
    );
    k.ok(&["delete", "pvc", "data", "--wait=false"]).await;
    k.wait_until("the PV to disappear", &["get", "pv", "pv-data"], |o| {
        !o.ok && o.stderr.contains("not found")
    })
    .await;
    watch.kill().await.ok();

    // An event written through events.k8s.io/v1 shows in `get events` and `describe`.
    k.apply(
        dir.path(),
        "claim.yaml",
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data2\n  namespace: default\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n",
    )
    .await;
    let uid = k
        .ok(&["get", "pvc", "data2", "-o", "jsonpath={.metadata.uid}"])
        .await;
    let event = format!(
        "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata:\n  name: data2.abc\n  namespace: default\neventTime: \"2025-01-01T00:00:00.000000Z\"\ntype: Normal\nreason: Provisioning\naction: Provision\nnote: External provisioner is provisioning volume for claim default/data2\nreportingController: d.example.com_csi-provisioner\nreportingInstance: node-1\nregarding:\n  kind: PersistentVolumeClaim\n  namespace: default\n  name: data2\n  uid: {uid}\n  apiVersion: v1\n"
    );
    k.apply(dir.path(), "event.yaml", &event).await;
    let events = k.ok(&["get", "events"]).await;
    assert!(
        events.contains("External provisioner is provisioning volume for claim default/data2"),
        "{events}"
    );
    let described = k.ok(&["describe", "pvc", "data2"]).await;
    assert!(
        described.contains("Provisioning")
            && described
                .contains("External provisioner is provisioning volume for claim default/data2"),
        "{described}"
    );

    sim.start_kill().unwrap();
    sim.wait().await.unwrap();
}
