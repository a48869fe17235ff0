//! End-to-end harness: the API simulator in-process, mock CSI drivers and csi-provisioner sidecars as
//! real child processes on real Unix sockets, and condition waits with deadlines (never sleeps).
#![allow(dead_code)] // Each test binary uses a different subset of the harness.

pub mod exposition;
pub mod real_cluster;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    Pod, PodSpec, Secret, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, Resource};
use kube_sim::{Sim, SimConfig};
use mock_csi_driver::StateDump;
use mock_csi_driver::control::ControlClient;
use tempfile::TempDir;
use tokio::process::{Child, Command};

/// Driver name every test uses.
pub const DRIVER: &str = "mock.csi.rs";
/// Topology key the mock driver reports with `--topology`.
pub const TOPOLOGY_KEY: &str = "topology.mock.csi/node";
/// The label of every intent-ledger Lease (valued with the ledger's name).
pub const LEDGER_LABEL: &str = "csi-provisioner.rs/intent-ledger";
/// The per-claim intent finalizer (node mode, or without Lease RBAC).
pub const INTENT_FINALIZER: &str = "csi-provisioner.rs/provisioning-intent";
/// Default deadline for a condition in these tests: generous, since CI machines are slow and shared.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Polls `probe` until it returns `Some`, or panics naming `what` after `deadline`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(20);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if start.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(250));
    }
}

/// `program` as a command whose process dies (SIGKILL) when the thread that starts it ends, the
/// test's own death included: a test killed outright (a timeout's SIGKILL, the OOM killer)
/// otherwise leaves its control plane, drivers and sidecars running. util-linux's `setpriv`
/// (Essential on Debian) sets the parent-death signal, which its exec of `program` keeps; tests
/// start their processes on the test's thread or its runtime's workers, which outlive them.
pub fn dying_with_test(program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let mut command = std::process::Command::new("setpriv");
    command.args(["--pdeathsig", "KILL", "--"]).arg(program);
    command
}

/// Builds the workspace binaries the tests spawn (a no-op when they are current), once per process.
fn built_bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let status = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "-q",
                "-p",
                "mock-csi-driver",
                "--bin",
                "mock-csi-driver",
            ])
            .status()
            .expect("run cargo build for the mock driver");
        assert!(status.success(), "building mock-csi-driver failed");
    });
    // Integration tests run from target/<profile>/deps; binaries live one level up.
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    dir.join(name)
}

/// What a test needs of any API server, simulated or real: an admin client, a temporary
/// directory and a kubeconfig for the sidecars. The helpers that only talk to the API live here,
/// so a scenario reads the same on kube-sim ([`Cluster`]) and on a real control plane
/// ([`real_cluster::RealCluster`]).
pub struct World {
    pub client: Client,
    pub dir: TempDir,
    pub kubeconfig: PathBuf,
}

/// The cluster of an end-to-end test: kube-sim, or with `KUBE_WORLD=real` the real control plane
/// (`real_cluster`), for the tests that need no more than the API and its controllers. A test
/// that reaches for [`Cluster::sim`] (fault injection, holds, stored objects) fits kube-sim only.
pub struct Cluster {
    sim: Option<Sim>,
    /// Kept for its processes: dropping it stops the control plane.
    _plane: Option<real_cluster::ControlPlane>,
    world: World,
}

impl std::ops::Deref for Cluster {
    type Target = World;
    fn deref(&self) -> &World {
        &self.world
    }
}

impl Cluster {
    /// kube-sim, or the real control plane when `KUBE_WORLD=real` (it must be built then).
    pub async fn start() -> Self {
        if std::env::var("KUBE_WORLD").as_deref() == Ok("real") {
            return Self::start_real()
                .await
                .unwrap_or_else(|| panic!("KUBE_WORLD=real needs {}", real_cluster::BUILD_SCRIPT));
        }
        Self::start_with(SimConfig::default()).await
    }

    /// The real control plane, or `None` (with the reason printed) when it is not built here.
    pub async fn start_real() -> Option<Self> {
        let (world, plane) = real_cluster::RealCluster::start().await?.into_parts();
        let cluster = Self {
            sim: None,
            _plane: Some(plane),
            world,
        };
        cluster.ensure_namespace("default").await;
        Some(cluster)
    }

    /// Stops the real control plane's processes now (a no-op on kube-sim), for a test that
    /// keeps the world's directory past its end.
    pub fn stop_control_plane(&mut self) {
        self._plane = None;
    }

    /// The simulator, or `None` on the real control plane.
    pub fn try_sim(&self) -> Option<&Sim> {
        self.sim.as_ref()
    }

    /// The simulator behind this cluster: for what only kube-sim can do.
    pub fn sim(&self) -> &Sim {
        self.sim.as_ref().expect(
            "this test drives kube-sim itself (faults, holds or stored objects): it does not fit \
             the real control plane (KUBE_WORLD=real)",
        )
    }

    pub async fn start_with(cfg: SimConfig) -> Self {
        let sim = Sim::start(cfg).await.expect("start kube-sim");
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).expect("write kubeconfig");
        let client = sim.client();
        let cluster = Self {
            sim: Some(sim),
            _plane: None,
            world: World {
                client,
                dir,
                kubeconfig,
            },
        };
        cluster.ensure_namespace("default").await;
        cluster
    }
}

impl World {
    pub async fn ensure_namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create namespace {name}: {e}"),
        }
    }

    /// Every entry of every intent ledger (Leases labelled `csi-provisioner.rs/intent-ledger`):
    /// `(ledger, volume, "namespace/claim")`.
    pub async fn ledger_entries(&self) -> Vec<(String, String, String)> {
        let api: Api<k8s_openapi::api::coordination::v1::Lease> = Api::all(self.client.clone());
        let leases = api
            .list(&ListParams::default().labels(LEDGER_LABEL))
            .await
            .expect("list ledger leases");
        let mut out = Vec::new();
        for lease in leases.items {
            let ledger = lease
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LEDGER_LABEL))
                .cloned()
                .unwrap_or_default();
            let Some(text) = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("csi-provisioner.rs/intents"))
            else {
                continue;
            };
            let entries: Vec<serde_json::Value> =
                serde_json::from_str(text).expect("ledger entries are JSON");
            for e in entries {
                let field = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                out.push((
                    ledger.clone(),
                    field("volume"),
                    format!("{}/{}", field("namespace"), field("claim")),
                ));
            }
        }
        out
    }

    /// Whether a provisioning intent for claim `ns/name` is recorded: in an intent ledger, or on
    /// the claim itself (finalizer; node mode, or without Lease RBAC).
    pub async fn intent_recorded(&self, ns: &str, name: &str) -> bool {
        let on_claim = self
            .pvcs(ns)
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .is_some_and(|c| {
                c.metadata
                    .finalizers
                    .unwrap_or_default()
                    .iter()
                    .any(|f| f == INTENT_FINALIZER)
            });
        let claim = format!("{ns}/{name}");
        on_claim
            || self
                .ledger_entries()
                .await
                .iter()
                .any(|(_, _, c)| *c == claim)
    }

    /// Waits until [`World::intent_recorded`] is `want` for `ns/name`.
    pub async fn wait_intent(&self, ns: &str, name: &str, want: bool) {
        let what = if want { "recorded" } else { "gone" };
        wait_for(
            &format!("intent of {ns}/{name} {what}"),
            DEADLINE,
            || async { (self.intent_recorded(ns, name).await == want).then_some(()) },
        )
        .await;
    }

    pub fn pvcs(&self, ns: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), ns)
    }
    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }
    pub fn classes(&self) -> Api<StorageClass> {
        Api::all(self.client.clone())
    }
    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }
    pub fn csinodes(&self) -> Api<CSINode> {
        Api::all(self.client.clone())
    }
    pub fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }
    pub fn secrets(&self, ns: &str) -> Api<Secret> {
        Api::namespaced(self.client.clone(), ns)
    }

    pub async fn create<K>(&self, api: &Api<K>, obj: &K) -> K
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        api.create(&PostParams::default(), obj)
            .await
            .unwrap_or_else(|e| panic!("create {:?}: {e}", obj.meta().name))
    }

    /// A Node plus its CSINode registering `DRIVER` with the mock's topology key.
    pub async fn add_node(&self, name: &str) -> Node {
        self.add_node_for(name, DRIVER, TOPOLOGY_KEY).await
    }

    /// [`World::add_node`] for a driver named `driver` whose topology key is `key` (a driver
    /// of another name, such as a migrated plugin's).
    pub async fn add_node_for(&self, name: &str, driver: &str, key: &str) -> Node {
        let node = self.add_node_labelled(name, key).await;
        let csinode = CSINode {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: CSINodeSpec {
                drivers: vec![CSINodeDriver {
                    name: driver.into(),
                    node_id: name.into(),
                    topology_keys: Some(vec![key.into()]),
                    ..Default::default()
                }],
            },
        };
        self.create(&self.csinodes(), &csinode).await;
        node
    }

    /// A Node only, labelled as [`World::add_node`] does, without a CSINode (a node where our
    /// driver does not run, or not yet).
    pub async fn add_node_without_driver(&self, name: &str) -> Node {
        self.add_node_labelled(name, TOPOLOGY_KEY).await
    }

    /// A Node labelled with its host name and `{key: name}`.
    pub async fn add_node_labelled(&self, name: &str, key: &str) -> Node {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".to_string(), name.to_string()),
                    (key.to_string(), name.to_string()),
                ])),
                ..Default::default()
            },
            ..Default::default()
        };
        self.create(&self.nodes(), &node).await
    }

    /// [`World::add_node`] for each of `names`, in order.
    pub async fn add_nodes(&self, names: &[&str]) {
        for name in names {
            self.add_node(name).await;
        }
    }

    /// Creates a StorageClass.
    pub async fn add_class(&self, class: &StorageClass) -> StorageClass {
        self.create(&self.classes(), class).await
    }

    /// Creates a PVC requesting `size` of `class` (see [`claim`]).
    pub async fn claim_of_class(
        &self,
        ns: &str,
        name: &str,
        class: &str,
        size: &str,
    ) -> PersistentVolumeClaim {
        self.create(&self.pvcs(ns), &claim(ns, name, class, size))
            .await
    }

    /// The most common start of a scenario: StorageClass `fast` (no parameters, Immediate), then
    /// a 1Gi claim `name` of it.
    pub async fn claim_with_fast_class(&self, ns: &str, name: &str) -> PersistentVolumeClaim {
        self.add_class(&storage_class("fast", &[])).await;
        self.claim_of_class(ns, name, "fast", "1Gi").await
    }

    /// Creates a Pod on `node` using `claim` (the simulator then selects the node for the claim).
    /// kube-sim only: a real scheduler never looks at a pod created with `spec.nodeName`, so on
    /// the real control plane its WaitForFirstConsumer claim stays unselected (there, set the
    /// claim's `volume.kubernetes.io/selected-node`, or let the scheduler place the pod).
    pub async fn schedule(&self, ns: &str, pod: &str, claim: &str, node: &str) -> Pod {
        self.create(&self.pods(ns), &pod_using(ns, pod, claim, node))
            .await
    }

    /// Deletes a Node and its CSINode (the garbage collector does the latter in a real cluster)
    /// and waits until both are gone.
    pub async fn delete_node(&self, name: &str) {
        let _ = self.nodes().delete(name, &DeleteParams::default()).await;
        let _ = self.csinodes().delete(name, &DeleteParams::default()).await;
        wait_for(&format!("Node {name} to disappear"), DEADLINE, || async {
            let node = self.nodes().get_opt(name).await.ok()?;
            let csinode = self.csinodes().get_opt(name).await.ok()?;
            (node.is_none() && csinode.is_none()).then_some(())
        })
        .await;
    }

    /// The Events on an object (`ns` empty: any namespace, as for cluster-scoped objects).
    pub async fn events_on(&self, kind: &str, ns: &str, name: &str) -> Vec<Event> {
        let api: Api<Event> = Api::all(self.client.clone());
        let list = api.list(&ListParams::default()).await.expect("list events");
        list.items
            .into_iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some(kind)
                    && e.involved_object.name.as_deref() == Some(name)
                    && (ns.is_empty() || e.involved_object.namespace.as_deref() == Some(ns))
            })
            .collect()
    }

    /// Total `count` of the events with `reason` on an object (an aggregated event counts as many
    /// times as it was recorded).
    pub async fn event_count(&self, kind: &str, ns: &str, name: &str, reason: &str) -> i32 {
        self.events_on(kind, ns, name)
            .await
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| e.count.unwrap_or(1).max(1))
            .sum()
    }

    /// Every Event on an object as `(reason, message, count)`: an aggregated repeat is one Event
    /// with a count above 1.
    pub async fn events_counted(&self, kind: &str, name: &str) -> Vec<(String, String, i32)> {
        self.events_on(kind, "", name)
            .await
            .into_iter()
            .map(|e| {
                let count = e.count.unwrap_or(1);
                (
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                    count,
                )
            })
            .collect()
    }

    /// Deletes a PVC and waits until it is gone from the API.
    pub async fn delete_pvc_and_wait(&self, ns: &str, name: &str) {
        let api = self.pvcs(ns);
        let _ = api.delete(name, &DeleteParams::default()).await;
        wait_for(
            &format!("PVC {ns}/{name} to disappear"),
            DEADLINE,
            || async {
                match api.get_opt(name).await {
                    Ok(None) => Some(()),
                    _ => None,
                }
            },
        )
        .await;
    }

    /// Waits for a PVC to be Bound and returns its PV.
    pub async fn wait_bound(&self, ns: &str, name: &str) -> PersistentVolume {
        let pvcs = self.pvcs(ns);
        let pv_name = wait_for(
            &format!("PVC {ns}/{name} to be Bound"),
            DEADLINE,
            || async {
                let pvc = pvcs.get_opt(name).await.ok()??;
                let bound = pvc.status.as_ref()?.phase.as_deref() == Some("Bound");
                bound.then(|| pvc.spec.as_ref()?.volume_name.clone())?
            },
        )
        .await;
        self.pvs().get(&pv_name).await.expect("bound PV")
    }

    /// How many PVs exist.
    pub async fn pv_count(&self) -> usize {
        self.pvs()
            .list(&ListParams::default())
            .await
            .expect("list PVs")
            .items
            .len()
    }

    /// Waits until no PV with this name exists.
    pub async fn wait_pv_gone(&self, name: &str) {
        let pvs = self.pvs();
        wait_for(&format!("PV {name} to disappear"), DEADLINE, || async {
            matches!(pvs.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
    }

    /// Messages of events on an object, e.g. `("PersistentVolumeClaim", "default", "c1")`.
    pub async fn events_for(&self, kind: &str, ns: &str, name: &str) -> Vec<(String, String)> {
        self.events_on(kind, ns, name)
            .await
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// [`World::wait_event`] on the claim `ns/name`.
    pub async fn wait_claim_event(
        &self,
        ns: &str,
        name: &str,
        reason: &str,
        needle: &str,
    ) -> String {
        self.wait_event("PersistentVolumeClaim", ns, name, reason, needle)
            .await
    }

    /// [`World::wait_event`] on the PV `name`.
    pub async fn wait_pv_event(&self, name: &str, reason: &str, needle: &str) -> String {
        self.wait_event("PersistentVolume", "", name, reason, needle)
            .await
    }

    /// Waits for an event with `reason` whose message contains `needle` on the object.
    pub async fn wait_event(
        &self,
        kind: &str,
        ns: &str,
        name: &str,
        reason: &str,
        needle: &str,
    ) -> String {
        wait_for(
            &format!("event {reason} containing {needle:?} on {kind} {ns}/{name}"),
            DEADLINE,
            || async {
                self.events_for(kind, ns, name)
                    .await
                    .into_iter()
                    .find(|(r, m)| r == reason && m.contains(needle))
                    .map(|(_, m)| m)
            },
        )
        .await
    }
}

/// An object's annotation as stored.
pub fn annotation<'a, K: Resource>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.meta()
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The values of the mock's topology key in the PV's required node affinity: the nodes its
/// volume is on.
pub fn affinity_nodes(pv: &PersistentVolume) -> Vec<String> {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .filter(|e| e.key == TOPOLOGY_KEY && e.operator == "In")
                .flat_map(|e| e.values.iter().flatten().cloned())
                .collect()
        })
        .unwrap_or_default()
}

/// An object's label as stored.
pub fn label<'a, K: Resource>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.meta().labels.as_ref()?.get(key).map(String::as_str)
}

/// A StorageClass of our driver.
pub fn storage_class(name: &str, params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: DRIVER.into(),
        parameters: Some(
            params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("Immediate".into()),
        ..Default::default()
    }
}

/// The same class with `WaitForFirstConsumer` binding.
pub fn delayed(mut class: StorageClass) -> StorageClass {
    class.volume_binding_mode = Some("WaitForFirstConsumer".into());
    class
}

/// A StorageClass of our driver, no parameters, `WaitForFirstConsumer` binding.
pub fn delayed_class(name: &str) -> StorageClass {
    delayed(storage_class(name, &[]))
}

/// A StorageClass whose provisioner secret is `<claim name>-creds` in the claim's namespace
/// (upstream's templates), used for provisioning and, recorded on the PV, for deletion.
pub fn templated_secret_class(name: &str) -> StorageClass {
    storage_class(
        name,
        &[
            (
                "csi.storage.k8s.io/provisioner-secret-name",
                "${pvc.name}-creds",
            ),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pvc.namespace}",
            ),
        ],
    )
}

/// A Secret holding one `key` with `value`.
pub fn secret(ns: &str, name: &str, key: &str, value: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            key.to_string(),
            k8s_openapi::ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

/// A PVC requesting `size` of `class`.
pub fn claim(ns: &str, name: &str, class: &str, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.into()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A Pod on `node` using `claim` (the simulator then sets selected-node for delayed binding).
/// A kube-sim-only shortcut ([`World::schedule`]): it pins the claim to any node, even one the
/// real scheduler would refuse (no driver there, outside the class's topology).
pub fn pod_using(ns: &str, name: &str, claim: &str, node: &str) -> Pod {
    let spec: PodSpec = serde_json::from_value(serde_json::json!({
        "nodeName": node,
        "containers": [{"name": "app", "image": "busybox"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
    }))
    .expect("pod spec");
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    }
}

/// The usual scenario start: a cluster, a mock driver on `node-1` with `driver_flags` and a
/// sidecar for it with `sidecar_flags`.
pub async fn start_single_node(
    driver_flags: &[&str],
    sidecar_flags: &[&str],
) -> (Cluster, Driver, Sidecar) {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", driver_flags).await;
    let sidecar = Sidecar::start(&cluster, &driver, sidecar_flags).await;
    (cluster, driver, sidecar)
}

/// A mock CSI driver child process with its socket, state file and control socket.
pub struct Driver {
    pub node: String,
    pub socket: PathBuf,
    pub control: PathBuf,
    pub state_file: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
}

impl Driver {
    /// Starts `mock-csi-driver` for `node` in `dir`, with extra flags.
    pub async fn start(dir: &Path, node: &str, extra: &[&str]) -> Self {
        Self::start_as(dir, node, DRIVER, extra).await
    }

    /// [`Driver::start`] under another driver name (a second driver in the cluster); `node` also
    /// names its directory, so give each driver its own.
    pub async fn start_as(dir: &Path, node: &str, name: &str, extra: &[&str]) -> Self {
        let base = dir.join(format!("driver-{node}"));
        std::fs::create_dir_all(&base).expect("driver dir");
        let socket = base.join("csi.sock");
        let control = base.join("control.sock");
        let state_file = base.join("state.json");
        let mut args = vec![
            format!("--endpoint=unix://{}", socket.display()),
            format!("--drivername={name}"),
            format!("--nodeid={node}"),
            format!("--state-file={}", state_file.display()),
            format!("--control={}", control.display()),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut driver = Self {
            node: node.into(),
            socket,
            control,
            state_file,
            args,
            child: None,
            log: base.join("driver.log"),
        };
        driver.spawn().await;
        driver
    }

    /// A driver that is not running (yet): only its socket path, for a sidecar started before it.
    pub fn placeholder(node: &str, socket: &Path) -> Self {
        Self {
            node: node.into(),
            socket: socket.to_path_buf(),
            control: socket.with_file_name("control.sock"),
            state_file: socket.with_file_name("state.json"),
            args: Vec::new(),
            child: None,
            log: socket.with_file_name("driver.log"),
        }
    }

    async fn spawn(&mut self) {
        let _ = std::fs::remove_file(&self.control);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("driver log");
        let child = Command::from(dying_with_test(built_bin("mock-csi-driver")))
            .args(&self.args)
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn mock-csi-driver");
        self.child = Some(child);
        let control = self.control.clone();
        // Accepting connections, not merely bound: the socket file appears before `listen`.
        wait_for("mock driver control socket", DEADLINE, || async {
            ControlClient::connect(&control).await.ok().map(drop)
        })
        .await;
    }

    /// Creates a volume straight through the driver's CSI socket, as an administrator does before
    /// writing a static PV for it (or as a leak looks); returns the volume id.
    pub async fn create_volume(&self, name: &str) -> String {
        self.create_volume_on(name, None, None).await
    }

    /// [`Driver::create_volume`] of `bytes` (default 1 GiB) on `node`'s pool (a driver started
    /// with `--topology`), e.g. to fill a node up.
    pub async fn create_volume_on(
        &self,
        name: &str,
        node: Option<&str>,
        bytes: Option<i64>,
    ) -> String {
        use mock_csi_driver::csi::v1::controller_client::ControllerClient;
        use mock_csi_driver::csi::v1::volume_capability::{
            AccessMode, AccessType, MountVolume, access_mode,
        };
        use mock_csi_driver::csi::v1::{
            CapacityRange, CreateVolumeRequest, Topology, TopologyRequirement, VolumeCapability,
        };
        let channel = mock_csi_driver::connect(&self.socket)
            .await
            .expect("connect to the mock driver's CSI socket");
        let request = CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: vec![VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: access_mode::Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Mount(MountVolume::default())),
            }],
            capacity_range: bytes.map(|b| CapacityRange {
                required_bytes: b,
                limit_bytes: 0,
            }),
            accessibility_requirements: node.map(|n| TopologyRequirement {
                requisite: vec![Topology {
                    segments: [(TOPOLOGY_KEY.to_owned(), n.to_owned())].into(),
                }],
                preferred: vec![],
            }),
            ..Default::default()
        };
        let response = ControllerClient::new(channel)
            .create_volume(request)
            .await
            .unwrap_or_else(|e| panic!("CreateVolume {name} on the mock driver: {e}"));
        response
            .into_inner()
            .volume
            .expect("CreateVolume answered a volume")
            .volume_id
    }

    /// Deletes a volume straight through the driver's CSI socket (a volume lost behind a PV).
    pub async fn delete_volume(&self, id: &str) {
        use mock_csi_driver::csi::v1::DeleteVolumeRequest;
        use mock_csi_driver::csi::v1::controller_client::ControllerClient;
        let channel = mock_csi_driver::connect(&self.socket)
            .await
            .expect("connect to the mock driver's CSI socket");
        ControllerClient::new(channel)
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("DeleteVolume {id} on the mock driver: {e}"));
    }

    /// Kills the driver (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts the driver again with the same flags and state file.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    /// Waits for the child to exit by itself (e.g. a crash-after-create fault) and returns its code.
    pub async fn wait_exit(&mut self) -> Option<i32> {
        let child = self.child.as_mut()?;
        let status = tokio::time::timeout(DEADLINE, child.wait())
            .await
            .expect("driver exit within deadline")
            .ok()?;
        self.child = None;
        status.code()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A client of the driver's control socket.
    pub async fn control(&self) -> ControlClient {
        ControlClient::connect(&self.control)
            .await
            .expect("connect to the mock driver's control socket")
    }

    /// A client of the driver's control socket, once every CreateVolume of the driver creates its
    /// volume and then answers DEADLINE_EXCEEDED: the sidecar never learns the volume's id.
    pub async fn creates_then_times_out(&self) -> ControlClient {
        let control = self.control().await;
        control
            .set_fault(
                "CreateVolume",
                mock_csi_driver::FaultRule::always(tonic::Code::DeadlineExceeded).after_effect(),
            )
            .await
            .expect("CreateVolume fault");
        control
    }

    /// The driver's state: volumes, snapshots, call counts.
    pub async fn state(&self) -> StateDump {
        self.control()
            .await
            .state()
            .await
            .expect("mock driver state")
    }

    /// Waits until the driver holds exactly `n` volumes and returns the state.
    pub async fn wait_volumes(&self, n: usize) -> StateDump {
        wait_for(
            &format!("{n} volumes on driver {}", self.node),
            DEADLINE,
            || async {
                let state = self.control().await.state().await.ok()?;
                (state.volumes.len() == n).then_some(state)
            },
        )
        .await
    }
}

/// A csi-provisioner child process.
pub struct Sidecar {
    pub name: String,
    /// The provisioner binary: ours unless started with [`Sidecar::start_bin`].
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    pub log: PathBuf,
    /// Where the current process's lines start in `log` (a sidecar started again appends).
    run_starts: usize,
}

impl Sidecar {
    /// Starts the sidecar against `cluster` and `driver` with test-friendly defaults plus `extra` flags
    /// (later flags win, so `extra` can override the defaults).
    pub async fn start(cluster: &World, driver: &Driver, extra: &[&str]) -> Self {
        Self::start_env(cluster, driver, extra, &[]).await
    }

    pub async fn start_env(
        cluster: &World,
        driver: &Driver,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_named(
            cluster,
            driver,
            &format!("sidecar-{}", driver.node),
            extra,
            env,
        )
        .await
    }

    /// [`Sidecar::start_env`] under `name` (its log file), for several sidecars of one driver name.
    pub async fn start_named(
        cluster: &World,
        driver: &Driver,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let ours = Path::new(env!("CARGO_BIN_EXE_csi-provisioner"));
        Self::start_bin(cluster, driver, ours, name, extra, env).await
    }

    /// [`Sidecar::start_named`] with another provisioner binary (any taking upstream's flags,
    /// such as the upstream sidecar the differential suite compares with).
    pub async fn start_bin(
        cluster: &World,
        driver: &Driver,
        bin: &Path,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let name = name.to_owned();
        let mut args = vec![
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            format!("--csi-address={}", driver.socket.display()),
            "--v=5".into(),
            "--kube-api-qps=1000".into(),
            "--kube-api-burst=2000".into(),
            "--retry-interval-start=100ms".into(),
            "--retry-interval-max=2s".into(),
            "--timeout=5s".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut sidecar = Self {
            log: cluster.dir.path().join(format!("{name}.log")),
            name,
            bin: bin.to_path_buf(),
            args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            run_starts: 0,
        };
        sidecar.spawn();
        sidecar
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("sidecar log");
        self.run_starts = log.metadata().map_or(0, |m| m.len() as usize);
        let child = Command::from(dying_with_test(&self.bin))
            .args(&self.args)
            .envs(self.env.iter().cloned())
            .env_remove("KUBECONFIG")
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn csi-provisioner");
        self.child = Some(child);
    }

    /// Whether the process is still running (it has not exited by itself).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Waits for the sidecar to exit by itself and returns its exit code.
    pub async fn wait_exit(&mut self) -> Option<i32> {
        let child = self.child.as_mut()?;
        let status = tokio::time::timeout(DEADLINE, child.wait())
            .await
            .expect("sidecar exit within deadline")
            .ok()?;
        self.child = None;
        status.code()
    }

    /// SIGKILL: the crash case, nothing is cleaned up.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// SIGTERM: a graceful shutdown, as a pod deletion does. Does not wait.
    pub async fn terminate(&self) {
        let pid = self.pid().expect("sidecar running");
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid} failed");
    }

    /// Starts it again with the same flags.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What the current process logged (not a process before it on the same log).
    fn this_run_log(&self) -> String {
        self.log()
            .get(self.run_starts..)
            .unwrap_or_default()
            .to_owned()
    }

    /// How many log lines contain every one of `parts`.
    pub fn log_lines_with(&self, parts: &[&str]) -> usize {
        self.log()
            .lines()
            .filter(|line| parts.iter().all(|p| line.contains(p)))
            .count()
    }

    /// Waits until at least `n` log lines contain every one of `parts`: the positive signal a
    /// "nothing happened" check needs before it may look.
    pub async fn wait_log(&self, parts: &[&str], n: usize) {
        wait_for(
            &format!("{n} sidecar log line(s) with {parts:?}"),
            DEADLINE,
            || async { (self.log_lines_with(parts) >= n).then_some(()) },
        )
        .await
    }
}

impl Sidecar {
    /// The address the sidecar's HTTP server listens on (start it with
    /// `--http-endpoint=127.0.0.1:0`), read from its log.
    pub async fn http_addr(&self) -> String {
        wait_for(
            &format!("{} to log its HTTP address", self.name),
            DEADLINE,
            || async {
                let log = self.this_run_log();
                let line = log.lines().find(|l| l.contains("HTTP server listening"))?;
                let rest = &line[line.find("address=")? + "address=".len()..];
                Some(rest.split_whitespace().next()?.trim_matches('"').to_owned())
            },
        )
        .await
    }

    /// Waits until the sidecar has filled its caches and started its controllers (its log says so).
    pub async fn wait_started(&self) {
        wait_for(
            &format!("{} to start its controllers", self.name),
            DEADLINE,
            || async {
                self.this_run_log()
                    .contains("starting controllers")
                    .then_some(())
            },
        )
        .await;
    }

    /// One scrape of `/metrics` (the body), or `None` when the sidecar does not answer.
    pub async fn try_metrics(&self) -> Option<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.http_addr().await;
        let mut stream = tokio::net::TcpStream::connect(&addr).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: sidecar\r\n\r\n")
            .await
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (_, body) = response.split_once("\r\n\r\n")?;
        Some(body.to_owned())
    }

    /// The value of an unlabelled metric, e.g. `csi_provisioner_deleted_node_volumes_total`
    /// (`None`: not answered or not exposed).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let text = self.try_metrics().await?;
        metric_value(&text, name)
    }

    /// Waits until the unlabelled sample `name` reads `want`.
    pub async fn wait_metric(&self, name: &str, want: f64) {
        wait_for(&format!("{name} to be {want}"), DEADLINE, || async {
            (self.metric(name).await? == want).then_some(())
        })
        .await
    }
}

/// The value of the unlabelled sample `name` in Prometheus text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        // A failing test shows what the sidecar said; passing tests stay quiet.
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!("----- last lines of {} -----", self.name);
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// A `snapshot.storage.k8s.io/v1` resource for dynamic clients.
pub fn snapshot_api(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "snapshot.storage.k8s.io".into(),
        version: "v1".into(),
        api_version: "snapshot.storage.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Takes a snapshot of `volume_id` on the driver, then writes the VolumeSnapshot `ns/name` and
/// its bound content (of driver `driver_name`) as the snapshot controller would, `ready` as given.
/// Returns the snapshot id.
pub async fn make_snapshot(
    cluster: &Cluster,
    driver: &Driver,
    driver_name: &str,
    ns: &str,
    volume_id: &str,
    name: &str,
    ready: bool,
) -> String {
    use mock_csi_driver::csi::v1::CreateSnapshotRequest;
    use mock_csi_driver::csi::v1::controller_client::ControllerClient;
    let channel = mock_csi_driver::connect(&driver.socket)
        .await
        .expect("connect to the mock driver");
    let id = ControllerClient::new(channel)
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: volume_id.into(),
            name: format!("snapshot-{name}"),
            ..Default::default()
        })
        .await
        .expect("CreateSnapshot")
        .into_inner()
        .snapshot
        .expect("a snapshot")
        .snapshot_id;

    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        ns,
        &snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    let contents: Api<DynamicObject> = Api::all_with(
        cluster.client.clone(),
        &snapshot_api("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    let content_name = format!("content-{name}");
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"source": {"persistentVolumeClaimName": "src"}},
    }))
    .expect("snapshot object");
    let created = snapshots
        .create(&PostParams::default(), &obj)
        .await
        .expect("create VolumeSnapshot");
    let uid = created.metadata.uid.clone().expect("uid");
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": content_name},
        "spec": {"driver": driver_name, "deletionPolicy": "Delete", "source": {"snapshotHandle": id},
            "sourceVolumeMode": "Filesystem",
            "volumeSnapshotRef": {"kind": "VolumeSnapshot", "namespace": ns, "name": name, "uid": uid}},
    }))
    .expect("content object");
    contents
        .create(&PostParams::default(), &obj)
        .await
        .expect("create VolumeSnapshotContent");
    let status = serde_json::json!({"status": {"snapshotHandle": id, "readyToUse": ready, "restoreSize": 1_073_741_824}});
    contents
        .patch_status(
            &content_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .expect("content status");
    let status = serde_json::json!({"status": {"boundVolumeSnapshotContentName": content_name,
        "readyToUse": ready, "restoreSize": "1Gi"}});
    snapshots
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("snapshot status");
    id
}
