//! What every check works with: connected clients with per-call deadlines, the driver's
//! discovered capabilities, unique names, request builders, verdict helpers, and the record of
//! created volumes and snapshots that is cleaned up after each check.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Request, Status};

use crate::csi::v1::*;
use crate::options::Options;

/// Why a check did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The driver broke a rule.
    Fail(String),
    /// The check does not apply to this driver.
    Skip(String),
}

/// The result of a check body.
pub type Verdict = Result<(), Failure>;

/// Fails with a formatted message.
#[macro_export]
macro_rules! fail {
    ($($arg:tt)*) => { return Err($crate::context::Failure::Fail(format!($($arg)*))) };
}

/// Fails unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => { if !$cond { $crate::fail!($($arg)*) } };
}

/// A created object to delete after the check.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Created {
    Volume(String),
    Snapshot(String),
}

/// Shared state of a run.
#[derive(Debug)]
pub struct Ctx {
    /// Identity client.
    pub identity: identity_client::IdentityClient<Channel>,
    /// Controller client.
    pub controller: controller_client::ControllerClient<Channel>,
    /// Node client.
    pub node: node_client::NodeClient<Channel>,
    /// Run options.
    pub opts: Options,
    /// Plugin service capabilities, or why GetPluginCapabilities failed.
    pub plugin_caps: Result<Vec<i32>, String>,
    /// Controller RPC capabilities, or why ControllerGetCapabilities failed.
    pub controller_caps: Result<Vec<i32>, String>,
    /// NodeGetInfo, or why it failed.
    pub node_info: Result<NodeGetInfoResponse, String>,
    /// Node RPC capabilities, or why NodeGetCapabilities failed.
    pub node_caps: Result<Vec<i32>, String>,
    run_id: String,
    counter: AtomicU32,
    created: Mutex<Vec<Created>>,
}

/// Connects to a driver socket, retrying until `timeout` while it does not accept yet.
pub async fn connect(path: &Path, timeout: Duration) -> Result<Channel, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let path = path.to_owned();
    loop {
        let p = path.clone();
        let attempt = Endpoint::from_static("http://[::1]:50051")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let p = p.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?))
                }
            }))
            .await;
        match attempt {
            Ok(channel) => return Ok(channel),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(format!(
                    "cannot connect to {} within {timeout:?}: {e:?}",
                    path.display()
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

impl Ctx {
    /// Connects and discovers the driver (waiting for Probe readiness up to the timeout).
    pub async fn new(opts: Options) -> Result<Ctx, String> {
        let channel = connect(&opts.address, opts.timeout).await?;
        let mut ctx = Ctx {
            identity: identity_client::IdentityClient::new(channel.clone()),
            controller: controller_client::ControllerClient::new(channel.clone()),
            node: node_client::NodeClient::new(channel),
            opts,
            plugin_caps: Err("not asked yet".into()),
            controller_caps: Err("not asked yet".into()),
            node_info: Err("not asked yet".into()),
            node_caps: Err("not asked yet".into()),
            run_id: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
            counter: AtomicU32::new(0),
            created: Mutex::new(Vec::new()),
        };
        // Later checks need a ready driver; identity/probe reports on readiness itself.
        let _ = ctx.wait_ready().await;
        ctx.plugin_caps = ctx
            .identity
            .clone()
            .get_plugin_capabilities(ctx.req(GetPluginCapabilitiesRequest {}))
            .await
            .map(|r| {
                r.into_inner()
                    .capabilities
                    .into_iter()
                    .filter_map(|c| match c.r#type {
                        Some(plugin_capability::Type::Service(s)) => Some(s.r#type),
                        _ => None,
                    })
                    .collect()
            })
            .map_err(|s| describe("GetPluginCapabilities", &s));
        ctx.controller_caps = ctx
            .controller
            .clone()
            .controller_get_capabilities(ctx.req(ControllerGetCapabilitiesRequest {}))
            .await
            .map(|r| {
                r.into_inner()
                    .capabilities
                    .into_iter()
                    .filter_map(|c| match c.r#type {
                        Some(controller_service_capability::Type::Rpc(r)) => Some(r.r#type),
                        _ => None,
                    })
                    .collect()
            })
            .map_err(|s| describe("ControllerGetCapabilities", &s));
        ctx.node_info = ctx
            .node
            .clone()
            .node_get_info(ctx.req(NodeGetInfoRequest {}))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| describe("NodeGetInfo", &s));
        ctx.node_caps = ctx
            .node
            .clone()
            .node_get_capabilities(ctx.req(NodeGetCapabilitiesRequest {}))
            .await
            .map(|r| {
                r.into_inner()
                    .capabilities
                    .into_iter()
                    .filter_map(|c| match c.r#type {
                        Some(node_service_capability::Type::Rpc(r)) => Some(r.r#type),
                        _ => None,
                    })
                    .collect()
            })
            .map_err(|s| describe("NodeGetCapabilities", &s));
        Ok(ctx)
    }

    /// Polls Probe until it reports ready (or no readiness), up to the timeout.
    pub async fn wait_ready(&self) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + self.opts.timeout;
        loop {
            let answer = self.identity.clone().probe(self.req(ProbeRequest {})).await;
            let last = match answer {
                Ok(r) if r.get_ref().ready != Some(false) => return Ok(()),
                Ok(_) => "Probe answers ready=false".to_owned(),
                Err(s) => describe("Probe", &s),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("{last} after {:?}", self.opts.timeout));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Wraps a message with the per-call deadline.
    pub fn req<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        r.set_timeout(self.opts.timeout);
        r
    }

    /// A name unique to this run: `csi-sanity-<run>-<what>-<n>`.
    pub fn name(&self, what: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("csi-sanity-{}-{what}-{n}", self.run_id)
    }

    /// Whether ControllerGetCapabilities advertised `t`.
    pub fn has_rpc(&self, t: controller_service_capability::rpc::Type) -> bool {
        self.controller_caps
            .as_ref()
            .is_ok_and(|c| c.contains(&(t as i32)))
    }

    /// Whether NodeGetCapabilities advertised `t`.
    pub fn has_node_rpc(&self, t: node_service_capability::rpc::Type) -> bool {
        self.node_caps
            .as_ref()
            .is_ok_and(|c| c.contains(&(t as i32)))
    }

    /// Whether GetPluginCapabilities advertised `t`.
    pub fn has_service(&self, t: plugin_capability::service::Type) -> bool {
        self.plugin_caps
            .as_ref()
            .is_ok_and(|c| c.contains(&(t as i32)))
    }

    /// The node's topology, when the driver advertises topology and NodeGetInfo reported one.
    pub fn node_topology(&self) -> Option<Topology> {
        if !self.has_service(plugin_capability::service::Type::VolumeAccessibilityConstraints) {
            return None;
        }
        self.node_info
            .as_ref()
            .ok()?
            .accessible_topology
            .clone()
            .filter(|t| !t.segments.is_empty())
    }

    /// A CreateVolume request as a provisioner would send it: test size, a single-node-writer
    /// mount capability, test parameters, CreateVolume secrets, and the node's topology as both
    /// requisite and preferred when the driver uses topology.
    pub fn volume_request(&self, what: &str) -> CreateVolumeRequest {
        CreateVolumeRequest {
            name: self.name(what),
            capacity_range: Some(CapacityRange {
                required_bytes: self.opts.test_volume_size,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_capability()],
            parameters: self.opts.test_volume_parameters.clone(),
            secrets: self.opts.secrets.get("CreateVolumeSecret"),
            volume_content_source: None,
            accessibility_requirements: self.node_topology().map(|t| TopologyRequirement {
                requisite: vec![t.clone()],
                preferred: vec![t],
            }),
            mutable_parameters: HashMap::new(),
        }
    }

    /// CreateVolume, recording the volume for cleanup; a non-OK answer is returned as is.
    pub async fn try_create_volume(&self, req: CreateVolumeRequest) -> Result<Volume, Status> {
        let name = req.name.clone();
        let volume = self
            .controller
            .clone()
            .create_volume(self.req(req))
            .await?
            .into_inner()
            .volume
            .ok_or_else(|| {
                Status::internal(format!("CreateVolume {name} answered OK without a volume"))
            })?;
        if !volume.volume_id.is_empty() {
            self.track(Created::Volume(volume.volume_id.clone()));
        }
        Ok(volume)
    }

    /// CreateVolume that must succeed with a volume id.
    pub async fn create_volume(&self, req: CreateVolumeRequest) -> Result<Volume, Failure> {
        let name = req.name.clone();
        let v = self
            .try_create_volume(req)
            .await
            .map_err(|s| Failure::Fail(describe(&format!("CreateVolume {name}"), &s)))?;
        ensure!(
            !v.volume_id.is_empty(),
            "CreateVolume {name}: the response has an empty volume_id"
        );
        Ok(v)
    }

    /// DeleteVolume with the DeleteVolume secrets; forgets the volume on success.
    pub async fn try_delete_volume(&self, id: &str) -> Result<(), Status> {
        let req = DeleteVolumeRequest {
            volume_id: id.to_owned(),
            secrets: self.opts.secrets.get("DeleteVolumeSecret"),
        };
        self.controller.clone().delete_volume(self.req(req)).await?;
        self.untrack(&Created::Volume(id.to_owned()));
        Ok(())
    }

    /// DeleteVolume that must succeed.
    pub async fn delete_volume(&self, id: &str) -> Verdict {
        self.try_delete_volume(id)
            .await
            .map_err(|s| Failure::Fail(describe(&format!("DeleteVolume {id}"), &s)))
    }

    /// CreateSnapshot, recording the snapshot for cleanup.
    pub async fn try_create_snapshot(
        &self,
        source_volume_id: &str,
        name: &str,
    ) -> Result<Snapshot, Status> {
        let req = CreateSnapshotRequest {
            source_volume_id: source_volume_id.to_owned(),
            name: name.to_owned(),
            secrets: self.opts.secrets.get("CreateSnapshotSecret"),
            parameters: self.opts.test_snapshot_parameters.clone(),
        };
        let snap = self
            .controller
            .clone()
            .create_snapshot(self.req(req))
            .await?
            .into_inner()
            .snapshot
            .ok_or_else(|| {
                Status::internal(format!(
                    "CreateSnapshot {name} answered OK without a snapshot"
                ))
            })?;
        if !snap.snapshot_id.is_empty() {
            self.track(Created::Snapshot(snap.snapshot_id.clone()));
        }
        Ok(snap)
    }

    /// CreateSnapshot that must succeed with a snapshot id.
    pub async fn create_snapshot(
        &self,
        source_volume_id: &str,
        name: &str,
    ) -> Result<Snapshot, Failure> {
        let s = self
            .try_create_snapshot(source_volume_id, name)
            .await
            .map_err(|s| Failure::Fail(describe(&format!("CreateSnapshot {name}"), &s)))?;
        ensure!(
            !s.snapshot_id.is_empty(),
            "CreateSnapshot {name}: the response has an empty snapshot_id"
        );
        Ok(s)
    }

    /// DeleteSnapshot; forgets the snapshot on success.
    pub async fn try_delete_snapshot(&self, id: &str) -> Result<(), Status> {
        let req = DeleteSnapshotRequest {
            snapshot_id: id.to_owned(),
            secrets: self.opts.secrets.get("DeleteSnapshotSecret"),
        };
        self.controller
            .clone()
            .delete_snapshot(self.req(req))
            .await?;
        self.untrack(&Created::Snapshot(id.to_owned()));
        Ok(())
    }

    /// Every volume id ListVolumes returns, walking pages of `max_entries`.
    pub async fn list_all_volumes(&self, max_entries: i32) -> Result<Vec<String>, Failure> {
        let mut ids = Vec::new();
        let mut token = String::new();
        // A driver that keeps handing out tokens must not hang the run.
        for _ in 0..10_000 {
            let page = self
                .controller
                .clone()
                .list_volumes(self.req(ListVolumesRequest {
                    max_entries,
                    starting_token: token.clone(),
                }))
                .await
                .map_err(|s| Failure::Fail(describe("ListVolumes", &s)))?
                .into_inner();
            if max_entries > 0 && page.entries.len() > max_entries as usize {
                fail!(
                    "ListVolumes returned {} entries with max_entries={max_entries}",
                    page.entries.len()
                );
            }
            for e in page.entries {
                let Some(v) = e.volume else {
                    fail!("ListVolumes returned an entry without a volume")
                };
                ids.push(v.volume_id);
            }
            if page.next_token.is_empty() {
                return Ok(ids);
            }
            token = page.next_token;
        }
        fail!("ListVolumes still returned a next_token after 10000 pages")
    }

    /// Deletes everything the check created (snapshots first) and returns what could not be
    /// deleted.
    pub async fn cleanup(&self) -> Vec<String> {
        let created = std::mem::take(&mut *self.created.lock().unwrap_or_else(|p| p.into_inner()));
        let mut errors = Vec::new();
        let (snapshots, volumes): (Vec<_>, Vec<_>) = created
            .into_iter()
            .partition(|c| matches!(c, Created::Snapshot(_)));
        // Newest first, snapshots before volumes, so nothing is deleted while something made from it
        // still exists.
        for c in snapshots.into_iter().rev().chain(volumes.into_iter().rev()) {
            let result = match &c {
                Created::Snapshot(id) => self
                    .try_delete_snapshot(id)
                    .await
                    .map_err(|s| describe(&format!("DeleteSnapshot {id}"), &s)),
                Created::Volume(id) => self
                    .try_delete_volume(id)
                    .await
                    .map_err(|s| describe(&format!("DeleteVolume {id}"), &s)),
            };
            if let Err(e) = result {
                errors.push(e);
            }
        }
        errors
    }

    fn track(&self, c: Created) {
        let mut created = self.created.lock().unwrap_or_else(|p| p.into_inner());
        if !created.contains(&c) {
            created.push(c);
        }
    }

    fn untrack(&self, c: &Created) {
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|x| x != c);
    }
}

/// A single-node-writer filesystem capability.
pub fn mount_capability() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
    }
}

/// `what: CODE: message`.
pub fn describe(what: &str, s: &Status) -> String {
    format!("{what}: {}: {}", code_name(s.code()), s.message())
}

/// The CSI/gRPC spelling of a code, e.g. `INVALID_ARGUMENT`.
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Passes when `got` is an error with one of `want`; fails on success or another code.
pub fn expect_code<T>(what: &str, got: Result<T, Status>, want: &[Code]) -> Verdict {
    let wanted = want
        .iter()
        .map(|c| code_name(*c))
        .collect::<Vec<_>>()
        .join(" or ");
    match got {
        Ok(_) => fail!("{what}: succeeded, but the CSI spec requires {wanted}"),
        Err(s) if want.contains(&s.code()) => Ok(()),
        Err(s) => fail!(
            "{what}: got {}, but the CSI spec requires {wanted}",
            describe("", &s).trim_start_matches(": ")
        ),
    }
}
