//! `--enable-pprof`: Go's `/debug/pprof/` endpoints that a Rust process can serve, on the HTTP
//! server's listener.
//!
//! - `/debug/pprof/`: an index of what is served.
//! - `/debug/pprof/profile?seconds=N`: a CPU profile (default 30 s, as Go), gzip-compressed
//!   `profile.proto`, which `go tool pprof` and other pprof viewers open.
//! - `/debug/pprof/cmdline`: the command line, NUL-separated.
//! - any other `/debug/pprof/<name>`: 404 `Unknown profile`, as Go answers a name it lacks. Go's
//!   heap, goroutine and other runtime profiles have no equivalent here (docs/observability.md).

use std::collections::HashMap;
use std::os::unix::ffi::OsStringExt;
use std::time::Duration;

use axum::Router;
use axum::extract::Query;
use axum::http::{HeaderName, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

mod cpu;
mod encode;
mod proto;

/// Go's default `seconds`.
const DEFAULT_SECONDS: u64 = 30;

/// Set by Go's pprof handlers on error responses; scripts may look for it.
const X_GO_PPROF: HeaderName = HeaderName::from_static("x-go-pprof");

/// The `/debug/pprof` routes, to merge into the HTTP server's router.
pub(crate) fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/debug/pprof", get(redirect_to_index))
        .route("/debug/pprof/", get(index))
        .route("/debug/pprof/cmdline", get(cmdline))
        .route("/debug/pprof/profile", get(profile))
        .route("/debug/pprof/{*name}", get(unknown))
}

/// Go's mux redirects a subtree's bare path to the subtree.
async fn redirect_to_index() -> Response {
    (
        StatusCode::MOVED_PERMANENTLY,
        [(header::LOCATION, "/debug/pprof/")],
    )
        .into_response()
}

async fn index() -> Html<&'static str> {
    Html(INDEX)
}

const INDEX: &str = "<html>
<head>
<title>/debug/pprof/</title>
</head>
<body>
/debug/pprof/
<br>
<p>Profiles available:</p>
<ul>
<li><a href=\"cmdline\">cmdline</a>: The command line invocation of the current program.</li>
<li><a href=\"profile\">profile</a>: CPU profile. You can specify the duration in the seconds GET parameter (default 30). After you get the profile file, use the go tool pprof command to investigate the profile.</li>
</ul>
<p>Go's allocs, block, goroutine, heap, mutex, threadcreate, symbol and trace are not available in this Rust implementation.</p>
</body>
</html>
";

/// `os.Args` joined with NUL, as Go writes it.
async fn cmdline() -> Response {
    let args: Vec<Vec<u8>> = std::env::args_os().map(OsStringExt::into_vec).collect();
    let body = args.join(&0);
    (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

async fn profile(Query(query): Query<HashMap<String, String>>) -> Response {
    let seconds = seconds(query.get("seconds").map(String::as_str));
    let running = match cpu::start() {
        Ok(running) => running,
        Err(err) => {
            return go_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("Could not enable CPU profiling: {err}"),
            );
        }
    };
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let encoded = tokio::task::spawn_blocking(move || {
        running
            .finish()
            .map_err(|err| err.to_string())
            .and_then(|profile| encode::gzipped(&profile).map_err(|err| err.to_string()))
    })
    .await
    .map_err(|err| err.to_string())
    .and_then(|result| result);
    match encoded {
        Ok(body) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile\"",
                ),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            body,
        )
            .into_response(),
        Err(err) => {
            tracing::error!(error = %err, "CPU profile failed");
            go_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("Could not write CPU profile: {err}"),
            )
        }
    }
}

/// The longest profile served: a forgotten request cannot keep the profiler (and its 100 Hz
/// interrupts) running for good. Go's only limit is the server's write timeout, which upstream
/// does not set.
const MAX_SECONDS: u64 = 3600;

/// Go: anything but a positive integer means the default; capped at [`MAX_SECONDS`].
fn seconds(value: Option<&str>) -> u64 {
    value
        .and_then(|value| value.parse::<i64>().ok())
        .and_then(|seconds| u64::try_from(seconds).ok())
        .filter(|&seconds| seconds > 0)
        .unwrap_or(DEFAULT_SECONDS)
        .min(MAX_SECONDS)
}

async fn unknown() -> Response {
    go_error(StatusCode::NOT_FOUND, "Unknown profile")
}

/// Go's `serveError`: plain text, the message and a newline.
fn go_error(status: StatusCode, message: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (X_GO_PPROF, "1"),
        ],
        format!("{message}\n"),
    )
        .into_response()
}

#[cfg(test)]
#[path = "pprof_tests.rs"]
mod tests;
