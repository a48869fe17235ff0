//! Logging set-up: text or JSON, `-v` levels mapped to tracing levels, `--vmodule`, split streams.
//!
//! | `-v`  | this program | dependencies (kube, hyper, tonic, ...) |
//! |-------|--------------|----------------------------------------|
//! | 0-3   | info         | info                                   |
//! | 4-5   | debug        | info                                   |
//! | 6-7   | trace        | debug                                  |
//! | 8+    | trace        | trace                                  |
//!
//! Upstream logs CSI requests and responses at klog V(5), so `-v=5` shows them here too (debug).
//! `--vmodule` raises the level of the call sites in matching files (see [`vmodule`]): a call
//! site logs if `-v` or its `--vmodule` level reaches the level its tracing level maps to.
//! A non-empty `RUST_LOG` replaces the mapping entirely, `--vmodule` included.
//!
//! Logs go to stderr, like klog's. With split streams, info (and debug, trace) lines go to stdout
//! and the rest to stderr: warnings and errors in text format, errors in JSON (klog's JSON logger
//! has no warning level; its warnings are info messages).

use std::io::IsTerminal;
use std::str::FromStr;

use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::Registry;
use tracing_subscriber::filter::{LevelFilter, filter_fn};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
use tracing_subscriber::layer::{Filter, SubscriberExt};

pub mod vmodule;

use vmodule::VModuleItem;

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

/// What the logging flags ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoggingOptions {
    /// `-v`.
    pub verbosity: u32,
    /// `--logging-format`.
    pub format: LogFormat,
    /// Every `--vmodule` item in command-line order, without those of level 0 (klog drops them).
    pub vmodule: Vec<VModuleItem>,
    /// `--log-text-split-stream` or `--log-json-split-stream`, whichever matches the format.
    pub split_stream: bool,
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

/// The most verbose tracing level shown at `verbosity` (see the module table).
fn max_level(verbosity: u32, ours: bool) -> Level {
    match (ours, verbosity) {
        (true, 0..=3) | (false, 0..=5) => Level::INFO,
        (true, 4..=5) | (false, 6..=7) => Level::DEBUG,
        _ => Level::TRACE,
    }
}

fn is_ours(target: &str) -> bool {
    target
        .strip_prefix(OUR_TARGET)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
}

/// `-v` and `--vmodule` as a per-call-site filter; tracing caches its answer per call site, so
/// the patterns are matched once per call site, as klog caches per PC.
fn verbosity_filter<S>(verbosity: u32, vmodule: Vec<VModuleItem>) -> impl Filter<S> + Send + Sync
where
    S: Subscriber,
{
    // Our crate is never behind its dependencies, so this bounds every call site; tracing's
    // macros skip levels above it without asking the filter.
    let most = vmodule
        .iter()
        .map(|item| item.level)
        .fold(verbosity, u32::max);
    let hint = LevelFilter::from_level(max_level(most, true));
    filter_fn(move |metadata: &Metadata<'_>| {
        let level = if vmodule.is_empty() {
            verbosity
        } else {
            vmodule::level_for(&vmodule, metadata.file(), metadata.module_path())
                .map_or(verbosity, |level| level.max(verbosity))
        };
        *metadata.level() <= max_level(level, is_ours(metadata.target()))
    })
    .with_max_level_hint(hint)
}

/// Installs the global subscriber, writing to stderr (and stdout with split streams).
/// `RUST_LOG` (if set and non-empty) overrides `-v` and `--vmodule`.
pub fn init(options: &LoggingOptions) -> Result<(), TelemetryError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let ansi = std::io::stderr().is_terminal()
        && (!options.split_stream || std::io::stdout().is_terminal());
    let subscriber = subscriber(
        options,
        rust_log.as_deref(),
        ansi,
        std::io::stdout,
        std::io::stderr,
    )?;
    tracing::subscriber::set_global_default(subscriber).map_err(TelemetryError::AlreadyInitialised)
}

/// Builds the subscriber [`init`] installs, for any writers (tests capture the output). `stdout`
/// is written only with split streams.
pub fn subscriber<O, E>(
    options: &LoggingOptions,
    rust_log: Option<&str>,
    ansi: bool,
    stdout: O,
    stderr: E,
) -> Result<Box<dyn Subscriber + Send + Sync>, TelemetryError>
where
    O: for<'w> MakeWriter<'w> + Send + Sync + 'static,
    E: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let writer = match (options.split_stream, options.format) {
        (false, _) => BoxMakeWriter::new(stderr),
        (true, LogFormat::Text) => {
            BoxMakeWriter::new(stderr.with_max_level(Level::WARN).or_else(stdout))
        }
        (true, LogFormat::Json) => {
            BoxMakeWriter::new(stderr.with_max_level(Level::ERROR).or_else(stdout))
        }
    };
    let filter: Box<dyn Filter<Registry> + Send + Sync> =
        match rust_log.filter(|value| !value.trim().is_empty()) {
            Some(value) => Box::new(EnvFilter::builder().parse(value).map_err(|source| {
                TelemetryError::InvalidRustLog {
                    value: value.to_owned(),
                    source,
                }
            })?),
            None => Box::new(verbosity_filter(options.verbosity, options.vmodule.clone())),
        };
    let registry = tracing_subscriber::registry();
    Ok(match options.format {
        LogFormat::Text => Box::new(
            registry.with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(writer)
                    .with_filter(filter),
            ),
        ),
        LogFormat::Json => Box::new(
            registry.with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(writer)
                    .with_filter(filter),
            ),
        ),
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

    fn options(verbosity: u32, format: LogFormat) -> LoggingOptions {
        LoggingOptions {
            verbosity,
            format,
            ..LoggingOptions::default()
        }
    }

    /// Logs with `options`: (stdout, stderr).
    fn log_split(
        options: &LoggingOptions,
        rust_log: Option<&str>,
        log: impl FnOnce(),
    ) -> (String, String) {
        let (out, err) = (Captured::default(), Captured::default());
        let subscriber = subscriber(options, rust_log, false, out.clone(), err.clone()).unwrap();
        tracing::subscriber::with_default(subscriber, log);
        (out.text(), err.text())
    }

    /// Logs one event per level from our crate and one debug event from a dependency's target;
    /// returns stderr (stdout must stay empty without split streams).
    fn log_with(verbosity: u32, format: LogFormat, rust_log: Option<&str>) -> String {
        let (out, err) = log_split(&options(verbosity, format), rust_log, || {
            tracing::info!(pvc = "default/claim", "info-line");
            tracing::debug!("debug-line");
            tracing::trace!("trace-line");
            tracing::debug!(target: "hyper::client", "dependency-debug-line");
        });
        assert_eq!(out, "", "everything goes to stderr by default");
        err
    }

    /// A second module, for `--vmodule` to tell apart from this one.
    mod other_module {
        pub(super) fn log() {
            tracing::debug!("other-debug-line");
            tracing::trace!("other-trace-line");
        }
    }

    fn log_two_modules(verbosity: u32, vmodule: &str) -> String {
        let options = LoggingOptions {
            vmodule: vmodule::parse_vmodule(vmodule).unwrap().0,
            ..options(verbosity, LogFormat::Text)
        };
        log_split(&options, None, || {
            tracing::debug!("this-debug-line");
            other_module::log();
        })
        .1
    }

    #[test]
    fn vmodule_raises_the_verbosity_of_matching_modules_only() {
        let out = log_two_modules(0, "other_module=4");
        assert!(out.contains("other-debug-line"), "{out}");
        assert!(
            !out.contains("other-trace-line") && !out.contains("this-debug-line"),
            "{out}"
        );
        // Globs; the first matching item decides (`*=1` matches the other module too).
        let out = log_two_modules(0, "oth?r_[l-n]odule=6,*=1");
        assert!(
            out.contains("other-trace-line") && !out.contains("this-debug-line"),
            "{out}"
        );
        // The file name (telemetry.rs) covers every module in the file.
        let out = log_two_modules(0, "telemetry=4");
        assert!(
            out.contains("this-debug-line") && out.contains("other-debug-line"),
            "{out}"
        );
        // vmodule never lowers -v.
        let out = log_two_modules(4, "other_module=1");
        assert!(
            out.contains("other-debug-line") && out.contains("this-debug-line"),
            "{out}"
        );
        let out = log_two_modules(0, "");
        assert!(!out.contains("debug-line"), "{out}");
    }

    #[test]
    fn split_stream_sends_info_to_stdout_and_problems_to_stderr() {
        let log = || {
            tracing::info!("info-line");
            tracing::debug!("debug-line");
            tracing::warn!("warn-line");
            tracing::error!("error-line");
        };
        let text = LoggingOptions {
            split_stream: true,
            ..options(4, LogFormat::Text)
        };
        let (out, err) = log_split(&text, None, log);
        assert!(
            out.contains("info-line") && out.contains("debug-line"),
            "{out}"
        );
        assert!(
            !out.contains("warn-line") && !out.contains("error-line"),
            "{out}"
        );
        assert!(
            err.contains("warn-line") && err.contains("error-line"),
            "{err}"
        );
        assert!(!err.contains("info-line"), "{err}");

        // JSON: only errors are "problems", as in component-base's JSON logger.
        let json = LoggingOptions {
            split_stream: true,
            ..options(0, LogFormat::Json)
        };
        let (out, err) = log_split(&json, None, log);
        assert!(
            out.contains("info-line") && out.contains("warn-line"),
            "{out}"
        );
        assert!(
            err.contains("error-line") && !err.contains("warn-line"),
            "{err}"
        );
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
            &LoggingOptions::default(),
            Some("csi_provisioner=loud"),
            false,
            Captured::default(),
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
