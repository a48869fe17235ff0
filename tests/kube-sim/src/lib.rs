//! kube-sim: an in-process Kubernetes API server simulator for tests, benchmarks and demos.
//!
//! Start one with [`Sim::start`], talk to it with [`Sim::client`] (kube-rs) or through the
//! kubeconfig from [`Sim::write_kubeconfig`] (kubectl), and steer it with [`Sim::faults`],
//! [`Sim::counters`], [`Sim::drop_watches`], [`Sim::compact`], [`Sim::pause`]. See README.md.

mod access;
mod controllers;
mod convert;
mod counters;
mod discovery;
mod error;
mod faults;
mod holds;
mod list;
mod openapi;
mod ops;
mod patch;
mod pv_index;
pub mod resources;
mod selectors;
mod server;
mod store;
mod util;
mod validate;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinHandle;

pub use counters::{AgentCounterRow, CounterRow, Counters};
pub use error::ApiError;
pub use faults::{FaultEntry, FaultRule, Faults};
pub use holds::{HoldEntry, HoldRule, HoldState, Holds, When, WriteRecord};
pub use ops::{PV_PROTECTION, PVC_PROTECTION};

use ops::Policy;
use store::Store;

/// How a simulator behaves. `SimConfig::default()` is a cluster with kube-controller-manager.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Run the control loops (PV binder, pv/pvc-protection, namespace deletion, the
    /// selected-node stand-in for the scheduler, pods going Running).
    pub controllers: bool,
    /// Add `kubernetes.io/pv-protection` / `kubernetes.io/pvc-protection` on create (the
    /// StorageObjectInUseProtection admission plugin). Without controllers nothing removes
    /// them, so tests without controllers usually turn this off too.
    pub protection_finalizers: bool,
    /// Watch events kept per resource for resuming watches; older resumes get 410 Gone.
    pub history_window: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Upper bound (and default) for watch `timeoutSeconds`.
    pub max_watch_timeout: Duration,
    /// Controllers' periodic full resync, on top of reacting to every change.
    pub resync_interval: Duration,
    /// Serve streaming lists (watch with `sendInitialEvents`). Off answers them 422 Invalid, as
    /// Kubernetes 1.33 does with its default WatchList gate, and 1.26 and older always.
    pub watch_list: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            controllers: true,
            protection_finalizers: true,
            history_window: 10_000,
            bookmark_interval: Duration::from_secs(1),
            max_watch_timeout: Duration::from_secs(1800),
            resync_interval: Duration::from_secs(5),
            watch_list: true,
        }
    }
}

impl SimConfig {
    /// An API server alone: no control loops and no protection finalizers.
    pub fn bare() -> Self {
        Self {
            controllers: false,
            protection_finalizers: false,
            ..Self::default()
        }
    }
}

pub(crate) struct Inner {
    store: Mutex<Store>,
    policy: Policy,
    faults: Faults,
    holds: Holds,
    counters: counters::Live,
    paused: tokio::sync::watch::Sender<bool>,
    cfg: SimConfig,
    addr: SocketAddr,
    /// Highest resourceVersion whose changes the controllers have fully processed.
    controllers_seen: tokio::sync::watch::Sender<u64>,
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) async fn wait_unpaused(&self) {
        let mut rx = self.paused.subscribe();
        let _ = rx.wait_for(|p| !*p).await;
    }

    fn dump(&self) -> Value {
        let st = self.lock();
        let mut objects = serde_json::Map::new();
        for s in st.storages() {
            let items: Vec<Value> = st.list(s, None).iter().map(|v| (**v).clone()).collect();
            if !items.is_empty() {
                objects.insert(s.to_string(), Value::Array(items));
            }
        }
        json!({"resourceVersion": st.resource_version().to_string(), "openWatches": st.open_watches(), "objects": objects})
    }
}

struct Tasks {
    server: Mutex<Option<JoinHandle<()>>>,
    background: Mutex<Vec<JoinHandle<()>>>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

/// A running simulator. Cheap to clone; all clones control the same server.
#[derive(Clone)]
pub struct Sim {
    inner: Arc<Inner>,
    tasks: Arc<Tasks>,
}

impl Sim {
    /// Starts on a free loopback port.
    pub async fn start(cfg: SimConfig) -> anyhow::Result<Sim> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), cfg).await
    }

    /// Starts on `addr` (port 0 picks a free one; see [`Sim::addr`]).
    pub async fn start_on(addr: SocketAddr, cfg: SimConfig) -> anyhow::Result<Sim> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!("kube-sim cannot listen on {addr}: {e}; pick another address or port 0")
        })?;
        let addr = listener.local_addr()?;
        let mut store = Store::new(cfg.history_window);
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let rd = resources::core(resources::NAMESPACES);
            let policy = Policy {
                protection_finalizers: false,
            };
            ops::create(
                &mut store,
                &policy,
                rd,
                "",
                json!({"metadata": {"name": ns}}),
                false,
            )
            .map_err(|e| anyhow::anyhow!("creating namespace {ns}: {e}"))?;
        }
        let (change_tx, change_rx) = tokio::sync::mpsc::unbounded_channel();
        if cfg.controllers {
            store.set_change_feed(change_tx);
        }
        let (paused, _) = tokio::sync::watch::channel(false);
        let inner = Arc::new(Inner {
            store: Mutex::new(store),
            policy: Policy {
                protection_finalizers: cfg.protection_finalizers,
            },
            faults: Faults::default(),
            holds: Holds::default(),
            counters: counters::Live::default(),
            paused,
            cfg: cfg.clone(),
            addr,
            controllers_seen: tokio::sync::watch::channel(0).0,
        });
        let (shutdown, mut shutdown_rx) = tokio::sync::watch::channel(false);
        let app = server::router(inner.clone());
        let server = tokio::spawn(async move {
            let stop = async move {
                let _ = shutdown_rx.wait_for(|s| *s).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::error!(error = %e, "kube-sim server stopped");
            }
        });
        let mut background = Vec::new();
        let bm_inner = inner.clone();
        let interval = cfg.bookmark_interval.max(Duration::from_millis(10));
        background.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            loop {
                tick.tick().await;
                bm_inner.wait_unpaused().await;
                bm_inner.lock().send_bookmarks();
            }
        }));
        if cfg.controllers {
            background.push(controllers::spawn(inner.clone(), change_rx));
        }
        tracing::info!(%addr, controllers = cfg.controllers, "kube-sim listening");
        Ok(Sim {
            inner,
            tasks: Arc::new(Tasks {
                server: Mutex::new(Some(server)),
                background: Mutex::new(background),
                shutdown,
            }),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// A kube client for this simulator (default namespace `default`).
    ///
    /// # Panics
    /// Outside a tokio runtime (kube's client needs one); use [`Sim::try_client`] to get an error.
    pub fn client(&self) -> kube::Client {
        match self.try_client() {
            Ok(c) => c,
            Err(e) => panic!("kube-sim: cannot build a kube client: {e}"),
        }
    }

    pub fn try_client(&self) -> anyhow::Result<kube::Client> {
        let mut config = kube::Config::new(self.url().parse()?);
        config.default_namespace = "default".into();
        Ok(kube::Client::try_from(config)?)
    }

    /// The kubeconfig document pointing at this simulator.
    pub fn kubeconfig(&self) -> Value {
        kubeconfig_for(&self.url())
    }

    /// Writes a kubeconfig (JSON, which is valid YAML) for kubectl and other clients.
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> std::io::Result<()> {
        let text =
            serde_json::to_string_pretty(&self.kubeconfig()).map_err(std::io::Error::other)?;
        std::fs::write(path, text)
    }

    pub fn faults(&self) -> Faults {
        self.inner.faults.clone()
    }

    /// Crash-point holds and the ordered write log.
    pub fn holds(&self) -> Holds {
        self.inner.holds.clone()
    }

    /// A snapshot of request counts so far.
    pub fn counters(&self) -> Counters {
        self.inner.counters.snapshot()
    }

    pub fn reset_counters(&self) {
        self.inner.counters.reset();
    }

    /// All objects (stored form), the current resourceVersion and the number of open watches.
    pub fn dump(&self) -> Value {
        self.inner.dump()
    }

    /// Ends every open watch stream; clients re-watch from their last resourceVersion.
    pub fn drop_watches(&self) {
        self.inner.lock().drop_watches();
    }

    /// Forgets watch history: resuming from any resourceVersion before now gets 410 Gone.
    pub fn compact(&self) {
        self.inner.lock().compact();
    }

    /// Holds every API request (and watch delivery, and the controllers) until [`Sim::resume`].
    pub fn pause(&self) {
        self.inner.paused.send_replace(true);
    }

    pub fn resume(&self) {
        self.inner.paused.send_replace(false);
    }

    /// The current cluster-wide resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.lock().resource_version()
    }

    /// Waits until the controllers have processed every change so far and made no new one
    /// (returns at once without controllers). Use it before asserting that something did
    /// *not* happen. Errors after `timeout` (e.g. while paused).
    pub async fn settle(&self, timeout: Duration) -> anyhow::Result<()> {
        if !self.inner.cfg.controllers {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut seen = self.inner.controllers_seen.subscribe();
        loop {
            let rv = self.resource_version();
            tokio::time::timeout_at(deadline, seen.wait_for(|s| *s >= rv))
                .await
                .map_err(|_| anyhow::anyhow!("controllers did not settle within {timeout:?}"))??;
            if self.resource_version() == rv {
                return Ok(());
            }
        }
    }

    /// The last reclaim policy every CSI volume handle's PV had.
    pub fn volume_policies(&self) -> std::collections::BTreeMap<String, String> {
        self.inner.lock().volume_policies.clone()
    }

    /// For the fault suite: the claim UID every CSI volume handle's PV has named, and when each
    /// claim UID was removed (Unix ms).
    pub fn claim_history(
        &self,
    ) -> (
        std::collections::BTreeMap<String, String>,
        std::collections::BTreeMap<String, u64>,
    ) {
        let st = self.inner.lock();
        (st.volume_claims.clone(), st.claim_removals.clone())
    }

    /// Open watch streams right now.
    pub fn open_watches(&self) -> usize {
        self.inner.lock().open_watches()
    }

    /// Reads an object straight from the store (no request, not counted). `plural` is a
    /// resource plural such as `persistentvolumes`; `ns` is "" for cluster-scoped objects.
    pub fn object(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        self.inner
            .lock()
            .get(plural, ns, name)
            .map(|v| (*v).clone())
    }

    /// All objects of one resource plural (stored form, key order), not counted.
    pub fn objects(&self, plural: &str) -> Vec<Value> {
        self.inner
            .lock()
            .list(plural, None)
            .iter()
            .map(|v| (**v).clone())
            .collect()
    }

    /// Creates an object directly (same validation and admission as a POST, not counted).
    pub fn create(
        &self,
        group: &str,
        plural: &str,
        ns: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        let rd = resources::find(group, "v1", plural).ok_or_else(ApiError::unknown_path)?;
        ops::create(
            &mut self.inner.lock(),
            &self.inner.policy,
            rd,
            ns,
            obj,
            false,
        )
    }

    /// Creates `obj` keeping its `metadata.uid` (a fresh one if it has none): an object restored
    /// under its old identity, as after an etcd restore. Validated, not counted; no API request can
    /// do this, which is why it is only a test hook.
    pub fn restore(
        &self,
        group: &str,
        plural: &str,
        ns: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        let rd = resources::find(group, "v1", plural).ok_or_else(ApiError::unknown_path)?;
        let uid = obj
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_owned);
        ops::create_keeping_uid(
            &mut self.inner.lock(),
            &self.inner.policy,
            rd,
            ns,
            obj,
            false,
            uid.as_deref(),
        )
    }

    /// Stops serving: ends watches, stops the server and the control loops.
    pub async fn shutdown(self) {
        self.inner.lock().drop_watches();
        self.inner.paused.send_replace(false);
        self.tasks.shutdown.send_replace(true);
        let server = self
            .tasks
            .server
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut h) = server
            && tokio::time::timeout(Duration::from_secs(5), &mut h)
                .await
                .is_err()
        {
            h.abort();
        }
        for h in self
            .tasks
            .background
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            h.abort();
        }
    }
}

/// A kubeconfig (as JSON) with one cluster/context named `kube-sim` pointing at `url`.
pub fn kubeconfig_for(url: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kube-sim", "cluster": {"server": url}}],
        "users": [{"name": "kube-sim", "user": {}}],
        "contexts": [{"name": "kube-sim", "context": {"cluster": "kube-sim", "user": "kube-sim", "namespace": "default"}}],
        "current-context": "kube-sim",
        "preferences": {}
    })
}
