//! Serving: socket binding (stale sockets removed), the gRPC server on a Unix socket, the
//! in-process [`MockDriver`] on its own runtime thread, and [`run`] for the binary.

use std::future::Future;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::config::{Config, ConfigError, ControllerCap, CrashAction, FaultRule, Misbehaviour};
use crate::control::{self, ControlRequest, ControlResponse};
use crate::csi::v1::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
};
use crate::driver::{Driver, StateDump};
use crate::service::Service;
use crate::store::StoreError;

/// How long the binary waits for open connections after SIGTERM before it exits anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a driver could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    State(#[from] StoreError),
    #[error(
        "{path} exists and is not a socket; refusing to replace it (choose another --endpoint/--control path)"
    )]
    NotASocket { path: PathBuf },
    #[error("cannot bind Unix socket {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the driver runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Binds a Unix socket at `path`, first removing a stale socket left by an earlier run and
/// creating missing parent directories.
pub fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, StartError> {
    let bind_err = |source| StartError::Bind {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(bind_err)?,
        Ok(_) => {
            return Err(StartError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(bind_err)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    Ok(listener)
}

/// Serves Identity, Controller and Node on `listener` until `shutdown` resolves.
pub async fn serve(
    driver: Arc<Driver>,
    listener: UnixListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let svc = Service(driver);
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(svc.clone()))
        .add_service(ControllerServer::new(svc.clone()))
        .add_service(NodeServer::new(svc))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
}

fn to_tokio(
    listener: std::os::unix::net::UnixListener,
    path: &Path,
) -> Result<UnixListener, StartError> {
    UnixListener::from_std(listener).map_err(|source| StartError::Bind {
        path: path.to_owned(),
        source,
    })
}

/// Runs the driver as the binary does: serves the CSI socket and the control socket until
/// `shutdown` resolves, then drains connections (up to 5 s) and removes the socket files. A
/// crash fault exits the process from inside.
pub async fn run(mut config: Config, shutdown: impl Future<Output = ()>) -> Result<(), StartError> {
    config.validate()?;
    config.crash_action = CrashAction::ExitProcess;
    let driver = Arc::new(Driver::new(config)?);
    let grpc = to_tokio(bind(&driver.config.endpoint)?, &driver.config.endpoint)?;
    let control_task = match &driver.config.control {
        Some(path) => Some(tokio::spawn(control::serve(
            Arc::clone(&driver),
            to_tokio(bind(path)?, path)?,
        ))),
        None => None,
    };
    tracing::info!(
        endpoint = %driver.config.endpoint.display(),
        driver = %driver.config.driver_name,
        node = %driver.config.node_id,
        topology = driver.config.topology,
        volumes = driver.store().volume_count(),
        "mock CSI driver serving"
    );
    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
    let server = serve(Arc::clone(&driver), grpc, async move {
        shutdown.await;
        tracing::info!("shutting down");
        let _ = drain_tx.send(());
    });
    let result = tokio::select! {
        r = server => r.map_err(StartError::from),
        () = async {
            // Graceful shutdown waits for clients to hang up; do not let one keep us alive.
            if drain_rx.await.is_ok() {
                tokio::time::sleep(DRAIN_TIMEOUT).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => Ok(()),
    };
    if let Some(task) = control_task {
        task.abort();
    }
    remove_sockets(&driver.config);
    result
}

fn remove_sockets(config: &Config) {
    for path in std::iter::once(&config.endpoint).chain(config.control.as_ref()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Starts in-process mock drivers.
#[derive(Debug)]
pub struct MockDriver;

impl MockDriver {
    /// Binds the CSI socket (and the control socket, if configured) and serves them on a
    /// dedicated thread with its own runtime. Clients may connect as soon as this returns.
    ///
    /// A crash fault stops that runtime, which closes every connection without an answer; the
    /// state file (if any) already holds the new volume, so a driver started again on it knows
    /// the volume.
    pub fn start(mut config: Config) -> Result<MockDriverHandle, StartError> {
        config.validate()?;
        if config.crash_action == CrashAction::ExitProcess {
            // Exiting would end the test process that embeds the driver.
            config.crash_action = CrashAction::StopServer;
        }
        let driver = Arc::new(Driver::new(config)?);
        let grpc = bind(&driver.config.endpoint)?;
        let control = driver.config.control.as_deref().map(bind).transpose()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(StartError::Runtime)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread_driver = Arc::clone(&driver);
        let thread = std::thread::Builder::new()
            .name("mock-csi-driver".into())
            .spawn(move || serve_in_thread(runtime, thread_driver, grpc, control, stop_rx))
            .map_err(StartError::Runtime)?;
        Ok(MockDriverHandle {
            driver,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }
}

fn serve_in_thread(
    runtime: tokio::runtime::Runtime,
    driver: Arc<Driver>,
    grpc: std::os::unix::net::UnixListener,
    control: Option<std::os::unix::net::UnixListener>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    runtime.block_on(async {
        let endpoint = driver.config.endpoint.clone();
        let grpc = match to_tokio(grpc, &endpoint) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "mock driver cannot serve");
                return;
            }
        };
        if let Some(l) = control {
            match UnixListener::from_std(l) {
                Ok(l) => drop(tokio::spawn(control::serve(Arc::clone(&driver), l))),
                Err(e) => {
                    tracing::error!(error = %e, "mock driver cannot serve its control socket")
                }
            }
        }
        tokio::select! {
            r = serve(Arc::clone(&driver), grpc, std::future::pending()) => {
                if let Err(e) = r {
                    tracing::error!(error = %e, "mock driver gRPC server failed");
                }
            }
            _ = stop => {}
            () = driver.crashed() => {}
        }
    });
    // Dropping the runtime cancels every connection task: clients see the socket close, as when
    // a real driver process dies.
    runtime.shutdown_background();
    remove_sockets(&driver.config);
}

/// A running in-process mock driver. Dropping it stops the driver and removes its sockets.
#[derive(Debug)]
pub struct MockDriverHandle {
    driver: Arc<Driver>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MockDriverHandle {
    /// The CSI socket path.
    pub fn endpoint(&self) -> &Path {
        &self.driver.config.endpoint
    }

    /// The driver's configuration.
    pub fn config(&self) -> &Config {
        &self.driver.config
    }

    /// Applies a control command, exactly as the control socket would.
    pub fn apply(&self, req: ControlRequest) -> ControlResponse {
        control::apply(&self.driver, req)
    }

    /// Volumes, snapshots, pools, call counts and switches.
    pub fn state(&self) -> StateDump {
        self.driver.dump()
    }

    /// Injects errors into `method` (or `*`).
    pub fn set_fault(&self, method: &str, rule: FaultRule) -> Result<(), ConfigError> {
        let method = crate::config::canonical_method(method)?;
        self.driver.faults.set_fault(method, rule);
        Ok(())
    }

    /// Removes all error rules and latencies, probe not-ready and the crash countdown.
    pub fn clear_faults(&self) {
        self.driver.faults.clear_faults();
    }

    /// Delays every call to `method` (or `*`); zero removes the delay.
    pub fn set_latency(&self, method: &str, latency: Duration) -> Result<(), ConfigError> {
        let method = crate::config::canonical_method(method)?;
        self.driver.faults.set_latency(method, latency);
        Ok(())
    }

    /// Probe answers not-ready for the next `count` probes and for `duration`.
    pub fn set_probe_not_ready(&self, count: u64, duration: Duration) {
        self.driver.faults.set_probe_not_ready(count, duration);
    }

    /// Crash after the `count`th next new volume (`None` disarms).
    pub fn set_crash_after_create(&self, count: Option<u64>) {
        self.driver.faults.set_crash_after_create(count);
    }

    /// Switches a controller capability on or off.
    pub fn set_capability(&self, cap: ControllerCap, enabled: bool) {
        self.driver.faults.set_capability(cap, enabled);
    }

    /// Switches a misbehaviour on or off.
    pub fn set_misbehaviour(&self, m: Misbehaviour, enabled: bool) {
        self.driver.faults.set_misbehaviour(m, enabled);
    }

    /// Forgets the call counts.
    pub fn reset_counts(&self) {
        self.driver.faults.reset_counts();
    }

    /// Whether a crash fault fired (the driver then stops serving).
    pub fn has_crashed(&self) -> bool {
        self.driver.has_crashed()
    }

    /// Stops serving, closes every connection and removes the sockets.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MockDriverHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}
