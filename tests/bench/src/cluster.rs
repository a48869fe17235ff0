//! The bench's own API client (with its own User-Agent, so its requests are told apart from the
//! provisioner's), the objects it creates, kube-sim's counters and a watch-fed tracker of claims
//! and volumes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, Config};
use serde_json::{Value, json};

/// User-Agent of every request the bench makes; all other requests are the provisioner's.
pub const BENCH_AGENT: &str = "kube-bench/0.1";
/// Driver name the mock driver registers and the classes name.
pub const DRIVER: &str = "mock.csi.rs";
/// Topology key the mock driver reports with `--topology`.
pub const TOPOLOGY_KEY: &str = "topology.mock.csi/node";
/// Namespace of every claim and pod.
pub const NS: &str = "default";
/// Claims created concurrently by the bench.
pub const CONCURRENCY: usize = 64;

pub async fn client(kubeconfig: &Path) -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut cfg = Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    cfg.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(BENCH_AGENT),
    ));
    Ok(Client::try_from(cfg)?)
}

/// Requests by (verb, resource) made by anyone but the bench, from kube-sim's `/sim/counters`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requests(pub BTreeMap<(String, String), u64>);

pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

impl Requests {
    /// The non-bench rows of a `/sim/counters` document.
    pub fn from_counters(doc: &Value) -> Self {
        let mut m = BTreeMap::new();
        for row in doc["byAgent"].as_array().into_iter().flatten() {
            if row["agent"].as_str() == Some(BENCH_AGENT) {
                continue;
            }
            let key = (
                row["verb"].as_str().unwrap_or("?").to_string(),
                row["resource"].as_str().unwrap_or("?").to_string(),
            );
            *m.entry(key).or_default() += row["count"].as_u64().unwrap_or(0);
        }
        Self(m)
    }
    pub fn since(&self, earlier: &Requests) -> Requests {
        let mut m = self.0.clone();
        for (k, n) in m.iter_mut() {
            *n = n.saturating_sub(earlier.0.get(k).copied().unwrap_or(0));
        }
        m.retain(|_, n| *n > 0);
        Requests(m)
    }
    fn sum(&self, f: impl Fn(&str, &str) -> bool) -> u64 {
        self.0
            .iter()
            .filter(|((v, r), _)| f(v, r))
            .map(|(_, n)| n)
            .sum()
    }
    /// Requests other than on Events.
    pub fn non_event(&self) -> u64 {
        self.sum(|_, r| !is_event(r))
    }
    /// Requests on Events (both API versions share the plural `events`).
    pub fn events(&self) -> u64 {
        self.sum(|_, r| is_event(r))
    }
    /// Writes other than on Events.
    pub fn writes(&self) -> u64 {
        // A SelfSubject{Access,Rules}Review (the RBAC self-check) is answered, never stored: not
        // a write.
        self.sum(|v, r| WRITE_VERBS.contains(&v) && !is_event(r) && !r.starts_with("selfsubject"))
    }
    /// Requests other than watches (a watch stays open; its count says nothing about load).
    pub fn non_watch(&self) -> u64 {
        self.sum(|v, _| v != "watch")
    }
}

fn is_event(resource: &str) -> bool {
    resource == "events"
}

/// Requests made so far by everyone but the bench.
pub async fn requests(client: &Client) -> Result<Requests> {
    let req = http::Request::get("/sim/counters")
        .body(Vec::new())
        .context("counters request")?;
    let text = client
        .request_text(req)
        .await
        .context("GET /sim/counters")?;
    Ok(Requests::from_counters(&serde_json::from_str(&text)?))
}

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("well-formed object")
}

/// How many of `claims` have a core/v1 Event with reason `Provisioning`, and how many one with
/// `ProvisioningSucceeded` (upstream's reasons; ours sends the same).
pub async fn claims_with_events(
    client: &Client,
    claims: &HashSet<String>,
) -> Result<(usize, usize)> {
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), NS);
    let list = api.list(&Default::default()).await.context("list Events")?;
    let mut started = HashSet::new();
    let mut succeeded = HashSet::new();
    for e in list.items {
        let Some(name) = e
            .involved_object
            .name
            .as_ref()
            .filter(|n| claims.contains(*n))
        else {
            continue;
        };
        match e.reason.as_deref() {
            Some("Provisioning") => started.insert(name.clone()),
            Some("ProvisioningSucceeded") => succeeded.insert(name.clone()),
            _ => false,
        };
    }
    Ok((started.len(), succeeded.len()))
}

pub async fn create_class(client: &Client, name: &str, binding: &str) -> Result<()> {
    create_class_of(client, name, binding, DRIVER).await
}

/// [`create_class`] naming `provisioner` (an in-tree plugin, under CSI migration).
pub async fn create_class_of(
    client: &Client,
    name: &str,
    binding: &str,
    provisioner: &str,
) -> Result<()> {
    let api: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &obj(
            json!({"metadata": {"name": name}, "provisioner": provisioner,
                    "reclaimPolicy": "Delete", "volumeBindingMode": binding}),
        ),
    )
    .await
    .with_context(|| format!("create StorageClass {name}"))?;
    Ok(())
}

pub fn claim(name: &str, class: &str) -> PersistentVolumeClaim {
    obj(json!({"metadata": {"name": name, "namespace": NS},
               "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                        "resources": {"requests": {"storage": "1Gi"}}}}))
}

/// A Node labelled with the mock driver's topology key, and (`with_driver`) its CSINode.
pub async fn create_node(client: &Client, name: &str, with_driver: bool) -> Result<()> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, TOPOLOGY_KEY: name}}})),
        )
        .await
        .with_context(|| format!("create Node {name}"))?;
    if with_driver {
        let csinodes: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(client.clone());
        csinodes
            .create(
                &PostParams::default(),
                &obj(json!({"metadata": {"name": name}, "spec": {"drivers": [
                    {"name": DRIVER, "nodeID": name, "topologyKeys": [TOPOLOGY_KEY]}]}})),
            )
            .await
            .with_context(|| format!("create CSINode {name}"))?;
    }
    Ok(())
}

/// Creates the claims, `CONCURRENCY` at a time, and returns when each create was answered.
pub async fn create_claims(
    client: &Client,
    names: &[String],
    class: &str,
) -> Result<HashMap<String, Instant>> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &claim(&name, class))
                    .await
                    .with_context(|| format!("create claim {name}"))?;
                Ok::<_, anyhow::Error>((name, Instant::now()))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// Like [`create_claims`], each claim restoring from the VolumeSnapshot `snapshot`.
pub async fn create_claims_from_snapshot(
    client: &Client,
    names: &[String],
    class: &str,
    snapshot: &str,
) -> Result<HashMap<String, Instant>> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            let mut c = claim(&name, class);
            if let Some(spec) = c.spec.as_mut() {
                spec.data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
                    api_group: Some("snapshot.storage.k8s.io".into()),
                    kind: "VolumeSnapshot".into(),
                    name: snapshot.into(),
                });
            }
            async move {
                api.create(&PostParams::default(), &c)
                    .await
                    .with_context(|| format!("create claim {name}"))?;
                Ok::<_, anyhow::Error>((name, Instant::now()))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// Pods, one per claim, on the given nodes in turn (kube-sim then selects the node for the claim).
pub async fn create_pods(client: &Client, claims: &[String], nodes: &[String]) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    futures::stream::iter(claims.iter().enumerate())
        .map(|(i, c)| {
            let api = api.clone();
            let node = nodes[i % nodes.len()].clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &obj(json!({"metadata": {"name": format!("pod-{c}"), "namespace": NS},
                                "spec": {"nodeName": node,
                                         "containers": [{"name": "app", "image": "busybox"}],
                                         "volumes": [{"name": "data",
                                                      "persistentVolumeClaim": {"claimName": c}}]}})),
                )
                .await
                .with_context(|| format!("create pod for claim {c}"))?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Deletes objects of `api` by name, `CONCURRENCY` at a time (already gone is fine).
pub async fn delete_all<K>(api: &Api<K>, names: &[String]) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(anyhow::Error::new(e).context(format!("delete {name}"))),
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Bound PV/PVC pairs as a provisioner would have left them (its annotations and finalizer),
/// with node affinity to `node` when given: the "many volumes already exist" part of a scenario.
pub async fn seed_bound_pairs(
    client: &Client,
    count: usize,
    class: &str,
    node: Option<&str>,
) -> Result<()> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    futures::stream::iter(0..count)
        .map(|i| {
            let (pvcs, pvs) = (pvcs.clone(), pvs.clone());
            async move {
                let claim_name = format!("seed-{i}");
                let pv_name = format!("pv-seed-{i}");
                let mut c = claim(&claim_name, class);
                c.spec.as_mut().expect("spec").volume_name = Some(pv_name.clone());
                c.metadata.annotations = Some(BTreeMap::from([
                    ("pv.kubernetes.io/bind-completed".into(), "yes".into()),
                    ("pv.kubernetes.io/bound-by-controller".into(), "yes".into()),
                    ("volume.kubernetes.io/storage-provisioner".into(), DRIVER.into()),
                    ("volume.beta.kubernetes.io/storage-provisioner".into(), DRIVER.into()),
                ]));
                if let Some(n) = node {
                    c.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert("volume.kubernetes.io/selected-node".into(), n.into());
                }
                let created = pvcs
                    .create(&PostParams::default(), &c)
                    .await
                    .with_context(|| format!("seed claim {claim_name}"))?;
                let mut spec = json!({
                    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": class,
                    "volumeMode": "Filesystem",
                    "csi": {"driver": DRIVER, "volumeHandle": format!("seed-{i}"), "fsType": "ext4"},
                    "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": NS,
                                 "name": claim_name, "uid": created.metadata.uid},
                });
                if let Some(n) = node {
                    spec["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": TOPOLOGY_KEY, "operator": "In", "values": [n]}]}]}});
                }
                pvs.create(
                    &PostParams::default(),
                    &obj(json!({"metadata": {"name": pv_name,
                        "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER},
                        "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"]},
                        "spec": spec})),
                )
                .await
                .with_context(|| format!("seed PV {pv_name}"))?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

#[derive(Default)]
struct TrackState {
    /// Claim name -> when the bench first saw it Bound.
    bound: HashMap<String, Instant>,
    /// PVs that exist now.
    pvs: HashSet<String>,
    claims_synced: bool,
    pvs_synced: bool,
}

/// Claims' first Bound time and the set of PVs, kept current by two watches.
#[derive(Clone)]
pub struct Tracker(
    Arc<Mutex<TrackState>>,
    Arc<Vec<tokio::task::JoinHandle<()>>>,
);

impl Tracker {
    pub fn start(client: &Client) -> Self {
        let state = Arc::new(Mutex::new(TrackState::default()));
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let s = state.clone();
        let claims = tokio::spawn(async move {
            let mut stream = watcher(pvcs, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                let mut st = s.lock().unwrap_or_else(|e| e.into_inner());
                match ev {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                        let bound =
                            c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
                        if bound && let Some(n) = c.metadata.name {
                            st.bound.entry(n).or_insert_with(Instant::now);
                        }
                    }
                    Ok(watcher::Event::InitDone) => st.claims_synced = true,
                    _ => {}
                }
            }
        });
        let s = state.clone();
        let volumes = tokio::spawn(async move {
            let mut stream = watcher(pvs, watcher::Config::default()).boxed();
            let mut fresh: Option<HashSet<String>> = None;
            while let Some(ev) = stream.next().await {
                let mut st = s.lock().unwrap_or_else(|e| e.into_inner());
                match ev {
                    Ok(watcher::Event::Apply(v)) => {
                        st.pvs.extend(v.metadata.name);
                    }
                    Ok(watcher::Event::Delete(v)) => {
                        if let Some(n) = v.metadata.name {
                            st.pvs.remove(&n);
                        }
                    }
                    Ok(watcher::Event::Init) => fresh = Some(HashSet::new()),
                    Ok(watcher::Event::InitApply(v)) => {
                        fresh.get_or_insert_default().extend(v.metadata.name);
                    }
                    Ok(watcher::Event::InitDone) => {
                        st.pvs = fresh.take().unwrap_or_default();
                        st.pvs_synced = true;
                    }
                    Err(_) => {}
                }
            }
        });
        Self(state, Arc::new(vec![claims, volumes]))
    }

    fn with<T>(&self, f: impl FnOnce(&TrackState) -> T) -> T {
        f(&self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn synced(&self) -> bool {
        self.with(|s| s.claims_synced && s.pvs_synced)
    }
    /// When each of `names` was first seen Bound (absent: not yet).
    pub fn bound_times(&self, names: &[String]) -> Vec<Option<Instant>> {
        self.with(|s| names.iter().map(|n| s.bound.get(n).copied()).collect())
    }
    pub fn bound_count(&self, names: &[String]) -> usize {
        self.bound_times(names).iter().flatten().count()
    }
    /// PVs that exist now whose name `keep` accepts.
    pub fn pv_count(&self, keep: impl Fn(&str) -> bool) -> usize {
        self.with(|s| s.pvs.iter().filter(|n| keep(n)).count())
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if Arc::strong_count(&self.1) == 1 {
            for h in self.1.iter() {
                h.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_leave_out_the_bench_and_split_events() {
        let doc = json!({"byAgent": [
            {"agent": BENCH_AGENT, "verb": "create", "resource": "persistentvolumeclaims", "code": 201, "count": 5},
            {"agent": "", "verb": "create", "resource": "persistentvolumes", "code": 201, "count": 3},
            {"agent": "csi-provisioner/v6", "verb": "create", "resource": "persistentvolumes", "code": 409, "count": 1},
            {"agent": "", "verb": "create", "resource": "events", "code": 201, "count": 4},
            {"agent": "", "verb": "watch", "resource": "persistentvolumes", "code": 200, "count": 2},
        ]});
        let r = Requests::from_counters(&doc);
        assert_eq!(
            r.0.get(&("create".into(), "persistentvolumes".into())),
            Some(&4)
        );
        assert_eq!(r.non_event(), 6);
        assert_eq!(r.events(), 4);
        assert_eq!(r.writes(), 4);
        assert_eq!(r.non_watch(), 8);
        assert!(!r.0.contains_key(&("create".into(), "persistentvolumeclaims".into())));
        assert_eq!(r.since(&r), Requests::default());
    }
}
