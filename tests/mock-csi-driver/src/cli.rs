//! Command-line flags of the `mock-csi-driver` binary and their conversion to a [`Config`].

use std::time::Duration;

use clap::Parser;

use crate::config::{
    self, Config, ConfigError, ControllerCap, CrashAction, Misbehaviour, ProbeNotReady, socket_path,
};

/// A mock CSI driver: real gRPC on a Unix socket, volumes kept in memory (and optionally in a
/// state file), with switches for capabilities, faults, latency and crashes.
#[derive(Debug, Parser)]
#[command(name = "mock-csi-driver", version)]
pub struct Args {
    /// CSI endpoint to serve: unix:///path/to/csi.sock or a bare path.
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: String,

    /// Driver name returned by GetPluginInfo.
    #[arg(long, default_value = config::DEFAULT_DRIVER_NAME)]
    pub drivername: String,

    /// Node id returned by NodeGetInfo; new volumes live on this node.
    #[arg(long, env = "NODE_NAME")]
    pub nodeid: String,

    /// Advertise VOLUME_ACCESSIBILITY_CONSTRAINTS: NodeGetInfo reports {<topology-key>: <nodeid>}
    /// and CreateVolume places volumes by the accessibility requirements.
    #[arg(long)]
    pub topology: bool,

    /// Key of the node topology segment.
    #[arg(long, default_value = config::DEFAULT_TOPOLOGY_KEY)]
    pub topology_key: String,

    /// Another node this instance may place volumes on, each with its own pool (a central
    /// controller for several simulated nodes). Repeatable.
    #[arg(long = "topology-node", value_name = "NODE")]
    pub topology_nodes: Vec<String>,

    /// Keep volumes and snapshots in this JSON file and <FILE>.journal (every change is
    /// written before the call is answered; the file is only replaced atomically), so a
    /// restarted driver still knows them.
    #[arg(long)]
    pub state_file: Option<std::path::PathBuf>,

    /// Serve the JSON control socket here (unix:///path or a path).
    #[arg(long)]
    pub control: Option<String>,

    /// Switch a controller capability off, e.g. CLONE_VOLUME, LIST_VOLUMES, GET_CAPACITY,
    /// CREATE_DELETE_SNAPSHOT, MODIFY_VOLUME. Repeatable. All but GET_SNAPSHOT are on by
    /// default.
    #[arg(long = "disable-capability", value_name = "CAP", value_parser = parse_cap)]
    pub disable_capabilities: Vec<ControllerCap>,

    /// Switch on a controller capability that is off by default: GET_SNAPSHOT (alpha; upstream
    /// csi-sanity v5.4 does not know it and fails its capabilities check). Repeatable.
    #[arg(long = "enable-capability", value_name = "CAP", value_parser = parse_cap)]
    pub enable_capabilities: Vec<ControllerCap>,

    /// Shorthand for --disable-capability PUBLISH_UNPUBLISH_VOLUME.
    #[arg(long)]
    pub no_publish: bool,

    /// Size of each node's storage pool (bytes or a quantity like 100Gi).
    #[arg(long, default_value = "1Ti", value_parser = parse_quantity)]
    pub capacity_total: i64,

    /// Largest volume CreateVolume accepts (OUT_OF_RANGE above); reported by GetCapacity.
    #[arg(long, value_parser = parse_quantity)]
    pub max_volume_size: Option<i64>,

    /// Size of a volume requested without a capacity range.
    #[arg(long, default_value = "1Gi", value_parser = parse_quantity)]
    pub default_volume_size: i64,

    /// Secret CreateVolume and DeleteVolume must carry, as KEY=VALUE (UNAUTHENTICATED when
    /// missing or wrong). Repeatable. Values are never logged or dumped.
    #[arg(long = "require-secret", value_name = "KEY=VALUE", value_parser = parse_secret)]
    pub require_secrets: Vec<(String, String)>,

    /// Mutable parameter key CreateVolume and ControllerModifyVolume accept; any other key is
    /// INVALID_ARGUMENT. Repeatable; replaces the default keys iops and throughput.
    #[arg(long = "mutable-parameter-key", value_name = "KEY")]
    pub mutable_parameter_keys: Vec<String>,

    /// Answer Probe with ready=false for the first N probes.
    #[arg(long, default_value_t = 0)]
    pub probe_not_ready_count: u64,

    /// Answer Probe with ready=false for this long after start (e.g. 5s).
    #[arg(long, value_parser = parse_duration)]
    pub probe_not_ready_for: Option<Duration>,

    /// Inject errors: METHOD=CODE[:COUNT|:RATE][:after], e.g. CreateVolume=UNAVAILABLE:3 (the
    /// next 3 calls), DeleteVolume=INTERNAL:0.2 (20% of calls), CreateVolume=DEADLINE_EXCEEDED:1:after
    /// (create, then answer the error). METHOD may be *. Repeatable.
    #[arg(long = "fail", value_name = "SPEC", value_parser = parse_fault)]
    pub faults: Vec<(&'static str, config::FaultRule)>,

    /// Delay calls: METHOD=DURATION, e.g. CreateVolume=2s. METHOD may be *. Repeatable.
    #[arg(long = "latency", value_name = "METHOD=DURATION", value_parser = parse_latency)]
    pub latencies: Vec<(&'static str, Duration)>,

    /// Exit (code 86) after the Nth newly created volume is persisted, before answering.
    #[arg(long, value_name = "N")]
    pub crash_after_create: Option<u64>,

    /// Deliberately violate the spec: non-idempotent-create, delete-unknown-not-found,
    /// accept-bad-list-token, undersized-volumes, drop-content-source, empty-volume-id,
    /// accept-unknown-mutable-parameters, modify-unknown-volume-ok,
    /// refuse-mutable-parameters-on-create, keep-target-path.
    /// Repeatable.
    #[arg(long = "misbehave", value_name = "NAME", value_parser = parse_misbehaviour)]
    pub misbehaviours: Vec<Misbehaviour>,

    /// Keep every CreateVolume request (capabilities, capacity, parameters, secret keys,
    /// topology, content source) for the `state` dump, as the differential suite compares them.
    #[arg(long)]
    pub record_requests: bool,

    /// Template of new volume ids: {uuid}, {name}, {node}, {zone} (the node's topology value).
    #[arg(long, default_value = config::DEFAULT_VOLUME_ID_TEMPLATE)]
    pub volume_id_template: String,

    /// An extra volume-context entry of new volumes, KEY=TEMPLATE (placeholders as for
    /// --volume-id-template). Repeatable.
    #[arg(long = "volume-context", value_name = "KEY=TEMPLATE", value_parser = parse_context)]
    pub volume_context: Vec<(String, String)>,

    /// Log format: text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

fn parse_cap(s: &str) -> Result<ControllerCap, ConfigError> {
    s.parse()
}

fn parse_misbehaviour(s: &str) -> Result<Misbehaviour, ConfigError> {
    s.parse()
}

fn parse_quantity(s: &str) -> Result<i64, ConfigError> {
    config::parse_quantity(s)
}

fn parse_duration(s: &str) -> Result<Duration, ConfigError> {
    config::parse_duration(s)
}

fn parse_context(s: &str) -> Result<(String, String), ConfigError> {
    config::parse_key_value("--volume-context", s)
}

fn parse_secret(s: &str) -> Result<(String, String), ConfigError> {
    config::parse_key_value("--require-secret", s)
}

fn parse_fault(s: &str) -> Result<(&'static str, config::FaultRule), ConfigError> {
    config::parse_fault(s)
}

fn parse_latency(s: &str) -> Result<(&'static str, Duration), ConfigError> {
    config::parse_latency(s)
}

impl Args {
    /// The validated configuration.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let Args {
            endpoint,
            drivername,
            nodeid,
            topology,
            topology_key,
            topology_nodes,
            state_file,
            control,
            disable_capabilities,
            enable_capabilities,
            no_publish,
            capacity_total,
            max_volume_size,
            default_volume_size,
            require_secrets,
            mutable_parameter_keys,
            probe_not_ready_count,
            probe_not_ready_for,
            faults,
            latencies,
            crash_after_create,
            misbehaviours,
            record_requests,
            volume_id_template,
            volume_context,
            log_format: _,
        } = self;
        let mut config = Config::new(socket_path(&endpoint), nodeid).with_driver_name(drivername);
        config.topology = topology;
        config.topology_key = topology_key;
        config.extra_nodes = topology_nodes;
        config.state_file = state_file;
        config.control = control.as_deref().map(socket_path);
        config.capabilities.extend(enable_capabilities);
        for cap in disable_capabilities {
            config.capabilities.remove(&cap);
        }
        if no_publish {
            config
                .capabilities
                .remove(&ControllerCap::PublishUnpublishVolume);
        }
        config.capacity_total = capacity_total;
        config.max_volume_size = max_volume_size;
        config.default_volume_size = default_volume_size;
        config.record_requests = record_requests;
        config.volume_id_template = volume_id_template;
        config.volume_context = volume_context.into_iter().collect();
        config.required_secrets = require_secrets.into_iter().collect();
        if !mutable_parameter_keys.is_empty() {
            config.mutable_parameter_keys = mutable_parameter_keys.into_iter().collect();
        }
        config.probe_not_ready = ProbeNotReady {
            count: probe_not_ready_count,
            duration: probe_not_ready_for.unwrap_or_default(),
        };
        config.faults = faults.into_iter().map(|(m, r)| (m.to_owned(), r)).collect();
        config.latencies = latencies
            .into_iter()
            .map(|(m, d)| (m.to_owned(), d))
            .collect();
        config.crash_after_create = crash_after_create.filter(|n| *n > 0);
        config.crash_action = CrashAction::ExitProcess;
        config.misbehaviours = misbehaviours.into_iter().collect();
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FaultRule;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut all = vec![
            "mock-csi-driver",
            "--endpoint",
            "unix:///tmp/x.sock",
            "--nodeid",
            "n1",
        ];
        all.extend_from_slice(args);
        Args::try_parse_from(all)
            .map_err(|e| e.to_string())?
            .into_config()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_documented_command_line_parses() {
        let c = parse(&[
            "--drivername",
            "hostpath.csi.k8s.io",
            "--topology",
            "--topology-key",
            "example.com/node",
            "--state-file",
            "/tmp/state.json",
            "--control",
            "unix:///tmp/ctl.sock",
            "--disable-capability",
            "CLONE_VOLUME",
            "--no-publish",
            "--capacity-total",
            "100Gi",
            "--max-volume-size",
            "10Gi",
            "--require-secret",
            "user=admin",
            "--fail",
            "CreateVolume=UNAVAILABLE:2",
            "--latency",
            "DeleteVolume=250ms",
            "--crash-after-create",
            "3",
            "--probe-not-ready-count",
            "2",
        ])
        .unwrap();
        assert_eq!(c.endpoint, std::path::PathBuf::from("/tmp/x.sock"));
        assert_eq!(c.control, Some(std::path::PathBuf::from("/tmp/ctl.sock")));
        assert_eq!(c.driver_name, "hostpath.csi.k8s.io");
        assert!(c.topology);
        assert_eq!(
            c.segment_of("n1")
                .get("example.com/node")
                .map(String::as_str),
            Some("n1")
        );
        assert!(!c.capabilities.contains(&ControllerCap::CloneVolume));
        assert!(
            !c.capabilities
                .contains(&ControllerCap::PublishUnpublishVolume)
        );
        assert!(c.capabilities.contains(&ControllerCap::ListVolumes));
        assert_eq!(
            (c.capacity_total, c.max_volume_size),
            (100 << 30, Some(10 << 30))
        );
        assert_eq!(
            c.required_secrets.get("user").map(String::as_str),
            Some("admin")
        );
        assert_eq!(
            c.faults["CreateVolume"],
            FaultRule::times(tonic::Code::Unavailable, 2)
        );
        assert_eq!(c.latencies["DeleteVolume"], Duration::from_millis(250));
        assert_eq!(c.crash_after_create, Some(3));
        assert_eq!(c.probe_not_ready.count, 2);
    }

    #[test]
    fn get_snapshot_is_opt_in_and_mutable_keys_replace_the_defaults() {
        let c = parse(&[]).unwrap();
        assert!(!c.capabilities.contains(&ControllerCap::GetSnapshot));
        assert!(c.capabilities.contains(&ControllerCap::ModifyVolume));
        assert_eq!(
            c.mutable_parameter_keys.iter().collect::<Vec<_>>(),
            ["iops", "throughput"]
        );
        let c = parse(&[
            "--enable-capability",
            "GET_SNAPSHOT",
            "--mutable-parameter-key",
            "tier",
            "--misbehave",
            "keep-target-path",
        ])
        .unwrap();
        assert!(c.capabilities.contains(&ControllerCap::GetSnapshot));
        assert_eq!(
            c.mutable_parameter_keys.iter().collect::<Vec<_>>(),
            ["tier"]
        );
        assert!(c.misbehaviours.contains(&Misbehaviour::KeepTargetPath));
    }

    #[test]
    fn invalid_values_are_rejected_with_what_to_use() {
        let err = parse(&["--drivername", "bad_name"]).unwrap_err();
        assert!(err.contains("invalid driver name"), "{err}");
        let err = parse(&["--disable-capability", "CLONE"]).unwrap_err();
        assert!(err.contains("CLONE_VOLUME"), "{err}");
        let err = parse(&["--fail", "CreateVolume=BROKEN"]).unwrap_err();
        assert!(err.contains("UNAVAILABLE"), "{err}");
    }
}
