//! The README's first command, `deploy/demo.sh`, run as a user would: it must finish on its own,
//! exit 0 and tell each of its four stories (it checks its own outcomes and exits non-zero with
//! `DEMO FAILED: ...` when one does not happen).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The demo waits at most 30 s per step; the first run may also build the binaries.
const DEADLINE: Duration = Duration::from_secs(600);

#[test]
fn demo_runs_to_the_end_and_shows_each_step() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut child = Command::new("bash")
        .arg(format!("{root}/deploy/demo.sh"))
        .env_remove("KEEP")
        .env_remove("DEMO_BIN")
        .env("CARGO", env!("CARGO"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run deploy/demo.sh");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the demo") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("deploy/demo.sh did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "demo failed ({status}):\n{out}\n{err}");
    for expected in [
        "the PV carries our finalizer",
        "\"finalizers\":[\"external-provisioner.volume.kubernetes.io/finalizer\"",
        "PV gone, and the backend volume with it",
        "the sidecar deleted the volume it made",
        "Volume answered as deleted without calling DeleteVolume",
        "no PV or claim is left",
    ] {
        assert!(
            out.contains(expected),
            "demo output lacks {expected:?}:\n{out}\n{err}"
        );
    }
}
