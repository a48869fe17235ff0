//! The driver core shared by the gRPC services, the control socket and in-process handles: the
//! store, the switchboard, the per-call wrapper (latency, injected errors, counting) and crashing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tonic::Status;

use crate::config::{CRASH_EXIT_CODE, Config, CrashAction, FaultRule, code_name};
use crate::csi::v1::{Topology, Volume, VolumeContentSource, volume_content_source};
use crate::faults::{CallStats, Faults, FaultsDump};
use crate::requests::RecordedCreate;
use crate::store::{ContentSource, SnapshotRecord, Store, StoreError, VolumeRecord};

/// Pool usage of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDump {
    /// Node name.
    pub node: String,
    /// Topology segment of the node (empty without topology).
    pub segment: BTreeMap<String, String>,
    /// Pool size in bytes.
    pub total_bytes: i64,
    /// Bytes held by volumes.
    pub used_bytes: i64,
    /// Bytes free for new volumes.
    pub available_bytes: i64,
}

/// Everything the driver knows, as tests see it (`state` on the control socket). Holds secret
/// keys only, never secret values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateDump {
    /// GetPluginInfo name.
    pub driver_name: String,
    /// NodeGetInfo node id.
    pub node_id: String,
    /// Pools of the nodes this instance places volumes on.
    pub pools: Vec<PoolDump>,
    /// Volumes in creation order.
    pub volumes: Vec<VolumeRecord>,
    /// Snapshots in creation order.
    pub snapshots: Vec<SnapshotRecord>,
    /// Calls per CSI method since start or the last `reset_counts`.
    pub calls: BTreeMap<String, CallStats>,
    /// Current fault, capability and misbehaviour switches.
    pub switches: FaultsDump,
    /// Volume names that had two CreateVolume calls outstanding at once (a provisioner must
    /// never do that; upstream issue 1469).
    #[serde(default)]
    pub concurrent_creates: BTreeSet<String>,
    /// Every DeleteVolume received since start: (volume id, Unix ms at arrival).
    #[serde(default)]
    pub delete_calls: Vec<(String, u64)>,
    /// Every CreateVolume request received, in order (only with `--record-requests`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub create_requests: Vec<RecordedCreate>,
    /// Crash-point holds by method.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub holds: BTreeMap<String, crate::holds::HoldDump>,
    /// Every call's method, in order (the crash-point suite enumerates its points from it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub call_log: Vec<String>,
}

impl StateDump {
    /// Calls received by `method` (0 if never called).
    pub fn calls(&self, method: &str) -> u64 {
        self.calls.get(method).map_or(0, |c| c.total)
    }

    /// Calls of `method` answered OK.
    pub fn ok_calls(&self, method: &str) -> u64 {
        self.calls.get(method).map_or(0, |c| c.ok)
    }

    /// The volume created under CreateVolume name `name`.
    pub fn volume_by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.volumes.iter().find(|v| v.name == name)
    }

    /// The volume with id `id`.
    pub fn volume(&self, id: &str) -> Option<&VolumeRecord> {
        self.volumes.iter().find(|v| v.id == id)
    }
}

/// The shared driver.
#[derive(Debug)]
pub struct Driver {
    /// Static configuration (run-time switches live in `faults`).
    pub config: Config,
    /// Run-time switches and call counts.
    pub faults: Faults,
    store: Mutex<Store>,
    crashed: AtomicBool,
    crash_notify: Notify,
    /// CreateVolume calls outstanding per volume name, and the names that ever had two at once.
    creates: Mutex<(BTreeMap<String, u32>, BTreeSet<String>)>,
    /// Every DeleteVolume received: (volume id, Unix ms).
    delete_calls: Mutex<Vec<(String, u64)>>,
    /// Every CreateVolume request received, with `Config::record_requests`.
    create_requests: Mutex<Vec<RecordedCreate>>,
    /// Crash-point holds and the call log.
    pub holds: crate::holds::Holds,
}

/// Held while one CreateVolume call is outstanding (dropped when it is answered or the caller
/// cancels it, as the caller sees it).
pub struct CreateInFlight<'a> {
    driver: &'a Driver,
    name: String,
}

impl Drop for CreateInFlight<'_> {
    fn drop(&mut self) {
        let mut creates = self
            .driver
            .creates
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = creates.0.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                creates.0.remove(&self.name);
            }
        }
    }
}

impl Driver {
    /// A driver with the state file loaded (or empty state).
    pub fn new(config: Config) -> Result<Driver, StoreError> {
        let store = match &config.state_file {
            Some(path) => Store::open(path)?,
            None => Store::default(),
        };
        Ok(Driver {
            faults: Faults::new(&config),
            config,
            store: Mutex::new(store),
            crashed: AtomicBool::new(false),
            crash_notify: Notify::new(),
            creates: Mutex::new(Default::default()),
            delete_calls: Mutex::new(Vec::new()),
            create_requests: Mutex::new(Vec::new()),
            holds: Default::default(),
        })
    }

    /// Records a CreateVolume for `name` as outstanding until the guard drops; a second one for
    /// the same name meanwhile is remembered (`StateDump::concurrent_creates`).
    pub fn create_started(&self, name: &str) -> CreateInFlight<'_> {
        let mut creates = self.creates.lock().unwrap_or_else(|p| p.into_inner());
        let n = creates.0.entry(name.to_owned()).or_default();
        *n += 1;
        if *n > 1 {
            tracing::warn!(
                name,
                "a second CreateVolume for this name while the first is outstanding"
            );
            creates.1.insert(name.to_owned());
        }
        CreateInFlight {
            driver: self,
            name: name.to_owned(),
        }
    }

    /// Records a DeleteVolume as it arrives (before latency or faults), for the check that no
    /// volume is deleted while its claim exists.
    pub fn delete_received(&self, volume_id: &str) {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.delete_calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((volume_id.to_owned(), ms));
    }

    /// Records a CreateVolume request as it arrives (before latency or faults), when
    /// `Config::record_requests` is on.
    pub fn create_received(&self, req: &crate::csi::v1::CreateVolumeRequest) {
        if self.config.record_requests {
            self.create_requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(RecordedCreate::of(req));
        }
    }

    /// The store, locked. Every change is followed by [`Driver::persist`] under the same lock, so
    /// the file always matches a state the driver really had.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        // Updates are applied to a record before it is put back, so a poisoned lock still holds a
        // consistent store.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Persists the changes just made to `store` (when a state file is configured); INTERNAL if
    /// that fails, after which the caller undoes its change.
    pub fn persist(&self, store: &mut Store) -> Result<(), Status> {
        store.persist().map_err(|e| Status::internal(e.to_string()))
    }

    /// Runs one RPC: counts it, applies injected latency and errors, runs `op` on a separate task
    /// (so the effect completes even when the caller gives up, as a real backend would), and
    /// never answers once the driver has crashed.
    pub async fn call<T, F>(
        self: &std::sync::Arc<Self>,
        method: &'static str,
        op: F,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> Result<T, Status> + Send + 'static,
    {
        let driver = std::sync::Arc::clone(self);
        let task = tokio::spawn(async move {
            driver.hang_if_crashed().await;
            let mut held_after = None;
            if let Some(ticket) = driver.holds.arrive(method) {
                match ticket.when {
                    crate::holds::HoldWhen::Before => {
                        if !ticket.released().await {
                            return Err(Status::unavailable(format!(
                                "{method} dropped by a hold before it ran (mock-csi-driver)"
                            )));
                        }
                    }
                    crate::holds::HoldWhen::After => held_after = Some(ticket),
                }
            }
            let plan = driver.faults.begin(method);
            if !plan.latency.is_zero() {
                tokio::time::sleep(plan.latency).await;
            }
            let result = match plan.fail {
                Some(rule) if !rule.after => Err(injected(method, rule)),
                fail => {
                    let result = op(&driver);
                    match (result, fail) {
                        (Ok(_), Some(rule)) => Err(injected(method, rule)),
                        (result, _) => result,
                    }
                }
            };
            if let Some(ticket) = held_after {
                ticket.released().await;
            }
            driver.hang_if_crashed().await;
            driver.faults.finish(method, result.is_ok());
            if let Err(status) = &result {
                tracing::info!(
                    method,
                    code = code_name(status.code()),
                    message = status.message(),
                    "call failed"
                );
            }
            result
        });
        task.await
            .unwrap_or_else(|e| Err(Status::internal(format!("mock driver task failed: {e}"))))
    }

    async fn hang_if_crashed(&self) {
        if self.has_crashed() {
            std::future::pending::<()>().await;
        }
    }

    /// Called right after a new volume was persisted: crashes when the countdown says so.
    pub fn maybe_crash_after_create(&self, volume: &VolumeRecord) {
        if !self.faults.crash_due() {
            return;
        }
        tracing::warn!(volume_id = %volume.id, name = %volume.name, "crash-after-create fired: volume persisted, not answering");
        match self.config.crash_action {
            CrashAction::ExitProcess => std::process::exit(CRASH_EXIT_CODE),
            CrashAction::StopServer => {
                self.crashed.store(true, Ordering::SeqCst);
                // notify_one keeps a permit if nobody waits yet.
                self.crash_notify.notify_one();
            }
        }
    }

    /// Whether a crash fault fired (in-process drivers only; the binary exits instead).
    pub fn has_crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Resolves when the driver crashes.
    pub async fn crashed(&self) {
        if !self.has_crashed() {
            self.crash_notify.notified().await;
        }
    }

    /// The proto form of a volume.
    pub fn volume_proto(&self, v: &VolumeRecord) -> Volume {
        Volume {
            capacity_bytes: v.capacity_bytes,
            volume_id: v.id.clone(),
            volume_context: v
                .volume_context
                .iter()
                .map(|(k, val)| (k.clone(), val.clone()))
                .collect(),
            content_source: v.content_source.as_ref().map(content_source_proto),
            accessible_topology: if self.config.topology {
                vec![Topology {
                    segments: v
                        .segment
                        .iter()
                        .map(|(k, val)| (k.clone(), val.clone()))
                        .collect(),
                }]
            } else {
                vec![]
            },
        }
    }

    /// Pool usage per node.
    pub fn pools(&self, store: &Store) -> Vec<PoolDump> {
        self.config
            .nodes()
            .into_iter()
            .map(|node| {
                let used = store.used_on(&node);
                PoolDump {
                    segment: self.config.segment_of(&node),
                    total_bytes: self.config.capacity_total,
                    used_bytes: used,
                    available_bytes: (self.config.capacity_total - used).max(0),
                    node,
                }
            })
            .collect()
    }

    /// Everything, for tests.
    pub fn dump(&self) -> StateDump {
        let store = self.store();
        StateDump {
            driver_name: self.config.driver_name.clone(),
            node_id: self.config.node_id.clone(),
            pools: self.pools(&store),
            volumes: store.volumes().cloned().collect(),
            snapshots: store.snapshots().cloned().collect(),
            calls: self.faults.calls(),
            switches: self.faults.dump(),
            delete_calls: self
                .delete_calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            concurrent_creates: self
                .creates
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .1
                .clone(),
            create_requests: self
                .create_requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            holds: self.holds.dump(),
            call_log: self.holds.log(),
        }
    }
}

/// The proto form of a content source.
pub fn content_source_proto(s: &ContentSource) -> VolumeContentSource {
    use volume_content_source::{SnapshotSource, Type, VolumeSource};
    VolumeContentSource {
        r#type: Some(match s {
            ContentSource::Snapshot(id) => Type::Snapshot(SnapshotSource {
                snapshot_id: id.clone(),
            }),
            ContentSource::Volume(id) => Type::Volume(VolumeSource {
                volume_id: id.clone(),
            }),
        }),
    }
}

fn injected(method: &str, rule: FaultRule) -> Status {
    Status::new(
        rule.code,
        format!(
            "injected fault: {} from {method} (mock-csi-driver fault switch)",
            code_name(rule.code)
        ),
    )
}
