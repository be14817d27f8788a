//! Command-line interface: `serve`, `check-config`, `key derive`, `queue`, ...

use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory as _, Parser, Subcommand};

mod queue;
mod table;

use crate::app::Relay;
use crate::config::{ConfigArgs, Settings};
use crate::intake::key::{derive_key, read_key_header, KeyHeader};
use crate::intake::message::scan_headers;
use crate::mail::{BodyType, Envelope};
use crate::shutdown::termination_signal;
use idemrelay_model::fingerprint::fingerprint;
pub(crate) use queue::QueueCommand;
use table::table;

#[derive(Debug, Parser)]
#[command(
    name = "idemrelay",
    version = crate::build_info::LONG_VERSION,
    about = "SMTP submission relay with exactly-once acceptance"
)]
pub struct Cli {
    /// Log lines for people (`human`) or one JSON object per line (`json`), on stderr.
    #[arg(
        long,
        global = true,
        env = "IDEMRELAY_LOG_FORMAT",
        value_enum,
        default_value = "human"
    )]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the relay.
    Serve,
    /// Validate the configuration and print the effective settings (secrets redacted).
    CheckConfig,
    /// Run the test upstream (`idemrelay sink`): an SMTP server with idempotent replay,
    /// fault injection and an HTTP API, for integration tests and demos.
    #[cfg(feature = "sink")]
    Sink(Box<idemrelay_sink::SinkArgs>),
    /// Idempotency keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// TLS certificates for the submission listeners.
    Certs {
        #[command(subcommand)]
        command: CertsCommand,
    },
    /// Submission users (AUTH PLAIN/LOGIN).
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// The delivery queue, through the running relay's admin API, or with --direct on the store.
    ///
    /// The relay asked is the one `--admin URL` (or IDEMRELAY_ADMIN) names, else the `admin`
    /// of the config file (`--config`, default /etc/idemrelay/idemrelay.toml); its token comes
    /// from IDEMRELAY_ADMIN_TOKEN or that file. Changes are refused when no relay is named that
    /// way; every command says which relay answered (on stderr, or in JSON output as
    /// `answered_by`). Never creates a store.
    Queue {
        /// Work on the store (`--store`) directly instead of through the relay's admin API:
        /// for a relay that is not running. Actions are recorded as the local user's.
        #[arg(long, global = true)]
        direct: bool,
        /// Who acts, as recorded with every action (default: $USER, $LOGNAME, else the OS's
        /// name for this process's user). Through the API it is recorded beside the token's
        /// name, as the caller's claim.
        #[arg(long, global = true, env = "IDEMRELAY_OPERATOR", value_name = "NAME")]
        by: Option<String>,
        #[command(subcommand)]
        command: QueueCommand,
    },
    /// Per scope and UTC day: accepted, replayed, delivered, failed and unresolved counts,
    /// for reconciliation with the upstream's usage figures.
    Report {
        /// First day to include (YYYY-MM-DD, UTC); default: every day on record.
        #[arg(long, value_parser = parse_since)]
        since: Option<String>,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The /usr/sbin/sendmail interface: read a message on standard input and submit it to
    /// the relay (`idemrelay sendmail --help` for its sendmail-style options).
    #[command(disable_help_flag = true)]
    Sendmail {
        /// sendmail's own options and the recipients (`idemrelay sendmail --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Exit 0 if the relay's admin API answers GET /healthz with 200, else 1 (for container
    /// health checks; the image has no curl).
    /// The address probed is the configured `admin` (`--admin`, `IDEMRELAY_ADMIN`, the config
    /// file; a wildcard address is probed over loopback).
    Healthcheck {
        /// Probe /readyz instead: the store is writable and delivery is not wedged.
        #[arg(long)]
        ready: bool,
        /// Give up (exit 1) when no answer came within this long.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Print a shell completion script on standard output, e.g.
    /// `idemrelay completions bash > /etc/bash_completion.d/idemrelay`.
    Completions {
        /// The shell to write the script for.
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Print a manual page (roff) on standard output, e.g. `idemrelay man | man -l -`.
    ///
    /// The command's own page, or a subcommand's: `idemrelay man queue list` is
    /// idemrelay-queue-list(1), as the pages' SUBCOMMANDS name them. --dir writes them all.
    Man {
        /// The subcommand whose page to print (nested ones by their path: `queue list`).
        subcommand: Vec<String>,
        /// Write every page (idemrelay.1, idemrelay-queue.1, ...) into this directory instead,
        /// e.g. /usr/local/share/man/man1.
        #[arg(long, conflicts_with = "subcommand")]
        dir: Option<PathBuf>,
    },
}

/// The shells `completions` writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

fn parse_since(s: &str) -> Result<String, String> {
    crate::store::parse_day(s).ok_or_else(|| format!("{s:?} is not a day like 2026-11-29"))
}

#[derive(Debug, Subcommand)]
pub(crate) enum CertsCommand {
    /// Write a self-signed certificate and key (cert.pem, key.pem) for local use.
    Generate {
        /// Directory to write cert.pem and key.pem into (created if missing).
        #[arg(long, default_value = "certs")]
        out: PathBuf,
        /// Subject alternative name, a DNS name or an IP address (repeatable). Default:
        /// localhost, 127.0.0.1, ::1 and this host's name.
        #[arg(long = "name")]
        names: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum UserCommand {
    /// Add or replace a user; the password is read from the first line of standard input.
    Add {
        /// The user name clients give at AUTH.
        name: String,
        /// The users file (created if missing); default: the configured `users_file`.
        #[arg(long)]
        users: Option<PathBuf>,
        /// The user's idempotency scope (defaults to the user name).
        #[arg(long)]
        scope: Option<String>,
        /// Allowed envelope sender: an address or `@domain` (repeatable; none = any).
        #[arg(long = "allow-sender")]
        allow_senders: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum KeyCommand {
    /// Print the key (read from the header or derived) and the fingerprint of a message file.
    Derive(DeriveArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct DeriveArgs {
    /// Message file; bare LF line endings are read as CRLF, as an SMTP client would send them.
    pub file: PathBuf,
    /// Envelope sender (MAIL FROM); empty for the null sender.
    #[arg(long, default_value = "")]
    pub from: String,
    /// Envelope recipient (repeatable).
    #[arg(long = "to", required = true)]
    pub to: Vec<String>,
    /// BODY parameter of MAIL FROM.
    #[arg(long, default_value = "7BIT", value_parser = ["7BIT", "8BITMIME"])]
    pub body: String,
    /// The SMTPUTF8 parameter was given.
    #[arg(long)]
    pub smtputf8: bool,
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    let mut config = cli.config;
    if config.config.is_none() {
        config.config = crate::config::default_config_file();
    }
    match cli.command {
        Command::Serve => serve(&Settings::load(&config)?),
        Command::CheckConfig => {
            let settings = Settings::load(&config)?;
            print!("{}", settings.to_redacted_toml());
            Ok(())
        }
        Command::Key {
            command: KeyCommand::Derive(args),
        } => {
            let settings = Settings::load(&config)?;
            print!("{}", derive_report(&args, &settings.scope)?);
            Ok(())
        }
        Command::Queue {
            direct,
            by,
            command,
        } => {
            let store_given = config.store.clone();
            let target = queue::AdminSource::of(&config);
            let settings = Settings::load(&config)?;
            queue::run(&settings, store_given, direct, target, by, command)
        }
        Command::Report { since, json } => {
            report(&Settings::load(&config)?, since.as_deref(), json)
        }
        Command::Healthcheck { ready, timeout } => {
            let Some(addr) = Settings::load(&config)?.admin.0 else {
                anyhow::bail!("the admin API is off; nothing to check");
            };
            let path = if ready { "/readyz" } else { "/healthz" };
            let status = crate::admin::healthcheck::get_status(addr, path, timeout)
                .with_context(|| format!("GET http://{addr}{path}"))?;
            anyhow::ensure!(status == 200, "GET http://{addr}{path}: {status}");
            println!("ok: GET http://{addr}{path} answered {status}");
            Ok(())
        }
        Command::Certs {
            command: CertsCommand::Generate { out, mut names },
        } => {
            if names.is_empty() {
                names = crate::smtp::tls::default_certificate_names(
                    &crate::hostname::system_hostname(),
                );
            }
            let (cert, key) = crate::smtp::tls::generate_self_signed(&out, &names)?;
            println!("wrote {} and {}", cert.display(), key.display());
            Ok(())
        }
        Command::User {
            command:
                UserCommand::Add {
                    name,
                    users,
                    scope,
                    allow_senders,
                },
        } => {
            let mut password = String::new();
            std::io::stdin().read_line(&mut password)?;
            let password = password.trim_end_matches(['\r', '\n']);
            anyhow::ensure!(!password.is_empty(), "no password on standard input");
            let scope = scope.unwrap_or_else(|| name.clone());
            let users = match users {
                Some(users) => users,
                None => Settings::load(&config)?.users_file.context(
                    "no users file: give --users FILE (or --users-file, IDEMRELAY_USERS_FILE, users_file)",
                )?,
            };
            crate::auth::Users::add_user(&users, &name, password, &scope, &allow_senders)?;
            println!("user {name} written to {} (scope {scope})", users.display());
            // stdout is for the result; the hint goes where a script does not parse it.
            eprintln!("a running relay takes it on SIGHUP (systemctl reload idemrelay)");
            Ok(())
        }
        Command::Completions { shell } => {
            let shell = match shell {
                CompletionShell::Bash => clap_complete::Shell::Bash,
                CompletionShell::Zsh => clap_complete::Shell::Zsh,
                CompletionShell::Fish => clap_complete::Shell::Fish,
            };
            let mut command = Cli::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "idemrelay", &mut script);
            write_stdout(&script)
        }
        Command::Man { subcommand, dir } => {
            let command = man_tree();
            if let Some(dir) = dir {
                let written = write_man_pages(&command, &dir)?;
                println!("wrote {written} page(s) into {}", dir.display());
                return Ok(());
            }
            let mut page_of = &command;
            for name in &subcommand {
                page_of = page_of.find_subcommand(name).with_context(|| {
                    format!(
                        "no subcommand {name:?} under `{}` (idemrelay man names each page's \
                         subcommands under SUBCOMMANDS)",
                        page_of.get_bin_name().unwrap_or("idemrelay")
                    )
                })?;
            }
            let mut page = Vec::new();
            clap_mangen::Man::new(page_of.clone()).render(&mut page)?;
            write_stdout(&page)
        }
        // main.rs hands `idemrelay [global flags] sendmail ...` over before clap; this is
        // reached only by lines it leaves to clap (a global flag's value that is not UTF-8).
        Command::Sendmail { args } => {
            let known =
                crate::config_env::known_variables(&<Cli as clap::CommandFactory>::command());
            std::process::exit(crate::sendmail::main("idemrelay sendmail", args, &known).into())
        }
        #[cfg(feature = "sink")]
        Command::Sink(args) => {
            let config = args.into_config()?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(idemrelay_sink::run(config))
        }
    }
}

/// The command tree the manual pages are made of: built, so each subcommand knows its page's
/// name (`idemrelay-queue-list`) and its synopsis (`idemrelay queue list`), without the `help`
/// subcommands, which have no page.
fn man_tree() -> clap::Command {
    fn without_help(command: clap::Command) -> clap::Command {
        let mut command = command.disable_help_subcommand(true);
        let names: Vec<String> = command
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        for name in names {
            command = command.mut_subcommand(name, without_help);
        }
        command
    }
    let mut command = without_help(Cli::command());
    command.build();
    command
}

/// Writes the page of `command` and of each subcommand under it into `dir`; returns how many.
fn write_man_pages(command: &clap::Command, dir: &std::path::Path) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = 0;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        written += write_man_pages(sub, dir)?;
    }
    let man = clap_mangen::Man::new(command.clone());
    let path = dir.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)?;
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    Ok(written + 1)
}

/// Writes a generated text to stdout. A reader that stops early (`| head`) closes the pipe:
/// that is the reader's choice, not an error of this command's, so it ends quietly with 0
/// (clap_complete's own writer would panic with a backtrace).
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn report(settings: &Settings, since: Option<&str>, json: bool) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let rows = runtime.block_on(async {
        let store =
            crate::store::open_existing(settings.store.expose(), settings.store_busy_timeout)
                .await?;
        anyhow::Ok(store.report(since).await?)
    })?;
    if json {
        let rows: Vec<_> = rows.iter().map(crate::admin::view::daily_json).collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", report_table(&rows));
    }
    Ok(())
}

fn report_table(rows: &[crate::store::DailyCounts]) -> String {
    let mut cells: Vec<Vec<String>> = Vec::new();
    let mut total = [0u64; 8];
    for r in rows {
        let counts = [
            r.accepted,
            r.replayed,
            r.delivered,
            r.failed,
            r.unresolved,
            r.cancelled,
            r.resolved_by_event,
            r.bounced,
        ];
        for (t, n) in total.iter_mut().zip(counts) {
            *t += n;
        }
        let mut row = vec![r.day.clone(), r.scope.clone()];
        row.extend(counts.iter().map(u64::to_string));
        cells.push(row);
    }
    let mut row = vec!["total".to_string(), "-".to_string()];
    row.extend(total.iter().map(u64::to_string));
    cells.push(row);
    table(
        &[
            "DAY",
            "SCOPE",
            "ACCEPTED",
            "REPLAYED",
            "DELIVERED",
            "FAILED",
            "UNRESOLVED",
            "CANCELLED",
            "RESOLVED-BY-EVENT",
            "BOUNCED",
        ],
        &cells,
    )
}

fn serve(settings: &Settings) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // Handlers go in before the listeners open, so a SIGTERM that follows the "listening"
        // line is always a graceful stop, never the default kill.
        let signal = termination_signal()?;
        let relay = Relay::start(settings).await?;
        signal.await;
        tracing::info!("shutting down");
        relay.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Converts lone LF to CRLF, leaving existing CRLF pairs alone.
pub fn to_crlf(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + bytes.len() / 32);
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\n' && (i == 0 || bytes[i - 1] != b'\r') {
            out.push(b'\r');
        }
        out.push(b);
    }
    out
}

fn derive_report(args: &DeriveArgs, scope: &str) -> anyhow::Result<String> {
    let raw =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let mut message = to_crlf(&raw);
    // Over DATA the last line always ends in CRLF, so that is the message the relay sees.
    if !message.is_empty() && !message.ends_with(b"\r\n") {
        message.extend_from_slice(b"\r\n");
    }
    let envelope = Envelope {
        mail_from: args.from.clone(),
        rcpt_to: args.to.clone(),
        body: if args.body == "8BITMIME" {
            BodyType::EightBitMime
        } else {
            BodyType::SevenBit
        },
        smtputf8: args.smtputf8,
        requests: Default::default(),
    };
    let scan = scan_headers(&message);
    let fp = fingerprint(scope, &envelope, &message);
    let (key, source) = match read_key_header(&scan.key_values) {
        KeyHeader::Present(value) => (value, "header"),
        KeyHeader::Invalid => anyhow::bail!(
            "the X-Bird-Idempotency-Key header is invalid (E01001): 1-255 printable characters, one value"
        ),
        KeyHeader::Absent => {
            let derived = derive_key(scope, scan.message_id.as_deref(), &envelope, &fp);
            (derived.value, derived.source.as_str())
        }
    };
    Ok(format!(
        "key: {key}\nsource: {source}\nfingerprint: {}\n",
        fp.to_hex()
    ))
}

#[cfg(test)]
mod tests {
    use super::to_crlf;

    /// Every flag and argument of every command says what it is for in `--help` (and so in
    /// the man pages and completions).
    #[test]
    fn every_argument_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" || arg.is_hide_set() {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut command = <super::Cli as clap::CommandFactory>::command();
        command.build();
        let mut missing = Vec::new();
        walk(&command, "idemrelay", &mut missing);
        assert!(missing.is_empty(), "without help:\n{}", missing.join("\n"));
    }

    #[test]
    fn lone_lf_becomes_crlf() {
        assert_eq!(to_crlf(b"a\nb\r\nc\n"), b"a\r\nb\r\nc\r\n");
        assert_eq!(to_crlf(b"\n"), b"\r\n");
    }
}
