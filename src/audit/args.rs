//! `csi-provisioner audit`'s command line: the audit's own flags, mixed freely with every sidecar
//! flag (the same connection flags: the Deployment's container args can be reused as they are).

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;

use crate::gofmt::parse_go_duration;

/// The subcommand's name, argv[1].
pub const SUBCOMMAND: &str = "audit";

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns, one section per finding kind.
    Table,
    /// One JSON document.
    Json,
    /// One YAML document.
    Yaml,
}

/// The audit's own flags.
#[derive(Debug, Clone, PartialEq, Parser)]
#[command(
    name = "csi-provisioner audit",
    no_binary_name = true,
    about = "Compare the PVs in the API server with the driver's volumes and report leaked and lost volumes, stuck PVs, missing finalizers, unresolved intents and unused claims. Every sidecar flag is accepted too (--csi-address, --kubeconfig, --timeout, --node-deployment, --leader-election-namespace, ...).",
    max_term_width = 110
)]
pub struct AuditArgs {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,

    /// Volumes and PVs are reported only when wrong in two observations this far apart (a volume
    /// whose PV is being created is never called leaked). 0s: one observation.
    #[arg(long, default_value = "2m0s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub min_age: Duration,

    /// PVs Released (reclaim Delete) or Terminating for longer than this are listed as stuck.
    #[arg(long, default_value = "10m0s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub stuck_after: Duration,

    /// List claims unused for longer than this (`--track-unused-claims` annotation, or the
    /// Kubernetes `Unused` condition).
    #[arg(long, default_value = "168h0m0s", value_name = "DURATION", value_parser = parse_go_duration)]
    pub unused_for: Duration,

    /// Call DeleteVolume for every leaked volume: a dry run that only lists them unless
    /// --confirm is given too.
    #[arg(long)]
    pub delete_orphans: bool,

    /// Really delete with --delete-orphans.
    #[arg(long)]
    pub confirm: bool,
}

/// The audit flags that take a value.
const VALUED: [&str; 5] = ["o", "output", "min-age", "unused-for", "stuck-after"];
/// The audit's boolean flags.
const SWITCHES: [&str; 4] = ["delete-orphans", "confirm", "h", "help"];

/// Splits the arguments after `audit` into the audit's (`--name=value` form) and the sidecar's.
/// Go-style single dashes are accepted for both, as the sidecar's own flags.
pub fn split(argv: impl IntoIterator<Item = OsString>) -> (Vec<OsString>, Vec<OsString>) {
    let mut audit = Vec::new();
    let mut sidecar = Vec::new();
    let mut args = argv.into_iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        let bare = text.strip_prefix("--").or_else(|| text.strip_prefix('-'));
        let Some(bare) = bare.filter(|b| !b.is_empty()) else {
            sidecar.push(arg);
            continue;
        };
        let (name, value) = match bare.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (bare, None),
        };
        let dashes = if name.len() == 1 { "-" } else { "--" };
        if VALUED.contains(&name) {
            let value = value.or_else(|| args.next().map(|v| v.to_string_lossy().into_owned()));
            audit.push(OsString::from(format!("{dashes}{name}")));
            audit.push(OsString::from(value.unwrap_or_default()));
        } else if SWITCHES.contains(&name) && value.as_deref().is_none_or(|v| v == "true") {
            audit.push(OsString::from(format!("{dashes}{name}")));
        } else if SWITCHES.contains(&name) {
            // `--confirm=false`: the flag is off, as in Go.
        } else {
            sidecar.push(arg);
        }
    }
    (audit, sidecar)
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
