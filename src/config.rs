//! Validated, typed configuration built from the command line; no clap types past this point.
//!
//! [`Config::from_args`] is the only way in: it folds in the environment (`KUBECONFIG`,
//! `NODE_NAME`, `POD_NAMESPACE`), applies client-go's defaulting, and refuses combinations that
//! upstream either rejects at start-up or turns into a panic or a silent hang later.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{Args, FeatureGate};
pub use crate::telemetry::LoggingOptions;

/// The whole configuration of one sidecar process.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// How to reach the CSI driver.
    pub csi: CsiOptions,
    /// How volumes are named, requested and retried.
    pub provisioning: ProvisioningOptions,
    /// Per-node deployment (`--node-deployment`), with the node this instance runs on.
    pub node_deployment: Option<NodeDeployment>,
    /// Handling of volumes whose node no longer exists.
    pub deleted_node: DeletedNodeOptions,
    /// Operator aids beyond upstream (audit, unused claims).
    pub operator: OperatorOptions,
    /// Resolved `--feature-gates`.
    pub feature_gates: FeatureGates,
    /// The Kubernetes API client.
    pub kube: KubeOptions,
    /// The metrics and health HTTP server; `None` when no address is set.
    pub http: Option<HttpOptions>,
    /// Lease-based leader election; `None` without `--leader-election`.
    pub leader_election: Option<LeaderElectionOptions>,
    /// CSIStorageCapacity publishing.
    pub capacity: CapacityOptions,
    /// Clone-source and snapshot-source protection.
    pub source_protection: SourceProtectionOptions,
    /// Log verbosity and format.
    pub logging: LoggingOptions,
    /// `--feature-gates` names accepted for compatibility that mean nothing here.
    inert_feature_gates: Vec<&'static str>,
}

/// The CSI driver connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiOptions {
    /// `--csi-address` as given: a socket path or `unix:///path`.
    pub address: String,
    /// `--timeout`: the deadline of every CSI call.
    pub timeout: Duration,
}

/// Provisioning behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisioningOptions {
    /// `--volume-name-prefix`, never empty.
    pub volume_name_prefix: String,
    /// `--volume-name-uuid-length`: `None` keeps the full UID with dashes; `Some(n)` (1..=32)
    /// strips dashes and keeps `n` characters.
    pub volume_name_uuid_length: Option<usize>,
    /// `--retry-interval-start`, > 0 and <= `retry_interval_max`.
    pub retry_interval_start: Duration,
    /// `--retry-interval-max`.
    pub retry_interval_max: Duration,
    /// `--worker-threads`: concurrent provisions, and as many concurrent deletions.
    pub worker_threads: usize,
    /// `--strict-topology`.
    pub strict_topology: bool,
    /// `--immediate-topology`.
    pub immediate_topology: bool,
    /// `--extra-create-metadata`.
    pub extra_create_metadata: bool,
    /// `--default-fstype`; `None` when empty.
    pub default_fstype: Option<String>,
    /// `--controller-publish-readonly`.
    pub controller_publish_readonly: bool,
    /// `--prevent-volume-mode-conversion`.
    pub prevent_volume_mode_conversion: bool,
}

/// `--node-deployment` mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDeployment {
    /// This instance's node, from the `NODE_NAME` environment variable.
    pub node_name: String,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay`.
    pub base_delay: Duration,
    /// `--node-deployment-max-delay`, >= `base_delay`.
    pub max_delay: Duration,
    /// `--node-deployment-intent-journal` (ours, retired and ignored): a directory where an
    /// earlier version kept this node's intents, whose volumes are named in a warning at start-up.
    pub intent_journal: Option<PathBuf>,
}

/// Volumes of nodes that no longer exist (our addition; upstream leaves them to manual clean-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletedNodeOptions {
    /// `--deleted-node-grace-period`: how long a node must have been absent before DeleteVolume of
    /// its volumes is answered as already deleted.
    pub grace_period: Duration,
    /// `--deleted-node-pvc-cleanup`: also delete PVCs still bound to such PVs.
    pub pvc_cleanup: bool,
}

/// Operator aids (ours): the periodic audit and unused-claim tracking.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorOptions {
    /// `--audit-interval`; `None` when 0 (off).
    pub audit_interval: Option<Duration>,
    /// `--track-unused-claims`.
    pub track_unused_claims: bool,
}

/// The Kubernetes API client.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeOptions {
    /// Kubeconfig path: `KUBECONFIG` if set, else `--kubeconfig`; `None` when neither is set.
    pub kubeconfig: Option<PathBuf>,
    /// `--master`; `None` when empty.
    pub master: Option<String>,
    /// Client-side rate limit; `None` (a negative `--kube-api-qps`) means unlimited, as client-go.
    pub rate_limit: Option<RateLimit>,
}

/// A token bucket: `burst` requests at once, refilled at `qps` per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained requests per second, > 0.
    pub qps: f64,
    /// Bucket size, >= 1.
    pub burst: u32,
}

/// The HTTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOptions {
    /// Listen address, `host:port` or `:port` (all interfaces), as Go's `net.Listen` takes it.
    pub address: String,
    /// Which flag set the address, for error messages.
    pub address_flag: &'static str,
    /// `--metrics-path`, starting with `/`.
    pub metrics_path: String,
    /// `--enable-pprof`: serve `/debug/pprof/` on the same listener.
    pub enable_pprof: bool,
    /// Serve `/healthz/leader-election`: leader election is on and the address came from
    /// `--http-endpoint` (not the deprecated `--metrics-address`), as upstream.
    pub leader_election_health: bool,
}

/// Leader election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionOptions {
    /// `--leader-election-namespace`, else `POD_NAMESPACE`; `None`: the service account's
    /// namespace file, else `default` (resolved at run time).
    pub namespace: Option<String>,
    /// `--leader-election-lease-duration`.
    pub lease_duration: Duration,
    /// `--leader-election-renew-deadline`.
    pub renew_deadline: Duration,
    /// `--leader-election-retry-period`.
    pub retry_period: Duration,
    /// `--leader-election-labels`.
    pub labels: BTreeMap<String, String>,
}

/// CSIStorageCapacity publishing (`capacity`).
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityOptions {
    /// `--enable-capacity`.
    pub enabled: bool,
    /// `--capacity-threads`.
    pub threads: u64,
    /// `--capacity-for-immediate-binding`.
    pub for_immediate_binding: bool,
    /// `--capacity-poll-interval`.
    pub poll_interval: Duration,
    /// `--capacity-ownerref-level`.
    pub ownerref_level: i64,
    /// `--kube-api-capacity-qps`.
    pub qps: f32,
    /// `--kube-api-capacity-burst`.
    pub burst: i64,
}

/// Clone and snapshot source protection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceProtectionOptions {
    /// `--cloning-protection-threads`.
    pub cloning_protection_threads: u64,
    /// `--snapshot-orphan-sweep-interval`; `None` when 0 (sweep disabled).
    pub snapshot_orphan_sweep_interval: Option<Duration>,
}

/// A configuration the sidecar refuses to start with. Each message names the flags involved and
/// what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// Both HTTP address flags are set.
    #[error(
        "--metrics-address ({metrics_address:?}) and --http-endpoint ({http_endpoint:?}) cannot both be set; \
         keep --http-endpoint (--metrics-address is deprecated)"
    )]
    ConflictingHttpAddresses {
        /// `--http-endpoint`.
        http_endpoint: String,
        /// `--metrics-address`.
        metrics_address: String,
    },
    /// An HTTP address that is not `host:port`.
    #[error("{flag} {address:?} is not a listen address; use host:port or :port (e.g. :8080)")]
    InvalidHttpAddress {
        /// The flag.
        flag: &'static str,
        /// Its value.
        address: String,
    },
    /// A metrics path that cannot be served.
    #[error("--metrics-path {0:?} must start with \"/\" and must not be /healthz or below it")]
    InvalidMetricsPath(String),
    /// Node mode without its node name.
    #[error(
        "--node-deployment requires the NODE_NAME environment variable; set it from the pod's \
         spec.nodeName (env: valueFrom: fieldRef: fieldPath: spec.nodeName)"
    )]
    MissingNodeName,
    /// A node-mode-only flag without `--node-deployment`.
    #[error(
        "--node-deployment-intent-journal={0:?} is retired (and was for --node-deployment only); \
         remove it"
    )]
    JournalWithoutNodeMode(String),
    /// A PV-name UID length outside what a UID holds.
    #[error(
        "--volume-name-uuid-length={0} is out of range: use -1 to keep the full PVC UID, or 1 to 32 \
         (a UID without dashes has 32 characters)"
    )]
    InvalidUuidLength(i64),
    /// An empty PV-name prefix.
    #[error("--volume-name-prefix must not be empty (the default is \"pvc\")")]
    EmptyVolumeNamePrefix,
    /// An empty CSI address.
    #[error("--csi-address must not be empty (the default is /run/csi/socket)")]
    EmptyCsiAddress,
    /// A duration flag that must be positive is 0.
    #[error("{0} must be greater than 0")]
    ZeroDuration(&'static str),
    /// A worker-count flag that must be positive is 0.
    #[error("{0} must be at least 1, or nothing would ever be processed")]
    ZeroWorkers(&'static str),
    /// A backoff whose start exceeds its cap.
    #[error("{start_flag} ({start}) must not be longer than {max_flag} ({max})")]
    BackoffOrder {
        /// The flag of the first delay.
        start_flag: &'static str,
        /// Its value.
        start: String,
        /// The flag of the cap.
        max_flag: &'static str,
        /// Its value.
        max: String,
    },
    /// Leader-election timings that client-go refuses.
    #[error(
        "leader election timings are inconsistent: {0} (defaults: --leader-election-lease-duration=15s, \
         --leader-election-renew-deadline=10s, --leader-election-retry-period=5s)"
    )]
    LeaderElectionTimings(String),
    /// `--vmodule` with the JSON format; upstream's text, then what to change.
    #[error(
        "vmodule: Forbidden: Only supported for text log format (remove --vmodule or use \
         --logging-format=text)"
    )]
    VModuleNeedsText,
    /// A rate limit that cannot be enforced.
    #[error("{0}")]
    InvalidRateLimit(String),
}

impl Config {
    /// Validates the command line. `env` looks up environment variables (injectable for tests);
    /// an empty value counts as unset, as in Go's `os.Getenv(..) != ""` checks.
    pub fn from_args(
        args: Args,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let env = |name: &str| env(name).filter(|value| !value.is_empty());
        let feature_gates = FeatureGates::resolve(args.feature_gate_settings());
        let mut inert_feature_gates: Vec<&'static str> = args
            .feature_gate_settings()
            .filter_map(|(gate, _)| match gate {
                FeatureGate::Inert(name) => Some(name),
                _ => None,
            })
            .collect();
        inert_feature_gates.sort_unstable();
        inert_feature_gates.dedup();
        let leader_election_labels = args.leader_election_label_map();
        // Destructured so that a flag added to `Args` but forgotten here fails to compile.
        let Args {
            version: _,
            csi_address,
            timeout,
            volume_name_prefix,
            volume_name_uuid_length,
            retry_interval_start,
            retry_interval_max,
            worker_threads,
            strict_topology,
            immediate_topology,
            extra_create_metadata,
            default_fstype,
            controller_publish_readonly,
            prevent_volume_mode_conversion,
            cloning_protection_threads,
            snapshot_orphan_sweep_interval,
            feature_gates: _,
            node_deployment,
            node_deployment_immediate_binding,
            node_deployment_base_delay,
            node_deployment_max_delay,
            node_deployment_intent_journal,
            deleted_node_grace_period,
            deleted_node_pvc_cleanup,
            audit_interval,
            track_unused_claims,
            kubeconfig,
            master,
            kube_api_qps,
            kube_api_burst,
            http_endpoint,
            metrics_address,
            metrics_path,
            enable_pprof,
            leader_election,
            leader_election_namespace,
            leader_election_lease_duration,
            leader_election_renew_deadline,
            leader_election_retry_period,
            leader_election_labels: _,
            enable_capacity,
            capacity_threads,
            capacity_for_immediate_binding,
            capacity_poll_interval,
            capacity_ownerref_level,
            kube_api_capacity_qps,
            kube_api_capacity_burst,
            v,
            logging_format,
            vmodule,
            log_flush_frequency,
            log_text_split_stream,
            // Accepted without effect: every line is written as it is logged (cli.rs).
            log_text_info_buffer_size: _,
            log_json_split_stream,
            log_json_info_buffer_size: _,
            automaxprocs: _,
        } = args;

        if csi_address.is_empty() {
            return Err(ConfigError::EmptyCsiAddress);
        }
        let logging = logging_options(
            v,
            logging_format,
            vmodule,
            (log_text_split_stream, log_json_split_stream),
        )?;
        positive(log_flush_frequency, "--log-flush-frequency")?;
        positive(timeout, "--timeout")?;

        if volume_name_prefix.is_empty() {
            return Err(ConfigError::EmptyVolumeNamePrefix);
        }
        let volume_name_uuid_length = match volume_name_uuid_length {
            -1 => None,
            // Bounded by 32 just above, so the conversion cannot truncate.
            n @ 1..=32 => Some(n as usize),
            n => return Err(ConfigError::InvalidUuidLength(n)),
        };
        positive(retry_interval_start, "--retry-interval-start")?;
        ordered(
            ("--retry-interval-start", retry_interval_start),
            ("--retry-interval-max", retry_interval_max),
        )?;
        let worker_threads = match usize::try_from(worker_threads) {
            Ok(0) => return Err(ConfigError::ZeroWorkers("--worker-threads")),
            Ok(n) => n,
            Err(_) => usize::MAX,
        };

        let node_deployment = if node_deployment {
            let node_name = env("NODE_NAME").ok_or(ConfigError::MissingNodeName)?;
            ordered(
                ("--node-deployment-base-delay", node_deployment_base_delay),
                ("--node-deployment-max-delay", node_deployment_max_delay),
            )?;
            Some(NodeDeployment {
                node_name,
                immediate_binding: node_deployment_immediate_binding,
                base_delay: node_deployment_base_delay,
                max_delay: node_deployment_max_delay,
                intent_journal: Some(node_deployment_intent_journal)
                    .filter(|dir| !dir.is_empty())
                    .map(PathBuf::from),
            })
        } else if !node_deployment_intent_journal.is_empty() {
            return Err(ConfigError::JournalWithoutNodeMode(
                node_deployment_intent_journal,
            ));
        } else {
            None
        };

        let kube = KubeOptions {
            kubeconfig: env("KUBECONFIG")
                .or(Some(kubeconfig).filter(|k| !k.is_empty()))
                .map(PathBuf::from),
            master: Some(master).filter(|m| !m.is_empty()),
            rate_limit: rate_limit(kube_api_qps, kube_api_burst)?,
        };

        let http = match (http_endpoint.is_empty(), metrics_address.is_empty()) {
            (true, true) => None,
            (false, false) => {
                return Err(ConfigError::ConflictingHttpAddresses {
                    http_endpoint,
                    metrics_address,
                });
            }
            (endpoint_empty, _) => {
                let (address, address_flag) = if endpoint_empty {
                    (metrics_address, "--metrics-address")
                } else {
                    (http_endpoint, "--http-endpoint")
                };
                validate_listen_address(&address, address_flag)?;
                if !metrics_path.starts_with('/')
                    || metrics_path == "/healthz"
                    || metrics_path.starts_with("/healthz/")
                {
                    return Err(ConfigError::InvalidMetricsPath(metrics_path));
                }
                Some(HttpOptions {
                    address,
                    address_flag,
                    metrics_path,
                    enable_pprof,
                    leader_election_health: leader_election && !endpoint_empty,
                })
            }
        };

        let leader_election = if leader_election {
            validate_leader_election(
                leader_election_lease_duration,
                leader_election_renew_deadline,
                leader_election_retry_period,
            )?;
            Some(LeaderElectionOptions {
                namespace: Some(leader_election_namespace)
                    .filter(|ns| !ns.is_empty())
                    .or_else(|| env("POD_NAMESPACE")),
                lease_duration: leader_election_lease_duration,
                renew_deadline: leader_election_renew_deadline,
                retry_period: leader_election_retry_period,
                labels: leader_election_labels,
            })
        } else {
            None
        };

        Ok(Config {
            csi: CsiOptions {
                address: csi_address,
                timeout,
            },
            provisioning: ProvisioningOptions {
                volume_name_prefix,
                volume_name_uuid_length,
                retry_interval_start,
                retry_interval_max,
                worker_threads,
                strict_topology,
                immediate_topology,
                extra_create_metadata,
                default_fstype: Some(default_fstype).filter(|fs| !fs.is_empty()),
                controller_publish_readonly,
                prevent_volume_mode_conversion,
            },
            node_deployment,
            deleted_node: DeletedNodeOptions {
                grace_period: deleted_node_grace_period,
                pvc_cleanup: deleted_node_pvc_cleanup,
            },
            operator: OperatorOptions {
                audit_interval: Some(audit_interval).filter(|d| !d.is_zero()),
                track_unused_claims,
            },
            feature_gates,
            kube,
            http,
            leader_election,
            capacity: CapacityOptions {
                enabled: enable_capacity,
                threads: capacity_threads,
                for_immediate_binding: capacity_for_immediate_binding,
                poll_interval: capacity_poll_interval,
                ownerref_level: capacity_ownerref_level,
                qps: kube_api_capacity_qps,
                burst: kube_api_capacity_burst,
            },
            source_protection: SourceProtectionOptions {
                cloning_protection_threads,
                snapshot_orphan_sweep_interval: Some(snapshot_orphan_sweep_interval)
                    .filter(|interval| !interval.is_zero()),
            },
            logging,
            inert_feature_gates,
        })
    }

    /// `--feature-gates` names set that upstream's binary accepts only because it links the API
    /// server's libraries: logged at start-up as having no effect.
    pub fn inert_feature_gates(&self) -> &[&'static str] {
        &self.inert_feature_gates
    }
}

/// The effective feature gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    /// `Topology` (default true).
    pub topology: bool,
    /// `CrossNamespaceVolumeDataSource` (default false).
    pub cross_namespace_volume_data_source: bool,
    /// `VolumeAttributesClass` (default true).
    pub volume_attributes_class: bool,
    /// Whether `VolumeAttributesClass` was set explicitly: upstream turns the gate off at start-up
    /// when the cluster lacks the API, but only if the user did not set it.
    pub volume_attributes_class_explicit: bool,
    /// `ReleaseLeaderElectionOnExit` (default false).
    pub release_leader_election_on_exit: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self::resolve([])
    }
}

impl FeatureGates {
    /// Applies settings in order (a later one wins). An explicit gate beats `AllAlpha`/`AllBeta`
    /// whatever the order, as in component-base.
    pub fn resolve(settings: impl IntoIterator<Item = (FeatureGate, bool)>) -> Self {
        let explicit: BTreeMap<&'static str, bool> = settings
            .into_iter()
            .map(|(gate, enabled)| (gate.name(), enabled))
            .collect();
        let gate = |gate: FeatureGate, default: bool| {
            explicit.get(gate.name()).copied().unwrap_or(default)
        };
        let all_alpha = gate(FeatureGate::AllAlpha, false);
        Self {
            topology: gate(FeatureGate::Topology, true),
            cross_namespace_volume_data_source: gate(
                FeatureGate::CrossNamespaceVolumeDataSource,
                all_alpha,
            ),
            volume_attributes_class: gate(FeatureGate::VolumeAttributesClass, true),
            volume_attributes_class_explicit: explicit
                .contains_key(FeatureGate::VolumeAttributesClass.name()),
            release_leader_election_on_exit: gate(
                FeatureGate::ReleaseLeaderElectionOnExit,
                all_alpha,
            ),
        }
    }
}

mod validate;

use validate::{
    logging_options, ordered, positive, rate_limit, validate_leader_election,
    validate_listen_address,
};

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
