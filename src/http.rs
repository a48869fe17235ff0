//! HTTP server on `--http-endpoint`: metrics and health endpoints.
//!
//! - `GET <--metrics-path>`: every registered family, Prometheus text 0.0.4, or OpenMetrics when
//!   the `Accept` header asks for it.
//! - `GET /healthz`: `ok` while the process serves.
//! - `GET /healthz/rbac`: `ok`, or 500 naming each permission the start-up RBAC self-check found
//!   missing (see `k8s::access`).
//! - `GET /debug/pprof/...`: only with `--enable-pprof` (see `pprof`).
//! - `GET /healthz/leader-election`: only with `--leader-election` and `--http-endpoint` (not the
//!   deprecated `--metrics-address`), as upstream: `ok`, or 500 `internal server error: <reason>`
//!   once the leader-election code reports a failure through [`Health`].
//!
//! The server is started before leader election and served by every replica; failing to listen
//! is fatal (the caller turns [`HttpError::Listen`] into an exit).

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::config::HttpOptions;
use crate::metrics::Metrics;
use crate::metrics::exposition::Format;

/// Health state shared between the HTTP server and the code that knows it (leader election).
/// Cloning shares the state; `default()` is healthy.
#[derive(Debug, Clone, Default)]
pub(crate) struct Health {
    /// `None` while healthy, else why not.
    leader_election: Arc<RwLock<Option<String>>>,
    /// Missing RBAC permissions found by the start-up self-check, one per line; empty when none.
    rbac: Arc<RwLock<String>>,
}

impl Health {
    /// Leader election works (or this replica is not leading, which is fine).
    pub(crate) fn set_leader_election_healthy(&self) {
        *crate::sync::write(&self.leader_election) = None;
    }

    /// The leader failed to renew its Lease in time; `/healthz/leader-election` reports `reason`.
    pub(crate) fn set_leader_election_unhealthy(&self, reason: impl Into<String>) {
        *crate::sync::write(&self.leader_election) = Some(reason.into());
    }

    /// The start-up RBAC self-check found `missing` (one permission per line; empty: none).
    pub(crate) fn set_rbac_missing(&self, missing: impl Into<String>) {
        *crate::sync::write(&self.rbac) = missing.into();
    }
}

/// The HTTP server failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// The listen address is taken, not local, or not resolvable.
    #[error("cannot listen on {flag}={address:?}: {source}; choose a free address or unset {flag}")]
    Listen {
        flag: &'static str,
        address: String,
        #[source]
        source: io::Error,
    },
    /// Serving stopped with an I/O error.
    #[error("the HTTP server on {address} failed: {source}")]
    Serve {
        address: String,
        #[source]
        source: io::Error,
    },
}

/// A bound, not yet serving, HTTP server. Binding first lets the caller fail fast on a taken port
/// and learn the port of `:0`.
#[derive(Debug)]
pub(crate) struct HttpServer {
    listener: TcpListener,
    router: Router,
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    metrics_path: Arc<str>,
    health: Health,
}

/// Binds the listen address of `options`.
pub(crate) async fn bind(
    options: &HttpOptions,
    metrics: Arc<Metrics>,
    health: Health,
) -> Result<HttpServer, HttpError> {
    let listen_error = |source| HttpError::Listen {
        flag: options.address_flag,
        address: options.address.clone(),
        source,
    };
    let listener = match options.address.strip_prefix(':') {
        // Go's `:port` means every interface: IPv6 (dual stack) where available, else IPv4.
        Some(port) => {
            let port: u16 = port.parse().map_err(|_| {
                listen_error(io::Error::new(io::ErrorKind::InvalidInput, "invalid port"))
            })?;
            let any = [
                SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)),
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)),
            ];
            TcpListener::bind(&any[..]).await
        }
        None => TcpListener::bind(options.address.as_str()).await,
    }
    .map_err(listen_error)?;
    Ok(HttpServer {
        listener,
        router: router(options, metrics, health),
    })
}

impl HttpServer {
    /// The bound address (with the actual port when `:0` was asked for).
    #[cfg(test)]
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then lets in-flight requests finish.
    pub(crate) async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), HttpError> {
        let address = self
            .listener
            .local_addr()
            .map_or_else(|_| "?".to_owned(), |a| a.to_string());
        tracing::info!(%address, "HTTP server listening");
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|source| HttpError::Serve { address, source })
    }
}

fn router(options: &HttpOptions, metrics: Arc<Metrics>, health: Health) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/healthz/rbac", get(rbac_health));
    if options.leader_election_health {
        router = router.route("/healthz/leader-election", get(leader_election_health));
    }
    if options.enable_pprof {
        router = router.merge(crate::pprof::routes());
    }
    // The metrics path is matched in the fallback rather than as a route: a user-chosen path may
    // contain characters axum's route syntax gives a meaning to (`{`, `*`).
    router.fallback(metrics_or_not_found).with_state(AppState {
        metrics,
        metrics_path: options.metrics_path.as_str().into(),
        health,
    })
}

/// Not part of `/healthz` on purpose: a restart does not grant a permission, and a liveness
/// failure would turn a partly working sidecar into a crash loop.
async fn rbac_health(State(state): State<AppState>) -> Response {
    let missing = crate::sync::read(&state.health.rbac).clone();
    if missing.is_empty() {
        return "ok".into_response();
    }
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("missing RBAC permissions:\n{missing}"),
    )
        .into_response()
}

async fn leader_election_health(State(state): State<AppState>) -> Response {
    match crate::sync::read(&state.health.leader_election).clone() {
        None => "ok".into_response(),
        Some(reason) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error: {reason}"),
        )
            .into_response(),
    }
}

async fn metrics_or_not_found(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
) -> Response {
    if uri.path() != &*state.metrics_path {
        return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    }
    if method != Method::GET && method != Method::HEAD {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok());
    let format = Format::negotiate(accept);
    match state.metrics.scrape(format) {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(err) => {
            tracing::error!(error = %err, "encoding metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding metrics failed\n",
            )
                .into_response()
        }
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
