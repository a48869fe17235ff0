//! Unit tests of `config.rs`: upstream defaults, both dash styles, every cross-flag error.
use super::*;
use crate::cli::{FeatureGateList, PROGRAM};
use crate::telemetry::LogFormat;
use crate::telemetry::vmodule::{VModuleItem, VModuleList};

const S: fn(u64) -> Duration = Duration::from_secs;

fn args(argv: &[&str]) -> Args {
    Args::try_parse_go_style(std::iter::once(PROGRAM).chain(argv.iter().copied())).unwrap()
}

fn config_with_env(argv: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_args(args(argv), |name| env.get(name).cloned())
}

fn config(argv: &[&str]) -> Result<Config, ConfigError> {
    config_with_env(argv, &[])
}

/// Upstream's defaults (reference §1a-1c) as upstream writes them.
const UPSTREAM_DEFAULTS: &[(&str, &str)] = &[
    ("master", ""),
    ("volume-name-prefix", "pvc"),
    ("volume-name-uuid-length", "-1"),
    ("retry-interval-start", "1s"),
    ("retry-interval-max", "5m"),
    ("worker-threads", "100"),
    ("cloning-protection-threads", "1"),
    ("snapshot-orphan-sweep-interval", "5m"),
    ("capacity-threads", "1"),
    ("timeout", "10s"),
    ("strict-topology", "false"),
    ("immediate-topology", "true"),
    ("extra-create-metadata", "false"),
    ("enable-pprof", "false"),
    ("default-fstype", ""),
    ("kube-api-capacity-qps", "1"),
    ("kube-api-capacity-burst", "5"),
    ("enable-capacity", "false"),
    ("capacity-for-immediate-binding", "false"),
    ("capacity-poll-interval", "1m"),
    ("capacity-ownerref-level", "1"),
    ("node-deployment", "false"),
    ("node-deployment-immediate-binding", "true"),
    ("node-deployment-base-delay", "20s"),
    ("node-deployment-max-delay", "60s"),
    ("controller-publish-readonly", "false"),
    ("prevent-volume-mode-conversion", "true"),
    ("feature-gates", ""),
    ("version", "false"),
    ("kubeconfig", ""),
    ("csi-address", "/run/csi/socket"),
    ("leader-election", "false"),
    ("leader-election-namespace", ""),
    ("leader-election-lease-duration", "15s"),
    ("leader-election-renew-deadline", "10s"),
    ("leader-election-retry-period", "5s"),
    ("kube-api-qps", "5"),
    ("kube-api-burst", "10"),
    ("http-endpoint", ""),
    ("metrics-address", ""),
    ("metrics-path", "/metrics"),
    ("automaxprocs", "false"),
    ("v", "0"),
    ("vmodule", ""),
    ("logging-format", "text"),
    ("log-flush-frequency", "5s"),
    ("log-text-split-stream", "false"),
    ("log-text-info-buffer-size", "0"),
    ("log-json-split-stream", "false"),
    ("log-json-info-buffer-size", "0"),
    // Ours.
    ("deleted-node-grace-period", "5m"),
    ("deleted-node-pvc-cleanup", "false"),
    ("audit-interval", "0s"),
    ("track-unused-claims", "false"),
    ("node-deployment-intent-journal", ""),
];

/// Passing upstream's default explicitly must give exactly what passing nothing gives.
#[test]
fn defaults_equal_upstream() {
    let defaults = Args::defaults();
    for (flag, upstream) in UPSTREAM_DEFAULTS {
        let mut explicit = args(&[&format!("--{flag}={upstream}")]);
        if *flag == "feature-gates" {
            assert_eq!(explicit.feature_gates, [FeatureGateList::default()]);
            explicit.feature_gates.clear();
        }
        if *flag == "vmodule" {
            assert_eq!(explicit.vmodule, [VModuleList::default()]);
            explicit.vmodule.clear();
        }
        assert_eq!(
            explicit, defaults,
            "our default of --{flag} is not upstream's {upstream:?}"
        );
    }
    // A map flag whose default, `{}`, cannot be written on the command line (upstream refuses
    // `--leader-election-labels=` too).
    assert!(defaults.leader_election_labels.is_empty());

    // The table covers every flag the command line defines, plus these two.
    let mut command = <Args as clap::CommandFactory>::command();
    command.build();
    let mut defined: Vec<&str> = command
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .collect();
    let mut tabled: Vec<&str> = UPSTREAM_DEFAULTS.iter().map(|(flag, _)| *flag).collect();
    tabled.extend(["help", "leader-election-labels"]);
    defined.sort_unstable();
    tabled.sort_unstable();
    assert_eq!(defined, tabled);
}

#[test]
fn default_command_line_gives_upstream_behaviour() {
    let c = config(&[]).unwrap();
    assert_eq!(
        c.csi,
        CsiOptions {
            address: "/run/csi/socket".into(),
            timeout: S(10)
        }
    );
    assert_eq!(c.provisioning.volume_name_uuid_length, None);
    assert_eq!(c.provisioning.worker_threads, 100);
    assert_eq!(c.provisioning.default_fstype, None);
    assert_eq!(
        c.kube.rate_limit,
        Some(RateLimit {
            qps: 5.0,
            burst: 10
        })
    );
    assert_eq!(c.kube.kubeconfig, None);
    assert_eq!(
        c.http, None,
        "no HTTP server when both address flags are empty"
    );
    assert_eq!(c.leader_election, None);
    assert_eq!(c.node_deployment, None);
    assert_eq!(
        c.deleted_node,
        DeletedNodeOptions {
            grace_period: S(300),
            pvc_cleanup: false
        }
    );
    assert_eq!(c.operator, crate::config::OperatorOptions::default());
    assert_eq!(
        c.source_protection.snapshot_orphan_sweep_interval,
        Some(S(300))
    );
    assert_eq!(c.feature_gates, FeatureGates::default());
}

#[test]
fn kubeconfig_env_overrides_the_flag() {
    let c = config_with_env(&["--kubeconfig=/flag"], &[("KUBECONFIG", "/env")]).unwrap();
    assert_eq!(c.kube.kubeconfig, Some(PathBuf::from("/env")));
    let c = config_with_env(&["--kubeconfig=/flag"], &[("KUBECONFIG", "")]).unwrap();
    assert_eq!(c.kube.kubeconfig, Some(PathBuf::from("/flag")));
    let c = config_with_env(&["--master=https://api:6443"], &[]).unwrap();
    assert_eq!(
        (c.kube.kubeconfig, c.kube.master.as_deref()),
        (None, Some("https://api:6443"))
    );
}

#[test]
fn rate_limit_follows_client_go_defaulting() {
    let limit = |argv: &[&str]| config(argv).unwrap().kube.rate_limit;
    assert_eq!(
        limit(&["--kube-api-qps=0", "--kube-api-burst=0"]),
        Some(RateLimit {
            qps: 5.0,
            burst: 10
        })
    );
    assert_eq!(
        limit(&["--kube-api-qps=0.5", "--kube-api-burst=1"]),
        Some(RateLimit { qps: 0.5, burst: 1 })
    );
    assert_eq!(limit(&["--kube-api-qps=-1"]), None);
    let err = config(&["--kube-api-burst=-3"]).unwrap_err();
    assert!(err.to_string().contains("--kube-api-burst=-3"), "{err}");
    assert!(config(&["--kube-api-qps=NaN"]).is_err());
}

#[test]
fn http_server_is_configured_from_either_address_flag() {
    let c = config(&["--http-endpoint=:8080", "--leader-election"]).unwrap();
    let http = c.http.unwrap();
    assert_eq!(
        (http.address.as_str(), http.address_flag),
        (":8080", "--http-endpoint")
    );
    assert_eq!(http.metrics_path, "/metrics");
    assert!(http.leader_election_health);
    // The deprecated flag serves metrics only, without the leader-election health check.
    let http = config(&["--metrics-address=127.0.0.1:9000", "--leader-election"])
        .unwrap()
        .http
        .unwrap();
    assert_eq!(
        (http.address.as_str(), http.address_flag),
        ("127.0.0.1:9000", "--metrics-address")
    );
    assert!(!http.leader_election_health);
    let http = config(&["--http-endpoint=[::1]:80", "--metrics-path=/m"])
        .unwrap()
        .http
        .unwrap();
    assert!(!http.leader_election_health);
    assert_eq!(http.metrics_path, "/m");
}

#[test]
fn both_http_address_flags_together_are_refused() {
    let err = config(&["--http-endpoint=:8080", "--metrics-address=:9090"]).unwrap_err();
    assert!(matches!(err, ConfigError::ConflictingHttpAddresses { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("--metrics-address") && msg.contains("--http-endpoint"),
        "{msg}"
    );
}

#[test]
fn malformed_http_addresses_and_paths_are_refused() {
    for address in [
        "8080",
        "host:",
        "host:http",
        "::1:80",
        "a b:80",
        "host:70000",
    ] {
        let err = config(&[&format!("--http-endpoint={address}")]).unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidHttpAddress { .. }),
            "{address}: {err}"
        );
        assert!(err.to_string().contains("--http-endpoint"));
    }
    for path in ["metrics", "/healthz", "/healthz/leader-election"] {
        let err =
            config(&["--http-endpoint=:8080", &format!("--metrics-path={path}")]).unwrap_err();
        assert_eq!(err, ConfigError::InvalidMetricsPath(path.into()));
    }
}

#[test]
fn node_deployment_requires_node_name() {
    let err = config(&["--node-deployment"]).unwrap_err();
    assert_eq!(err, ConfigError::MissingNodeName);
    let msg = err.to_string();
    assert!(
        msg.contains("NODE_NAME") && msg.contains("--node-deployment"),
        "{msg}"
    );
    assert_eq!(
        config_with_env(&["--node-deployment"], &[("NODE_NAME", "")]).unwrap_err(),
        ConfigError::MissingNodeName
    );

    let c = config_with_env(
        &["-node-deployment", "-node-deployment-base-delay=1s"],
        &[("NODE_NAME", "n1")],
    )
    .unwrap();
    assert_eq!(
        c.node_deployment,
        Some(NodeDeployment {
            node_name: "n1".into(),
            immediate_binding: true,
            base_delay: S(1),
            max_delay: S(60),
            intent_journal: None,
        })
    );
    // Without node mode, NODE_NAME is irrelevant.
    assert_eq!(
        config_with_env(&[], &[("NODE_NAME", "n1")])
            .unwrap()
            .node_deployment,
        None
    );
}

#[test]
fn the_intent_journal_is_a_node_mode_directory() {
    let c = config_with_env(
        &[
            "--node-deployment",
            "--node-deployment-intent-journal=/csi/intents",
        ],
        &[("NODE_NAME", "n1")],
    )
    .unwrap();
    let journal = c.node_deployment.and_then(|n| n.intent_journal);
    assert_eq!(journal, Some(PathBuf::from("/csi/intents")));

    let err = config(&["--node-deployment-intent-journal=/csi/intents"]).unwrap_err();
    assert_eq!(
        err,
        ConfigError::JournalWithoutNodeMode("/csi/intents".into())
    );
    assert!(err.to_string().contains("is retired"), "{err}");
}

#[test]
fn node_deployment_delays_must_be_ordered() {
    let err = config_with_env(
        &["--node-deployment", "--node-deployment-base-delay=2m"],
        &[("NODE_NAME", "n")],
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "--node-deployment-base-delay (2m0s) must not be longer than --node-deployment-max-delay (1m0s)"
    );
}

#[test]
fn uuid_length_must_fit_a_uid() {
    for n in ["0", "33", "-2", "1000"] {
        let err = config(&[&format!("--volume-name-uuid-length={n}")]).unwrap_err();
        assert_eq!(err, ConfigError::InvalidUuidLength(n.parse().unwrap()));
        assert!(
            err.to_string()
                .contains("use -1 to keep the full PVC UID, or 1 to 32")
        );
    }
    assert_eq!(
        config(&["--volume-name-uuid-length=32"])
            .unwrap()
            .provisioning
            .volume_name_uuid_length,
        Some(32)
    );
    assert_eq!(
        config(&["-volume-name-uuid-length", "1"])
            .unwrap()
            .provisioning
            .volume_name_uuid_length,
        Some(1)
    );
    assert_eq!(
        config(&["--volume-name-uuid-length", "-1"])
            .unwrap()
            .provisioning
            .volume_name_uuid_length,
        None
    );
}

#[test]
fn empty_prefix_and_address_are_refused() {
    assert_eq!(
        config(&["--volume-name-prefix="]).unwrap_err(),
        ConfigError::EmptyVolumeNamePrefix
    );
    assert_eq!(
        config(&["--csi-address="]).unwrap_err(),
        ConfigError::EmptyCsiAddress
    );
}

#[test]
fn retry_intervals_must_be_positive_and_ordered() {
    let err = config(&["--retry-interval-start=10m"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--retry-interval-start (10m0s) must not be longer than --retry-interval-max (5m0s)"
    );
    assert_eq!(
        config(&["--retry-interval-start=0"]).unwrap_err(),
        ConfigError::ZeroDuration("--retry-interval-start")
    );
    let c = config(&["--retry-interval-start=5m", "--retry-interval-max=5m"]).unwrap();
    assert_eq!(
        c.provisioning.retry_interval_start,
        c.provisioning.retry_interval_max
    );
}

#[test]
fn zero_timeout_and_zero_workers_are_refused() {
    assert_eq!(
        config(&["--timeout=0s"]).unwrap_err(),
        ConfigError::ZeroDuration("--timeout")
    );
    assert_eq!(
        config(&["--worker-threads=0"]).unwrap_err(),
        ConfigError::ZeroWorkers("--worker-threads")
    );
}

#[test]
fn leader_election_options_and_namespace_fallback() {
    let c = config_with_env(
        &["--leader-election", "--leader-election-labels=a:b"],
        &[("POD_NAMESPACE", "kube-system")],
    )
    .unwrap();
    let le = c.leader_election.unwrap();
    assert_eq!(le.namespace.as_deref(), Some("kube-system"));
    assert_eq!(
        (le.lease_duration, le.renew_deadline, le.retry_period),
        (S(15), S(10), S(5))
    );
    assert_eq!(le.labels, BTreeMap::from([("a".into(), "b".into())]));
    let c = config_with_env(
        &["--leader-election", "--leader-election-namespace=x"],
        &[("POD_NAMESPACE", "y")],
    )
    .unwrap();
    assert_eq!(c.leader_election.unwrap().namespace.as_deref(), Some("x"));
    assert_eq!(
        config(&["--leader-election"])
            .unwrap()
            .leader_election
            .unwrap()
            .namespace,
        None
    );
}

#[test]
fn inconsistent_leader_election_timings_are_refused() {
    for argv in [
        &["--leader-election", "--leader-election-lease-duration=10s"][..],
        &["--leader-election", "--leader-election-renew-deadline=6s"],
        &["--leader-election", "--leader-election-retry-period=0s"],
    ] {
        assert!(config(argv).is_err(), "{argv:?}");
    }
    let err = config(&["--leader-election", "--leader-election-lease-duration=10s"]).unwrap_err();
    assert!(
        err.to_string()
            .contains("--leader-election-lease-duration (10s) must be longer than"),
        "{err}"
    );
    // Only checked when leader election is on.
    assert!(config(&["--leader-election-lease-duration=1s"]).is_ok());
}

#[test]
fn feature_gates_resolve_with_alpha_and_explicit_settings() {
    let gates = |argv: &[&str]| config(argv).unwrap().feature_gates;
    let g = gates(&["--feature-gates=Topology=false,VolumeAttributesClass=true"]);
    assert!(!g.topology && g.volume_attributes_class && g.volume_attributes_class_explicit);
    assert!(!gates(&[]).volume_attributes_class_explicit);
    let g = gates(&["--feature-gates=AllAlpha=true"]);
    assert!(
        g.cross_namespace_volume_data_source && g.release_leader_election_on_exit && g.topology
    );
    // An explicit gate wins over AllAlpha in either order; repeated flags merge.
    for argv in [
        &["--feature-gates=ReleaseLeaderElectionOnExit=false,AllAlpha=true"][..],
        &[
            "--feature-gates=AllAlpha=true",
            "--feature-gates=ReleaseLeaderElectionOnExit=false",
        ],
    ] {
        let g = gates(argv);
        assert!(
            g.cross_namespace_volume_data_source && !g.release_leader_election_on_exit,
            "{argv:?}"
        );
    }
    let g = gates(&[
        "--feature-gates=HonorPVReclaimPolicy=true,MutableCSINodeAllocatableCount=true,AllBeta=true",
    ]);
    assert_eq!(g, FeatureGates::default());
}

#[test]
fn enable_pprof_and_the_logging_flags_are_accepted_together() {
    let c = config(&[
        "--feature-gates=AllAlpha=true",
        "--http-endpoint=:1",
        "--enable-pprof",
        "--log-text-split-stream",
        "--log-json-split-stream",
        "--log-text-info-buffer-size=1Mi",
        "--log-json-info-buffer-size=1Mi",
        "--log-flush-frequency=1s",
    ])
    .unwrap();
    assert!(c.http.unwrap().enable_pprof);
    assert!(
        !config(&["--http-endpoint=:1"])
            .unwrap()
            .http
            .unwrap()
            .enable_pprof
    );
}

#[test]
fn logging_flags_resolve_as_component_base() {
    let c = config(&[
        "-v=2",
        "--vmodule=controller=5,http*=0",
        "-vmodule",
        "plan=3,http=4",
        "--log-text-split-stream",
    ])
    .unwrap();
    let item = |pattern: &str, level| VModuleItem {
        pattern: pattern.into(),
        level,
    };
    assert_eq!(
        c.logging,
        LoggingOptions {
            verbosity: 2,
            format: LogFormat::Text,
            // Repeated flags append; level 0 items are dropped, as klog does.
            vmodule: vec![item("controller", 5), item("plan", 3), item("http", 4)],
            split_stream: true,
        }
    );
    // Each format has its own split-stream flag.
    assert!(
        !config(&["--log-json-split-stream"])
            .unwrap()
            .logging
            .split_stream
    );
    let json = config(&["--logging-format=json", "--log-json-split-stream"]).unwrap();
    assert!(json.logging.split_stream);

    let err = config(&["--logging-format=json", "--vmodule=a=0"]).unwrap_err();
    assert_eq!(err, ConfigError::VModuleNeedsText);
    assert!(
        err.to_string()
            .starts_with("vmodule: Forbidden: Only supported for text log format"),
        "{err}"
    );
    assert_eq!(
        config(&["--log-flush-frequency=0"]).unwrap_err(),
        ConfigError::ZeroDuration("--log-flush-frequency")
    );
}

#[test]
fn supported_flags_reach_the_config() {
    let c = config(&[
        "-csi-address=unix:///csi/csi.sock",
        "-timeout=30s",
        "-volume-name-prefix=vol",
        "-worker-threads=7",
        "-strict-topology",
        "-immediate-topology=false",
        "-extra-create-metadata",
        "-default-fstype=ext4",
        "-controller-publish-readonly=true",
        "-prevent-volume-mode-conversion=false",
        "-deleted-node-grace-period=1m",
        "-audit-interval=10m",
        "-track-unused-claims",
        "-deleted-node-pvc-cleanup",
        "-snapshot-orphan-sweep-interval=0",
        "-v=5",
        "-logging-format=json",
    ])
    .unwrap();
    assert_eq!(
        c.csi,
        CsiOptions {
            address: "unix:///csi/csi.sock".into(),
            timeout: S(30)
        }
    );
    assert_eq!(
        c.provisioning,
        ProvisioningOptions {
            volume_name_prefix: "vol".into(),
            volume_name_uuid_length: None,
            retry_interval_start: S(1),
            retry_interval_max: S(300),
            worker_threads: 7,
            strict_topology: true,
            immediate_topology: false,
            extra_create_metadata: true,
            default_fstype: Some("ext4".into()),
            controller_publish_readonly: true,
            prevent_volume_mode_conversion: false,
        }
    );
    assert_eq!(
        c.deleted_node,
        DeletedNodeOptions {
            grace_period: S(60),
            pvc_cleanup: true
        }
    );
    assert_eq!(
        c.operator,
        crate::config::OperatorOptions {
            audit_interval: Some(S(600)),
            track_unused_claims: true
        }
    );
    assert_eq!(c.source_protection.snapshot_orphan_sweep_interval, None);
    assert_eq!(
        c.logging,
        LoggingOptions {
            verbosity: 5,
            format: LogFormat::Json,
            vmodule: Vec::new(),
            split_stream: false,
        }
    );
}

#[test]
fn gates_upstreams_binary_accepts_for_the_api_server_start_us_and_are_reported_as_without_effect() {
    let c = config(&[
        "--feature-gates=WatchList=false,Topology=true",
        "--feature-gates=NativeHistograms=true,BtreeWatchCache=true,WatchList=true",
    ])
    .unwrap();
    assert_eq!(
        c.inert_feature_gates(),
        ["BtreeWatchCache", "NativeHistograms", "WatchList"]
    );
    assert!(c.feature_gates.topology);
    assert!(config(&[]).unwrap().inert_feature_gates().is_empty());
}
