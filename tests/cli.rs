//! Binary-level command-line compatibility: `--help` lists upstream's flags, `--version`, exit codes
//! of usage and configuration errors, and Go-style single-dash command lines getting past parsing.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");

/// Every flag of the upstream sidecar (reference §1a, §1b, §1c).
const UPSTREAM_FLAGS: &[&str] = &[
    "master",
    "volume-name-prefix",
    "volume-name-uuid-length",
    "retry-interval-start",
    "retry-interval-max",
    "worker-threads",
    "cloning-protection-threads",
    "snapshot-orphan-sweep-interval",
    "capacity-threads",
    "timeout",
    "strict-topology",
    "immediate-topology",
    "extra-create-metadata",
    "enable-pprof",
    "default-fstype",
    "kube-api-capacity-qps",
    "kube-api-capacity-burst",
    "enable-capacity",
    "capacity-for-immediate-binding",
    "capacity-poll-interval",
    "capacity-ownerref-level",
    "node-deployment",
    "node-deployment-immediate-binding",
    "node-deployment-base-delay",
    "node-deployment-max-delay",
    "controller-publish-readonly",
    "prevent-volume-mode-conversion",
    "feature-gates",
    "version",
    "kubeconfig",
    "csi-address",
    "leader-election",
    "leader-election-namespace",
    "leader-election-lease-duration",
    "leader-election-renew-deadline",
    "leader-election-retry-period",
    "leader-election-labels",
    "kube-api-qps",
    "kube-api-burst",
    "http-endpoint",
    "metrics-address",
    "metrics-path",
    "automaxprocs",
    "v",
    "vmodule",
    "logging-format",
    "log-flush-frequency",
    "log-text-split-stream",
    "log-text-info-buffer-size",
    "log-json-split-stream",
    "log-json-info-buffer-size",
];

/// The binary with an environment that does not depend on the developer's shell.
fn sidecar(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.args(args);
    for name in ["KUBECONFIG", "NODE_NAME", "POD_NAMESPACE", "RUST_LOG"] {
        command.env_remove(name);
    }
    command
}

fn run(args: &[&str]) -> Output {
    sidecar(args).stdin(Stdio::null()).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_lists_every_upstream_flag() {
    let output = run(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let help = text(&output.stdout);
    for flag in UPSTREAM_FLAGS.iter().chain(&[
        "deleted-node-grace-period",
        "deleted-node-pvc-cleanup",
        "audit-interval",
        "track-unused-claims",
        "node-deployment-intent-journal",
    ]) {
        // `--name` followed by a space, `=`, `[` or a newline: not a longer flag's prefix.
        let listed = [" ", "=", "[", "\n", " <"]
            .iter()
            .any(|end| help.contains(&format!("--{flag}{end}")));
        assert!(listed, "--help does not list --{flag}:\n{help}");
    }
    assert!(
        help.contains("[default: 10s]"),
        "the CSI timeout default is 10s, as upstream's code:\n{help}"
    );
}

#[test]
fn go_style_help_works_too() {
    let output = run(&["-help"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(text(&output.stdout).contains("--csi-address"));
}

#[test]
fn version_prints_the_program_name_and_version() {
    for flag in ["--version", "-version"] {
        let output = run(&[flag]);
        assert_eq!(output.status.code(), Some(0));
        assert_eq!(
            text(&output.stdout),
            format!("csi-provisioner {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn unknown_flags_exit_2_naming_the_flag() {
    for (args, name) in [
        (&["--no-such-flag"][..], "no-such-flag"),
        (&["-no-such-flag=1"], "no-such-flag"),
        // A flag of an old upstream release, removed since.
        (&["-csi-address=/x", "--provisioner", "x"], "provisioner"),
    ] {
        let output = run(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains(name),
            "stderr does not name {name}: {stderr}"
        );
    }
}

#[test]
fn bad_values_exit_2_naming_the_flag() {
    for (args, name) in [
        (&["-timeout=10"][..], "timeout"),
        (&["--leader-election=yes"], "leader-election"),
        (&["--feature-gates=NoSuchGate=true"], "NoSuchGate"),
        (&["--worker-threads", "many"], "worker-threads"),
    ] {
        let output = run(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            text(&output.stderr).contains(name),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
}

#[test]
fn invalid_configurations_exit_1_with_the_reason() {
    let output = run(&["--node-deployment"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("NODE_NAME") && stderr.contains("--node-deployment"),
        "{stderr}"
    );

    let output = run(&["-http-endpoint=:8080", "-metrics-address=:8081"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("cannot both be set"));
}

/// Waits for the first stderr line containing `needle` (the process may keep running, e.g.
/// waiting for its CSI socket), then stops the process.
fn wait_for_stderr_line(
    mut command: Command,
    needle: &str,
    deadline: Duration,
) -> Result<String, String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    let found = loop {
        let remaining = deadline.saturating_sub(start.elapsed());
        match lines_rx.recv_timeout(remaining) {
            Ok(line) if line.contains(needle) => break Ok(line),
            Ok(line) => seen.push(line),
            // Timed out, or stderr closed (the process exited) without the line.
            Err(_) => break Err(seen.join("\n")),
        }
    };
    let _ = child.kill();
    let status = child.wait().unwrap();
    found.map_err(|seen| {
        format!("no line containing {needle:?} (exit status {status}); stderr was:\n{seen}")
    })
}

#[test]
fn go_single_dash_command_lines_get_past_parsing() {
    // The warning is logged after parsing, validation and logging set-up: proof that this manifest-
    // style command line was accepted, whatever the program does next (it would wait for a CSI
    // socket that does not exist).
    let command = sidecar(&[
        "-v=5",
        "-csi-address=/nonexistent/csi.sock",
        "-timeout=1s",
        "-kube-api-qps",
        "20",
        "-leader-election-namespace",
        "kube-system",
        "-feature-gates=Topology=true",
        "-strict-topology",
        "-enable-pprof",
        "--master=http://127.0.0.1:1",
    ]);
    let line = wait_for_stderr_line(
        command,
        "--enable-pprof is not yet supported",
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(
        line.contains("flag --enable-pprof is not yet supported, ignored"),
        "{line}"
    );
}

#[test]
fn json_logging_format_writes_json_lines() {
    let command = sidecar(&[
        "--logging-format=json",
        "--enable-pprof",
        "--master=http://127.0.0.1:1",
    ]);
    let line = wait_for_stderr_line(command, "enable-pprof", Duration::from_secs(30)).unwrap();
    let value: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|err| panic!("{err}: {line}"));
    assert_eq!(value["level"], "WARN");
    assert_eq!(
        value["message"],
        "flag --enable-pprof is not yet supported, ignored"
    );
}

#[test]
fn the_flags_reference_has_a_row_for_every_flag() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md")).unwrap();
    for flag in UPSTREAM_FLAGS.iter().chain(&[
        "deleted-node-grace-period",
        "deleted-node-pvc-cleanup",
        "node-deployment-intent-journal",
    ]) {
        let row = format!("| `--{flag}` |");
        let v_row = *flag == "v" && readme.contains("| `-v`, `--v` |");
        assert!(
            readme.contains(&row) || v_row,
            "docs/flags.md has no flags-table row {row}"
        );
    }
}
