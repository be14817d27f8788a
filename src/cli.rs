//! Command-line interface: `serve`, `check-config`, `key derive`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::app::{termination_signal, Relay};
use crate::config::{ConfigArgs, Settings};
use crate::intake::fingerprint::fingerprint;
use crate::intake::key::{derive_key, read_key_header, KeyHeader};
use crate::intake::message::scan_headers;
use crate::smtp::session::{BodyType, Envelope};

#[derive(Debug, Parser)]
#[command(
    name = "idemrelay",
    version,
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
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the relay.
    Serve(ConfigArgs),
    /// Validate the configuration and print the effective settings (secrets redacted).
    CheckConfig(ConfigArgs),
    /// Run the test upstream (`idemrelay sink`): an SMTP server with idempotent replay,
    /// fault injection and an HTTP API, for integration tests and demos.
    Sink(crate::sink::SinkArgs),
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
    /// The delivery queue.
    Queue {
        #[command(flatten)]
        config: ConfigArgs,
        #[command(subcommand)]
        command: QueueCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Write a self-signed certificate and key (cert.pem, key.pem) for local use.
    Generate {
        #[arg(long, default_value = "certs")]
        out: PathBuf,
        /// Subject alternative names (repeatable).
        #[arg(long = "name", default_values_t = ["localhost".to_string()])]
        names: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add or replace a user; the password is read from the first line of standard input.
    Add {
        name: String,
        /// The users file (created if missing).
        #[arg(long, env = "IDEMRELAY_USERS_FILE")]
        users: PathBuf,
        /// The user's idempotency scope (defaults to the user name).
        #[arg(long)]
        scope: Option<String>,
        /// Allowed envelope sender: an address or `@domain` (repeatable; none = any).
        #[arg(long = "allow-sender")]
        allow_senders: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Resume delivery after an account-level pause (the relay notices within a second).
    Resume,
    /// Pause delivery for the whole relay; accepted messages keep queueing.
    Pause {
        #[arg(long, default_value = "paused by an operator")]
        reason: String,
    },
    /// Show whether delivery is paused, and why.
    Status,
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Print the key (read from the header or derived) and the fingerprint of a message file.
    Derive(DeriveArgs),
}

#[derive(Debug, clap::Args)]
pub struct DeriveArgs {
    /// Message file; bare LF line endings are read as CRLF, as an SMTP client would send them.
    pub file: PathBuf,
    /// Envelope sender (MAIL FROM); empty for the null sender.
    #[arg(long, default_value = "")]
    pub from: String,
    /// Envelope recipient (repeatable).
    #[arg(long = "to", required = true)]
    pub to: Vec<String>,
    /// Idempotency scope.
    #[arg(long, default_value = "default")]
    pub scope: String,
    /// BODY parameter of MAIL FROM.
    #[arg(long, default_value = "7BIT", value_parser = ["7BIT", "8BITMIME"])]
    pub body: String,
    /// The SMTPUTF8 parameter was given.
    #[arg(long)]
    pub smtputf8: bool,
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(&Settings::load(&args)?),
        Command::CheckConfig(args) => {
            let settings = Settings::load(&args)?;
            print!("{}", settings.to_redacted_toml());
            Ok(())
        }
        Command::Key {
            command: KeyCommand::Derive(args),
        } => {
            print!("{}", derive_report(&args)?);
            Ok(())
        }
        Command::Queue { config, command } => queue(&Settings::load(&config)?, command),
        Command::Certs {
            command: CertsCommand::Generate { out, names },
        } => {
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
            crate::auth::Users::add_user(&users, &name, password, &scope, &allow_senders)?;
            println!("user {name} written to {} (scope {scope})", users.display());
            Ok(())
        }
        Command::Sink(args) => {
            let config = args.into_config()?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(crate::sink::run(config))
        }
    }
}

fn queue(settings: &Settings, command: QueueCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = crate::store::open(&settings.store, settings.store_busy_timeout).await?;
        match command {
            QueueCommand::Resume => {
                store.resume().await?;
                println!("delivery resumed");
            }
            QueueCommand::Pause { reason } => {
                store.pause(&reason, false).await?;
                println!("delivery paused: {reason}");
            }
            QueueCommand::Status => match store.paused().await? {
                Some(pause) if pause.probe => {
                    println!(
                        "paused (resumes after a normal upstream probe): {}",
                        pause.reason
                    )
                }
                Some(pause) => println!("paused by an operator: {}", pause.reason),
                None => println!("running"),
            },
        }
        Ok(())
    })
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

fn derive_report(args: &DeriveArgs) -> anyhow::Result<String> {
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
    };
    let scan = scan_headers(&message);
    let fp = fingerprint(&args.scope, &envelope, &message);
    let (key, source) = match read_key_header(&scan.key_values) {
        KeyHeader::Present(value) => (value, "header"),
        KeyHeader::Invalid => anyhow::bail!(
            "the X-Bird-Idempotency-Key header is invalid (E01001): 1-255 printable characters, one value"
        ),
        KeyHeader::Absent => {
            let derived = derive_key(&args.scope, scan.message_id.as_deref(), &envelope, &fp);
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

    #[test]
    fn lone_lf_becomes_crlf() {
        assert_eq!(to_crlf(b"a\nb\r\nc\n"), b"a\r\nb\r\nc\r\n");
        assert_eq!(to_crlf(b"\n"), b"\r\n");
    }
}
