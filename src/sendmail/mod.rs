//! `idemrelay sendmail`: the `/usr/sbin/sendmail` interface (docs/operations/) for programs that hand
//! mail to a sendmail binary (PHP's `mail()`, cron, git send-email, logwatch). It reads the
//! message from standard input and submits it to the relay over SMTP, so every intake rule
//! applies; a message without a key gets the relay's derived key, so running the same command
//! with the same input again is an idempotent replay.
//!
//! `args` parses the command line, `message` turns the input into an envelope and bytes (both
//! pure), `submit` is the SMTP client; this file wires them to the process (arguments,
//! configuration, standard input, exit status).

pub(crate) mod args;
pub(crate) mod message;
pub(crate) mod submit;
pub(crate) mod sysexits;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::BufRead;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::config::{ConfigArgs, Settings};

use args::{Invocation, Options, TlsChoice};
use message::{Draft, Fed, Input, PrepareError};
use submit::{Cause, Phase, Server};

use sysexits::*;

/// The password for `--auth-user` (never a flag: flags show in the process list).
pub(crate) const PASSWORD_VARIABLE: &str = "IDEMRELAY_SENDMAIL_PASSWORD";

/// Each SMTP phase's deadline unless `--timeout` says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) const HELP: &str = "\
idemrelay sendmail: the /usr/sbin/sendmail interface, submitting to the relay over SMTP

usage: sendmail [options] [recipient ...] < message
       idemrelay sendmail [options] [recipient ...] < message
       (a link named `sendmail` to the idemrelay binary runs this command)

The message is read from standard input (LF or CRLF line endings) and submitted to the relay,
which accepts it under its X-Bird-Idempotency-Key header or, without one, under a key derived
from the message. Nothing is added to the message but a From: field when it has none (and an
empty line between header and body when it lacks one); no Date: or Message-ID: is added, so
running the same command with the same input again gives the same bytes, and the relay answers
it as an idempotent replay instead of sending a second copy. Bcc: fields are removed.

Options (sendmail's syntax: -oi, -fuser@example.com, -ti; options and recipients in any order):
  -t               recipients from the To:, Cc: and Bcc: fields (Resent-To/Cc/Bcc when the
                   message has them), added to those given as arguments
  -i, -oi          a line with a lone '.' is data; without, it ends the message
  -f ADDR, -r ADDR envelope sender (-f '<>' is the null sender); default: the message's From:
                   address, else LOGIN@HOSTNAME (HOSTNAME: the configuration's `hostname`)
  -F NAME          full name for the From: field added to a message without one
  -B 8BITMIME|7BIT the BODY parameter; default: 8BITMIME when the message has 8-bit bytes
  -bm              read a message and submit it (the default and only mode)
  -bi, -I          nothing to do (there is no alias database): exit 0
  -q, -qINTERVAL   nothing to do (the relay delivers its own queue): exit 0
  -v               print the relay's reply on standard error on success too
  -C FILE          same as --config FILE
Accepted and ignored: -odi -odb -oem -oee -oep -oeq -oew -om -o7 -o8 -oA... and any other
-oX..., -Ac -Am, -G, -U, -n, -m, -c, -x, -h N, -L LABEL, -N DSN, -O OPTION=VALUE, -R RET,
-X FILE, -e X, -p PROTOCOL. Refused (exit 64): -bp (use `idemrelay queue list`), -bs, -bd and
other modes, -V (VERP), unknown options.

Where to submit (long options, anywhere on the line):
  --server HOST:PORT   the relay; default: the configuration's first `listen` address (a
                       wildcard address is reached over loopback), else its first
                       submission_listen (STARTTLS), else submissions_listen (TLS)
  --starttls           STARTTLS before anything else, required
  --smtps              TLS from the first byte (a submissions_listen listener)
  --tls-ca FILE        trust this PEM certificate (default with a listener from the
                       configuration: its tls_cert); the name checked is the HOST of --server,
                       else the configuration's `hostname`
  --auth-user USER     AUTH PLAIN/LOGIN as USER, password from IDEMRELAY_SENDMAIL_PASSWORD
  --timeout DURATION   deadline of each SMTP phase (connect, greeting, ..., final dot);
                       default 60s
  --config FILE and the other configuration flags (--hostname, --listen, ...; see
  `idemrelay serve --help`) and IDEMRELAY_* variables are read as by the other commands;
  --log-format is accepted and ignored.
  --help, --version

Exit status (sysexits.h):
  0   the relay answered 250 to the final dot: the message is committed
  64  bad command line (EX_USAGE)
  65  the relay refused the message itself, 5xx after the final dot (size, NUL, line
      length, key reuse), or it is larger than max_message_size (EX_DATAERR); also -t with
      no recipient in the header
  69  the relay refused with a 5xx before the message (greeting, AUTH, sender, recipient),
      or lacks STARTTLS/AUTH (EX_UNAVAILABLE); nothing was accepted
  71  no login name for the sender (EX_OSERR)
  74  standard input could not be read (EX_IOERR)
  75  the relay is unreachable, timed out, or answered 4xx (EX_TEMPFAIL): run the same
      command with the same input again later; if the relay had committed it, that is a replay
  78  the configuration cannot be used (EX_CONFIG)
The relay's reply goes to standard error.
";

/// The sendmail arguments when this process is to act as sendmail: a link named `sendmail`
/// (then every argument is sendmail's), or `idemrelay [global flags] sendmail ...`, whose
/// global flags (`--config FILE`, `--log-format F`, all with a value) are handed over with the
/// rest. Returns the program name for messages and the arguments.
pub fn invocation(argv: &[OsString]) -> Option<(String, Vec<OsString>)> {
    let name = std::path::Path::new(argv.first()?).file_name()?;
    if name == "sendmail" {
        return Some(("sendmail".into(), argv[1..].to_vec()));
    }
    let mut i = 1;
    while let Some(arg) = argv.get(i).and_then(|a| a.to_str()) {
        if arg == "sendmail" {
            let mut args = argv[1..i].to_vec();
            args.extend_from_slice(&argv[i + 1..]);
            return Some(("idemrelay sendmail".into(), args));
        }
        match arg.strip_prefix("--") {
            Some(flag) if !flag.is_empty() && flag.contains('=') => i += 1,
            Some(flag) if !flag.is_empty() && flag != "help" && flag != "version" => i += 2,
            // A subcommand, `-h`, `--help`, `--`: clap's business.
            _ => return None,
        }
    }
    None
}

/// Runs sendmail and returns its exit status. `known` are the environment variables the
/// relay reads (`config_env::known_variables` of its command line), warned about when
/// misspelt, as the other commands do.
pub fn main(prog: &str, args: Vec<OsString>, known: &BTreeSet<String>) -> u8 {
    let filter = tracing_subscriber::EnvFilter::try_from_env("IDEMRELAY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .fmt_fields(crate::log_format::EscapedFields)
        .try_init();
    // The other commands warn about these in main.rs, after clap, which sendmail bypasses.
    let names = std::env::vars_os().map(|(name, _)| name);
    for warning in
        crate::config_env::unknown_variable_warnings(known, &Settings::file_setting_names(), names)
    {
        tracing::warn!("{warning}");
    }
    match run(args) {
        Ok(replies) => {
            for line in replies {
                eprintln!("{prog}: {line}");
            }
            EX_OK
        }
        Err((code, text)) => {
            eprintln!("{prog}: {text}");
            code
        }
    }
}

/// Lines for standard error on success (only with `-v`), or the exit status and the reason.
fn run(args: Vec<OsString>) -> Result<Vec<String>, (u8, String)> {
    let args = args
        .into_iter()
        .map(|a| {
            a.into_string()
                .map_err(|a| (EX_USAGE, format!("argument {a:?} is not UTF-8")))
        })
        .collect::<Result<Vec<String>, _>>()?;
    let options = match args::parse(&args) {
        Ok(Invocation::Send(options)) => options,
        Ok(Invocation::Help) => {
            print!("{HELP}");
            return Ok(Vec::new());
        }
        Ok(Invocation::Version) => {
            println!("idemrelay sendmail {}", env!("CARGO_PKG_VERSION"));
            return Ok(Vec::new());
        }
        Ok(Invocation::Nothing(why)) => return Ok(vec![why.to_string()]),
        Err(e) => return Err((EX_USAGE, format!("{e} (see --help)"))),
    };
    let settings = load_settings(&options.config_args)?;
    let server = server(&options, &settings)?;

    let mut input = Input::new(options.dot_ends_input, settings.max_message_size);
    let mut stdin = std::io::stdin().lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = stdin
            .read_until(b'\n', &mut line)
            .map_err(|e| (EX_IOERR, format!("reading standard input: {e}")))?;
        if n == 0 {
            break;
        }
        match input.feed_line(&line) {
            Fed::More => {}
            Fed::End => break,
            Fed::TooLarge => {
                return Err((
                    EX_DATAERR,
                    format!(
                        "the message is larger than max_message_size ({} bytes); nothing sent",
                        settings.max_message_size
                    ),
                ))
            }
        }
    }
    let raw = input.into_message();
    let login = login_name();
    let draft = Draft {
        extract_recipients: options.extract_recipients,
        recipients: &options.recipients,
        sender: options.sender.as_deref(),
        full_name: options.full_name.as_deref(),
        eight_bit: options.eight_bit,
        domain: &settings.hostname,
        login: login.as_deref(),
    };
    let prepared = message::prepare(&raw, &draft).map_err(|e| {
        let code = match e {
            PrepareError::NoRecipients { extract: true } => EX_DATAERR,
            PrepareError::NoRecipients { extract: false } | PrepareError::BadSender(_) => EX_USAGE,
            PrepareError::NoLogin => EX_OSERR,
        };
        (code, e.to_string())
    })?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (EX_OSERR, format!("starting the runtime: {e}")))?;
    match runtime.block_on(submit::submit(&server, &prepared)) {
        Ok(replies) if options.verbose => Ok(replies),
        Ok(_) => Ok(Vec::new()),
        Err(failure) => {
            let code = submit::exit_code(&failure);
            let mut text = format!(
                "relay {} at {}: {}",
                server.address(),
                phase_name(failure.phase),
                failure.text
            );
            for line in &failure.accepted {
                text.push_str(&format!(
                    "\n(recipients of an earlier transaction were accepted: {line})"
                ));
            }
            text.push_str(match (code, &failure.cause, failure.phase) {
                (EX_TEMPFAIL, Cause::Network, Phase::Dot) => {
                    "\nthe relay may have committed the message: run the same command with the \
                     same input again (a committed message is replayed, not sent twice)"
                }
                (EX_TEMPFAIL, ..) => "\nnot accepted; try again later",
                _ => "\nnot accepted",
            });
            Err((code, text))
        }
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Connect => "connect",
        Phase::Greeting => "greeting",
        Phase::Ehlo => "EHLO",
        Phase::StartTls => "STARTTLS",
        Phase::Auth => "AUTH",
        Phase::Mail => "MAIL FROM",
        Phase::Rcpt => "RCPT TO",
        Phase::Data => "DATA",
        Phase::Dot => "end of data",
    }
}

/// The configuration, read exactly as the other commands read it: flags (here those on the
/// sendmail line), `IDEMRELAY_*` variables, the `--config` file.
fn load_settings(config_args: &[String]) -> Result<Settings, (u8, String)> {
    use clap::{Args as _, FromArgMatches as _};
    let command = ConfigArgs::augment_args(
        clap::Command::new("idemrelay sendmail")
            .disable_help_flag(true)
            .disable_version_flag(true),
    );
    let argv = std::iter::once("idemrelay sendmail".to_string()).chain(config_args.iter().cloned());
    let matches = command
        .try_get_matches_from(argv)
        .map_err(|e| (EX_USAGE, e.to_string().trim_end().to_string()))?;
    let config = ConfigArgs::from_arg_matches(&matches)
        .map_err(|e| (EX_USAGE, e.to_string().trim_end().to_string()))?;
    Settings::load(&config).map_err(|e| (EX_CONFIG, format!("configuration: {e:#}")))
}

/// A listener bound to a wildcard address is reached over loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

/// `HOST:PORT` or `[IPV6]:PORT`.
fn parse_server(text: &str) -> Option<(String, u16)> {
    let (host, port) = text.rsplit_once(':')?;
    let port = port.parse().ok().filter(|&p| p != 0)?;
    let host = match host.strip_prefix('[') {
        Some(inner) => inner.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

fn server(options: &Options, settings: &Settings) -> Result<Server, (u8, String)> {
    let timeout = options.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let hello = settings.hostname.clone();
    let mut server = match &options.server {
        Some(text) => {
            let (host, port) = parse_server(text).ok_or_else(|| {
                (
                    EX_USAGE,
                    format!("--server {text:?}: expected HOST:PORT (IPv6 as [ADDR]:PORT)"),
                )
            })?;
            let mut server = Server::new(host, port, timeout, hello);
            server.tls = options.tls;
            server
        }
        None => {
            let (addr, tls) = if let Some(addr) = settings.listen.first() {
                (*addr, options.tls)
            } else if let Some(addr) = settings.submission_listen.first() {
                (*addr, Some(options.tls.unwrap_or(TlsChoice::StartTls)))
            } else if let Some(addr) = settings.submissions_listen.first() {
                (*addr, Some(TlsChoice::Implicit))
            } else {
                return Err((EX_CONFIG, "the configuration has no listener".into()));
            };
            let addr = reachable(addr);
            let mut server = Server::new(addr.ip().to_string(), addr.port(), timeout, hello);
            server.tls = tls;
            server.tls_name = settings.hostname.clone();
            if tls.is_some() && options.tls_ca.is_none() {
                if let Some(cert) = &settings.tls_cert {
                    server.tls_ca = Some(read_pem(cert)?);
                }
            }
            server
        }
    };
    if let Some(path) = &options.tls_ca {
        server.tls_ca = Some(read_pem(path)?);
    }
    if let Some(user) = &options.auth_user {
        let password = std::env::var(PASSWORD_VARIABLE).map_err(|_| {
            (
                EX_CONFIG,
                format!("--auth-user needs the password in {PASSWORD_VARIABLE}"),
            )
        })?;
        server = server.with_auth(user.clone(), password);
    }
    Ok(server)
}

fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, (u8, String)> {
    std::fs::read(path).map_err(|e| (EX_CONFIG, format!("reading {}: {e}", path.display())))
}

/// The login name of the real user id (as sendmail takes it: the password database, not the
/// environment, which a caller controls), else `LOGNAME`/`USER`.
fn login_name() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok();
    let passwd = std::fs::read_to_string("/etc/passwd").ok();
    let from_passwd = status
        .as_deref()
        .and_then(real_uid)
        .and_then(|uid| passwd_name(passwd.as_deref()?, uid));
    from_passwd.or_else(|| {
        ["LOGNAME", "USER"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| message_safe_login(s)))
    })
}

/// A login name goes into an address: nothing that could break one.
fn message_safe_login(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-+$".contains(&b))
}

/// The real uid from /proc/self/status (`Uid:\treal\teffective\tsaved\tfs`).
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The name of `uid` in /etc/passwd (`name:x:uid:gid:gecos:home:shell`).
fn passwd_name(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let id: u32 = fields.next()?.parse().ok()?;
        (id == uid && message_safe_login(name)).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invoked_by_a_link_or_as_a_subcommand() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let (prog, args) = invocation(&os(&["/usr/sbin/sendmail", "-t", "-i"])).unwrap();
        assert_eq!((prog.as_str(), args), ("sendmail", os(&["-t", "-i"])));
        let (prog, args) = invocation(&os(&["sendmail"])).unwrap();
        assert_eq!((prog.as_str(), args), ("sendmail", os(&[])));
        let (prog, args) =
            invocation(&os(&["/usr/bin/idemrelay", "sendmail", "-oi", "a@x"])).unwrap();
        assert_eq!(
            (prog.as_str(), args),
            ("idemrelay sendmail", os(&["-oi", "a@x"]))
        );
        let (prog, args) = invocation(&os(&[
            "idemrelay",
            "--config",
            "/etc/i.toml",
            "--log-format=json",
            "sendmail",
            "-t",
        ]))
        .unwrap();
        assert_eq!(
            (prog.as_str(), args),
            (
                "idemrelay sendmail",
                os(&["--config", "/etc/i.toml", "--log-format=json", "-t"])
            )
        );
        assert!(invocation(&os(&["idemrelay", "serve"])).is_none());
        assert!(invocation(&os(&["idemrelay", "--log-format", "json", "serve"])).is_none());
        assert!(invocation(&os(&["idemrelay", "--store", "sendmail"])).is_none());
        assert!(invocation(&os(&["idemrelay", "--help", "sendmail"])).is_none());
        assert!(invocation(&os(&["idemrelay", "-h", "sendmail"])).is_none());
        assert!(invocation(&os(&["idemrelay", "help", "sendmail"])).is_none());
        assert!(invocation(&os(&["/usr/sbin/sendmail.postfix", "-t"])).is_none());
        assert!(invocation(&os(&[])).is_none());
    }

    #[test]
    fn server_addresses() {
        assert_eq!(
            parse_server("127.0.0.1:2525"),
            Some(("127.0.0.1".into(), 2525))
        );
        assert_eq!(
            parse_server("relay.example.com:587"),
            Some(("relay.example.com".into(), 587))
        );
        assert_eq!(parse_server("[::1]:25"), Some(("::1".into(), 25)));
        for bad in [
            "relay", "::1:25", "relay:0", "relay:x", ":25", "[::1:25", "[]:25",
        ] {
            assert_eq!(parse_server(bad), None, "{bad}");
        }
        assert_eq!(
            reachable("0.0.0.0:2525".parse().unwrap()),
            "127.0.0.1:2525".parse().unwrap()
        );
        assert_eq!(
            reachable("[::]:25".parse().unwrap()),
            "[::1]:25".parse().unwrap()
        );
        assert_eq!(
            reachable("10.0.0.1:25".parse().unwrap()),
            "10.0.0.1:25".parse().unwrap()
        );
    }

    #[test]
    fn login_from_the_password_database() {
        let status = "Name:\tx\nUid:\t33\t0\t0\t0\nGid:\t33\t33\t33\t33\n";
        assert_eq!(real_uid(status), Some(33));
        let passwd = "root:x:0:0:root:/root:/bin/bash\nwww-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\nbad name:x:34:34::/:/bin/sh\n";
        assert_eq!(passwd_name(passwd, 33).as_deref(), Some("www-data"));
        assert_eq!(passwd_name(passwd, 0).as_deref(), Some("root"));
        assert_eq!(passwd_name(passwd, 34), None);
        assert_eq!(passwd_name(passwd, 1000), None);
    }

    #[test]
    fn configuration_flags_reach_the_settings() {
        let s = load_settings(&[
            "--hostname".into(),
            "mail.example.com".into(),
            "--listen".into(),
            "127.0.0.1:2600".into(),
        ])
        .unwrap();
        assert_eq!(s.hostname, "mail.example.com");
        assert_eq!(s.listen, vec!["127.0.0.1:2600".parse().unwrap()]);
        let (code, text) = load_settings(&["--no-such-flag".into(), "x".into()]).unwrap_err();
        assert_eq!(code, EX_USAGE, "{text}");
        let (code, _) =
            load_settings(&["--config".into(), "/nonexistent/x.toml".into()]).unwrap_err();
        assert_eq!(code, EX_CONFIG);
    }
}
