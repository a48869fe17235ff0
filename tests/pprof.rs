//! `--enable-pprof` on the real binary: the profile and command line it serves, and what a
//! profile request answers when the sampler cannot be created.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");

/// The running sidecar; killed when the test ends, however it ends.
struct Sidecar {
    child: Child,
    address: String,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the sidecar with `args` (it then waits for a CSI socket that never comes) and returns
/// once its HTTP server listens.
fn start(args: &[&str], env: &[(&str, &str)]) -> Sidecar {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .args([
            "--http-endpoint=127.0.0.1:0",
            "--master=http://127.0.0.1:1",
            "--csi-address=/nonexistent/csi.sock",
        ])
        .env_remove("RUST_LOG")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut sidecar = Sidecar {
        child,
        address: String::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while sidecar.address.is_empty() {
        let line = lines_rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|err| panic!("not listening ({err}); stderr:\n{}", seen.join("\n")));
        if line.contains("HTTP server listening") {
            sidecar.address = line
                .split("address=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .to_owned();
        }
        seen.push(line);
    }
    sidecar
}

/// A minimal HTTP/1.1 GET: (status, body).
fn get(address: &str, path: &str) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .unwrap();
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, response[split + 4..].to_vec())
}

#[test]
fn serves_a_gzipped_cpu_profile_and_the_command_line() {
    let sidecar = start(&["--enable-pprof", "-v=2"], &[]);
    let (status, body) = get(&sidecar.address, "/debug/pprof/profile?seconds=1");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(&body[..2], [0x1f, 0x8b], "gzip, as Go serves it");

    let (status, body) = get(&sidecar.address, "/debug/pprof/cmdline");
    assert_eq!(status, 200);
    let argv: Vec<&[u8]> = body.split(|&b| b == 0).collect();
    assert_eq!(argv[0], BIN.as_bytes());
    assert_eq!(&argv[1..3], [b"--enable-pprof".as_slice(), b"-v=2"]);
}

#[test]
fn without_a_writable_temp_dir_the_profile_request_says_what_to_do() {
    let sidecar = start(&["--enable-pprof"], &[("TMPDIR", "/nonexistent/tmp")]);
    let (status, body) = get(&sidecar.address, "/debug/pprof/profile?seconds=1");
    let body = String::from_utf8(body).unwrap();
    assert_eq!(status, 500, "{body}");
    assert!(
        body.starts_with(
            "Could not enable CPU profiling: the profiler could not be created: it needs a \
             writable temporary directory"
        ),
        "{body}"
    );
}
