//! One world: a fresh kube-sim (or, with `DIFF_WORLD=real`, a fresh real control plane), the mock
//! driver(s) and one provisioner binary, driven through a scenario's steps. Both binaries get
//! identical worlds; only the binary differs.
// Shared by the differential and crash-point suites; each uses a subset.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use mock_csi_driver::StateDump;
use serde_json::{Value, json};

use crate::common::{Cluster, DEADLINE, DRIVER, Driver, Sidecar, TOPOLOGY_KEY};
use crate::scenario::{Condition, DriverSwitch, Mode, ObjectRef, Scenario, SidecarAction, Step};

/// A local address nothing listens on now (a sidecar's metrics endpoint).
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").to_string()
}

/// Whether `DIFF_WORLD=real` asks for a real control plane in every world.
pub fn real_world_wanted() -> bool {
    std::env::var("DIFF_WORLD").as_deref() == Ok("real")
}

/// How long one `wait` may take before it is recorded as timed out.
pub const WAIT_DEADLINE: Duration = Duration::from_secs(60);

/// Where a kind lives in the API: (group, version, plural, namespaced).
pub fn resource_of(kind: &str) -> Option<(&'static str, &'static str, &'static str, bool)> {
    Some(match kind {
        "PersistentVolumeClaim" => ("", "v1", "persistentvolumeclaims", true),
        "PersistentVolume" => ("", "v1", "persistentvolumes", false),
        "Secret" => ("", "v1", "secrets", true),
        "Node" => ("", "v1", "nodes", false),
        "Pod" => ("", "v1", "pods", true),
        "Namespace" => ("", "v1", "namespaces", false),
        "StorageClass" => ("storage.k8s.io", "v1", "storageclasses", false),
        "CSINode" => ("storage.k8s.io", "v1", "csinodes", false),
        "VolumeAttachment" => ("storage.k8s.io", "v1", "volumeattachments", false),
        "VolumeAttributesClass" => ("storage.k8s.io", "v1", "volumeattributesclasses", false),
        "VolumeSnapshot" => ("snapshot.storage.k8s.io", "v1", "volumesnapshots", true),
        "VolumeSnapshotContent" => (
            "snapshot.storage.k8s.io",
            "v1",
            "volumesnapshotcontents",
            false,
        ),
        "VolumeSnapshotClass" => (
            "snapshot.storage.k8s.io",
            "v1",
            "volumesnapshotclasses",
            false,
        ),
        "ReferenceGrant" => (
            "gateway.networking.k8s.io",
            "v1beta1",
            "referencegrants",
            true,
        ),
        _ => return None,
    })
}

/// Before or after the effect of a held request or call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    Before,
    After,
}

/// A crash point: the `nth` request the sidecar sends matching an API write, or the `nth` call of
/// a CSI method on one node's driver, held before or after its effect.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Point {
    Api {
        verb: String,
        resource: String,
        nth: u64,
        side: Side,
    },
    Csi {
        node: String,
        method: String,
        nth: u64,
        side: Side,
    },
}

impl std::fmt::Display for Point {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |s: &Side| match s {
            Side::Before => "before",
            Side::After => "after",
        };
        match self {
            Point::Api {
                verb,
                resource,
                nth,
                side: s,
            } => write!(f, "{} {verb} {resource} #{nth}", side(s)),
            Point::Csi {
                node,
                method,
                nth,
                side: s,
            } => write!(f, "{} {method} #{nth} on {node}", side(s)),
        }
    }
}

/// The crash point of a replay and whether it fired.
struct Crash {
    point: Point,
    hold_id: Option<u64>,
    fired: bool,
}

/// User agent prefix of both sidecars (ours and upstream's client-go default).
pub const SIDECAR_AGENT: &str = "csi-provisioner";

/// Which provisioner a world runs.
#[derive(Debug, Clone)]
pub struct Binary {
    /// `ours` or `upstream`, for logs.
    pub label: String,
    pub path: PathBuf,
}

/// Run-time values the steps made and the identities to normalise.
#[derive(Debug, Default, Clone)]
pub struct Tokens {
    /// Object UID -> stable name (`default/c1` for claims, `Kind:ns/name` otherwise).
    pub uids: BTreeMap<String, String>,
    /// Driver volume id -> CreateVolume name, for every volume ever seen.
    pub volumes: BTreeMap<String, String>,
    /// Driver snapshot id -> name.
    pub snapshots: BTreeMap<String, String>,
    /// `{{...}}` variables of the steps.
    pub vars: BTreeMap<String, String>,
}

pub struct World {
    pub cluster: Cluster,
    /// Node name -> driver (controller mode: one, under the first node's name or `controller`).
    pub drivers: BTreeMap<String, Driver>,
    pub sidecars: BTreeMap<String, Sidecar>,
    /// The metrics address (`--http-endpoint`) of each sidecar, by the key of `sidecars`.
    pub metrics: BTreeMap<String, String>,
    pub tokens: Tokens,
    /// Waits that timed out, in step order.
    pub timeouts: Vec<String>,
    /// Outcomes kept by `checkpoint` steps, their paths prefixed with `<name>:`.
    pub checkpoints: crate::outcome::Outcome,
    /// The crash point of a crash-point replay.
    crash: Option<Crash>,
    /// How long one `wait` may take (shorter for the best-effort steps while down).
    wait_deadline: Duration,
    binary: Binary,
    scenario: Scenario,
}

impl World {
    pub async fn start(scenario: &Scenario, binary: &Binary) -> Result<World, String> {
        Self::start_with(scenario, binary, None).await
    }

    /// A world whose sidecar will be killed at `point` (held until then), then restarted.
    pub async fn start_with(
        scenario: &Scenario,
        binary: &Binary,
        point: Option<Point>,
    ) -> Result<World, String> {
        let cluster = if real_world_wanted() {
            start_real_cluster().await?
        } else {
            Cluster::start().await
        };
        let mut world = World {
            cluster,
            drivers: BTreeMap::new(),
            sidecars: BTreeMap::new(),
            metrics: BTreeMap::new(),
            tokens: Tokens::default(),
            timeouts: Vec::new(),
            checkpoints: Default::default(),
            crash: None,
            wait_deadline: WAIT_DEADLINE,
            binary: binary.clone(),
            scenario: scenario.clone(),
        };
        for node in &scenario.nodes {
            world.add_node(node.name(), node.has_driver()).await?;
        }
        let dir = world.cluster.dir.path().to_path_buf();
        let driver_name = scenario.driver_name.as_deref().unwrap_or(DRIVER);
        let mut driver_flags: Vec<String> = vec!["--record-requests".into()];
        if let Some(key) = &scenario.topology_key {
            driver_flags.push(format!("--topology-key={key}"));
        }
        driver_flags.extend(scenario.driver.iter().cloned());
        let with_driver: Vec<String> = scenario
            .nodes
            .iter()
            .filter(|n| n.has_driver())
            .map(|n| n.name().to_owned())
            .collect();
        match scenario.mode {
            Mode::Controller => {
                let home = with_driver
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "controller".into());
                let mut flags = driver_flags.clone();
                if flags.iter().any(|f| f == "--topology") {
                    flags.extend(
                        with_driver
                            .iter()
                            .skip(1)
                            .map(|n| format!("--topology-node={n}")),
                    );
                }
                let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                let driver = Driver::start_as(&dir, &home, driver_name, &flags).await;
                world.drivers.insert(home, driver);
            }
            Mode::Node => {
                for node in &with_driver {
                    let flags: Vec<&str> = driver_flags.iter().map(String::as_str).collect();
                    let driver = Driver::start_as(&dir, node, driver_name, &flags).await;
                    world.drivers.insert(node.clone(), driver);
                }
            }
        }
        if world.is_real() && uses_snapshots(scenario) {
            world.install_snapshot_crds().await?;
        }
        for obj in scenario.objects.clone() {
            world.create(obj).await?;
        }
        if let Some(point) = point {
            world.arm(point).await?;
        }
        world.start_sidecars().await;
        Ok(world)
    }

    /// Installs the hold of a crash point.
    async fn arm(&mut self, point: Point) -> Result<(), String> {
        let hold_id = match &point {
            Point::Api {
                verb,
                resource,
                nth,
                side,
            } => Some(
                self.sim_only("an API crash point")?
                    .holds()
                    .add(kube_sim::HoldRule {
                        verb: Some(verb.clone()),
                        resource: Some(resource.clone()),
                        name: None,
                        agent: Some(SIDECAR_AGENT.into()),
                        nth: *nth,
                        when: match side {
                            Side::Before => kube_sim::When::Before,
                            Side::After => kube_sim::When::After,
                        },
                    }),
            ),
            Point::Csi {
                node,
                method,
                nth,
                side,
            } => {
                let when = match side {
                    Side::Before => mock_csi_driver::HoldWhen::Before,
                    Side::After => mock_csi_driver::HoldWhen::After,
                };
                self.driver_for(Some(node))?
                    .control()
                    .await
                    .set_hold(method, *nth, when)
                    .await
                    .map_err(|e| e.to_string())?;
                None
            }
        };
        self.crash = Some(Crash {
            point,
            hold_id,
            fired: false,
        });
        Ok(())
    }

    /// Whether the crash point fired (the sidecar was killed there and restarted).
    pub fn crash_fired(&self) -> bool {
        self.crash.as_ref().is_some_and(|c| c.fired)
    }

    /// When the crash point's request or call is held: SIGKILL the sidecars, run the
    /// scenario's `while_down` steps, release the hold (a request held before its effect is
    /// dropped, as a crash before it left would), start the sidecars again.
    pub async fn crash_check(&mut self) {
        let Some(crash) = &self.crash else {
            return;
        };
        if crash.fired {
            return;
        }
        let held = match &crash.point {
            Point::Api { .. } => {
                let id = crash.hold_id;
                self.cluster
                    .sim()
                    .holds()
                    .list()
                    .iter()
                    .any(|h| Some(h.id) == id && h.state == kube_sim::HoldState::Held)
            }
            Point::Csi { node, method, .. } => match self.drivers.get(node) {
                Some(d) => match mock_csi_driver::ControlClient::connect(&d.control).await {
                    Ok(c) => c.state().await.is_ok_and(|s| {
                        s.holds
                            .get(method)
                            .is_some_and(|h| h.state == mock_csi_driver::HoldState::Held)
                    }),
                    Err(_) => false,
                },
                None => false,
            },
        };
        if !held {
            return;
        }
        let point = crash.point.clone();
        let hold_id = crash.hold_id;
        if let Some(c) = &mut self.crash {
            c.fired = true;
        }
        for key in self.crashing_sidecars() {
            if let Some(mut s) = self.sidecars.remove(&key) {
                s.kill().await;
            }
        }
        let deadline = std::mem::replace(&mut self.wait_deadline, Duration::from_secs(5));
        for (i, step) in self.scenario.while_down.clone().into_iter().enumerate() {
            if let Err(e) = Box::pin(self.run_step(1000 + i, step)).await {
                tracing::debug!("while down, step {i}: {e}");
            }
        }
        self.wait_deadline = deadline;
        match &point {
            Point::Api { side, .. } => {
                if let Some(id) = hold_id {
                    self.cluster.sim().holds().release(id, *side == Side::After);
                }
            }
            Point::Csi {
                node, method, side, ..
            } => {
                if let Ok(d) = self.driver_for(Some(node)) {
                    let _ = d
                        .control()
                        .await
                        .release_hold(method, *side == Side::After)
                        .await;
                }
            }
        }
        self.start_sidecars().await;
    }

    /// Starts every sidecar that is not running: one per driver, or `replicas` with leader
    /// election (keyed `<node>#<i>`, identity `replica-<i>`).
    async fn start_sidecars(&mut self) {
        let replicas = self.scenario.replicas.max(1);
        for (node, driver) in &self.drivers {
            for i in 0..replicas {
                let key = if replicas > 1 {
                    format!("{node}#{i}")
                } else {
                    node.clone()
                };
                if self.sidecars.contains_key(&key) {
                    continue;
                }
                let mut flags = self.scenario.sidecar.clone();
                if self.binary.label == "ours" {
                    flags.extend(self.scenario.ours.iter().cloned());
                }
                let identity = format!("replica-{i}");
                let mut env: Vec<(&str, &str)> = Vec::new();
                // Every sidecar serves metrics, so the suite compares the families both serve.
                if !flags
                    .iter()
                    .any(|f| f.starts_with("--http-endpoint") || f.starts_with("--metrics-address"))
                {
                    let address = free_address();
                    flags.push(format!("--http-endpoint={address}"));
                    self.metrics.insert(key.clone(), address);
                }
                // Capacity objects live in the sidecar's namespace.
                if flags.iter().any(|f| f == "--enable-capacity") {
                    env.push(("NAMESPACE", "default"));
                }
                if self.scenario.mode == Mode::Node {
                    flags.insert(0, "--node-deployment".into());
                    env.push(("NODE_NAME", node));
                }
                if replicas > 1 {
                    flags.insert(0, "--leader-election".into());
                    env.push(("HOSTNAME", &identity));
                }
                let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                let name = format!("{}-{}", self.binary.label, key.replace('#', "-r"));
                let sidecar = Sidecar::start_bin(
                    &self.cluster,
                    driver,
                    &self.binary.path,
                    &name,
                    &flags,
                    &env,
                )
                .await;
                self.sidecars.insert(key, sidecar);
            }
        }
    }

    /// The sidecars a crash point kills: the leader's among replicas (the one whose write was
    /// held; the others take over), else all.
    fn crashing_sidecars(&self) -> Vec<String> {
        if self.scenario.replicas <= 1 {
            return self.sidecars.keys().cloned().collect();
        }
        let Some(sim) = self.cluster.try_sim() else {
            return self.sidecars.keys().cloned().collect();
        };
        let leader = sim.objects("leases").into_iter().find_map(|l| {
            let holder = l["spec"]["holderIdentity"].as_str()?.to_owned();
            holder.strip_prefix("replica-").map(str::to_owned)
        });
        match leader {
            Some(i) => self
                .sidecars
                .keys()
                .filter(|k| k.ends_with(&format!("#{i}")))
                .cloned()
                .collect(),
            None => self.sidecars.keys().cloned().collect(),
        }
    }

    /// Whether this world runs on a real control plane rather than kube-sim.
    pub fn is_real(&self) -> bool {
        self.cluster.try_sim().is_none()
    }

    /// kube-sim, for what only it can do (a crash point's hold).
    fn sim_only(&self, what: &str) -> Result<&kube_sim::Sim, String> {
        self.cluster
            .try_sim()
            .ok_or_else(|| format!("{what} needs kube-sim: it does not fit the real control plane"))
    }

    async fn add_node(&self, name: &str, driver: bool) -> Result<(), String> {
        let key = self
            .scenario
            .topology_key
            .as_deref()
            .unwrap_or(TOPOLOGY_KEY);
        if self.is_real() {
            return self.add_real_node(name, key, driver).await;
        }
        if driver {
            let driver = self.scenario.driver_name.as_deref().unwrap_or(DRIVER);
            self.cluster.add_node_for(name, driver, key).await;
        } else {
            self.cluster.add_node_labelled(name, key).await;
        }
        Ok(())
    }

    /// A Node the real scheduler can place pods on (capacity, Ready; no kubelet behind it, so
    /// it turns `Unknown` later and the pods tolerate every taint), labelled as kube-sim's
    /// nodes are, and the CSINode naming the driver. Not managed by the attach-detach
    /// controller: a kube-sim world has no VolumeAttachments the scenario did not make.
    async fn add_real_node(&self, name: &str, key: &str, driver: bool) -> Result<(), String> {
        let now = jiff::Timestamp::now().to_string();
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", key: name},
            },
            "status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "faked by the differential suite", "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }],
            },
        });
        let (nodes, _) = self.api("Node", None)?;
        let node: DynamicObject =
            serde_json::from_value(node).map_err(|e| format!("node {name}: {e}"))?;
        let node = nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(|e| format!("create Node {name}: {e}"))?;
        if !driver {
            return Ok(());
        }
        let driver_name = self.scenario.driver_name.as_deref().unwrap_or(DRIVER);
        // Owned by its Node, as the kubelet makes it: the garbage collector removes it with it.
        let csinode = json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": {
                "name": name,
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": name,
                    "uid": node.metadata.uid.clone().unwrap_or_default(),
                }],
            },
            "spec": {"drivers": [{"name": driver_name, "nodeID": name, "topologyKeys": [key]}]},
        });
        let (csinodes, _) = self.api("CSINode", None)?;
        let csinode: DynamicObject =
            serde_json::from_value(csinode).map_err(|e| format!("CSINode {name}: {e}"))?;
        csinodes
            .create(&PostParams::default(), &csinode)
            .await
            .map_err(|e| format!("create CSINode {name}: {e}"))?;
        Ok(())
    }

    /// The three snapshot CRDs (`snapshot.storage.k8s.io/v1`, with a status subresource), which a
    /// real control plane lacks and kube-sim serves built in. Their schema keeps every field
    /// unvalidated: the objects are stored as the scenario writes them, as kube-sim stores them.
    async fn install_snapshot_crds(&self) -> Result<(), String> {
        let ar = ApiResource {
            group: "apiextensions.k8s.io".into(),
            version: "v1".into(),
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            plural: "customresourcedefinitions".into(),
        };
        let api: Api<DynamicObject> = Api::all_with(self.cluster.client.clone(), &ar);
        let crds = [
            ("VolumeSnapshot", "volumesnapshots", "Namespaced"),
            ("VolumeSnapshotContent", "volumesnapshotcontents", "Cluster"),
            ("VolumeSnapshotClass", "volumesnapshotclasses", "Cluster"),
        ];
        for (kind, plural, scope) in crds {
            let crd = json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {
                    "name": format!("{plural}.snapshot.storage.k8s.io"),
                    // A *.k8s.io group is protected: the API server wants its API review.
                    "annotations": {
                        "api-approved.kubernetes.io":
                            "https://github.com/kubernetes-csi/external-snapshotter/pull/419",
                    },
                },
                "spec": {
                    "group": "snapshot.storage.k8s.io",
                    "scope": scope,
                    "names": {
                        "kind": kind,
                        "listKind": format!("{kind}List"),
                        "plural": plural,
                        "singular": kind.to_lowercase(),
                    },
                    "versions": [{
                        "name": "v1",
                        "served": true,
                        "storage": true,
                        "subresources": {"status": {}},
                        "schema": {"openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": true,
                        }},
                    }],
                },
            });
            let crd: DynamicObject =
                serde_json::from_value(crd).map_err(|e| format!("CRD {plural}: {e}"))?;
            api.create(&PostParams::default(), &crd)
                .await
                .map_err(|e| format!("create CRD {plural}: {e}"))?;
        }
        // Established: the API server serves the kinds, so the objects and the sidecars'
        // informers that follow find them.
        let start = tokio::time::Instant::now();
        for (_, plural, _) in crds {
            let name = format!("{plural}.snapshot.storage.k8s.io");
            loop {
                let established = api.get_opt(&name).await.ok().flatten().is_some_and(|c| {
                    c.data["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                });
                if established {
                    break;
                }
                if start.elapsed() > DEADLINE {
                    return Err(format!("CRD {name} never established"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Every object of a resource (by plural) as JSON: kube-sim's store read directly, or a
    /// list through the admin client on the real control plane (empty when the API server does
    /// not serve the resource).
    pub async fn objects(&self, plural: &str) -> Vec<Value> {
        if let Some(sim) = self.cluster.try_sim() {
            return sim.objects(plural);
        }
        let Some(ar) = api_resource_of_plural(plural) else {
            return Vec::new();
        };
        let api: Api<DynamicObject> = Api::all_with(self.cluster.client.clone(), &ar);
        match api.list(&kube::api::ListParams::default()).await {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect(),
            Err(e) => {
                tracing::debug!("list {plural}: {e}");
                Vec::new()
            }
        }
    }

    /// One object (by plural, namespace `""` for cluster-scoped, name), as [`World::objects`].
    pub async fn object(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        if let Some(sim) = self.cluster.try_sim() {
            return sim.object(plural, ns, name);
        }
        let ar = api_resource_of_plural(plural)?;
        let client = self.cluster.client.clone();
        let api: Api<DynamicObject> = if ns.is_empty() {
            Api::all_with(client, &ar)
        } else {
            Api::namespaced_with(client, ns, &ar)
        };
        let obj = api.get_opt(name).await.ok()??;
        serde_json::to_value(obj).ok()
    }

    /// Kills the sidecars, the drivers and a real control plane, leaving the directory.
    pub async fn stop_processes(&mut self) {
        for s in self.sidecars.values_mut() {
            s.kill().await;
        }
        for d in self.drivers.values_mut() {
            d.kill().await;
        }
        self.cluster.stop_control_plane();
    }

    /// The sidecar logs, for a report.
    pub fn logs(&self) -> Vec<PathBuf> {
        self.sidecars.values().map(|s| s.log.clone()).collect()
    }

    pub fn dir(&self) -> &Path {
        self.cluster.dir.path()
    }

    fn api(&self, kind: &str, ns: Option<&str>) -> Result<(Api<DynamicObject>, bool), String> {
        let (group, version, plural, namespaced) =
            resource_of(kind).ok_or_else(|| format!("unknown kind {kind}"))?;
        let ar = api_resource(group, version, kind, plural);
        let client = self.cluster.client.clone();
        let api = if namespaced {
            Api::namespaced_with(client, ns.unwrap_or("default"), &ar)
        } else {
            Api::all_with(client, &ar)
        };
        Ok((api, namespaced))
    }

    /// Creates one object through the API (apiVersion and namespace filled in) and remembers its
    /// UID for normalising.
    pub async fn create(&mut self, obj: Value) -> Result<(), String> {
        let mut obj = self.substitute(obj);
        let kind = obj["kind"].as_str().unwrap_or_default().to_owned();
        let (group, version, _, namespaced) =
            resource_of(&kind).ok_or_else(|| format!("unknown kind {kind:?} in {obj}"))?;
        if obj.get("apiVersion").is_none() {
            obj["apiVersion"] = json!(if group.is_empty() {
                version.to_owned()
            } else {
                format!("{group}/{version}")
            });
        }
        if namespaced && obj["metadata"].get("namespace").is_none() {
            obj["metadata"]["namespace"] = json!("default");
        }
        if kind == "Pod" && self.is_real() {
            obj = placed_by_scheduler(obj);
        }
        let ns = obj["metadata"]["namespace"].as_str().map(str::to_owned);
        if let Some(ns) = &ns {
            self.cluster.ensure_namespace(ns).await;
        }
        let (api, _) = self.api(&kind, ns.as_deref())?;
        let dynamic: DynamicObject =
            serde_json::from_value(obj.clone()).map_err(|e| format!("{kind}: {e}"))?;
        let created = api
            .create(&PostParams::default(), &dynamic)
            .await
            .map_err(|e| format!("create {kind} {}: {e}", obj["metadata"]["name"]))?;
        if let (Some(uid), Some(name)) = (&created.metadata.uid, &created.metadata.name) {
            self.tokens
                .vars
                .insert(format!("uid:{kind}/{name}"), uid.clone());
        }
        self.remember(&kind, &created.metadata);
        Ok(())
    }

    /// Remembers an object's UID under its stable name.
    pub fn remember(&mut self, kind: &str, meta: &kube::api::ObjectMeta) {
        let (Some(uid), Some(name)) = (&meta.uid, &meta.name) else {
            return;
        };
        let ns = meta.namespace.as_deref().unwrap_or("");
        let token = if kind == "PersistentVolumeClaim" {
            format!("{ns}/{name}")
        } else if ns.is_empty() {
            format!("{kind}:{name}")
        } else {
            format!("{kind}:{ns}/{name}")
        };
        self.tokens.uids.entry(uid.clone()).or_insert(token);
    }

    /// `{{var}}` references in every string of `v`, replaced by their values.
    fn substitute(&self, v: Value) -> Value {
        match v {
            Value::String(s) if s.contains("{{") => {
                let mut out = s.clone();
                for (k, val) in &self.tokens.vars {
                    out = out.replace(&format!("{{{{{k}}}}}"), val);
                }
                Value::String(out)
            }
            Value::Array(a) => Value::Array(a.into_iter().map(|x| self.substitute(x)).collect()),
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .map(|(k, x)| (k, self.substitute(x)))
                    .collect(),
            ),
            other => other,
        }
    }

    fn driver_for(&self, node: Option<&str>) -> Result<&Driver, String> {
        match node {
            Some(n) => self
                .drivers
                .get(n)
                .ok_or_else(|| format!("no driver on node {n}")),
            None => self
                .drivers
                .values()
                .next()
                .ok_or_else(|| "no driver".to_owned()),
        }
    }

    /// Every driver's state.
    pub async fn states(&mut self) -> Vec<StateDump> {
        let mut out = Vec::new();
        for driver in self.drivers.values() {
            if let Ok(c) = mock_csi_driver::ControlClient::connect(&driver.control).await
                && let Ok(s) = c.state().await
            {
                out.push(s);
            }
        }
        for s in &out {
            for v in &s.volumes {
                self.tokens
                    .volumes
                    .entry(v.id.clone())
                    .or_insert_with(|| v.name.clone());
            }
            for snap in &s.snapshots {
                self.tokens
                    .snapshots
                    .entry(snap.id.clone())
                    .or_insert_with(|| snap.name.clone());
            }
        }
        out
    }

    /// Runs every step in order.
    pub async fn run_steps(&mut self) -> Result<(), String> {
        for (i, step) in self.scenario.steps.clone().into_iter().enumerate() {
            let start = tokio::time::Instant::now();
            let what = format!("{step:?}");
            self.step(i, step).await?;
            if std::env::var_os("DIFF_VERBOSE").is_some() {
                eprintln!(
                    "[{} {}] step {i} took {:.1}s: {what}",
                    self.scenario.name,
                    self.binary.label,
                    start.elapsed().as_secs_f64()
                );
            }
        }
        Ok(())
    }

    /// `{{var}}` references in one string.
    fn substitute_str(&self, s: &str) -> String {
        match self.substitute(Value::String(s.to_owned())) {
            Value::String(out) => out,
            _ => s.to_owned(),
        }
    }

    fn substitute_ref(&self, r: ObjectRef) -> ObjectRef {
        ObjectRef {
            name: self.substitute_str(&r.name),
            ..r
        }
    }

    fn substitute_condition(&self, c: Condition) -> Condition {
        match c {
            Condition::Event { on, reason } => Condition::Event {
                on: self.substitute_ref(on),
                reason,
            },
            Condition::Gone(r) => Condition::Gone(self.substitute_ref(r)),
            other => other,
        }
    }

    async fn step(&mut self, i: usize, step: Step) -> Result<(), String> {
        let result = self.run_step(i, step).await;
        // Every id seen on the way is a token, even of volumes gone by the end.
        self.states().await;
        self.crash_check().await;
        result
    }

    async fn run_step(&mut self, i: usize, step: Step) -> Result<(), String> {
        match step {
            Step::Create(objs) => {
                for obj in objs {
                    self.create(obj).await?;
                }
            }
            Step::Delete(target) => {
                let target = self.substitute_ref(target);
                let (api, _) = self.api(&target.kind, target.namespace.as_deref())?;
                // A scheduled Pod on the real control plane waits for its kubelet to confirm a
                // graceful deletion; these nodes have none, so it goes at once, as on kube-sim.
                let params = if target.kind == "Pod" && self.is_real() {
                    DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    }
                } else {
                    DeleteParams::default()
                };
                api.delete(&target.name, &params)
                    .await
                    .map_err(|e| format!("delete {} {}: {e}", target.kind, target.name))?;
                if target.kind == "Pod" && self.is_real() {
                    let ns = target.namespace.as_deref().unwrap_or("default");
                    let gone = wait_for_gone(self, "pods", ns, &target.name).await;
                    if !gone {
                        self.timeouts
                            .push(format!("step {i}: Pod {} never went", target.name));
                    }
                }
            }
            Step::Patch { target, merge } => {
                let target = self.substitute_ref(target);
                let merge = self.substitute(merge);
                let (api, _) = self.api(&target.kind, target.namespace.as_deref())?;
                api.patch(&target.name, &PatchParams::default(), &Patch::Merge(&merge))
                    .await
                    .map_err(|e| format!("patch {} {}: {e}", target.kind, target.name))?;
            }
            Step::Status { target, merge } => {
                let target = self.substitute_ref(target);
                let merge = self.substitute(merge);
                let (api, _) = self.api(&target.kind, target.namespace.as_deref())?;
                api.patch_status(&target.name, &PatchParams::default(), &Patch::Merge(&merge))
                    .await
                    .map_err(|e| format!("patch status of {} {}: {e}", target.kind, target.name))?;
            }
            Step::Wait(cond) => {
                let cond = self.substitute_condition(cond);
                let what = format!("step {i}: wait {cond:?}");
                if !self.wait(&cond).await {
                    self.timeouts.push(what);
                }
            }
            Step::Driver(switch) => self.switch(switch).await?,
            Step::Volume { name, node, size } => {
                let id = self
                    .make_volume(&name, node.as_deref(), size.as_deref())
                    .await?;
                self.tokens.volumes.insert(id.clone(), name.clone());
                self.tokens.vars.insert(format!("volume:{name}"), id);
            }
            Step::Snapshot { name, of_claim } => {
                let handle = self.handle_of(&of_claim).await?;
                let id = self.make_snapshot(&name, &handle).await?;
                self.tokens.snapshots.insert(id.clone(), name.clone());
                self.tokens.vars.insert(format!("snapshot:{name}"), id);
            }
            Step::DeleteNode(name) => {
                // Node mode: the node's sidecar and driver go with it; a controller stays.
                if self.scenario.mode == Mode::Node {
                    if let Some(mut s) = self.sidecars.remove(&name) {
                        s.kill().await;
                    }
                    if let Some(mut d) = self.drivers.remove(&name) {
                        d.kill().await;
                    }
                }
                self.cluster.delete_node(&name).await;
            }
            Step::Sidecar(SidecarAction::Kill) => {
                for s in self.sidecars.values_mut() {
                    s.kill().await;
                }
                self.sidecars.clear();
            }
            Step::Sidecar(SidecarAction::Start) => self.start_sidecars().await,
            Step::Checkpoint(name) => {
                if !crate::outcome::settle(self, Duration::from_secs(1), WAIT_DEADLINE).await {
                    self.timeouts
                        .push(format!("step {i}: checkpoint {name} never quiet"));
                }
                let now = crate::outcome::observe(self).await;
                self.checkpoints.extend(
                    now.into_iter()
                        .filter(|(k, _)| !k.starts_with('@'))
                        .map(|(k, v)| (format!("@{name}:{k}"), v)),
                );
            }
        }
        Ok(())
    }

    /// The volume handle of the PV bound to `claim` (in `default`), also as a variable.
    async fn handle_of(&mut self, claim: &str) -> Result<String, String> {
        let pvc = self
            .cluster
            .pvcs("default")
            .get(claim)
            .await
            .map_err(|e| format!("get claim {claim}: {e}"))?;
        let pv_name = pvc
            .spec
            .and_then(|s| s.volume_name)
            .ok_or_else(|| format!("claim {claim} is not bound"))?;
        let pv = self
            .cluster
            .pvs()
            .get(&pv_name)
            .await
            .map_err(|e| format!("get PV {pv_name}: {e}"))?;
        // An in-tree Portworx PV (CSI migration) holds the driver's volume id as it is.
        let spec = pv.spec.unwrap_or_default();
        let handle = spec
            .csi
            .map(|c| c.volume_handle)
            .or_else(|| spec.portworx_volume.map(|p| p.volume_id))
            .ok_or_else(|| format!("PV {pv_name} has no CSI source"))?;
        self.tokens
            .vars
            .insert(format!("volume-of:{claim}"), handle.clone());
        Ok(handle)
    }

    async fn switch(&self, s: DriverSwitch) -> Result<(), String> {
        let driver = self.driver_for(s.node.as_deref())?;
        let control = driver.control().await;
        if s.clear {
            control.clear_faults().await.map_err(|e| e.to_string())?;
        }
        if let Some(spec) = &s.fail {
            let (method, rule) =
                mock_csi_driver::config::parse_fault(spec).map_err(|e| e.to_string())?;
            control
                .set_fault(method, rule)
                .await
                .map_err(|e| e.to_string())?;
        }
        if let Some(cap) = &s.capability {
            let (name, on) = cap
                .split_once('=')
                .ok_or_else(|| format!("capability {cap:?}: use NAME=on|off"))?;
            let cap: mock_csi_driver::ControllerCap = name.parse().map_err(|e| format!("{e}"))?;
            control
                .set_capability(cap, on == "on")
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    async fn make_volume(
        &self,
        name: &str,
        node: Option<&str>,
        size: Option<&str>,
    ) -> Result<String, String> {
        use mock_csi_driver::csi::v1::controller_client::ControllerClient;
        use mock_csi_driver::csi::v1::volume_capability::{
            AccessMode, AccessType, MountVolume, access_mode,
        };
        use mock_csi_driver::csi::v1::{
            CapacityRange, CreateVolumeRequest, Topology, TopologyRequirement, VolumeCapability,
        };
        // Node mode: the volume is made by its node's driver, whose topology is that node's.
        let driver = match node {
            Some(n) if self.scenario.mode == Mode::Node => self.driver_for(Some(n))?,
            _ => self.driver_for(None)?,
        };
        let channel = mock_csi_driver::connect(&driver.socket)
            .await
            .map_err(|e| e.to_string())?;
        let bytes = match size {
            Some(s) => mock_csi_driver::config::parse_quantity(s).map_err(|e| e.to_string())?,
            None => 1 << 30,
        };
        let request = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: access_mode::Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Mount(MountVolume::default())),
            }],
            accessibility_requirements: node.map(|n| TopologyRequirement {
                requisite: vec![Topology {
                    segments: [(
                        self.scenario
                            .topology_key
                            .clone()
                            .unwrap_or_else(|| TOPOLOGY_KEY.to_owned()),
                        n.to_owned(),
                    )]
                    .into(),
                }],
                preferred: vec![],
            }),
            ..Default::default()
        };
        let response = ControllerClient::new(channel)
            .create_volume(request)
            .await
            .map_err(|e| format!("CreateVolume {name}: {e}"))?;
        response
            .into_inner()
            .volume
            .map(|v| v.volume_id)
            .ok_or_else(|| "CreateVolume answered no volume".to_owned())
    }

    async fn make_snapshot(&self, name: &str, source: &str) -> Result<String, String> {
        use mock_csi_driver::csi::v1::CreateSnapshotRequest;
        use mock_csi_driver::csi::v1::controller_client::ControllerClient;
        let driver = self.driver_for(None)?;
        let channel = mock_csi_driver::connect(&driver.socket)
            .await
            .map_err(|e| e.to_string())?;
        let response = ControllerClient::new(channel)
            .create_snapshot(CreateSnapshotRequest {
                name: name.into(),
                source_volume_id: source.into(),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("CreateSnapshot {name}: {e}"))?;
        response
            .into_inner()
            .snapshot
            .map(|s| s.snapshot_id)
            .ok_or_else(|| "CreateSnapshot answered no snapshot".to_owned())
    }

    /// Polls the condition until it holds (true) or the deadline passes (false).
    async fn wait(&mut self, cond: &Condition) -> bool {
        if let Condition::Quiet(secs) = cond {
            let deadline = self.wait_deadline;
            return crate::outcome::settle(self, Duration::from_secs_f64(*secs), deadline).await;
        }
        let start = tokio::time::Instant::now();
        loop {
            self.crash_check().await;
            if self.holds(cond).await {
                return true;
            }
            if start.elapsed() > self.wait_deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn holds(&mut self, cond: &Condition) -> bool {
        match cond {
            Condition::Bound(name) => self
                .object("persistentvolumeclaims", "default", name)
                .await
                .is_some_and(|c| c["status"]["phase"] == "Bound"),
            Condition::Event { on, reason } => {
                let ns = on.namespace.clone().unwrap_or_else(|| "default".into());
                self.objects("events").await.iter().any(|e| {
                    let o = &e["involvedObject"];
                    o["kind"] == on.kind.as_str()
                        && o["name"] == on.name.as_str()
                        && (o["namespace"].is_null()
                            || o["namespace"] == ""
                            || o["namespace"] == ns.as_str())
                        && e["reason"] == reason.as_str()
                })
            }
            Condition::Gone(target) => {
                let Some((_, _, plural, namespaced)) = resource_of(&target.kind) else {
                    return false;
                };
                let ns = if namespaced {
                    target.namespace.as_deref().unwrap_or("default")
                } else {
                    ""
                };
                self.object(plural, ns, &target.name).await.is_none()
            }
            Condition::PvPhase { claim, phase } => {
                let Some(c) = self
                    .object("persistentvolumeclaims", "default", claim)
                    .await
                else {
                    // A deleted claim: any PV whose claimRef names it.
                    return self.objects("persistentvolumes").await.iter().any(|pv| {
                        pv["spec"]["claimRef"]["name"] == claim.as_str()
                            && pv["status"]["phase"] == phase.as_str()
                    });
                };
                let Some(pv) = c["spec"]["volumeName"].as_str() else {
                    return false;
                };
                self.object("persistentvolumes", "", pv)
                    .await
                    .is_some_and(|pv| pv["status"]["phase"] == phase.as_str())
            }
            Condition::Volumes(n) => {
                let states = self.states().await;
                states.len() == self.drivers.len()
                    && states.iter().map(|s| s.volumes.len()).sum::<usize>() == *n
            }
            Condition::Pvs(n) => self.objects("persistentvolumes").await.len() == *n,
            Condition::Calls { method, at_least } => {
                let states = self.states().await;
                states.iter().map(|s| s.calls(method)).sum::<u64>() >= *at_least
            }
            Condition::Quiet(_) => true,
            Condition::Capacity { class, is } => {
                self.objects("csistoragecapacities").await.iter().any(|c| {
                    c["storageClassName"] == class.as_str() && c["capacity"] == is.as_str()
                })
            }
        }
    }
}

/// The API resource of a plural [`World::objects`] reads.
fn api_resource_of_plural(plural: &str) -> Option<ApiResource> {
    let (group, version, kind) = match plural {
        "persistentvolumeclaims" => ("", "v1", "PersistentVolumeClaim"),
        "persistentvolumes" => ("", "v1", "PersistentVolume"),
        "events" => ("", "v1", "Event"),
        "pods" => ("", "v1", "Pod"),
        "leases" => ("coordination.k8s.io", "v1", "Lease"),
        "csistoragecapacities" => ("storage.k8s.io", "v1", "CSIStorageCapacity"),
        "volumesnapshots" => ("snapshot.storage.k8s.io", "v1", "VolumeSnapshot"),
        "volumesnapshotcontents" => ("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent"),
        _ => return None,
    };
    Some(api_resource(group, version, kind, plural))
}

/// The API resource of `kind` (`plural`) in `group`/`version` (the core group is "").
fn api_resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A scenario's Pod "on" a node, for the real scheduler: kube-sim selects the node of a Pod
/// with `nodeName`, while the real scheduler only places (and selects a node for the
/// WaitForFirstConsumer claims of) a Pod without one. So `nodeName` becomes a `nodeSelector`
/// on that host name, and the Pod tolerates every taint (the nodes have no kubelet and turn
/// unreachable).
pub fn placed_by_scheduler(mut pod: Value) -> Value {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return pod;
    };
    if let Some(Value::String(node)) = spec.remove("nodeName") {
        spec.insert(
            "nodeSelector".into(),
            json!({"kubernetes.io/hostname": node}),
        );
    }
    spec.insert("tolerations".into(), json!([{"operator": "Exists"}]));
    pod
}

/// Waits (deadline [`DEADLINE`]) until the object is gone; false when it never went.
async fn wait_for_gone(world: &World, plural: &str, ns: &str, name: &str) -> bool {
    let start = tokio::time::Instant::now();
    while start.elapsed() < DEADLINE {
        if world.object(plural, ns, name).await.is_none() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Whether the scenario makes snapshot objects or restores a claim from one.
pub fn uses_snapshots(s: &Scenario) -> bool {
    let created = s
        .steps
        .iter()
        .chain(&s.while_down)
        .filter_map(|step| match step {
            Step::Create(objs) => Some(objs.iter()),
            _ => None,
        });
    s.objects.iter().chain(created.flatten()).any(|o| {
        o["kind"]
            .as_str()
            .is_some_and(|k| k.starts_with("VolumeSnapshot"))
            || o["spec"]["dataSource"]["kind"] == "VolumeSnapshot"
    })
}

/// A fresh real control plane, started again when it does not come up: its ports are picked
/// free but may be taken before its processes bind them (any connection's ephemeral port).
async fn start_real_cluster() -> Result<Cluster, String> {
    const ATTEMPTS: usize = 3;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        // In a task of its own: a component that exits panics there, and the half-started
        // control plane is dropped (its processes killed) with the task.
        match tokio::spawn(Cluster::start_real()).await {
            Ok(Some(cluster)) => return Ok(cluster),
            Ok(None) => {
                return Err(format!(
                    "DIFF_WORLD=real: the real control plane is not built here (run {})",
                    crate::common::real_cluster::BUILD_SCRIPT
                ));
            }
            Err(e) => {
                last = e.to_string();
                tracing::warn!("the real control plane did not come up, starting another: {last}");
            }
        }
    }
    Err(format!(
        "the real control plane did not come up in {ATTEMPTS} attempts; the last: {last}"
    ))
}
