//! `csi-sanity` binary: parse flags, run the checks against the driver, map the result to the
//! exit code (0 all passed, 1 a check failed, 2 the run could not start).

use std::process::ExitCode;

use clap::Parser;
use csi_sanity::cli::Args;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let mut out = std::io::stdout();
    if args.list {
        return match csi_sanity::runner::list(&mut out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(2),
        };
    }
    let opts = match args.into_options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("csi-sanity: {e}");
            return ExitCode::from(2);
        }
    };
    match csi_sanity::runner::run(opts, &mut out).await {
        Ok(report) if report.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("csi-sanity: {e}");
            ExitCode::from(2)
        }
    }
}
