//! Logging set-up: text or JSON, `-v` levels mapped to tracing levels.
//!
//! | `-v`  | this program | dependencies (kube, hyper, tonic, ...) |
//! |-------|--------------|----------------------------------------|
//! | 0-3   | info         | info                                   |
//! | 4-5   | debug        | info                                   |
//! | 6-7   | trace        | debug                                  |
//! | 8+    | trace        | trace                                  |
//!
//! Upstream logs CSI requests and responses at klog V(5), so `-v=5` shows them here too (debug).
//! A non-empty `RUST_LOG` replaces the mapping entirely. Logs go to stderr, like klog's.

use std::io::IsTerminal;
use std::str::FromStr;

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// `--logging-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "unsupported logging format {other:?} (use text or json)"
            )),
        }
    }
}

/// A logging set-up that could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `RUST_LOG` does not parse.
    #[error("RUST_LOG={value:?} is not a valid filter ({source}); unset it to use -v")]
    InvalidRustLog {
        /// The variable's value.
        value: String,
        /// Why it does not parse.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was installed already.
    #[error("logging was already initialised")]
    AlreadyInitialised(#[source] tracing::subscriber::SetGlobalDefaultError),
}

/// The crate whose logs `-v` raises first; dependencies follow two levels behind.
const OUR_TARGET: &str = "csi_provisioner";

/// The `EnvFilter` directives for a `-v` level (see the module table).
pub fn filter_directives(verbosity: u32) -> String {
    let (ours, deps) = match verbosity {
        0..=3 => ("info", "info"),
        4..=5 => ("debug", "info"),
        6..=7 => ("trace", "debug"),
        _ => ("trace", "trace"),
    };
    format!("{deps},{OUR_TARGET}={ours}")
}

/// Installs the global subscriber, writing to stderr. `RUST_LOG` (if set and non-empty) overrides
/// the `-v` mapping.
pub fn init(verbosity: u32, format: LogFormat) -> Result<(), TelemetryError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let ansi = std::io::stderr().is_terminal();
    let subscriber = subscriber(
        verbosity,
        format,
        rust_log.as_deref(),
        ansi,
        std::io::stderr,
    )?;
    tracing::subscriber::set_global_default(subscriber).map_err(TelemetryError::AlreadyInitialised)
}

/// Builds the subscriber [`init`] installs, for any writer (tests capture the output).
pub fn subscriber<W>(
    verbosity: u32,
    format: LogFormat,
    rust_log: Option<&str>,
    ansi: bool,
    writer: W,
) -> Result<Box<dyn Subscriber + Send + Sync>, TelemetryError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let directives = match rust_log.filter(|value| !value.trim().is_empty()) {
        Some(value) => value.to_owned(),
        None => filter_directives(verbosity),
    };
    let filter = EnvFilter::builder().parse(&directives).map_err(|source| {
        TelemetryError::InvalidRustLog {
            value: directives.clone(),
            source,
        }
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    Ok(match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(builder.json().flatten_event(true).finish()),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer that keeps everything written, for assertions.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// Logs one event per level from our crate and one debug event from a dependency's target.
    fn log_with(verbosity: u32, format: LogFormat, rust_log: Option<&str>) -> String {
        let out = Captured::default();
        let subscriber = subscriber(verbosity, format, rust_log, false, out.clone()).unwrap();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(pvc = "default/claim", "info-line");
            tracing::debug!("debug-line");
            tracing::trace!("trace-line");
            tracing::debug!(target: "hyper::client", "dependency-debug-line");
        });
        out.text()
    }

    #[test]
    fn verbosity_maps_to_levels() {
        let cases = [
            (
                0,
                ["info-line"].as_slice(),
                ["debug-line", "trace-line", "dependency-debug-line"].as_slice(),
            ),
            (3, &["info-line"], &["debug-line"]),
            (
                4,
                &["info-line", "debug-line"],
                &["trace-line", "dependency-debug-line"],
            ),
            (5, &["debug-line"], &["trace-line", "dependency-debug-line"]),
            (6, &["trace-line", "dependency-debug-line"], &[]),
            (9, &["trace-line", "dependency-debug-line"], &[]),
        ];
        for (verbosity, shown, hidden) in cases {
            let out = log_with(verbosity, LogFormat::Text, None);
            for line in shown {
                assert!(
                    out.contains(line),
                    "-v={verbosity} should show {line}:\n{out}"
                );
            }
            for line in hidden {
                assert!(
                    !out.contains(line),
                    "-v={verbosity} should hide {line}:\n{out}"
                );
            }
        }
    }

    #[test]
    fn rust_log_overrides_the_verbosity() {
        let out = log_with(0, LogFormat::Text, Some("csi_provisioner=trace"));
        assert!(out.contains("trace-line"), "{out}");
        let out = log_with(9, LogFormat::Text, Some("warn"));
        assert!(!out.contains("info-line"), "{out}");
        // An empty RUST_LOG is ignored.
        assert!(log_with(4, LogFormat::Text, Some("")).contains("debug-line"));
    }

    #[test]
    fn invalid_rust_log_is_reported() {
        let err = subscriber(
            0,
            LogFormat::Text,
            Some("csi_provisioner=loud"),
            false,
            Captured::default(),
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("RUST_LOG"), "{err}");
    }

    #[test]
    fn json_format_writes_one_object_per_line() {
        let out = log_with(0, LogFormat::Json, None);
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 1, "{out}");
        assert_eq!(lines[0]["level"], "INFO");
        assert_eq!(lines[0]["message"], "info-line");
        assert_eq!(lines[0]["pvc"], "default/claim");
    }

    #[test]
    fn text_format_is_plain_text() {
        let out = log_with(0, LogFormat::Text, None);
        assert!(
            out.contains("INFO")
                && out.contains("info-line")
                && out.contains("pvc=\"default/claim\""),
            "{out}"
        );
        assert!(serde_json::from_str::<serde_json::Value>(out.trim()).is_err());
    }

    #[test]
    fn log_format_parses_the_upstream_names() {
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert!(
            "JSON"
                .parse::<LogFormat>()
                .unwrap_err()
                .contains("use text or json")
        );
    }
}
