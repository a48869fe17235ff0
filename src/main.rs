//! Binary entry point: parse the Go-style command line, validate it, start logging, run the sidecar
//! (or the `audit` subcommand).

use std::process::ExitCode;

use csi_provisioner::{app, audit, cli, config::Config, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    // `csi-provisioner audit ...`: a one-shot report, with the sidecar's own flags.
    let mut argv = std::env::args_os();
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == audit::args::SUBCOMMAND)
    {
        return audit::main(argv.by_ref().skip(2).collect()).await;
    }
    // Usage errors exit 2 and --help exits 0, both inside `exit`.
    let args = cli::Args::try_parse_go_style(std::env::args_os()).unwrap_or_else(|err| err.exit());
    if args.version {
        println!("{} {}", cli::PROGRAM, cli::VERSION);
        return ExitCode::SUCCESS;
    }
    let config = match Config::from_args(args, |name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(err) => return fail(&err),
    };
    if let Err(err) = telemetry::init(&config.logging) {
        return fail(&err);
    }
    for gate in config.inert_feature_gates() {
        tracing::info!("feature gate {gate} has no effect on this provisioner, ignored");
    }
    match app::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

fn fail(err: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {err}");
    ExitCode::FAILURE
}
