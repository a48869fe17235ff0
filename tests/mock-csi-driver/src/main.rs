//! `mock-csi-driver` binary: parse flags, set up logging, serve until SIGTERM/SIGINT.

use std::process::ExitCode;

use clap::Parser;
use mock_csi_driver::cli::Args;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    mock_csi_driver::init_logging(&args.log_format);
    let config = match args.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mock-csi-driver: {e}");
            return ExitCode::from(2);
        }
    };
    match mock_csi_driver::run(config, mock_csi_driver::shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock-csi-driver: {e}");
            ExitCode::FAILURE
        }
    }
}
