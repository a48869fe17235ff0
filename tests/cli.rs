//! Binary-level command-line compatibility: `--help` lists upstream's flags, `--version`, exit codes
//! of usage and configuration errors, Go-style single-dash command lines getting past parsing, and
//! the logging flags that only show on the real process's streams.

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
    // The line is logged after parsing, validation and logging set-up: proof that this manifest-
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
        "-vmodule=controller=6",
        "-http-endpoint=127.0.0.1:0",
        "-enable-pprof",
        "--master=http://127.0.0.1:1",
    ]);
    let line =
        wait_for_stderr_line(command, "Starting profiling", Duration::from_secs(30)).unwrap();
    assert!(line.contains("endpoint=127.0.0.1:0"), "{line}");
}

#[test]
fn json_logging_format_writes_json_lines() {
    let command = sidecar(&[
        "--logging-format=json",
        "--http-endpoint=127.0.0.1:0",
        "--enable-pprof",
        "--master=http://127.0.0.1:1",
        "--csi-address=/nonexistent/csi.sock",
    ]);
    let line =
        wait_for_stderr_line(command, "Starting profiling", Duration::from_secs(30)).unwrap();
    let value: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|err| panic!("{err}: {line}"));
    assert_eq!(value["level"], "INFO");
    assert_eq!(value["message"], "Starting profiling");
    assert_eq!(value["endpoint"], "127.0.0.1:0");
}

#[test]
fn vmodule_with_json_is_refused_as_upstream() {
    let output = run(&["--logging-format=json", "--vmodule=controller=5"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("vmodule: Forbidden: Only supported for text log format"),
        "{stderr}"
    );
    let output = run(&["--vmodule=controller"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("\"controller\" does not have the pattern=N format"),
        "{stderr}"
    );
}

#[test]
fn split_stream_puts_info_on_stdout_and_errors_on_stderr() {
    let mut child = sidecar(&[
        "--log-text-split-stream",
        "--http-endpoint=127.0.0.1:0",
        "--master=http://127.0.0.1:1",
        "--csi-address=/nonexistent/csi.sock",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    // Running: it waits for the CSI socket. A SIGTERM then makes it log an error and exit.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut stdout_lines = Vec::new();
    while !stdout_lines
        .iter()
        .any(|line: &String| line.contains("HTTP server listening"))
    {
        let remaining = deadline.saturating_duration_since(std::time::Instant::now());
        match lines_rx.recv_timeout(remaining) {
            Ok(line) => stdout_lines.push(line),
            Err(err) => {
                let _ = child.kill();
                panic!("no info line on stdout ({err}): {stdout_lines:?}");
            }
        }
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit_deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > exit_deadline {
            let _ = child.kill();
            panic!("still running 30 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    reader.join().unwrap();
    stdout_lines.extend(lines_rx.try_iter());
    assert!(
        stderr.contains("ERROR") && stderr.contains("shutdown requested"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("INFO"),
        "info lines stay off stderr: {stderr}"
    );
    assert!(
        stdout_lines.iter().all(|line| !line.contains("ERROR")),
        "{stdout_lines:?}"
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
