//! The gRPC channel to the driver's Unix socket: waits (with capped backoff) until the socket accepts,
//! and reconnects lazily through the same connector after the driver restarts.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::{Channel, Uri};
use tower::service_fn;
use tracing::info;

use super::endpoint::Endpoint;

/// How [`connect`] waits.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// Set to `true` to stop waiting (SIGTERM during start-up).
    pub shutdown: watch::Receiver<bool>,
    /// How often to repeat the "waiting for CSI driver socket" line.
    pub log_interval: Duration,
    /// Longest pause between two attempts. Upstream's reconnect backoff is capped at 1 s.
    pub max_backoff: Duration,
    /// Give up on one attempt after this long (a socket whose owner never answers the handshake).
    pub attempt_timeout: Duration,
}

impl ConnectOptions {
    /// Defaults: log every 10 s, retry at most every 1 s, 10 s per attempt.
    pub fn new(shutdown: watch::Receiver<bool>) -> Self {
        Self {
            shutdown,
            log_interval: Duration::from_secs(10),
            max_backoff: Duration::from_secs(1),
            attempt_timeout: Duration::from_secs(10),
        }
    }
}

/// Why [`connect`] returned without a channel.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Shutdown was requested before the driver's socket accepted a connection.
    #[error("shutdown requested while waiting for CSI driver socket {0}")]
    Cancelled(PathBuf),
}

/// Connects to the driver at `endpoint`, waiting as long as it takes (or until shutdown).
///
/// While the socket is missing or refuses, it retries with capped exponential backoff and logs at
/// info, about every `log_interval`, what it waits for. The returned channel dials the same path again
/// whenever its connection breaks, so calls made after a driver restart reach the new driver.
pub async fn connect(endpoint: Endpoint, options: ConnectOptions) -> Result<Channel, ConnectError> {
    let ConnectOptions {
        mut shutdown,
        log_interval,
        max_backoff,
        attempt_timeout,
    } = options;
    let path = endpoint.path().to_path_buf();
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(max_backoff)
        .with_jitter()
        .without_max_times()
        .build();
    let mut last_logged: Option<Instant> = None;

    loop {
        if *shutdown.borrow() {
            return Err(ConnectError::Cancelled(path));
        }
        let attempt = tokio::time::timeout(attempt_timeout, connect_once(&path));
        let reason = tokio::select! {
            result = attempt => match result {
                Ok(Ok(channel)) => {
                    info!(socket = %path.display(), "connected to CSI driver socket {}", path.display());
                    return Ok(channel);
                }
                Ok(Err(err)) => describe_error(&*err),
                Err(_) => format!("no answer within {attempt_timeout:?}"),
            },
            () = shutdown_requested(&mut shutdown) => return Err(ConnectError::Cancelled(path)),
        };
        if last_logged.is_none_or(|at| at.elapsed() >= log_interval) {
            info!(socket = %path.display(), "waiting for CSI driver socket {}: {reason}", path.display());
            last_logged = Some(Instant::now());
        }
        let delay = delays.next().unwrap_or(max_backoff);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown_requested(&mut shutdown) => return Err(ConnectError::Cancelled(path)),
        }
    }
}

/// One eager connection attempt; the channel keeps the connector for later reconnects.
async fn connect_once(path: &Path) -> Result<Channel, Box<dyn Error + Send + Sync>> {
    let path = path.to_path_buf();
    let connector = service_fn(move |_: Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    });
    // The URI is required by the API but unused: the connector decides where to dial.
    Ok(tonic::transport::Endpoint::from_static("http://csi.sock")
        .connect_with_connector(connector)
        .await?)
}

/// Resolves when shutdown is requested; never, if the sender is gone (nobody can request it).
pub(crate) async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A one-line cause for logs and status messages: the OS error if there is one ("No such file or
/// directory"), otherwise the error chain joined with ": ".
pub(crate) fn describe_error(err: &(dyn Error + 'static)) -> String {
    let mut current: Option<&(dyn Error + 'static)> = Some(err);
    let mut parts: Vec<String> = Vec::new();
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return strip_os_error_suffix(&io.to_string()).to_owned();
        }
        let text = e.to_string();
        // Wrappers often repeat their source's text; keep each piece once.
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        current = e.source();
    }
    parts.join(": ")
}

/// "No such file or directory (os error 2)" → "No such file or directory".
fn strip_os_error_suffix(text: &str) -> &str {
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => &text[..at],
        _ => text,
    }
}

#[cfg(test)]
#[path = "connect_tests.rs"]
mod tests;
