//! Command-line flags of the `csi-sanity` binary and their conversion to [`Options`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::options::{self, Options, OptionsError, Pattern, Secrets};

/// Checks a CSI driver's Identity and Controller services (and the Node rules a conformance
/// run expects) against the CSI spec rules the external-provisioner relies on. Prints one line per check (PASS/FAIL/SKIP),
/// then "N passed, N failed, N skipped"; exits 1 when a check failed, 2 when it could not run.
#[derive(Debug, Parser)]
#[command(name = "csi-sanity", version)]
pub struct Args {
    /// The driver's CSI socket: a path or unix:///path.
    #[arg(long, env = "CSI_ADDRESS", required_unless_present = "list")]
    pub csi_address: Option<String>,

    /// Run only checks whose name matches (regex, or substring when not a valid regex).
    /// Repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub focus: Vec<String>,

    /// Do not run checks whose name matches (regex or substring). Repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub skip: Vec<String>,

    /// Secrets to send, as upstream csi-sanity's YAML or JSON file: sections like
    /// CreateVolumeSecret, DeleteVolumeSecret, CreateSnapshotSecret mapping keys to values.
    #[arg(long, value_name = "FILE")]
    pub secrets_file: Option<PathBuf>,

    /// required_bytes of test volumes: bytes or a quantity like 1Gi, 500Mi, 2G.
    #[arg(long, value_name = "SIZE", default_value = "10Gi", value_parser = parse_quantity)]
    pub test_volume_size: i64,

    /// A CreateVolume parameter for test volumes, KEY=VALUE. Repeatable.
    #[arg(long = "test-volume-parameter", value_name = "KEY=VALUE", value_parser = parse_volume_parameter)]
    pub test_volume_parameters: Vec<(String, String)>,

    /// A mutable parameter for the ControllerModifyVolume checks, KEY=VALUE (they are skipped
    /// without one). Repeatable.
    #[arg(long = "test-volume-mutable-parameter", value_name = "KEY=VALUE", value_parser = parse_mutable_parameter)]
    pub test_volume_mutable_parameters: Vec<(String, String)>,

    /// A CreateSnapshot parameter for test snapshots, KEY=VALUE. Repeatable.
    #[arg(long = "test-snapshot-parameter", value_name = "KEY=VALUE", value_parser = parse_snapshot_parameter)]
    pub test_snapshot_parameters: Vec<(String, String)>,

    /// Deadline of each CSI call, of connecting, and of waiting for Probe readiness.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Directory in which the node checks create a fresh directory per check, holding the
    /// target and staging paths they hand to the driver (which must see the same filesystem).
    /// Default: the system's temporary directory.
    #[arg(long, value_name = "DIR")]
    pub mount_dir: Option<PathBuf>,

    /// List the checks (name and what it verifies) and exit.
    #[arg(long)]
    pub list: bool,
}

fn parse_duration(s: &str) -> Result<Duration, OptionsError> {
    options::parse_duration(s)
}

fn parse_quantity(s: &str) -> Result<i64, OptionsError> {
    options::parse_quantity(s)
}

fn parse_volume_parameter(s: &str) -> Result<(String, String), OptionsError> {
    options::parse_pair("--test-volume-parameter", s)
}

fn parse_mutable_parameter(s: &str) -> Result<(String, String), OptionsError> {
    options::parse_pair("--test-volume-mutable-parameter", s)
}

fn parse_snapshot_parameter(s: &str) -> Result<(String, String), OptionsError> {
    options::parse_pair("--test-snapshot-parameter", s)
}

impl Args {
    /// The run options (the secrets file is read here).
    pub fn into_options(self) -> Result<Options, OptionsError> {
        let Args {
            csi_address,
            focus,
            skip,
            secrets_file,
            test_volume_size,
            test_volume_parameters,
            test_volume_mutable_parameters,
            test_snapshot_parameters,
            timeout,
            mount_dir,
            list: _,
        } = self;
        let address = csi_address.unwrap_or_default();
        let address = address
            .strip_prefix("unix://")
            .unwrap_or(&address)
            .to_owned();
        let mut opts = Options::new(address);
        opts.focus = focus.iter().map(|p| Pattern::new(p)).collect();
        opts.skip = skip.iter().map(|p| Pattern::new(p)).collect();
        opts.secrets = match secrets_file {
            Some(path) => Secrets::load(&path)?,
            None => Secrets::default(),
        };
        opts.test_volume_size = test_volume_size;
        opts.test_volume_parameters = test_volume_parameters.into_iter().collect();
        opts.test_volume_mutable_parameters = test_volume_mutable_parameters.into_iter().collect();
        opts.test_snapshot_parameters = test_snapshot_parameters.into_iter().collect();
        opts.timeout = timeout;
        opts.mount_dir = mount_dir;
        Ok(opts)
    }
}
