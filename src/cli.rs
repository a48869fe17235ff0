//! Command line: every upstream flag with its name, type and default; Go-style `-flag=value` forms;
//! Go durations.
//!
//! Existing manifests were written for Go's flag parsing, so argv is first normalised by
//! [`normalize_args`] (a pure function) into the one form clap is configured for, `--name=value`:
//! `-flag=value`, `-flag value`, `--flag value`, `-v5` and `-v 5` all become `--flag=value`, while a
//! boolean never takes the following argument as its value (as in Go: `--flag false` sets the flag
//! and leaves `false` as a stray argument, which is rejected).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::str::FromStr;
use std::time::Duration;

use clap::{Arg, ArgAction, CommandFactory, Parser};

use crate::gofmt::{parse_go_bool, parse_go_duration};
use crate::telemetry::LogFormat;
use crate::telemetry::vmodule::{VModuleList, parse_vmodule};

/// The version printed by `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Program name used in `--version` and `--help`, as upstream's image names its binary.
pub const PROGRAM: &str = "csi-provisioner";

/// Every command-line flag. Names, types and defaults follow the upstream Go sidecar
/// (`shared/reference/upstream-external-provisioner.md` §1); only the last two flags of the
/// "Deleted nodes" group are ours. Every `bool` flag takes Go's forms ([`go_bool_flag`]) and every
/// flag is listed in `--help` under its section ([`SECTIONS`]). Values reach clap attached
/// (`--name=-1`, see [`normalize_args`]), so negative numbers need no setting.
#[derive(Debug, Clone, PartialEq, Parser)]
#[command(
    name = PROGRAM,
    about = "Drop-in Rust replacement for the Kubernetes CSI external-provisioner sidecar",
    disable_version_flag = true,
    // Go flag semantics: repeating a flag replaces its earlier value.
    args_override_self = true,
    max_term_width = 110,
    mut_args = go_flags()
)]
pub struct Args {
    /// Print "csi-provisioner <version>" and exit.
    #[arg(long)]
    pub version: bool,

    // === CSI driver ===
    /// CSI endpoint: a socket path or unix:///path.
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,

    /// Deadline of every CSI call (CreateVolume, DeleteVolume, Probe, ...).
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub timeout: Duration,

    // === Provisioning ===
    /// Prefix of PV names: <prefix>-<PVC UID>.
    #[arg(long, default_value = "pvc")]
    pub volume_name_prefix: String,

    /// -1 keeps the full PVC UID in PV names; 1..32 strips dashes and keeps that many characters.
    #[arg(long, default_value_t = -1)]
    pub volume_name_uuid_length: i64,

    /// First retry delay after a failed provision or delete; doubles on each failure.
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub retry_interval_start: Duration,

    /// Cap on the retry delay.
    #[arg(long, default_value = "5m0s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub retry_interval_max: Duration,

    /// Concurrent provision workers, and as many delete workers.
    #[arg(long, default_value_t = 100)]
    pub worker_threads: u64,

    /// With delayed binding, request only the selected node's topology.
    #[arg(long)]
    pub strict_topology: bool,

    /// With immediate binding, request the aggregated cluster topology (false: no requirements).
    #[arg(long, default_value = "true")]
    pub immediate_topology: bool,

    /// Pass PVC and PV names and namespace to CreateVolume as parameters.
    #[arg(long)]
    pub extra_create_metadata: bool,

    /// fsType used when the StorageClass names none (empty: none).
    #[arg(long, default_value = "", hide_default_value = true)]
    pub default_fstype: String,

    /// Set the PV's spec.csi.readOnly when the PVC's only access mode is ReadOnlyMany.
    #[arg(long)]
    pub controller_publish_readonly: bool,

    /// Refuse snapshot restores that change the volume mode unless the snapshot content allows it.
    #[arg(long, default_value = "true")]
    pub prevent_volume_mode_conversion: bool,

    /// Workers removing the clone-source protection finalizer. Accepted for compatibility: the
    /// claim workers (--worker-threads) release it here, so no separate pool is needed (and 0
    /// does not stop the release, as it does upstream).
    #[arg(long, default_value_t = 1)]
    pub cloning_protection_threads: u64,

    /// Period of the sweep for orphaned snapshot protection finalizers; 0 disables it.
    #[arg(long, default_value = "5m0s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub snapshot_orphan_sweep_interval: Duration,

    /// Feature gates, Key=bool,... (Topology, VolumeAttributesClass, CrossNamespaceVolumeDataSource,
    /// ReleaseLeaderElectionOnExit, MutableCSINodeAllocatableCount, HonorPVReclaimPolicy=true,
    /// AllAlpha, AllBeta; the API server gates upstream's binary also accepts are accepted and
    /// have no effect).
    #[arg(long, value_name = "GATES", value_parser = parse_feature_gates, action = ArgAction::Append)]
    pub feature_gates: Vec<FeatureGateList>,

    // === Node deployment ===
    /// Run one instance per node (local volumes). Requires the NODE_NAME environment variable.
    #[arg(long)]
    pub node_deployment: bool,

    /// In node mode, compete for PVCs whose StorageClass uses Immediate binding.
    #[arg(long, default_value = "true")]
    pub node_deployment_immediate_binding: bool,

    /// Initial wait (and jitter range) before claiming an immediate-binding PVC in node mode.
    #[arg(long, default_value = "20s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub node_deployment_base_delay: Duration,

    /// Cap on that wait.
    #[arg(long, default_value = "1m0s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub node_deployment_max_delay: Duration,

    /// (ours, retired and ignored) Intents always go to the node's Lease ledger; the volumes a
    /// journal an earlier version kept in this directory lists are named in a warning at start-up,
    /// not resolved. Remove the flag.
    #[arg(long, default_value = "", value_name = "DIR")]
    pub node_deployment_intent_journal: String,

    // === Deleted nodes (ours) ===
    /// How long a node must have been gone before DeleteVolume for its volumes is answered as
    /// already deleted.
    #[arg(long, default_value = "5m0s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub deleted_node_grace_period: Duration,

    /// Also delete PVCs still bound to PVs whose node is gone.
    #[arg(long)]
    pub deleted_node_pvc_cleanup: bool,

    // === Operator aids (ours) ===
    /// Run the audit (as `csi-provisioner audit`) this often and export its counts as metrics;
    /// 0 turns it off.
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub audit_interval: Duration,

    /// Keep on each claim of this driver the time the last Pod using it went away
    /// (csi-provisioner.rs/unused-since); needs get, list and watch on pods.
    #[arg(long)]
    pub track_unused_claims: bool,

    // === Kubernetes API ===
    /// Path to a kubeconfig (out of cluster). The KUBECONFIG environment variable overrides it.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub kubeconfig: String,

    /// API server URL (out of cluster), alone or with --kubeconfig.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub master: String,

    /// Client-side rate limit (queries per second) of API requests.
    #[arg(long, default_value_t = 5.0)]
    pub kube_api_qps: f64,

    /// Burst of that rate limit.
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: i64,

    // === HTTP ===
    /// Address of the HTTP server for metrics and health checks (e.g. :8080); empty disables it.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub http_endpoint: String,

    /// Deprecated metrics-only address; cannot be combined with --http-endpoint.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub metrics_address: String,

    /// HTTP path of the Prometheus metrics.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,

    /// Serve /debug/pprof/ (CPU profile, cmdline) on the HTTP endpoint.
    #[arg(long)]
    pub enable_pprof: bool,

    // === Leader election ===
    /// Elect a leader through a Lease so that only one replica works.
    #[arg(long)]
    pub leader_election: bool,

    /// Namespace of the Lease (default: POD_NAMESPACE, then the pod's own namespace).
    #[arg(long, default_value = "", hide_default_value = true)]
    pub leader_election_namespace: String,

    /// How long non-leaders wait before taking over an unrenewed Lease.
    #[arg(long, default_value = "15s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader retries renewing before it gives up.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub leader_election_renew_deadline: Duration,

    /// Interval between leader-election attempts.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub leader_election_retry_period: Duration,

    /// Labels put on the Lease, key:value,key2:value2.
    #[arg(long, value_name = "LABELS", value_parser = parse_labels, action = ArgAction::Append)]
    pub leader_election_labels: Vec<LabelList>,

    // === Storage capacity ===
    /// Publish CSIStorageCapacity objects.
    #[arg(long)]
    pub enable_capacity: bool,

    /// Workers of the capacity controller.
    #[arg(long, default_value_t = 1)]
    pub capacity_threads: u64,

    /// Also publish capacity for StorageClasses with Immediate binding.
    #[arg(long)]
    pub capacity_for_immediate_binding: bool,

    /// How often capacity is polled from the driver.
    #[arg(long, default_value = "1m0s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub capacity_poll_interval: Duration,

    /// Owner of capacity objects: -1 none, 0 the pod, 1 its controller, 2 that one's controller, ...
    #[arg(long, default_value_t = 1)]
    pub capacity_ownerref_level: i64,

    /// QPS of the capacity controller's own API client.
    #[arg(long, default_value_t = 1.0)]
    pub kube_api_capacity_qps: f32,

    /// Burst of the capacity controller's own API client.
    #[arg(long, default_value_t = 5)]
    pub kube_api_capacity_burst: i64,

    // === Logging and runtime ===
    /// Log verbosity: 0-3 info, 4-5 debug (CSI requests and responses), 6+ trace. RUST_LOG overrides.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", default_value_t = 0)]
    pub v: u32,

    /// Log format: text or json.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = LogFormat::from_str)]
    pub logging_format: LogFormat,

    /// Per-file verbosity: pattern=N,... where pattern is a source file name without .rs (or a
    /// module name), literal or glob (* ? [...]); the first match wins. Text format only.
    /// Repeating the flag appends.
    #[arg(long, value_name = "PATTERN=N,...", value_parser = parse_vmodule, action = ArgAction::Append)]
    pub vmodule: Vec<VModuleList>,

    /// Maximum time between log flushes. Accepted, must be positive; no effect: logs are written
    /// unbuffered, so nothing waits for a flush.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub log_flush_frequency: Duration,

    /// Text format: info messages to stdout, warnings and errors to stderr (upstream refuses
    /// this alpha flag; here it works).
    #[arg(long)]
    pub log_text_split_stream: bool,

    /// Text format: buffer size of info messages with --log-text-split-stream. Accepted, no
    /// effect: lines are written unbuffered, each as soon as it is logged.
    #[arg(long, value_name = "QUANTITY", default_value = "0")]
    pub log_text_info_buffer_size: String,

    /// JSON format: info messages to stdout, errors to stderr (upstream refuses this alpha flag;
    /// here it works).
    #[arg(long)]
    pub log_json_split_stream: bool,

    /// JSON format: buffer size of info messages with --log-json-split-stream. Accepted, no
    /// effect: lines are written unbuffered, each as soon as it is logged.
    #[arg(long, value_name = "QUANTITY", default_value = "0")]
    pub log_json_info_buffer_size: String,

    /// Size GOMAXPROCS from the cgroup CPU quota. Accepted; the Rust runtime always does this.
    #[arg(long)]
    pub automaxprocs: bool,
}

impl Args {
    /// Parses a Go-style command line (argv[0] first). On a usage error, `--help` or a bad value,
    /// clap's error is returned: [`clap::Error::exit`] prints it and exits 2 (0 for `--help`).
    pub fn try_parse_go_style<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let mut command = Self::command();
        command.build();
        let normalized = normalize_args(argv.into_iter().map(Into::into), |name| {
            command
                .get_arguments()
                .find(|arg| arg.get_long() == Some(name))
                .map(|arg| {
                    let optional_value = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
                    if !arg.get_action().takes_values() || optional_value {
                        FlagKind::Switch
                    } else {
                        FlagKind::Value
                    }
                })
        });
        Self::try_parse_from(normalized)
    }

    /// The values a command line without flags yields: upstream's defaults.
    pub fn defaults() -> Self {
        // The parse of an empty command line only fails if a default string above does not parse,
        // which the unit tests rule out.
        Self::try_parse_from([PROGRAM]).unwrap_or_else(|err| panic!("invalid flag default: {err}"))
    }

    /// All `--feature-gates` occurrences, in command-line order.
    pub fn feature_gate_settings(&self) -> impl Iterator<Item = (FeatureGate, bool)> + '_ {
        self.feature_gates
            .iter()
            .flat_map(|list| list.0.iter().copied())
    }

    /// All `--leader-election-labels` occurrences merged; a later key wins, as upstream's map does.
    pub fn leader_election_label_map(&self) -> BTreeMap<String, String> {
        self.leader_election_labels
            .iter()
            .flat_map(|list| list.0.iter().cloned())
            .collect()
    }
}

/// The `--help` sections (the `// ===` comments in [`Args`]), each named by the id of its first
/// flag: a flag belongs to the section of the nearest one at or above it.
const SECTIONS: [(&str, &str); 10] = [
    ("csi_address", "CSI driver"),
    ("volume_name_prefix", "Provisioning"),
    ("node_deployment", "Node deployment"),
    ("deleted_node_grace_period", "Deleted nodes"),
    ("audit_interval", "Operator aids"),
    ("kubeconfig", "Kubernetes API"),
    ("http_endpoint", "HTTP"),
    ("leader_election", "Leader election"),
    ("enable_capacity", "Storage capacity"),
    ("v", "Logging"),
];

/// What every flag of [`Args`] gets, in declaration order: its section heading and, for a `bool`,
/// [`go_bool_flag`].
fn go_flags() -> impl FnMut(Arg) -> Arg {
    let mut heading = None;
    move |arg| {
        if let Some((_, section)) = SECTIONS.iter().find(|(first, _)| arg.get_id() == *first) {
            heading = Some(*section);
        }
        match heading {
            Some(heading) => go_bool_flag(arg.help_heading(heading)),
            None => go_bool_flag(arg),
        }
    }
}

/// Makes a `bool` field's flag (clap's `SetTrue`) a Go boolean flag: `--flag` alone means true,
/// `--flag=<BOOL>` takes any value Go's strconv.ParseBool does, and the default is `false` unless
/// the field names one.
fn go_bool_flag(arg: Arg) -> Arg {
    if !matches!(arg.get_action(), ArgAction::SetTrue) {
        return arg;
    }
    let arg = arg
        .value_name("BOOL")
        .num_args(0..=1)
        .require_equals(true)
        .default_missing_value("true")
        .value_parser(parse_go_bool)
        .action(ArgAction::Set);
    if arg.get_default_values().is_empty() {
        arg.default_value("false")
    } else {
        arg
    }
}

/// How a flag consumes values, for [`normalize_args`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    /// Booleans and `--help`: the value, if any, is attached with `=`; the next argument is never
    /// taken.
    Switch,
    /// The value is attached with `=` or is the next argument (whatever it looks like, as in Go).
    Value,
}

/// Rewrites a Go-style argv into `--name=value` form. `kind_of` tells whether a long flag name is
/// known and how it takes values; unknown single-dash flags become `--name` so that clap's error
/// names them. Arguments after `--` and non-UTF-8 arguments are left alone.
pub fn normalize_args<I>(argv: I, kind_of: impl Fn(&str) -> Option<FlagKind>) -> Vec<OsString>
where
    I: IntoIterator<Item = OsString>,
{
    let mut argv = argv.into_iter();
    let mut out: Vec<OsString> = argv.next().into_iter().collect();
    while let Some(arg) = argv.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(argv);
            break;
        }
        let body = match text.strip_prefix("--").or_else(|| text.strip_prefix('-')) {
            Some(body) if !body.is_empty() && !text.starts_with("---") => body,
            _ => {
                out.push(arg);
                continue;
            }
        };
        let single_dash = !text.starts_with("--");
        let (mut name, mut value) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        let mut kind = kind_of(name);
        if kind.is_none() && single_dash {
            if name.len() == 1 {
                // A genuine short flag such as `-h`: clap knows it.
                out.push(arg);
                continue;
            }
            // `-v5`, the klog shorthand with the level attached.
            if let Some(level) = name.strip_prefix('v')
                && value.is_none()
                && level.bytes().all(|b| b.is_ascii_digit())
            {
                (name, value, kind) = ("v", Some(level), kind_of("v"));
            }
        }
        let normalized = match (kind, value) {
            (_, Some(value)) => format!("--{name}={value}"),
            (Some(FlagKind::Value), None) => match argv.next() {
                Some(next) => {
                    let mut joined = OsString::from(format!("--{name}="));
                    joined.push(next);
                    out.push(joined);
                    continue;
                }
                // clap reports the missing value.
                None => format!("--{name}"),
            },
            (_, None) => format!("--{name}"),
        };
        out.push(normalized.into());
    }
    out
}

/// One `--leader-election-labels` value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelList(pub Vec<(String, String)>);

/// Parses `key:value,key2:value2` as csi-lib-utils does: every item must have exactly one `:`.
/// An empty key is refused too (the API server would reject the Lease later).
pub fn parse_labels(text: &str) -> Result<LabelList, String> {
    text.split(',')
        .map(|item| match item.split(':').collect::<Vec<_>>()[..] {
            [key, value] if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => Err(format!(
                "malformed item in list of labels: {item:?} (expected key:value)"
            )),
        })
        .collect::<Result<_, _>>()
        .map(LabelList)
}

mod gates;

pub use gates::{FeatureGate, FeatureGateList, parse_feature_gates};

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "cli_props_tests.rs"]
mod props_tests;
