use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use idemrelay::cli::{Cli, LogFormat};
use idemrelay::config::Settings;
use idemrelay::config_env::{blame_variable, known_variables, unknown_variable_warnings};

fn main() -> ExitCode {
    idemrelay::allocator::return_large_buffers_to_the_os();
    let args: Vec<_> = std::env::args_os().collect();
    // Before clap: sendmail's options are not GNU-style (`-oi`, `-fuser@x`), and a link named
    // `sendmail` gets no subcommand at all.
    if let Some((prog, sendmail_args)) = idemrelay::sendmail::invocation(&args) {
        let known = known_variables(&Cli::command());
        return ExitCode::from(idemrelay::sendmail::main(&prog, sendmail_args, &known));
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => {
            match blame_variable(&error, &Cli::command(), &args, |v| std::env::var_os(v)) {
                Some(message) => eprint!("{message}"),
                None => error.exit(),
            }
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("IDEMRELAY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().with_current_span(false).init(),
        // Every value escaped and cut, so that no value can start a line of its own.
        LogFormat::Human => logs
            .with_ansi(std::io::stderr().is_terminal())
            .fmt_fields(idemrelay::log_format::EscapedFields)
            .init(),
    }
    let names = std::env::vars_os().map(|(name, _)| name);
    let known = known_variables(&Cli::command());
    for warning in unknown_variable_warnings(&known, &Settings::file_setting_names(), names) {
        tracing::warn!("{warning}");
    }
    match idemrelay::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("idemrelay: {err:#}");
            ExitCode::FAILURE
        }
    }
}
