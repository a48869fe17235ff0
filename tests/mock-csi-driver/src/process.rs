//! Running the `mock-csi-driver` binary from other crates' tests: finding it in the cargo target
//! directory, starting it with a control socket, and stopping, killing or restarting it.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use crate::control::{ControlClient, ControlError};

/// Environment variable that overrides where the binary is looked for.
pub const BINARY_ENV: &str = "MOCK_CSI_DRIVER_BIN";

/// How long [`MockDriverProcess::spawn`] waits for the control socket to answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the driver process could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(
        "mock-csi-driver binary not found at {0}; build it first (`cargo build -p mock-csi-driver`) or set {BINARY_ENV}"
    )]
    NotFound(PathBuf),
    #[error("cannot start or signal {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mock-csi-driver exited during start-up with {0}; see its stderr above")]
    ExitedEarly(ExitStatus),
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// The `mock-csi-driver` binary: `$MOCK_CSI_DRIVER_BIN`, else next to the running test
/// executable's profile directory (`target/<profile>/deps/<test>` → `target/<profile>/mock-csi-driver`).
pub fn binary_path() -> Result<PathBuf, ProcessError> {
    if let Some(p) = std::env::var_os(BINARY_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(ProcessError::NotFound(p))
        };
    }
    let exe = std::env::current_exe().map_err(|source| ProcessError::Spawn {
        binary: "current_exe".into(),
        source,
    })?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let candidate = dir.join("mock-csi-driver");
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(ProcessError::NotFound(candidate))
    }
}

/// A running `mock-csi-driver` process with a connected control client. The process is killed
/// when this is dropped.
#[derive(Debug)]
pub struct MockDriverProcess {
    child: tokio::process::Child,
    endpoint: PathBuf,
    control: ControlClient,
}

impl MockDriverProcess {
    /// Starts the binary with `--endpoint unix://<endpoint> --control <control>` plus `args`
    /// (e.g. `--nodeid n1 --topology --state-file ...`), and waits until the control socket
    /// answers. stdout/stderr are inherited so the driver's log shows in test output.
    pub async fn spawn(
        endpoint: &Path,
        control: &Path,
        args: &[String],
    ) -> Result<Self, ProcessError> {
        Self::spawn_inner(endpoint, control, args, None).await
    }

    /// Like [`MockDriverProcess::spawn`], with stdout and stderr appended to `log`.
    pub async fn spawn_logging_to(
        endpoint: &Path,
        control: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Self, ProcessError> {
        Self::spawn_inner(endpoint, control, args, Some(log)).await
    }

    async fn spawn_inner(
        endpoint: &Path,
        control: &Path,
        args: &[String],
        log: Option<&Path>,
    ) -> Result<Self, ProcessError> {
        let binary = binary_path()?;
        let io_err = |source| ProcessError::Spawn {
            binary: binary.clone(),
            source,
        };
        let mut cmd = tokio::process::Command::new(&binary);
        cmd.arg("--endpoint")
            .arg(format!("unix://{}", endpoint.display()))
            .arg("--control")
            .arg(control)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(log) = log {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(io_err)?;
            cmd.stdout(file.try_clone().map_err(io_err)?).stderr(file);
        }
        let mut child = cmd.spawn().map_err(io_err)?;
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        let control = loop {
            if let Some(status) = child.try_wait().map_err(io_err)? {
                return Err(ProcessError::ExitedEarly(status));
            }
            // A stale socket file from an earlier run may still exist: only a driver that answers
            // `state` counts as started.
            if let Ok(c) = ControlClient::connect(control).await
                && c.state().await.is_ok()
            {
                break c;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ControlError::Connect {
                    path: control.to_owned(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no answer within 30s",
                    ),
                }
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Ok(MockDriverProcess {
            child,
            endpoint: endpoint.to_owned(),
            control,
        })
    }

    /// The CSI socket path.
    pub fn endpoint(&self) -> &Path {
        &self.endpoint
    }

    /// The control client.
    pub fn control(&self) -> &ControlClient {
        &self.control
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub async fn terminate(mut self) -> Result<ExitStatus, ProcessError> {
        if let Some(pid) = self.child.id() {
            let status = tokio::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await
                .map_err(|source| ProcessError::Spawn {
                    binary: "kill".into(),
                    source,
                })?;
            if !status.success() {
                tracing::warn!(pid, "kill -TERM failed; the process may already be gone");
            }
        }
        self.wait().await
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub async fn kill(mut self) -> Result<ExitStatus, ProcessError> {
        let binary = PathBuf::from("mock-csi-driver");
        self.child
            .start_kill()
            .map_err(|source| ProcessError::Spawn {
                binary: binary.clone(),
                source,
            })?;
        self.wait().await
    }

    /// Waits for the process to exit on its own (e.g. after a crash fault).
    pub async fn wait(&mut self) -> Result<ExitStatus, ProcessError> {
        self.child
            .wait()
            .await
            .map_err(|source| ProcessError::Spawn {
                binary: "mock-csi-driver".into(),
                source,
            })
    }
}
