//! A real Kubernetes 1.20.2 control plane for end-to-end tests: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler on free loopback ports, with TLS, RBAC and
//! service-account tokens, and Node objects faked for the nodes a test needs (no kubelet).
//!
//! The three Kubernetes binaries come from `tests/real-cluster/build.sh` (Debian's source package,
//! built into a cache outside the checkout); etcd is Debian's `etcd-server`. Without them
//! [`RealCluster::start`] prints why and returns `None`, and the test skips. Every process is
//! stopped by its PID when the cluster is dropped.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use super::{DEADLINE, TOPOLOGY_KEY, World, wait_for};

/// The script that builds the control plane; named in every skip message.
pub const BUILD_SCRIPT: &str = "tests/real-cluster/build.sh";
const VERSION: &str = "1.20.2";
const COMPONENTS: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];
/// How long the node lifecycle controller waits for a heartbeat before it marks a Node
/// `Unknown` (40 s by default; shorter so the "node stops heartbeating" scenario is quick).
pub const NODE_MONITOR_GRACE: &str = "15s";

/// Where the build script puts the binaries: `$KUBE_BIN_DIR`, else the cache.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KUBE_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("CSI_PROVISIONER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/csi-provisioner")
        });
    cache.join(format!("kubernetes-{VERSION}/bin"))
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Why the real control plane cannot run here, if it cannot.
pub fn missing() -> Option<String> {
    let dir = bin_dir();
    let absent: Vec<&str> = COMPONENTS
        .iter()
        .copied()
        .filter(|c| !dir.join(c).is_file())
        .collect();
    if !absent.is_empty() {
        return Some(format!(
            "{} not found in {}: run {BUILD_SCRIPT} once",
            absent.join(", "),
            dir.display()
        ));
    }
    for tool in ["etcd", "openssl"] {
        if on_path(tool).is_none() {
            return Some(format!("{tool} not found on PATH: run {BUILD_SCRIPT} once"));
        }
    }
    None
}

/// A port the kernel just handed out on 127.0.0.1 (free when this returns).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A certificate signed by the test CA: `name.crt` / `name.key` in `dir`.
fn signed_cert(dir: &Path, name: &str, subject: &str, extensions: &str) {
    let (key, csr, crt, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    std::fs::write(dir.join(&ext), extensions).expect("write extensions");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &crt,
            "-extfile",
            &ext,
        ],
    );
}

/// A kubeconfig for `server` with a client certificate, or a bearer token.
fn write_kubeconfig(path: &Path, server: &str, ca: &Path, auth: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {server}\n    \
         certificate-authority: {ca}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    \
         user: user\ncurrent-context: real\nusers:\n- name: user\n  user:\n{auth}",
        ca = ca.display()
    );
    std::fs::write(path, text).expect("write kubeconfig");
}

fn cert_auth(dir: &Path, name: &str) -> String {
    format!(
        "    client-certificate: {}\n    client-key: {}\n",
        dir.join(format!("{name}.crt")).display(),
        dir.join(format!("{name}.key")).display()
    )
}

/// One process of the control plane, stopped by its PID on drop.
struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(name: &'static str, bin: &Path, args: &[String], dir: &Path) -> Self {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("component log");
        let child = super::dying_with_test(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log fd"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} ({}): {e}", bin.display()));
        Self { name, child, log }
    }

    /// The end of its log, for a failure message.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // SIGKILL by PID: nothing of a test's control plane needs a graceful stop.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The processes of a running control plane and how to reach it.
pub struct ControlPlane {
    /// `https://127.0.0.1:PORT` of kube-apiserver.
    pub server: String,
    /// The test CA, which also signs the API server's serving certificate.
    pub ca: PathBuf,
    /// In start order; dropped (killed) in reverse, the store last.
    processes: Vec<Process>,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        while let Some(p) = self.processes.pop() {
            drop(p);
        }
    }
}

/// A running control plane: the admin [`World`] plus the processes behind it.
pub struct RealCluster {
    /// Dropped first (fields drop in order): the processes stop before their directory goes.
    plane: ControlPlane,
    world: World,
}

impl std::ops::Deref for RealCluster {
    type Target = World;
    fn deref(&self) -> &World {
        &self.world
    }
}

impl RealCluster {
    /// Starts etcd and the three components, or says why it cannot and returns `None` (the
    /// caller returns: the test is skipped).
    pub async fn start() -> Option<Self> {
        if let Some(why) = missing() {
            eprintln!("SKIPPED: the real control plane is not built here ({why})");
            return None;
        }
        // Ports are picked free, then bound by another process a moment later: another test may
        // take one in between, so a control plane whose component exits at start-up is made again.
        let mut last = String::new();
        for attempt in 1..=3 {
            match Self::start_built().await {
                Ok(cluster) => return Some(cluster),
                Err(why) => {
                    eprintln!("real control plane, attempt {attempt} failed: {why}");
                    last = why;
                }
            }
        }
        panic!("the real control plane did not start: {last}");
    }

    /// The admin world and the processes, for a [`super::Cluster`] that owns them.
    pub fn into_parts(self) -> (World, ControlPlane) {
        (self.world, self.plane)
    }

    async fn start_built() -> Result<Self, String> {
        let bins = bin_dir();
        // etcd's fsyncs dominate start-up on a shared disk; memory is enough for a test's data.
        let dir = match Path::new("/dev/shm").is_dir() {
            true => tempfile::tempdir_in("/dev/shm"),
            false => tempfile::tempdir(),
        }
        .expect("tempdir");
        let d = dir.path();
        std::fs::create_dir_all(d.join("flex")).expect("flex dir");

        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=csi-provisioner-test-ca",
            ],
        );
        signed_cert(
            d,
            "apiserver",
            "/CN=kube-apiserver",
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n\
             extendedKeyUsage=serverAuth\n",
        );
        let client_ext = "extendedKeyUsage=clientAuth\n";
        signed_cert(d, "admin", "/O=system:masters/CN=admin", client_ext);
        signed_cert(
            d,
            "controller-manager",
            "/CN=system:kube-controller-manager",
            client_ext,
        );
        signed_cert(d, "scheduler", "/CN=system:kube-scheduler", client_ext);
        // Service-account tokens are signed with an RSA key, as kubeadm makes it.
        openssl(d, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);

        let (etcd_client, etcd_peer, api_port) = (free_port(), free_port(), free_port());
        let server = format!("https://127.0.0.1:{api_port}");
        let ca = d.join("ca.crt");
        let kubeconfig = d.join("admin.kubeconfig");
        write_kubeconfig(&kubeconfig, &server, &ca, &cert_auth(d, "admin"));
        for c in ["controller-manager", "scheduler"] {
            write_kubeconfig(
                &d.join(format!("{c}.kubeconfig")),
                &server,
                &ca,
                &cert_auth(d, c),
            );
        }
        let p = |name: &str| d.join(name).display().to_string();

        let mut processes = Vec::new();
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        processes.push(Process::spawn(
            "etcd",
            &on_path("etcd").expect("etcd"),
            &[
                format!("--data-dir={}", p("etcd")),
                "--name=default".into(),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
            ],
            d,
        ));
        processes.push(Process::spawn(
            "kube-apiserver",
            &bins.join("kube-apiserver"),
            &[
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                "--insecure-port=0".into(),
                format!("--etcd-servers={etcd_url}"),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                "--service-cluster-ip-range=10.96.0.0/24".into(),
                "--authorization-mode=Node,RBAC".into(),
                "--v=1".into(),
            ],
            d,
        ));
        let world = World {
            client: admin_client(&kubeconfig).await,
            dir,
            kubeconfig,
        };
        let mut cluster = Self {
            plane: ControlPlane {
                server,
                ca,
                processes,
            },
            world,
        };
        cluster.wait_api_ready().await?;

        let d = cluster.world.dir.path().to_path_buf();
        let p = |name: &str| d.join(name).display().to_string();
        let (kcm_port, sched_port) = (free_port(), free_port());
        cluster.plane.processes.push(Process::spawn(
            "kube-controller-manager",
            &bins.join("kube-controller-manager"),
            &[
                format!("--kubeconfig={}", p("controller-manager.kubeconfig")),
                format!(
                    "--authentication-kubeconfig={}",
                    p("controller-manager.kubeconfig")
                ),
                format!(
                    "--authorization-kubeconfig={}",
                    p("controller-manager.kubeconfig")
                ),
                "--controllers=*".into(),
                "--use-service-account-credentials=true".into(),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                "--port=0".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={kcm_port}"),
                "--leader-elect=false".into(),
                format!("--flex-volume-plugin-dir={}", p("flex")),
                format!("--node-monitor-grace-period={NODE_MONITOR_GRACE}"),
                "--node-monitor-period=2s".into(),
                "--v=1".into(),
            ],
            &d,
        ));
        cluster.plane.processes.push(Process::spawn(
            "kube-scheduler",
            &bins.join("kube-scheduler"),
            &[
                format!("--kubeconfig={}", p("scheduler.kubeconfig")),
                format!("--authentication-kubeconfig={}", p("scheduler.kubeconfig")),
                format!("--authorization-kubeconfig={}", p("scheduler.kubeconfig")),
                "--port=0".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={sched_port}"),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ],
            &d,
        ));
        cluster.wait_default_token().await?;
        Ok(cluster)
    }

    /// Panics with the components' logs if one of them has exited.
    /// Why the control plane is down, if one of its processes has exited.
    fn exited(&mut self) -> Option<String> {
        self.plane
            .processes
            .iter_mut()
            .find_map(|p| match p.child.try_wait() {
                Ok(Some(status)) => Some(format!("{} exited ({status}):\n{}", p.name, p.tail())),
                _ => None,
            })
    }

    async fn wait_api_ready(&mut self) -> Result<(), String> {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(why) = self.exited() {
                return Err(why);
            }
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("request");
            if let Ok(text) = self.world.client.request_text(req).await
                && text.trim() == "ok"
            {
                return Ok(());
            }
            if start.elapsed() > DEADLINE {
                let logs: Vec<String> = self.plane.processes.iter().map(Process::tail).collect();
                return Err(format!(
                    "kube-apiserver not ready within {DEADLINE:?}:\n{}",
                    logs.join("\n")
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// The token controller has made the `default` ServiceAccount's token: the controller
    /// manager works (and pods, which need that account, can be created).
    async fn wait_default_token(&mut self) -> Result<(), String> {
        let api: Api<ServiceAccount> = Api::namespaced(self.world.client.clone(), "default");
        let start = tokio::time::Instant::now();
        loop {
            if let Some(why) = self.exited() {
                return Err(why);
            }
            if let Ok(Some(sa)) = api.get_opt("default").await
                && !sa.secrets.unwrap_or_default().is_empty()
            {
                return Ok(());
            }
            if start.elapsed() > DEADLINE {
                return Err(format!(
                    "no token for ServiceAccount default/default within {DEADLINE:?}"
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Waits until ServiceAccount `ns/name` exists with its token Secret.
    pub async fn wait_service_account(&self, ns: &str, name: &str) {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        wait_for(
            &format!("the token of ServiceAccount {ns}/{name}"),
            DEADLINE,
            || async {
                let sa = api.get_opt(name).await.ok()??;
                (!sa.secrets.unwrap_or_default().is_empty()).then_some(())
            },
        )
        .await;
    }

    /// A kubeconfig that authenticates as ServiceAccount `ns/name` with its token (made by the
    /// real token controller), for a sidecar that must run with exactly its RBAC.
    pub async fn service_account_kubeconfig(&self, ns: &str, name: &str) -> PathBuf {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        match accounts
            .create(
                &PostParams::default(),
                &ServiceAccount {
                    metadata: ObjectMeta {
                        name: Some(name.into()),
                        namespace: Some(ns.into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create ServiceAccount {ns}/{name}: {e}"),
        }
        self.wait_service_account(ns, name).await;
        let sa = accounts.get(name).await.expect("ServiceAccount");
        let secret_name = sa.secrets.unwrap_or_default()[0]
            .name
            .clone()
            .expect("token secret name");
        let secret = self.secrets(ns).get(&secret_name).await.expect("token");
        let token = secret
            .data
            .and_then(|d| d.get("token").cloned())
            .expect("token data");
        let token = String::from_utf8(token.0).expect("token is text");
        let path = self.dir.path().join(format!("{ns}-{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.plane.server,
            &self.plane.ca,
            &format!("    token: {token}\n"),
        );
        path
    }

    /// A Node as a kubelet would register it (labels, capacity, Ready, attach-detach managed
    /// by the controller) but with no kubelet behind it: it never heartbeats again, so the node
    /// lifecycle controller marks it `Unknown` after [`NODE_MONITOR_GRACE`] and taints it. Pods
    /// that must run there tolerate every taint ([`pod_placed_by_scheduler`]).
    pub async fn add_fake_node(&self, name: &str) -> Node {
        let now = jiff::Timestamp::now().to_string();
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    TOPOLOGY_KEY: name,
                },
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            },
            "status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "faked by the test", "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }],
            },
        }))
        .expect("node json");
        self.create(&self.nodes(), &node).await
    }

    /// [`RealCluster::add_fake_node`] plus the CSINode that registers `driver` there, owned by
    /// the Node as the kubelet makes it (the real garbage collector removes it with its Node).
    pub async fn add_fake_node_with_driver(&self, name: &str, driver: &str) -> Node {
        let node = self.add_fake_node(name).await;
        let csinode = CSINode {
            metadata: ObjectMeta {
                name: Some(name.into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: name.into(),
                    uid: node.metadata.uid.clone().expect("node uid"),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: CSINodeSpec {
                drivers: vec![CSINodeDriver {
                    name: driver.into(),
                    node_id: name.into(),
                    topology_keys: Some(vec![TOPOLOGY_KEY.into()]),
                    ..Default::default()
                }],
            },
        };
        self.create(&self.csinodes(), &csinode).await;
        node
    }

    /// Waits until the node lifecycle controller has marked Node `name` `Unknown` and tainted
    /// it unreachable: a node that stopped heartbeating but still exists.
    pub async fn wait_node_unreachable(&self, name: &str) -> Node {
        wait_for(
            &format!("Node {name} to be Unknown and tainted unreachable"),
            DEADLINE,
            || async {
                let node = self.nodes().get(name).await.ok()?;
                let status = node.status.as_ref()?;
                let unknown = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "Unknown");
                let tainted = node
                    .spec
                    .as_ref()?
                    .taints
                    .iter()
                    .flatten()
                    .any(|t| t.key == "node.kubernetes.io/unreachable");
                (unknown && tainted).then_some(node.clone())
            },
        )
        .await
    }
}

/// A Pod using `claim` with no node named: the real scheduler places it (and, for a
/// WaitForFirstConsumer claim, sets the claim's selected node). It tolerates every taint, since
/// the fake nodes have no kubelet and turn unreachable.
pub fn pod_placed_by_scheduler(
    ns: &str,
    name: &str,
    claim: &str,
) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "containers": [{"name": "app", "image": "busybox"}],
            "tolerations": [{"operator": "Exists"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .expect("pod json")
}

async fn admin_client(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// Labels as a map, for objects the tests build by hand.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
