//! The control socket: newline-delimited JSON commands (`{"cmd":"state"}`, `set_fault`, ...) that
//! flip the fault switches and dump state at run time, its server, and the typed async client.
//!
//! One request per line, one response per line: `{"ok":true,"state":{...}}` for `state`,
//! `{"ok":true}` for switches, `{"ok":false,"error":"..."}` when a command is rejected.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::config::{
    ConfigError, ControllerCap, FaultRule, Misbehaviour, canonical_method, socket_path,
};
use crate::driver::{Driver, StateDump};

/// A control command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum ControlRequest {
    /// Dump volumes, snapshots, pools, call counts and switches.
    State,
    /// Inject errors into `method` (a CSI method name or `*`), replacing its current rule.
    SetFault {
        /// CSI method, e.g. `CreateVolume`, or `*`.
        method: String,
        /// Code, trigger and timing.
        rule: FaultRule,
    },
    /// Remove the error rule of `method`.
    ClearFault {
        /// CSI method or `*`.
        method: String,
    },
    /// Remove all error rules and latencies, probe not-ready and the crash countdown.
    ClearFaults,
    /// Delay every call to `method` (or `*`); 0 removes the delay.
    SetLatency {
        /// CSI method or `*`.
        method: String,
        /// Delay in milliseconds.
        latency_ms: u64,
    },
    /// Report `ready: false` for the next `count` probes and for `duration_ms` from now.
    SetProbeNotReady {
        /// Probes to answer not-ready.
        #[serde(default)]
        count: u64,
        /// Milliseconds to answer not-ready.
        #[serde(default)]
        duration_ms: u64,
    },
    /// Crash after the `count`th next newly created volume is persisted, before answering;
    /// `null` disarms.
    SetCrashAfterCreate {
        /// 1 = the next new volume.
        count: Option<u64>,
    },
    /// Switch a controller capability on or off.
    SetCapability {
        /// e.g. `CLONE_VOLUME`.
        capability: ControllerCap,
        /// On or off.
        enabled: bool,
    },
    /// Switch a deliberate spec violation on or off.
    SetMisbehaviour {
        /// e.g. `non-idempotent-create`.
        misbehaviour: Misbehaviour,
        /// On or off.
        enabled: bool,
    },
    /// Forget the call counts.
    ResetCounts,
    /// Hold the `nth` next call of `method` before or after its effect (a crash point).
    SetHold {
        /// CSI method, e.g. `CreateVolume`.
        method: String,
        /// 1 = the next call.
        nth: u64,
        /// `before` or `after` the effect.
        when: crate::holds::HoldWhen,
    },
    /// Release the hold of `method`: the call goes on, or (`apply: false`, held before its
    /// effect) is answered UNAVAILABLE without running.
    ReleaseHold {
        /// CSI method.
        method: String,
        /// Whether the held call goes on.
        #[serde(default = "yes")]
        apply: bool,
    },
}

fn yes() -> bool {
    true
}

/// A control response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlResponse {
    /// Whether the command was applied.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The dump, for `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Box<StateDump>>,
}

impl ControlResponse {
    fn ok() -> Self {
        ControlResponse {
            ok: true,
            error: None,
            state: None,
        }
    }

    fn error(e: impl ToString) -> Self {
        ControlResponse {
            ok: false,
            error: Some(e.to_string()),
            state: None,
        }
    }
}

/// Applies one command to a driver (shared by the socket and in-process handles).
pub fn apply(driver: &Driver, req: ControlRequest) -> ControlResponse {
    let f = &driver.faults;
    let method = |m: &str| canonical_method(m);
    let result: Result<(), ConfigError> = match req {
        ControlRequest::State => {
            return ControlResponse {
                ok: true,
                error: None,
                state: Some(Box::new(driver.dump())),
            };
        }
        ControlRequest::SetFault { method: m, rule } => method(&m).map(|m| f.set_fault(m, rule)),
        ControlRequest::ClearFault { method: m } => method(&m).map(|m| f.set_fault_cleared(m)),
        ControlRequest::ClearFaults => {
            f.clear_faults();
            Ok(())
        }
        ControlRequest::SetLatency {
            method: m,
            latency_ms,
        } => method(&m).map(|m| f.set_latency(m, Duration::from_millis(latency_ms))),
        ControlRequest::SetProbeNotReady { count, duration_ms } => {
            f.set_probe_not_ready(count, Duration::from_millis(duration_ms));
            Ok(())
        }
        ControlRequest::SetCrashAfterCreate { count } => {
            f.set_crash_after_create(count);
            Ok(())
        }
        ControlRequest::SetCapability {
            capability,
            enabled,
        } => {
            f.set_capability(capability, enabled);
            Ok(())
        }
        ControlRequest::SetMisbehaviour {
            misbehaviour,
            enabled,
        } => {
            f.set_misbehaviour(misbehaviour, enabled);
            Ok(())
        }
        ControlRequest::ResetCounts => {
            f.reset_counts();
            Ok(())
        }
        ControlRequest::SetHold {
            method: m,
            nth,
            when,
        } => method(&m).map(|m| driver.holds.set(m, nth, when)),
        ControlRequest::ReleaseHold { method: m, apply } => method(&m).map(|m| {
            driver.holds.release(m, apply);
        }),
    };
    match result {
        Ok(()) => ControlResponse::ok(),
        Err(e) => ControlResponse::error(e),
    }
}

/// Serves the control socket until the listener fails or the task is dropped.
pub async fn serve(driver: Arc<Driver>, listener: tokio::net::UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(connection(Arc::clone(&driver), stream));
            }
            Err(e) => {
                tracing::warn!(error = %e, "control socket: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn connection(driver: Arc<Driver>, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        let response = match serde_json::from_str::<ControlRequest>(&line) {
            Ok(req) => apply(&driver, req),
            Err(e) => ControlResponse::error(format!(
                "invalid control command ({e}); send one JSON object per line, e.g. {{\"cmd\":\"state\"}}"
            )),
        };
        let mut out = match serde_json::to_vec(&response) {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(error = %e, "control socket: cannot encode response");
                return;
            }
        };
        out.push(b'\n');
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(
        "cannot connect to the mock driver control socket {path}: {source} (is the driver running with --control {path}?)"
    )]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("control socket I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("control socket closed the connection without answering")]
    Closed,
    #[error("control socket sent an unreadable response: {0}")]
    Protocol(#[from] serde_json::Error),
    #[error("the mock driver rejected the command: {0}")]
    Rejected(String),
}

/// Typed client of the control socket.
#[derive(Debug)]
pub struct ControlClient {
    path: PathBuf,
    conn: tokio::sync::Mutex<(tokio::io::Lines<BufReader<OwnedReadHalf>>, OwnedWriteHalf)>,
}

impl ControlClient {
    /// Connects to the control socket at `path` (a path or `unix://` URL).
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, ControlError> {
        let path = socket_path(&path.as_ref().to_string_lossy());
        let stream = UnixStream::connect(&path)
            .await
            .map_err(|source| ControlError::Connect {
                path: path.clone(),
                source,
            })?;
        let (read, write) = stream.into_split();
        Ok(ControlClient {
            path,
            conn: tokio::sync::Mutex::new((BufReader::new(read).lines(), write)),
        })
    }

    /// Connects, retrying until `timeout` while the socket does not exist yet or refuses (the
    /// driver process is still starting).
    pub async fn connect_with_timeout(
        path: impl AsRef<Path>,
        timeout: Duration,
    ) -> Result<Self, ControlError> {
        let deadline = Instant::now() + timeout;
        loop {
            match Self::connect(path.as_ref()).await {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one command and returns the response; a rejected command is an error.
    pub async fn request(&self, req: &ControlRequest) -> Result<ControlResponse, ControlError> {
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        let mut conn = self.conn.lock().await;
        conn.1.write_all(&line).await?;
        let answer = conn.0.next_line().await?.ok_or(ControlError::Closed)?;
        let response: ControlResponse = serde_json::from_str(&answer)?;
        if response.ok {
            Ok(response)
        } else {
            Err(ControlError::Rejected(response.error.unwrap_or_default()))
        }
    }

    async fn send(&self, req: ControlRequest) -> Result<(), ControlError> {
        self.request(&req).await.map(drop)
    }

    /// Volumes, snapshots, pools, call counts and switches.
    pub async fn state(&self) -> Result<StateDump, ControlError> {
        let response = self.request(&ControlRequest::State).await?;
        response.state.map(|s| *s).ok_or(ControlError::Closed)
    }

    /// Injects errors into `method` (or `*`).
    pub async fn set_fault(&self, method: &str, rule: FaultRule) -> Result<(), ControlError> {
        self.send(ControlRequest::SetFault {
            method: method.to_owned(),
            rule,
        })
        .await
    }

    /// Removes the error rule of `method`.
    pub async fn clear_fault(&self, method: &str) -> Result<(), ControlError> {
        self.send(ControlRequest::ClearFault {
            method: method.to_owned(),
        })
        .await
    }

    /// Removes all error rules and latencies, probe not-ready and the crash countdown.
    pub async fn clear_faults(&self) -> Result<(), ControlError> {
        self.send(ControlRequest::ClearFaults).await
    }

    /// Delays every call to `method` (or `*`); zero removes the delay.
    pub async fn set_latency(&self, method: &str, latency: Duration) -> Result<(), ControlError> {
        let latency_ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        self.send(ControlRequest::SetLatency {
            method: method.to_owned(),
            latency_ms,
        })
        .await
    }

    /// Probe answers not-ready for the next `count` probes and for `duration`.
    pub async fn set_probe_not_ready(
        &self,
        count: u64,
        duration: Duration,
    ) -> Result<(), ControlError> {
        let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        self.send(ControlRequest::SetProbeNotReady { count, duration_ms })
            .await
    }

    /// Crash after the `count`th next new volume (`None` disarms).
    pub async fn set_crash_after_create(&self, count: Option<u64>) -> Result<(), ControlError> {
        self.send(ControlRequest::SetCrashAfterCreate { count })
            .await
    }

    /// Switches a controller capability on or off.
    pub async fn set_capability(
        &self,
        capability: ControllerCap,
        enabled: bool,
    ) -> Result<(), ControlError> {
        self.send(ControlRequest::SetCapability {
            capability,
            enabled,
        })
        .await
    }

    /// Switches a misbehaviour on or off.
    pub async fn set_misbehaviour(
        &self,
        misbehaviour: Misbehaviour,
        enabled: bool,
    ) -> Result<(), ControlError> {
        self.send(ControlRequest::SetMisbehaviour {
            misbehaviour,
            enabled,
        })
        .await
    }

    /// Forgets the call counts.
    pub async fn reset_counts(&self) -> Result<(), ControlError> {
        self.send(ControlRequest::ResetCounts).await
    }

    /// Holds the `nth` next call of `method` before or after its effect.
    pub async fn set_hold(
        &self,
        method: &str,
        nth: u64,
        when: crate::holds::HoldWhen,
    ) -> Result<(), ControlError> {
        self.send(ControlRequest::SetHold {
            method: method.to_owned(),
            nth,
            when,
        })
        .await
    }

    /// Releases the hold of `method` (`apply: false` drops a call held before its effect).
    pub async fn release_hold(&self, method: &str, apply: bool) -> Result<(), ControlError> {
        self.send(ControlRequest::ReleaseHold {
            method: method.to_owned(),
            apply,
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Trigger;

    #[test]
    fn commands_have_a_stable_readable_json_form() {
        let req: ControlRequest = serde_json::from_str(
            r#"{"cmd":"set_fault","method":"CreateVolume","rule":{"code":"UNAVAILABLE","trigger":{"kind":"count","remaining":2}}}"#,
        )
        .unwrap();
        assert_eq!(
            req,
            ControlRequest::SetFault {
                method: "CreateVolume".into(),
                rule: FaultRule {
                    code: tonic::Code::Unavailable,
                    trigger: Trigger::Count { remaining: 2 },
                    after: false
                },
            }
        );
        let req: ControlRequest = serde_json::from_str(
            r#"{"cmd":"set_capability","capability":"CLONE_VOLUME","enabled":false}"#,
        )
        .unwrap();
        assert_eq!(
            req,
            ControlRequest::SetCapability {
                capability: ControllerCap::CloneVolume,
                enabled: false
            }
        );
        assert_eq!(
            serde_json::to_string(&ControlRequest::State).unwrap(),
            r#"{"cmd":"state"}"#
        );
    }

    #[test]
    fn unknown_methods_are_rejected_with_the_valid_names() {
        let driver = Driver::new(crate::Config::new("/unused", "n1")).unwrap();
        let r = apply(
            &driver,
            ControlRequest::SetLatency {
                method: "CreateVolumes".into(),
                latency_ms: 1,
            },
        );
        assert!(!r.ok);
        assert!(r.error.unwrap().contains("CreateVolume,"));
    }
}
