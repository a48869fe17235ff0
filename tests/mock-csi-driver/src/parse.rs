//! Parsers of flag and control-socket values: gRPC codes, fault specs, latencies, durations, byte
//! quantities, KEY=VALUE pairs, driver names and endpoints.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{ConfigError, FaultRule, Trigger, canonical_method};

/// Canonical gRPC code names, indexed by code number.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// Parses a non-OK gRPC code from `UNAVAILABLE`, `Unavailable`, `unavailable` or `14`.
pub fn parse_code(s: &str) -> Result<tonic::Code, ConfigError> {
    let s = s.trim();
    let number = match s.parse::<i32>() {
        Ok(n) => n,
        Err(_) => {
            let wanted: String = s.chars().filter(|c| *c != '_' && *c != '-').collect();
            let found = CODE_NAMES
                .iter()
                .position(|n| n.replace('_', "").eq_ignore_ascii_case(&wanted))
                // "CANCELED" is Go's spelling.
                .or_else(|| wanted.eq_ignore_ascii_case("canceled").then_some(1));
            found.and_then(|i| i32::try_from(i).ok()).unwrap_or(-1)
        }
    };
    if (1..=16).contains(&number) {
        Ok(tonic::Code::from_i32(number))
    } else {
        Err(ConfigError::UnknownCode(s.to_owned()))
    }
}

/// The canonical name of a gRPC code, e.g. `RESOURCE_EXHAUSTED`.
pub fn code_name(code: tonic::Code) -> &'static str {
    usize::try_from(code as i32)
        .ok()
        .and_then(|i| CODE_NAMES.get(i))
        .copied()
        .unwrap_or("UNKNOWN")
}

/// Parses `METHOD=CODE[:COUNT|:RATE][:after]`; a trigger with `.` or `%` is a rate.
pub fn parse_fault(s: &str) -> Result<(&'static str, FaultRule), ConfigError> {
    let bad = || ConfigError::Fault(s.to_owned());
    let (method, rest) = s.split_once('=').ok_or_else(bad)?;
    let method = canonical_method(method.trim())?;
    let mut parts = rest.split(':');
    let code = parse_code(parts.next().ok_or_else(bad)?)?;
    let mut rule = FaultRule::always(code);
    for part in parts {
        let part = part.trim();
        if part.eq_ignore_ascii_case("after") {
            rule.after = true;
        } else if let Some(percent) = part.strip_suffix('%') {
            let p: f64 = percent.parse().map_err(|_| bad())?;
            rule.trigger = Trigger::Rate { rate: p / 100.0 };
        } else if part.contains('.') {
            rule.trigger = Trigger::Rate {
                rate: part.parse().map_err(|_| bad())?,
            };
        } else {
            rule.trigger = Trigger::Count {
                remaining: part.parse().map_err(|_| bad())?,
            };
        }
    }
    if let Trigger::Rate { rate } = rule.trigger
        && !(0.0..=1.0).contains(&rate)
    {
        return Err(bad());
    }
    Ok((method, rule))
}

/// Parses `METHOD=DURATION`.
pub fn parse_latency(s: &str) -> Result<(&'static str, Duration), ConfigError> {
    let (method, d) = s.split_once('=').ok_or_else(|| ConfigError::Pair {
        what: "latency",
        value: s.to_owned(),
        expected: "METHOD=DURATION, e.g. CreateVolume=2s",
    })?;
    Ok((canonical_method(method.trim())?, parse_duration(d)?))
}

/// Parses `KEY=VALUE` (secrets, parameters).
pub fn parse_key_value(what: &'static str, s: &str) -> Result<(String, String), ConfigError> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(ConfigError::Pair {
            what,
            value: redact_value(s),
            expected: "KEY=VALUE",
        }),
    }
}

/// Keeps only the key of a `KEY=VALUE` string, so a malformed secret flag never echoes its value.
fn redact_value(s: &str) -> String {
    match s.split_once('=') {
        Some((k, _)) => format!("{k}=<redacted>"),
        None => "<redacted>".to_owned(),
    }
}

/// Parses a Go-style duration: `1h2m3s`, `500ms`, `1.5s`, `250us`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::Duration(s.to_owned());
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_len == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Parses a byte count: `1073741824`, `10Gi`, `500Mi`, `1G`, `100k`.
pub fn parse_quantity(s: &str) -> Result<i64, ConfigError> {
    let bad = || ConfigError::Quantity(s.to_owned());
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: i64 = num.parse().map_err(|_| bad())?;
    let mult: i64 = match suffix {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// CSI rule for plugin names (GetPluginInfo): domain-name-like, 63 characters or less.
pub fn valid_driver_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= 63
        && first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.')
}

/// Strips `unix://` (and `unix:`) from an endpoint, as the CSI sidecars accept both forms.
pub fn socket_path(endpoint: &str) -> PathBuf {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    PathBuf::from(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_count_rate_and_after() {
        assert_eq!(
            parse_fault("CreateVolume=UNAVAILABLE:3").unwrap(),
            (
                "CreateVolume",
                FaultRule::times(tonic::Code::Unavailable, 3)
            )
        );
        assert_eq!(
            parse_fault("deletevolume=internal:0.25").unwrap(),
            ("DeleteVolume", FaultRule::rate(tonic::Code::Internal, 0.25))
        );
        assert_eq!(
            parse_fault("CreateVolume=4:50%:after").unwrap(),
            (
                "CreateVolume",
                FaultRule::rate(tonic::Code::DeadlineExceeded, 0.5).after_effect()
            )
        );
        assert_eq!(
            parse_fault("Probe=FAILED_PRECONDITION").unwrap(),
            ("Probe", FaultRule::always(tonic::Code::FailedPrecondition))
        );
    }

    #[test]
    fn bad_faults_are_rejected_with_the_reason() {
        assert!(matches!(
            parse_fault("CreateVolum=INTERNAL"),
            Err(ConfigError::UnknownMethod(_))
        ));
        assert!(matches!(
            parse_fault("CreateVolume=NOPE"),
            Err(ConfigError::UnknownCode(_))
        ));
        assert!(matches!(
            parse_fault("CreateVolume=OK"),
            Err(ConfigError::UnknownCode(_))
        ));
        assert!(matches!(
            parse_fault("CreateVolume=INTERNAL:1.5"),
            Err(ConfigError::Fault(_))
        ));
        assert!(matches!(
            parse_fault("CreateVolume"),
            Err(ConfigError::Fault(_))
        ));
    }

    #[test]
    fn codes_parse_in_every_common_spelling() {
        assert_eq!(
            parse_code("RESOURCE_EXHAUSTED").unwrap(),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(
            parse_code("ResourceExhausted").unwrap(),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(parse_code("8").unwrap(), tonic::Code::ResourceExhausted);
        assert_eq!(parse_code("Canceled").unwrap(), tonic::Code::Cancelled);
        assert_eq!(code_name(tonic::Code::Unauthenticated), "UNAUTHENTICATED");
    }

    #[test]
    fn durations_follow_go_syntax() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1x").is_err());
    }

    #[test]
    fn quantities_accept_binary_and_decimal_suffixes() {
        assert_eq!(parse_quantity("10Gi").unwrap(), 10 << 30);
        assert_eq!(parse_quantity("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_quantity("4096").unwrap(), 4096);
        assert!(parse_quantity("10GB").is_err());
        assert!(parse_quantity("99999999999Pi").is_err());
    }

    #[test]
    fn a_malformed_secret_flag_never_echoes_its_value() {
        let err = parse_key_value("secret", "password")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("password"), "{err}");
        let err = parse_key_value("secret", "=hunter2")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn driver_names_follow_the_csi_rule() {
        assert!(valid_driver_name("io.kubernetes.storage.mock"));
        assert!(valid_driver_name("a"));
        assert!(!valid_driver_name(""));
        assert!(!valid_driver_name("-mock"));
        assert!(!valid_driver_name("mock_driver"));
        assert!(!valid_driver_name(&"a".repeat(64)));
    }

    #[test]
    fn endpoints_accept_unix_urls_and_bare_paths() {
        assert_eq!(
            socket_path("unix:///tmp/csi.sock"),
            PathBuf::from("/tmp/csi.sock")
        );
        assert_eq!(socket_path("/tmp/csi.sock"), PathBuf::from("/tmp/csi.sock"));
    }
}
