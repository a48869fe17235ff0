//! The checks that turn flags into a valid [`super::Config`]: positive and ordered durations, the
//! client rate limit, listen addresses, leader-election timings, and the flags not built yet.

use std::time::Duration;

use super::{ConfigError, LoggingOptions, RateLimit};
use crate::gofmt::format_go_duration as go;
use crate::telemetry::LogFormat;
use crate::telemetry::vmodule::VModuleList;

pub(super) fn positive(duration: Duration, flag: &'static str) -> Result<(), ConfigError> {
    if duration.is_zero() {
        Err(ConfigError::ZeroDuration(flag))
    } else {
        Ok(())
    }
}

pub(super) fn ordered(
    (start_flag, start): (&'static str, Duration),
    (max_flag, max): (&'static str, Duration),
) -> Result<(), ConfigError> {
    if start <= max {
        return Ok(());
    }
    Err(ConfigError::BackoffOrder {
        start_flag,
        start: go(start),
        max_flag,
        max: go(max),
    })
}

/// client-go's defaulting: 0 means the default (5 QPS, burst 10); a negative QPS disables the
/// limiter.
pub(super) fn rate_limit(qps: f64, burst: i64) -> Result<Option<RateLimit>, ConfigError> {
    if !qps.is_finite() {
        return Err(ConfigError::InvalidRateLimit(format!(
            "--kube-api-qps={qps} must be a finite number"
        )));
    }
    if qps < 0.0 {
        return Ok(None);
    }
    let burst = match burst {
        0 => 10,
        1..=0xFFFF_FFFF => burst as u32,
        _ => {
            return Err(ConfigError::InvalidRateLimit(format!(
                "--kube-api-burst={burst} is out of range: it must be at least 1 (0 means the default, 10)"
            )));
        }
    };
    Ok(Some(RateLimit {
        qps: if qps == 0.0 { 5.0 } else { qps },
        burst,
    }))
}

/// The logging flags, checked as component-base's `ValidateAndApply` does; the split-stream flag
/// of the chosen format applies.
pub(super) fn logging_options(
    verbosity: u32,
    format: LogFormat,
    vmodule: Vec<VModuleList>,
    (text_split_stream, json_split_stream): (bool, bool),
) -> Result<LoggingOptions, ConfigError> {
    let vmodule: Vec<_> = vmodule.into_iter().flat_map(|list| list.0).collect();
    if !vmodule.is_empty() && format != LogFormat::Text {
        return Err(ConfigError::VModuleNeedsText);
    }
    Ok(LoggingOptions {
        verbosity,
        format,
        // Level 0 items are dropped by klog, so a later pattern can still match those files.
        vmodule: vmodule.into_iter().filter(|item| item.level > 0).collect(),
        split_stream: match format {
            LogFormat::Text => text_split_stream,
            LogFormat::Json => json_split_stream,
        },
    })
}

/// Accepts what Go's `net.Listen("tcp", addr)` accepts: `host:port`, `[v6]:port` or `:port`.
pub(super) fn validate_listen_address(
    address: &str,
    flag: &'static str,
) -> Result<(), ConfigError> {
    let invalid = || ConfigError::InvalidHttpAddress {
        flag,
        address: address.to_owned(),
    };
    let (host, port) = address.rsplit_once(':').ok_or_else(invalid)?;
    port.parse::<u16>().map_err(|_| invalid())?;
    let bracketed = host.starts_with('[') && host.ends_with(']');
    if host.contains(':') && !bracketed || host.contains(char::is_whitespace) {
        return Err(invalid());
    }
    Ok(())
}

/// The checks client-go's `NewLeaderElector` makes (JitterFactor 1.2), done before anything starts.
pub(super) fn validate_leader_election(
    lease: Duration,
    renew: Duration,
    retry: Duration,
) -> Result<(), ConfigError> {
    let fail = |why: String| Err(ConfigError::LeaderElectionTimings(why));
    positive(retry, "--leader-election-retry-period")?;
    if lease <= renew {
        return fail(format!(
            "--leader-election-lease-duration ({}) must be longer than --leader-election-renew-deadline ({})",
            go(lease),
            go(renew)
        ));
    }
    if renew.as_secs_f64() <= retry.as_secs_f64() * 1.2 {
        return fail(format!(
            "--leader-election-renew-deadline ({}) must be longer than 1.2 x --leader-election-retry-period ({})",
            go(renew),
            go(retry)
        ));
    }
    Ok(())
}
