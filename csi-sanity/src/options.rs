//! Run options: the typed form of the command line (address, check filters, secrets, test volume
//! size and parameters, per-call timeout), with the secrets-file and duration parsers.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Upstream csi-sanity's default test volume size: 10 GiB.
pub const DEFAULT_TEST_VOLUME_SIZE: i64 = 10 << 30;
/// Default per-call deadline.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why options could not be built.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("cannot read secrets file {path}: {source}")]
    ReadSecrets {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "secrets file {path} is not a YAML/JSON map of secret maps like upstream csi-sanity's (CreateVolumeSecret: {{key: value}}): {reason}"
    )]
    ParseSecrets { path: PathBuf, reason: String },
    #[error("secrets file {path} has unknown section {section:?}; known sections: {known}", known = SECRET_SECTIONS.join(", "))]
    UnknownSecretSection { path: PathBuf, section: String },
    #[error("invalid duration {0:?}; use Go syntax like 30s, 1m, 500ms")]
    Duration(String),
    #[error("invalid size {0:?}; use bytes or a quantity like 10Gi, 500Mi, 1G")]
    Quantity(String),
    #[error("invalid {what} {value:?}; use KEY=VALUE")]
    Pair { what: &'static str, value: String },
}

/// Sections of an upstream csi-sanity secrets file.
pub const SECRET_SECTIONS: &[&str] = &[
    "CreateVolumeSecret",
    "DeleteVolumeSecret",
    "ControllerPublishVolumeSecret",
    "ControllerUnpublishVolumeSecret",
    "ControllerValidateVolumeCapabilitiesSecret",
    "NodeStageVolumeSecret",
    "NodePublishVolumeSecret",
    "CreateSnapshotSecret",
    "DeleteSnapshotSecret",
    "ListSnapshotsSecret",
    "ControllerExpandVolumeSecret",
    "NodeExpandVolumeSecret",
    "ControllerModifyVolumeSecret",
];

/// Secrets passed to each RPC, by upstream csi-sanity section name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets(BTreeMap<String, HashMap<String, String>>);

impl Secrets {
    /// Reads an upstream-style secrets file (YAML or JSON).
    pub fn load(path: &Path) -> Result<Secrets, OptionsError> {
        let text = std::fs::read_to_string(path).map_err(|source| OptionsError::ReadSecrets {
            path: path.to_owned(),
            source,
        })?;
        Secrets::parse(path, &text)
    }

    /// Parses secrets-file text; `path` only names the file in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Secrets, OptionsError> {
        #[derive(Deserialize)]
        #[serde(transparent)]
        struct File(BTreeMap<String, HashMap<String, String>>);
        // JSON is YAML, so one parser reads both. Errors are reduced to their kind so a secret
        // value quoted in a parser message never reaches the terminal.
        let file: File = serde_saphyr::from_str(text).map_err(|e| OptionsError::ParseSecrets {
            path: path.to_owned(),
            reason: redact_parse_error(&e.to_string()),
        })?;
        if let Some(section) = file
            .0
            .keys()
            .find(|k| !SECRET_SECTIONS.contains(&k.as_str()))
        {
            return Err(OptionsError::UnknownSecretSection {
                path: path.to_owned(),
                section: section.clone(),
            });
        }
        Ok(Secrets(file.0))
    }

    /// Secrets of one section (empty when absent).
    pub fn get(&self, section: &str) -> HashMap<String, String> {
        self.0.get(section).cloned().unwrap_or_default()
    }

    /// Whether a section has any secret.
    pub fn has(&self, section: &str) -> bool {
        self.0.get(section).is_some_and(|m| !m.is_empty())
    }

    /// Sets the secrets of one section.
    pub fn set(&mut self, section: &str, secrets: HashMap<String, String>) {
        self.0.insert(section.to_owned(), secrets);
    }
}

/// Keeps the first line of a parser error up to any quoted text (which could be a secret value).
fn redact_parse_error(message: &str) -> String {
    let first = message.lines().next().unwrap_or_default();
    match first.find(['"', '\'', '`']) {
        Some(i) => format!("{}…", &first[..i]),
        None => first.to_owned(),
    }
}

/// A `--focus`/`--skip` pattern: a regular expression, or a plain substring when it is not one.
#[derive(Debug, Clone)]
pub enum Pattern {
    /// A valid regex.
    Regex(regex::Regex),
    /// Anything else, matched literally.
    Substring(String),
}

impl Pattern {
    /// Compiles `s` as a regex, falling back to a literal substring.
    pub fn new(s: &str) -> Pattern {
        regex::Regex::new(s).map_or_else(|_| Pattern::Substring(s.to_owned()), Pattern::Regex)
    }

    /// Whether a check name matches.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Regex(r) => r.is_match(name),
            Pattern::Substring(s) => name.contains(s.as_str()),
        }
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The driver's socket.
    pub address: PathBuf,
    /// Run only checks matching one of these (all when empty).
    pub focus: Vec<Pattern>,
    /// Never run checks matching one of these.
    pub skip: Vec<Pattern>,
    /// Secrets per RPC.
    pub secrets: Secrets,
    /// required_bytes of test volumes.
    pub test_volume_size: i64,
    /// Parameters of test volumes (driver-specific).
    pub test_volume_parameters: HashMap<String, String>,
    /// Mutable parameters for the ControllerModifyVolume checks (they are skipped without).
    pub test_volume_mutable_parameters: HashMap<String, String>,
    /// Parameters of test snapshots.
    pub test_snapshot_parameters: HashMap<String, String>,
    /// Deadline of each call (and of connecting and of waiting for Probe readiness).
    pub timeout: Duration,
    /// Where the node checks make their target and staging paths (one fresh directory per
    /// check inside it); the system's temporary directory when `None`. The driver must see
    /// the same filesystem.
    pub mount_dir: Option<PathBuf>,
}

impl Options {
    /// Defaults for a driver at `address`.
    pub fn new(address: impl Into<PathBuf>) -> Options {
        Options {
            address: address.into(),
            focus: Vec::new(),
            skip: Vec::new(),
            secrets: Secrets::default(),
            test_volume_size: DEFAULT_TEST_VOLUME_SIZE,
            test_volume_parameters: HashMap::new(),
            test_volume_mutable_parameters: HashMap::new(),
            test_snapshot_parameters: HashMap::new(),
            timeout: DEFAULT_TIMEOUT,
            mount_dir: None,
        }
    }

    /// Whether the filters select check `name`.
    pub fn selects(&self, name: &str) -> bool {
        (self.focus.is_empty() || self.focus.iter().any(|p| p.matches(name)))
            && !self.skip.iter().any(|p| p.matches(name))
    }
}

/// Parses a Go-style duration: `10s`, `1m30s`, `500ms`, `1.5s`.
pub fn parse_duration(s: &str) -> Result<Duration, OptionsError> {
    let bad = || OptionsError::Duration(s.to_owned());
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        total += value
            * match &rest[..u] {
                "ns" => 1e-9,
                "us" | "µs" => 1e-6,
                "ms" => 1e-3,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(bad()),
            };
        rest = &rest[u..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Parses a positive byte count: `1073741824`, `10Gi`, `500Mi`, `1G`.
pub fn parse_quantity(s: &str) -> Result<i64, OptionsError> {
    let bad = || OptionsError::Quantity(s.to_owned());
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n: i64 = t[..split].parse().map_err(|_| bad())?;
    let unit: i64 = match &t[split..] {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(bad()),
    };
    n.checked_mul(unit).filter(|b| *b > 0).ok_or_else(bad)
}

/// Parses `KEY=VALUE`.
pub fn parse_pair(what: &'static str, s: &str) -> Result<(String, String), OptionsError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(OptionsError::Pair {
            what,
            value: s.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_style_yaml_and_json_secrets_files_parse() {
        let yaml = "CreateVolumeSecret:\n  username: admin\n  password: \"p@ss\"\nDeleteVolumeSecret:\n  username: admin\n";
        let s = Secrets::parse(Path::new("s.yaml"), yaml).unwrap();
        assert_eq!(
            s.get("CreateVolumeSecret")
                .get("password")
                .map(String::as_str),
            Some("p@ss")
        );
        assert!(s.has("DeleteVolumeSecret") && !s.has("CreateSnapshotSecret"));
        let json = r#"{"CreateVolumeSecret": {"username": "admin"}}"#;
        let s = Secrets::parse(Path::new("s.json"), json).unwrap();
        assert_eq!(
            s.get("CreateVolumeSecret")
                .get("username")
                .map(String::as_str),
            Some("admin")
        );
    }

    #[test]
    fn a_misspelled_secrets_section_is_an_error_naming_the_valid_ones() {
        let err = Secrets::parse(Path::new("s.yaml"), "CreateVolumeSecrets:\n  a: b\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("CreateVolumeSecrets") && err.contains("DeleteVolumeSecret"),
            "{err}"
        );
    }

    #[test]
    fn a_malformed_secrets_file_error_does_not_quote_its_content() {
        let err = Secrets::parse(Path::new("s.yaml"), "CreateVolumeSecret: [\"hunter2\", {\n")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn focus_and_skip_accept_regexes_and_plain_substrings() {
        let mut o = Options::new("/x.sock");
        o.focus = vec![
            Pattern::new("^controller/create-volume"),
            Pattern::new("snapshot["),
        ];
        o.skip = vec![Pattern::new("idempotent")];
        assert!(o.selects("controller/create-volume/basic"));
        assert!(!o.selects("controller/create-volume/idempotent"));
        assert!(o.selects("x/snapshot[1]"));
        assert!(!o.selects("identity/probe"));
    }

    #[test]
    fn sizes_accept_bytes_and_quantities() {
        assert_eq!(parse_quantity("10Gi").unwrap(), 10 << 30);
        assert_eq!(parse_quantity("1073741824").unwrap(), 1 << 30);
        assert!(parse_quantity("0").is_err() && parse_quantity("1GB").is_err());
    }

    #[test]
    fn durations_follow_go_syntax() {
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("10").is_err());
    }
}
