//! Kubernetes client construction (--kubeconfig / --master / in-cluster) with the
//! --kube-api-qps/--kube-api-burst token bucket.
//!
//! The limiter works like client-go's `flowcontrol.NewTokenBucketRateLimiter`: the bucket starts
//! full (`burst` requests pass at once), refills at `qps` tokens per second, and a request without
//! a token waits for one. Watches count as one request each, as in client-go.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use governor::clock::{Clock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::{Layer, Service};

use crate::config::{KubeOptions, RateLimit};

/// A Kubernetes client could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The kubeconfig file is missing or invalid.
    #[error("cannot load kubeconfig {path:?} (from KUBECONFIG or --kubeconfig): {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// `--master` is not a URL.
    #[error("--master={master:?} is not a valid URL (e.g. https://10.0.0.1:6443): {source}")]
    InvalidMaster {
        master: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Neither flag is set and this is not a pod.
    #[error(
        "cannot use the in-cluster configuration ({source}); outside a cluster, set --kubeconfig \
         (or the KUBECONFIG environment variable) or --master"
    )]
    NotInCluster {
        #[source]
        source: kube::config::InClusterError,
    },
    /// The HTTP client could not be set up (e.g. bad TLS material).
    #[error("cannot create the Kubernetes client: {}", crate::retry::describe(.0))]
    Build(#[source] kube::Error),
}

/// Builds the API client: `--kubeconfig` (with `--master` overriding its server) or `--master`
/// alone, else the in-cluster configuration; every request passes the `--kube-api-qps` /
/// `--kube-api-burst` token bucket.
pub(crate) async fn build_client(options: &KubeOptions) -> Result<kube::Client, ClientError> {
    Ok(build_clients(options).await?.workers)
}

/// The clients of one process, all within one `--kube-api-qps` / `--kube-api-burst` budget.
#[derive(Clone)]
pub(crate) struct Clients {
    /// Every request waits for a token of the bucket.
    pub workers: kube::Client,
    /// No limiter of its own: for background senders that take spare tokens of `bucket` first
    /// ([`TokenBucket::try_acquire_spare`]).
    pub background: kube::Client,
    /// The shared bucket; `None` without a rate limit.
    pub bucket: Option<Arc<TokenBucket>>,
}

/// [`Clients`] over one configuration and one bucket.
pub(crate) async fn build_clients(options: &KubeOptions) -> Result<Clients, ClientError> {
    let config = kube_config(options).await?;
    let background = kube::Client::try_from(config.clone()).map_err(ClientError::Build)?;
    let builder = kube::client::ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    let bucket = options
        .rate_limit
        .map(|limit| Arc::new(TokenBucket::with_clock(limit, TokioClock::default())));
    let workers = match &bucket {
        Some(bucket) => builder
            .with_layer(&TokenBucketLayer::over(bucket.clone()))
            .build(),
        None => builder.build(),
    };
    Ok(Clients {
        workers,
        background,
        bucket,
    })
}

/// The client configuration `options` select (upstream: `BuildConfigFromFlags` or
/// `InClusterConfig`).
pub(crate) async fn kube_config(options: &KubeOptions) -> Result<kube::Config, ClientError> {
    let mut config = source_config(options).await?;
    // Audit logs, API priority and fairness, and kube-sim's counters tell the sidecar's requests
    // apart by this header; kube-rs sends none of its own. The shape is client-go's default
    // (`<binary>/<version> (<os>/<arch>) ...`), which upstream's sidecar sends.
    let platform = match std::env::consts::ARCH {
        "x86_64" => "linux/amd64",
        "aarch64" => "linux/arm64",
        _ => "linux",
    };
    let agent = format!(
        "csi-provisioner/{} ({platform}) csi-provisioner-rs",
        env!("CARGO_PKG_VERSION")
    );
    // Only ASCII: the version is semver and the rest is literal.
    if let Ok(agent) = http::HeaderValue::try_from(agent) {
        config.headers.push((http::header::USER_AGENT, agent));
    }
    Ok(config)
}

/// The configuration `options` select, before our own headers.
async fn source_config(options: &KubeOptions) -> Result<kube::Config, ClientError> {
    let master = |default_scheme: &str| -> Option<Result<http::Uri, ClientError>> {
        let master = options.master.as_deref()?;
        // client-go accepts a bare host:port: plain HTTP without TLS material, HTTPS with it.
        let url = if master.contains("://") {
            master.to_owned()
        } else {
            format!("{default_scheme}://{master}")
        };
        Some(url.parse().map_err(|source| ClientError::InvalidMaster {
            master: master.to_owned(),
            source,
        }))
    };
    match &options.kubeconfig {
        Some(path) => {
            let kubeconfig_error = |source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            let mut config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(kubeconfig_error)?;
            if let Some(url) = master("https") {
                config.cluster_url = url?;
            }
            Ok(config)
        }
        None => match master("http") {
            Some(url) => Ok(kube::Config::new(url?)),
            None => {
                kube::Config::incluster().map_err(|source| ClientError::NotInCluster { source })
            }
        },
    }
}

/// governor's clock on tokio's time, so that waiting (tokio timers) and accounting agree.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokioClock {
    origin: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        tokio::time::Instant::now().saturating_duration_since(self.origin)
    }
}

/// A token bucket of `burst` tokens refilled at `qps` per second (GCRA, equivalent to client-go's
/// token bucket), over any governor clock.
///
/// Two kinds of takers share it: the workers' requests ([`TokenBucket::try_acquire`], through
/// [`TokenBucketLayer`]) and background work that must never delay them, such as events
/// ([`TokenBucket::try_acquire_spare`]): a spare token is handed out only while no worker is
/// waiting and none has asked for one for [`TokenBucket::quiet`]. Both count against the same
/// limit, so the API server never sees more than the flags allow.
#[derive(Debug)]
pub(crate) struct TokenBucket<C: Clock = TokioClock> {
    limiter: RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<C::Instant>>,
    clock: C,
    /// Worker requests waiting for a token right now.
    waiting: AtomicUsize,
    /// When a worker last asked for a token.
    last_demand: Mutex<Option<C::Instant>>,
    quiet: Duration,
}

impl<C: Clock + Clone> TokenBucket<C> {
    /// A full bucket.
    pub(crate) fn with_clock(limit: RateLimit, clock: C) -> Self {
        let burst = NonZeroU32::new(limit.burst).unwrap_or(NonZeroU32::MIN);
        // A rate above 1e9/s would need a sub-nanosecond period; treat it as 1ns (no practical limit).
        let period = Duration::from_secs_f64(1.0 / limit.qps).max(Duration::from_nanos(1));
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX))
            .allow_burst(burst);
        Self {
            limiter: RateLimiter::direct_with_clock(quota, clock.clone()),
            clock,
            waiting: AtomicUsize::new(0),
            last_demand: Mutex::new(None),
            // Two refill periods: a worker between two requests of one reconcile (a PATCH, then a
            // PV create after the CSI call) keeps its claim on the next token.
            quiet: (period * 2).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        }
    }

    /// A worker takes a token, or learns how long until one is available.
    pub(crate) fn try_acquire(&self) -> Result<(), Duration> {
        *crate::sync::lock(&self.last_demand) = Some(self.clock.now());
        self.limiter
            .check()
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Background work takes a token only when the workers leave it: none is waiting and none
    /// asked within [`TokenBucket::quiet`]. Otherwise says when to look again.
    pub(crate) fn try_acquire_spare(&self) -> Result<(), Duration> {
        self.spare()?;
        self.limiter
            .check()
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()).max(self.quiet))
    }

    /// Whether a worker request waits for a token now: the rate limit, not the work, is what
    /// holds things up, so more work released now would only queue.
    pub(crate) fn congested(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Whether background work may send now, without taking a token (it then takes its token as
    /// workers do, through [`TokenBucketLayer`]): no worker waits and none asked within
    /// [`TokenBucket::quiet`]; otherwise when to look again.
    pub(crate) fn spare(&self) -> Result<(), Duration> {
        if self.congested() {
            return Err(self.quiet);
        }
        let last = *crate::sync::lock(&self.last_demand);
        match last.map(|last| Duration::from(self.clock.now().duration_since(last))) {
            Some(since) if since < self.quiet => Err(self.quiet - since),
            _ => Ok(()),
        }
    }

    /// How long the workers must have left the bucket alone before background work may use it.
    #[cfg(test)]
    pub(crate) fn quiet(&self) -> Duration {
        self.quiet
    }

    fn set_waiting(&self, waiting: bool) {
        if waiting {
            self.waiting.fetch_add(1, Ordering::AcqRel);
        } else {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Tower layer that makes every request take a token from one shared bucket first.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucketLayer {
    bucket: Arc<TokenBucket>,
}

impl TokenBucketLayer {
    /// A layer over a fresh, full bucket.
    #[cfg(test)]
    pub(crate) fn new(limit: RateLimit) -> Self {
        Self::over(Arc::new(TokenBucket::with_clock(
            limit,
            TokioClock::default(),
        )))
    }

    /// A layer over `bucket`, which other takers may share.
    pub(crate) fn over(bucket: Arc<TokenBucket>) -> Self {
        Self { bucket }
    }
}

impl<S> Layer<S> for TokenBucketLayer {
    type Service = TokenBucketService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenBucketService::fresh(inner, self.bucket.clone())
    }
}

/// The service of [`TokenBucketLayer`]. The token is taken in `poll_ready`, so callers queue in
/// order (kube's client drives it through a `Buffer`, one request at a time) instead of all
/// waking at once when a token arrives.
pub(crate) struct TokenBucketService<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    has_token: bool,
    /// This service is counted in the bucket's waiting workers.
    counted_waiting: bool,
}

impl<S> TokenBucketService<S> {
    /// A service without a token, not counted as waiting.
    fn fresh(inner: S, bucket: Arc<TokenBucket>) -> Self {
        Self {
            inner,
            bucket,
            wait: None,
            has_token: false,
            counted_waiting: false,
        }
    }
}

impl<S> Drop for TokenBucketService<S> {
    fn drop(&mut self) {
        if self.counted_waiting {
            self.bucket.set_waiting(false);
        }
    }
}

impl<S: Clone> Clone for TokenBucketService<S> {
    fn clone(&self) -> Self {
        // A clone starts without a token: tokens are never duplicated.
        Self::fresh(self.inner.clone(), self.bucket.clone())
    }
}

impl<S, Request> Service<Request> for TokenBucketService<S>
where
    S: Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(wait) = self.wait.as_mut() {
                ready!(wait.as_mut().poll(cx));
                self.wait = None;
            }
            match self.bucket.try_acquire() {
                Ok(()) => {
                    self.has_token = true;
                    if std::mem::take(&mut self.counted_waiting) {
                        self.bucket.set_waiting(false);
                    }
                }
                Err(delay) => {
                    if !std::mem::replace(&mut self.counted_waiting, true) {
                        self.bucket.set_waiting(true);
                    }
                    self.wait = Some(Box::pin(tokio::time::sleep(delay)));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.has_token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
