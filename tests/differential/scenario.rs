//! The scenario files of `tests/differential/scenarios/`: YAML data, one world each, run the same
//! way against both provisioner binaries.
//!
//! ```yaml
//! about: what a user does and what they should get
//! mode: controller            # or `node`: one driver and one sidecar per node with a driver
//! sidecar: [--extra-create-metadata]   # flags for both binaries, after the harness's defaults
//! ours: [--deleted-node-grace-period=2s]  # flags for ours only (our own flags)
//! driver: [--topology]        # mock driver flags (`--record-requests` is always on)
//! nodes: [node-1, {name: node-2, driver: false}]
//! objects: [...]              # created before the sidecars start
//! steps:
//!   - create: [...]           # Kubernetes objects; apiVersion and namespace may be left out
//!   - wait: {bound: c1}
//!   - checkpoint: bound       # the outcome now, compared too
//!   - delete: {kind: PersistentVolumeClaim, name: c1}
//!   - wait: {volumes: 0}
//! ```
//!
//! Strings in objects may name values only known at run time: `{{volume:NAME}}` (the id of a
//! volume made by a `volume` step), `{{snapshot:NAME}}` (a `snapshot` step's id),
//! `{{volume-of:CLAIM}}` (the handle of the PV bound to CLAIM in `default`), `{{uid:KIND/NAME}}`
//! (the UID of an object a step created).
// Shared by the differential and crash-point suites; each uses a subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// One scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// File stem, relative to the scenarios directory (`provision/basic`); set by the loader.
    #[serde(skip)]
    pub name: String,
    /// What the scenario shows, in a user's words.
    pub about: String,
    /// Controller or node-deployment mode.
    #[serde(default)]
    pub mode: Mode,
    /// Flags both sidecars get after the harness defaults.
    #[serde(default)]
    pub sidecar: Vec<String>,
    /// Flags only ours gets (this sidecar's own, which upstream would refuse), to show a
    /// deliberate difference within the scenario's time.
    #[serde(default)]
    pub ours: Vec<String>,
    /// Flags of the mock driver(s).
    #[serde(default)]
    pub driver: Vec<String>,
    /// The driver's name and topology key, when not the mock's own (a migrated plugin's
    /// driver). Nodes are labelled `{key: <node name>}`, so a node named after a zone is in it.
    #[serde(default)]
    pub driver_name: Option<String>,
    #[serde(default)]
    pub topology_key: Option<String>,
    /// Controller mode: this many sidecars with `--leader-election` (identities `replica-<i>`);
    /// a crash point kills the leader only.
    #[serde(default = "one")]
    pub replicas: usize,
    /// Nodes of the cluster (a Node labelled with the mock's topology key, and its CSINode
    /// naming our driver unless `driver: false`).
    #[serde(default)]
    pub nodes: Vec<NodeSpec>,
    /// Objects that exist before the sidecar starts.
    #[serde(default)]
    pub objects: Vec<Value>,
    /// What happens, in order.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// Crash-point suite only: what happens while the sidecar is down at a crash point (each
    /// step best-effort, waits at most 5 s), before the held request is released and the
    /// sidecar restarted.
    #[serde(default)]
    pub while_down: Vec<Step>,
    /// Seconds the outcome must stay unchanged at the end before it is compared.
    #[serde(default = "default_quiet")]
    pub quiet: f64,
}

fn one() -> usize {
    1
}

fn default_quiet() -> f64 {
    2.0
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Controller,
    Node,
}

/// A node: a bare name, or a name with options.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum NodeSpec {
    Name(String),
    Full {
        name: String,
        /// Whether a CSINode lists our driver (and, in node mode, a driver and sidecar run).
        #[serde(default = "yes")]
        driver: bool,
    },
}

fn yes() -> bool {
    true
}

impl NodeSpec {
    pub fn name(&self) -> &str {
        match self {
            NodeSpec::Name(n) | NodeSpec::Full { name: n, .. } => n,
        }
    }
    pub fn has_driver(&self) -> bool {
        match self {
            NodeSpec::Name(_) => true,
            NodeSpec::Full { driver, .. } => *driver,
        }
    }
}

/// One step.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Create these objects through the API.
    Create(Vec<Value>),
    /// Delete one object.
    Delete(ObjectRef),
    /// JSON merge patch of one object's status subresource.
    Status {
        #[serde(flatten)]
        target: ObjectRef,
        merge: Value,
    },
    /// JSON merge patch of one object.
    Patch {
        #[serde(flatten)]
        target: ObjectRef,
        merge: Value,
    },
    /// Wait for a condition (deadline 60 s; a timeout is part of the outcome).
    Wait(Condition),
    /// Flip a switch of the mock driver (the one of `node`, or the only one).
    Driver(DriverSwitch),
    /// Create a volume straight on the driver (an administrator's static volume).
    Volume {
        name: String,
        #[serde(default)]
        node: Option<String>,
        #[serde(default)]
        size: Option<String>,
    },
    /// Cut a snapshot of the volume bound to `of_claim` on the driver.
    Snapshot { name: String, of_claim: String },
    /// Delete a Node and its CSINode (node mode: its driver and sidecar stop first).
    DeleteNode(String),
    /// Stop (SIGKILL) or start again the sidecar(s).
    Sidecar(SidecarAction),
    /// Wait until the outcome is quiet for a second, and keep it under this name: a scenario
    /// that ends with everything deleted still compares what it had made on the way.
    Checkpoint(String),
}

/// An object by kind and name (namespace `default` for namespaced kinds unless given).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectRef {
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// What a `wait` waits for.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Condition {
    /// The claim (in `default`) is Bound.
    Bound(String),
    /// An event with this reason exists on the object.
    Event {
        #[serde(flatten)]
        on: ObjectRef,
        reason: String,
    },
    /// The object does not exist.
    Gone(ObjectRef),
    /// The PV bound to this claim has this phase.
    PvPhase { claim: String, phase: String },
    /// The driver(s) hold exactly this many volumes.
    Volumes(usize),
    /// Exactly this many PVs exist.
    Pvs(usize),
    /// The driver(s) received at least this many calls of a method.
    Calls { method: String, at_least: u64 },
    /// The outcome stayed unchanged for this many seconds.
    Quiet(f64),
    /// A CSIStorageCapacity of this StorageClass reports this capacity, as written (`1023Gi`).
    Capacity { class: String, is: String },
}

/// A mock driver switch.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverSwitch {
    #[serde(default)]
    pub node: Option<String>,
    /// `METHOD=CODE[:COUNT]` as the mock's `--fail`.
    #[serde(default)]
    pub fail: Option<String>,
    /// Remove every fault and latency.
    #[serde(default)]
    pub clear: bool,
    /// `CAPABILITY=on|off`.
    #[serde(default)]
    pub capability: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SidecarAction {
    Kill,
    Start,
}

/// Every scenario under `dir` (recursively), sorted by name; `filter` keeps the names containing
/// it.
pub fn load_all(dir: &Path, filter: Option<&str>) -> Result<Vec<Scenario>, String> {
    let mut files = Vec::new();
    collect(dir, &mut files).map_err(|e| format!("read {}: {e}", dir.display()))?;
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let name = file
            .strip_prefix(dir)
            .unwrap_or(&file)
            .with_extension("")
            .to_string_lossy()
            .into_owned();
        if filter.is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
        let mut s: Scenario =
            serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        s.name = name;
        out.push(s);
    }
    Ok(out)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scenario_reads_with_every_kind_of_step() {
        let text = r#"
about: x
mode: node
sidecar: [--a]
nodes: [n1, {name: n2, driver: false}]
objects:
  - {kind: StorageClass, metadata: {name: sc}, provisioner: p}
steps:
  - create: [{kind: PersistentVolumeClaim, metadata: {name: c1}}]
  - wait: {bound: c1}
  - wait: {event: {kind: PersistentVolumeClaim, name: c1, reason: ProvisioningFailed}}
  - wait: {volumes: 0}
  - wait: {quiet: 1.5}
  - wait: {capacity: {class: sc, is: 1Ti}}
  - delete: {kind: PersistentVolumeClaim, name: c1}
  - patch: {kind: PersistentVolume, name: pv1, merge: {spec: {}}}
  - status: {kind: VolumeSnapshot, name: s1, merge: {status: {readyToUse: true}}}
  - driver: {fail: CreateVolume=INTERNAL:1}
  - volume: {name: v1, node: n1}
  - snapshot: {name: s1, of_claim: c1}
  - delete_node: n1
  - sidecar: kill
  - checkpoint: bound
"#;
        let s: Scenario = serde_saphyr::from_str(text).unwrap();
        assert_eq!(s.mode, Mode::Node);
        assert_eq!(s.steps.len(), 15);
        assert!(!s.nodes[1].has_driver());
        assert_eq!(s.quiet, 2.0);
    }

    #[test]
    fn every_scenario_file_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential/scenarios");
        let all = load_all(&dir, None).unwrap();
        assert!(!all.is_empty());
    }
}
