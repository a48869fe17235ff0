//! Typed driver configuration: capabilities, misbehaviours, fault rules, crash and probe
//! settings, and `Config` with its defaults and cross-field checks (value parsers: `parse`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::parse::{
    code_name, parse_code, parse_duration, parse_fault, parse_key_value, parse_latency,
    parse_quantity, socket_path, valid_driver_name,
};

/// Default topology key of the node segment (`{topology.mock.csi/node: <node id>}`).
pub const DEFAULT_TOPOLOGY_KEY: &str = "topology.mock.csi/node";
/// Default driver name; the same as the csi-test mock driver, so manifests written for it work.
pub const DEFAULT_DRIVER_NAME: &str = "io.kubernetes.storage.mock";
/// Size of a volume whose request has no capacity range: 1 GiB.
pub const DEFAULT_VOLUME_SIZE: i64 = 1 << 30;
/// Default size of each node's storage pool: 1 TiB.
pub const DEFAULT_POOL_SIZE: i64 = 1 << 40;
/// Mutable parameter keys the driver supports unless `--mutable-parameter-key` says otherwise.
/// A fixed set, as in a real driver, so an unknown key gets INVALID_ARGUMENT.
pub const DEFAULT_MUTABLE_PARAMETER_KEYS: &[&str] = &["iops", "throughput"];
/// Exit code of the process when a `crash-after-create` fault fires, so tests can tell a planned
/// crash from a real one.
pub const CRASH_EXIT_CODE: i32 = 86;

/// Every gRPC method the mock serves, by its CSI name; fault and latency switches take these.
pub const METHODS: &[&str] = &[
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerGetCapabilities",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetVolumeStats",
    "NodeExpandVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
];

/// Looks a method name up (case-insensitively) and returns its canonical spelling; `*` means all.
pub fn canonical_method(name: &str) -> Result<&'static str, ConfigError> {
    if name == "*" {
        return Ok("*");
    }
    METHODS
        .iter()
        .find(|m| m.eq_ignore_ascii_case(name))
        .copied()
        .ok_or_else(|| ConfigError::UnknownMethod(name.to_owned()))
}

/// Why a flag or control-socket value was rejected; each message says what a valid value is.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("unknown CSI method {0:?}; use one of {list} or *", list = METHODS.join(", "))]
    UnknownMethod(String),
    #[error("unknown controller capability {0:?}; use one of {list}", list = ControllerCap::names().join(", "))]
    UnknownCapability(String),
    #[error("unknown misbehaviour {0:?}; use one of {list}", list = Misbehaviour::names().join(", "))]
    UnknownMisbehaviour(String),
    #[error("unknown gRPC code {0:?}; use a name like UNAVAILABLE or a number 1-16")]
    UnknownCode(String),
    #[error("invalid duration {0:?}; use Go syntax like 500ms, 2s, 1m30s")]
    Duration(String),
    #[error("invalid size {0:?}; use bytes or a quantity like 10Gi, 500Mi, 1G")]
    Quantity(String),
    #[error(
        "invalid fault {0:?}; use METHOD=CODE[:COUNT|:RATE][:after], e.g. CreateVolume=UNAVAILABLE:3 or DeleteVolume=INTERNAL:0.5"
    )]
    Fault(String),
    #[error("invalid {what} {value:?}; use {expected}")]
    Pair {
        what: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "invalid driver name {0:?}: it must be 1-63 characters, start and end with [a-z0-9A-Z], with only dashes, dots and alphanumerics between (CSI GetPluginInfo rules)"
    )]
    DriverName(String),
    #[error("invalid node id: it must not be empty")]
    NodeId,
}

/// Controller capabilities the mock can advertise (CSI `ControllerServiceCapability.RPC.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ControllerCap {
    CreateDeleteVolume,
    PublishUnpublishVolume,
    ListVolumes,
    GetCapacity,
    CreateDeleteSnapshot,
    ListSnapshots,
    CloneVolume,
    ExpandVolume,
    GetVolume,
    ModifyVolume,
    GetSnapshot,
}

impl ControllerCap {
    /// All capabilities, in proto enum order.
    pub const ALL: [ControllerCap; 11] = [
        ControllerCap::CreateDeleteVolume,
        ControllerCap::PublishUnpublishVolume,
        ControllerCap::ListVolumes,
        ControllerCap::GetCapacity,
        ControllerCap::CreateDeleteSnapshot,
        ControllerCap::ListSnapshots,
        ControllerCap::CloneVolume,
        ControllerCap::ExpandVolume,
        ControllerCap::GetVolume,
        ControllerCap::ModifyVolume,
        ControllerCap::GetSnapshot,
    ];

    /// The CSI spelling, e.g. `CREATE_DELETE_VOLUME`.
    pub fn name(self) -> &'static str {
        match self {
            ControllerCap::CreateDeleteVolume => "CREATE_DELETE_VOLUME",
            ControllerCap::PublishUnpublishVolume => "PUBLISH_UNPUBLISH_VOLUME",
            ControllerCap::ListVolumes => "LIST_VOLUMES",
            ControllerCap::GetCapacity => "GET_CAPACITY",
            ControllerCap::CreateDeleteSnapshot => "CREATE_DELETE_SNAPSHOT",
            ControllerCap::ListSnapshots => "LIST_SNAPSHOTS",
            ControllerCap::CloneVolume => "CLONE_VOLUME",
            ControllerCap::ExpandVolume => "EXPAND_VOLUME",
            ControllerCap::GetVolume => "GET_VOLUME",
            ControllerCap::ModifyVolume => "MODIFY_VOLUME",
            ControllerCap::GetSnapshot => "GET_SNAPSHOT",
        }
    }

    fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|c| c.name()).collect()
    }

    /// Whether it is off unless switched on: only GET_SNAPSHOT, an alpha capability nothing in
    /// this project uses and that conformance suites predating it reject (upstream csi-sanity
    /// v5.4 fails "should return appropriate capabilities" with "Unknown capability").
    pub fn off_by_default(self) -> bool {
        matches!(self, ControllerCap::GetSnapshot)
    }
}

impl fmt::Display for ControllerCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ControllerCap {
    type Err = ConfigError;
    /// Accepts `CLONE_VOLUME`, `clone-volume`, `clone_volume`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(&wanted))
            .ok_or_else(|| ConfigError::UnknownCapability(s.to_owned()))
    }
}

/// Deliberate spec violations, so tests can show that csi-sanity (or the provisioner) notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Misbehaviour {
    /// A repeated CreateVolume with the same name provisions a second volume.
    NonIdempotentCreate,
    /// DeleteVolume of an unknown id answers NOT_FOUND instead of OK.
    DeleteUnknownNotFound,
    /// ListVolumes/ListSnapshots treat an invalid starting token as "from the start".
    AcceptBadListToken,
    /// CreateVolume reports half the requested capacity.
    UndersizedVolumes,
    /// CreateVolume from a snapshot or volume omits `content_source` in the response.
    DropContentSource,
    /// CreateVolume creates the volume but answers with an empty `volume_id`.
    EmptyVolumeId,
    /// CreateVolume and ControllerModifyVolume accept mutable parameter keys they do not
    /// support instead of answering INVALID_ARGUMENT.
    AcceptUnknownMutableParameters,
    /// ControllerModifyVolume of a volume that does not exist answers OK instead of NOT_FOUND.
    ModifyUnknownVolumeOk,
    /// CreateVolume refuses any mutable parameters (INVALID_ARGUMENT) although MODIFY_VOLUME is
    /// advertised, so a claim with a VolumeAttributesClass never provisions.
    RefuseMutableParametersOnCreate,
    /// NodeUnpublishVolume leaves the target path behind instead of removing it.
    KeepTargetPath,
    /// CreateVolume answers a 10 MB volume context (no PV that large can be stored).
    HugeVolumeContext,
    /// CreateVolume gives volumes ids with control characters (a newline and an ANSI escape).
    ControlCharVolumeId,
}

impl Misbehaviour {
    /// All misbehaviours.
    pub const ALL: [Misbehaviour; 12] = [
        Misbehaviour::NonIdempotentCreate,
        Misbehaviour::DeleteUnknownNotFound,
        Misbehaviour::AcceptBadListToken,
        Misbehaviour::UndersizedVolumes,
        Misbehaviour::DropContentSource,
        Misbehaviour::EmptyVolumeId,
        Misbehaviour::AcceptUnknownMutableParameters,
        Misbehaviour::ModifyUnknownVolumeOk,
        Misbehaviour::RefuseMutableParametersOnCreate,
        Misbehaviour::KeepTargetPath,
        Misbehaviour::HugeVolumeContext,
        Misbehaviour::ControlCharVolumeId,
    ];

    /// The flag spelling, e.g. `non-idempotent-create`.
    pub fn name(self) -> &'static str {
        match self {
            Misbehaviour::NonIdempotentCreate => "non-idempotent-create",
            Misbehaviour::DeleteUnknownNotFound => "delete-unknown-not-found",
            Misbehaviour::AcceptBadListToken => "accept-bad-list-token",
            Misbehaviour::UndersizedVolumes => "undersized-volumes",
            Misbehaviour::DropContentSource => "drop-content-source",
            Misbehaviour::EmptyVolumeId => "empty-volume-id",
            Misbehaviour::AcceptUnknownMutableParameters => "accept-unknown-mutable-parameters",
            Misbehaviour::ModifyUnknownVolumeOk => "modify-unknown-volume-ok",
            Misbehaviour::RefuseMutableParametersOnCreate => "refuse-mutable-parameters-on-create",
            Misbehaviour::KeepTargetPath => "keep-target-path",
            Misbehaviour::HugeVolumeContext => "huge-volume-context",
            Misbehaviour::ControlCharVolumeId => "control-char-volume-id",
        }
    }

    fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|m| m.name()).collect()
    }
}

impl FromStr for Misbehaviour {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().replace('_', "-");
        Self::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(&wanted))
            .ok_or_else(|| ConfigError::UnknownMisbehaviour(s.to_owned()))
    }
}

/// When an injected error fires.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Trigger {
    /// Every call.
    #[default]
    Always,
    /// The next `remaining` calls, then the rule switches itself off.
    Count { remaining: u64 },
    /// Each call with this probability (0.0-1.0).
    Rate { rate: f64 },
}

/// An injected gRPC error for one method.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FaultRule {
    /// The code returned, by its canonical name.
    #[serde(with = "code_serde")]
    pub code: tonic::Code,
    /// When it fires.
    #[serde(default)]
    pub trigger: Trigger,
    /// Run the operation first and then fail (the effect happens, the caller sees an error),
    /// instead of failing before anything changes.
    #[serde(default)]
    pub after: bool,
}

impl FaultRule {
    /// Fails every call with `code`.
    pub fn always(code: tonic::Code) -> Self {
        FaultRule {
            code,
            trigger: Trigger::Always,
            after: false,
        }
    }
    /// Fails the next `count` calls with `code`.
    pub fn times(code: tonic::Code, count: u64) -> Self {
        FaultRule {
            code,
            trigger: Trigger::Count { remaining: count },
            after: false,
        }
    }
    /// Fails each call with probability `rate`.
    pub fn rate(code: tonic::Code, rate: f64) -> Self {
        FaultRule {
            code,
            trigger: Trigger::Rate { rate },
            after: false,
        }
    }
    /// Lets the operation take effect before the error is returned.
    #[must_use]
    pub fn after_effect(mut self) -> Self {
        self.after = true;
        self
    }
}

mod code_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(code: &tonic::Code, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(super::code_name(*code))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<tonic::Code, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_code(&s).map_err(serde::de::Error::custom)
    }
}

/// What the process does when a `crash-after-create` fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CrashAction {
    /// Exit the process with [`CRASH_EXIT_CODE`] (the binary).
    #[default]
    ExitProcess,
    /// Stop serving and drop every connection without answering (in-process drivers, where
    /// exiting would end the test itself).
    StopServer,
}

/// Probe readiness at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProbeNotReady {
    /// Answer `ready: false` to this many probes first.
    pub count: u64,
    /// Answer `ready: false` until this long after start.
    pub duration: Duration,
}

/// Everything a mock driver instance needs; build with [`Config::new`] and the `with_*` setters.
#[derive(Debug, Clone)]
pub struct Config {
    /// Unix socket path the CSI services are served on.
    pub endpoint: PathBuf,
    /// GetPluginInfo name.
    pub driver_name: String,
    /// GetPluginInfo vendor_version.
    pub vendor_version: String,
    /// NodeGetInfo node id; the node new volumes live on unless `extra_nodes` offer others.
    pub node_id: String,
    /// Advertise VOLUME_ACCESSIBILITY_CONSTRAINTS and place volumes by topology.
    pub topology: bool,
    /// Key of the node segment.
    pub topology_key: String,
    /// Further nodes this instance may place volumes on (a central controller in front of
    /// several simulated nodes); each has its own pool.
    pub extra_nodes: Vec<String>,
    /// Persist volumes and snapshots here (plus `<file>.journal`) and load them at start.
    pub state_file: Option<PathBuf>,
    /// Control socket path.
    pub control: Option<PathBuf>,
    /// Advertised (and served) controller capabilities.
    pub capabilities: BTreeSet<ControllerCap>,
    /// Size of each node's pool in bytes.
    pub capacity_total: i64,
    /// Largest volume CreateVolume accepts (OUT_OF_RANGE above it); reported by GetCapacity.
    pub max_volume_size: Option<i64>,
    /// Size of a volume created without a capacity range.
    pub default_volume_size: i64,
    /// Secrets CreateVolume and DeleteVolume must carry (UNAUTHENTICATED otherwise).
    pub required_secrets: BTreeMap<String, String>,
    /// Mutable parameter keys CreateVolume/ControllerModifyVolume accept (INVALID_ARGUMENT for
    /// any other key); [`DEFAULT_MUTABLE_PARAMETER_KEYS`] unless configured. An empty set
    /// accepts any key.
    pub mutable_parameter_keys: BTreeSet<String>,
    /// Probe readiness at start.
    pub probe_not_ready: ProbeNotReady,
    /// Injected errors per method (or `*`).
    pub faults: BTreeMap<String, FaultRule>,
    /// Injected latency per method (or `*`).
    pub latencies: BTreeMap<String, Duration>,
    /// Crash after the Nth newly created volume was persisted, before answering.
    pub crash_after_create: Option<u64>,
    /// What "crash" means.
    pub crash_action: CrashAction,
    /// Deliberate spec violations.
    pub misbehaviours: BTreeSet<Misbehaviour>,
    /// Keep every CreateVolume request for the state dump (`StateDump::create_requests`).
    pub record_requests: bool,
    /// New volume ids: `{uuid}`, `{name}`, `{node}` and `{zone}` (the node's topology value)
    /// are filled in; `vol-{uuid}` by default. A cloud driver's id shape (`projects/UNSPECIFIED/
    /// zones/{zone}/disks/{name}` for GCE PD) lets CSI migration write PVs back in in-tree form.
    pub volume_id_template: String,
    /// Extra volume-context entries of new volumes, their values templates as above.
    pub volume_context: BTreeMap<String, String>,
}

/// The volume id template's default.
pub const DEFAULT_VOLUME_ID_TEMPLATE: &str = "vol-{uuid}";

/// `template` with `{uuid}`, `{name}`, `{node}` and `{zone}` filled in.
pub fn fill_template(template: &str, uuid: &str, name: &str, node: &str, zone: &str) -> String {
    template
        .replace("{uuid}", uuid)
        .replace("{name}", name)
        .replace("{node}", node)
        .replace("{zone}", zone)
}

impl Config {
    /// A spec-correct driver with every controller capability but GET_SNAPSHOT (see
    /// [`ControllerCap::off_by_default`]), serving on `endpoint`, for node
    /// `node_id`, without topology, state file or faults.
    pub fn new(endpoint: impl Into<PathBuf>, node_id: impl Into<String>) -> Self {
        Config {
            endpoint: endpoint.into(),
            driver_name: DEFAULT_DRIVER_NAME.to_owned(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            node_id: node_id.into(),
            topology: false,
            topology_key: DEFAULT_TOPOLOGY_KEY.to_owned(),
            extra_nodes: Vec::new(),
            state_file: None,
            control: None,
            capabilities: ControllerCap::ALL
                .into_iter()
                .filter(|c| !c.off_by_default())
                .collect(),
            capacity_total: DEFAULT_POOL_SIZE,
            max_volume_size: None,
            default_volume_size: DEFAULT_VOLUME_SIZE,
            required_secrets: BTreeMap::new(),
            mutable_parameter_keys: DEFAULT_MUTABLE_PARAMETER_KEYS
                .iter()
                .map(|k| (*k).to_owned())
                .collect(),
            probe_not_ready: ProbeNotReady::default(),
            faults: BTreeMap::new(),
            latencies: BTreeMap::new(),
            crash_after_create: None,
            crash_action: CrashAction::StopServer,
            misbehaviours: BTreeSet::new(),
            record_requests: false,
            volume_id_template: DEFAULT_VOLUME_ID_TEMPLATE.to_owned(),
            volume_context: BTreeMap::new(),
        }
    }

    /// Sets the driver name.
    #[must_use]
    pub fn with_driver_name(mut self, name: impl Into<String>) -> Self {
        self.driver_name = name.into();
        self
    }

    /// Turns topology on (node segment under the default key).
    #[must_use]
    pub fn with_topology(mut self) -> Self {
        self.topology = true;
        self
    }

    /// Persists state in `path`.
    #[must_use]
    pub fn with_state_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.state_file = Some(path.into());
        self
    }

    /// Serves the control socket on `path`.
    #[must_use]
    pub fn with_control(mut self, path: impl Into<PathBuf>) -> Self {
        self.control = Some(path.into());
        self
    }

    /// Advertises and serves `cap` (for GET_SNAPSHOT, which is off by default).
    #[must_use]
    pub fn with_capability(mut self, cap: ControllerCap) -> Self {
        self.capabilities.insert(cap);
        self
    }

    /// Stops advertising and serving `cap`.
    #[must_use]
    pub fn without_capability(mut self, cap: ControllerCap) -> Self {
        self.capabilities.remove(&cap);
        self
    }

    /// Requires a secret on CreateVolume and DeleteVolume.
    #[must_use]
    pub fn with_required_secret(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        self.required_secrets.insert(key.into(), value.into());
        self
    }

    /// Injects a fault.
    #[must_use]
    pub fn with_fault(mut self, method: &str, rule: FaultRule) -> Self {
        self.faults.insert(method.to_owned(), rule);
        self
    }

    /// Turns a misbehaviour on.
    #[must_use]
    pub fn with_misbehaviour(mut self, m: Misbehaviour) -> Self {
        self.misbehaviours.insert(m);
        self
    }

    /// Checks the cross-field rules (driver name format, non-empty node id, sizes).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !valid_driver_name(&self.driver_name) {
            return Err(ConfigError::DriverName(self.driver_name.clone()));
        }
        if self.node_id.is_empty() || self.extra_nodes.iter().any(String::is_empty) {
            return Err(ConfigError::NodeId);
        }
        for (what, v) in [
            ("capacity-total", Some(self.capacity_total)),
            ("max-volume-size", self.max_volume_size),
            ("default-volume-size", Some(self.default_volume_size)),
        ] {
            if v.is_some_and(|v| v < 0) {
                return Err(ConfigError::Pair {
                    what,
                    value: v.unwrap_or_default().to_string(),
                    expected: "a size of 0 bytes or more",
                });
            }
        }
        Ok(())
    }

    /// Every node this instance places volumes on: `node_id` first, then `extra_nodes`.
    pub fn nodes(&self) -> Vec<String> {
        // A set, not `Vec::contains`: thousands of `--topology-node`s made this quadratic.
        let mut seen = std::collections::HashSet::new();
        std::iter::once(&self.node_id)
            .chain(&self.extra_nodes)
            .filter(|n| seen.insert(n.as_str()))
            .cloned()
            .collect()
    }

    /// Whether `node` is one of [`Config::nodes`].
    pub fn has_node(&self, node: &str) -> bool {
        self.node_id == node || self.extra_nodes.iter().any(|n| n == node)
    }

    /// The topology segment of `node` (empty without topology).
    pub fn segment_of(&self, node: &str) -> BTreeMap<String, String> {
        if self.topology {
            BTreeMap::from([(self.topology_key.clone(), node.to_owned())])
        } else {
            BTreeMap::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_and_misbehaviours_accept_flag_spellings() {
        assert_eq!(
            "clone-volume".parse::<ControllerCap>().unwrap(),
            ControllerCap::CloneVolume
        );
        assert_eq!(
            "LIST_VOLUMES".parse::<ControllerCap>().unwrap(),
            ControllerCap::ListVolumes
        );
        assert!("CLONE".parse::<ControllerCap>().is_err());
        assert_eq!(
            "non_idempotent_create".parse::<Misbehaviour>().unwrap(),
            Misbehaviour::NonIdempotentCreate
        );
    }
}
