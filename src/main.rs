use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use idemrelay::cli::{Cli, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("IDEMRELAY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().with_current_span(false).init(),
        LogFormat::Human => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    match idemrelay::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("idemrelay: {err:#}");
            ExitCode::FAILURE
        }
    }
}
