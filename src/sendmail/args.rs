//! The sendmail command line, parsed without I/O.
//!
//! sendmail's syntax is getopt's, not GNU's: options cluster (`-ti`), an option's value may be
//! glued (`-fuser@x`, `-oi`, `-FCronDaemon`) or the next argument (`-f user@x`), and `-o`
//! takes a value whose first letter is the real option (`-oi`, `-oem`, `-odi`). The letters
//! and which of them take a value are Postfix's sendmail(1). Options and recipients may come
//! in any order; `--` ends the options. Long options (`--server`, ...) are ours; any other
//! long option is a configuration flag (`--config FILE`, `--hostname H`) handed to the same
//! parser the other commands use.

use std::path::PathBuf;
use std::time::Duration;

/// Option letters that take a value (glued or the next argument), as in Postfix's getopt
/// string. `q` and `V` are handled before this table (they may stand alone).
const WITH_VALUE: &str = "ABCFLNORXbefhopr";
/// Option letters without a value.
const WITHOUT_VALUE: &str = "GIUcimntvx";

/// How the SMTP connection to the relay is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsChoice {
    /// `--starttls`: plaintext greeting, then STARTTLS, required.
    StartTls,
    /// `--smtps`: TLS from the first byte (a `submissions_listen` listener).
    Implicit,
}

/// What to submit and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    /// `-t`: recipients from To/Cc/Bcc, added to those on the command line.
    pub extract_recipients: bool,
    /// Without `-i`/`-oi`, a line holding a lone `.` ends the message.
    pub dot_ends_input: bool,
    /// `-f`/`-r`, as given (parsed later: `<>` and empty are the null sender).
    pub sender: Option<String>,
    /// `-F`: the full name for a From: field the message lacks.
    pub full_name: Option<String>,
    /// `-B 8BITMIME` (true) or `-B 7BIT` (false); unset: decided by the content.
    pub eight_bit: Option<bool>,
    /// `-v`: print the relay's replies on success too.
    pub verbose: bool,
    /// Command-line recipients, each possibly a list (`a@x, "B" <b@y>`).
    pub recipients: Vec<String>,
    pub server: Option<String>,
    pub tls: Option<TlsChoice>,
    pub auth_user: Option<String>,
    pub tls_ca: Option<PathBuf>,
    pub timeout: Option<Duration>,
    /// Configuration flags for the settings loader, e.g. `["--config", "/etc/idemrelay.toml"]`.
    pub config_args: Vec<String>,
    /// Options accepted for compatibility and ignored, as given (for `-v`).
    pub ignored: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            extract_recipients: false,
            dot_ends_input: true,
            sender: None,
            full_name: None,
            eight_bit: None,
            verbose: false,
            recipients: Vec::new(),
            server: None,
            tls: None,
            auth_user: None,
            tls_ca: None,
            timeout: None,
            config_args: Vec::new(),
            ignored: Vec::new(),
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Invocation {
    /// `-bm` (the default): read a message and submit it.
    Send(Options),
    /// Modes with nothing to do here (`-bi`, `-I`, `-q`): exit 0 after saying why.
    Nothing(&'static str),
    Help,
    Version,
}

/// A command line sendmail cannot run (EX_USAGE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn usage(text: impl Into<String>) -> UsageError {
    UsageError(text.into())
}

/// Values that end up in an SMTP command or a header field may not break a line.
fn single_line(what: &str, value: &str) -> Result<(), UsageError> {
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(usage(format!("{what} contains a control character")));
    }
    Ok(())
}

pub(crate) fn parse(args: &[String]) -> Result<Invocation, UsageError> {
    let mut o = Options::default();
    let mut nothing: Option<&'static str> = None;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            o.recipients.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, glued) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            let mut value = |name: &str| -> Result<String, UsageError> {
                if let Some(v) = &glued {
                    return Ok(v.clone());
                }
                let v = args
                    .get(i)
                    .ok_or_else(|| usage(format!("--{name} needs a value")))?;
                i += 1;
                Ok(v.clone())
            };
            match name {
                "help" => return Ok(Invocation::Help),
                "version" => return Ok(Invocation::Version),
                "starttls" | "smtps" if glued.is_some() => {
                    return Err(usage(format!("--{name} takes no value")))
                }
                "starttls" => o.tls = Some(TlsChoice::StartTls),
                "smtps" => o.tls = Some(TlsChoice::Implicit),
                "server" => o.server = Some(value(name)?),
                "auth-user" => {
                    let user = value(name)?;
                    single_line("--auth-user", &user)?;
                    o.auth_user = Some(user);
                }
                "tls-ca" => o.tls_ca = Some(PathBuf::from(value(name)?)),
                "timeout" => {
                    let text = value(name)?;
                    let d = humantime::parse_duration(&text)
                        .map_err(|e| usage(format!("--timeout {text:?}: {e}")))?;
                    if d.is_zero() {
                        return Err(usage("--timeout must be positive"));
                    }
                    o.timeout = Some(d);
                }
                // A global flag of `idemrelay`: sendmail logs only warnings, in one format.
                "log-format" => {
                    value(name)?;
                }
                "" => return Err(usage("unexpected `--=`")),
                // Every configuration flag takes a value; the settings loader checks the name.
                _ => {
                    let v = value(name)?;
                    o.config_args.push(format!("--{name}"));
                    o.config_args.push(v);
                }
            }
            continue;
        }
        let Some(cluster) = arg.strip_prefix('-').filter(|c| !c.is_empty()) else {
            o.recipients.push(arg.clone());
            continue;
        };
        // Postfix reads these two by hand: both may stand alone.
        if cluster.starts_with('q') {
            nothing = Some("the relay delivers its queue by itself; there is nothing to flush");
            continue;
        }
        if cluster.starts_with('V') {
            return Err(usage("-V (VERP) is not supported"));
        }
        for (at, letter) in cluster.char_indices() {
            if WITHOUT_VALUE.contains(letter) {
                match letter {
                    'i' => o.dot_ends_input = false,
                    't' => o.extract_recipients = true,
                    'v' => o.verbose = true,
                    'I' => nothing = Some("there is no alias database to rebuild"),
                    _ => o.ignored.push(format!("-{letter}")),
                }
                continue;
            }
            if !WITH_VALUE.contains(letter) {
                return Err(usage(format!("unknown option -{letter}")));
            }
            let glued = &cluster[at + letter.len_utf8()..];
            let value = if glued.is_empty() {
                let v = args
                    .get(i)
                    .ok_or_else(|| usage(format!("-{letter} needs a value")))?;
                i += 1;
                v.clone()
            } else {
                glued.to_string()
            };
            match letter {
                'f' | 'r' => {
                    single_line("the sender", &value)?;
                    o.sender = Some(value);
                }
                'F' => {
                    single_line("the full name", &value)?;
                    o.full_name = Some(value);
                }
                'B' => {
                    o.eight_bit = Some(match value.to_ascii_uppercase().as_str() {
                        "8BITMIME" => true,
                        "7BIT" => false,
                        _ => return Err(usage("-B needs 8BITMIME or 7BIT")),
                    })
                }
                'C' => {
                    o.config_args.push("--config".into());
                    o.config_args.push(value);
                }
                'o' => match value.chars().next() {
                    Some('i') => o.dot_ends_input = false,
                    _ => o.ignored.push(format!("-o{value}")),
                },
                'b' => {
                    match value.chars().next() {
                        Some('m') => {}
                        Some('i') => nothing = Some("there is no alias database to rebuild"),
                        Some('p') => return Err(usage(
                            "-bp: the queue is the relay's; list it with `idemrelay queue list`",
                        )),
                        _ => return Err(usage(format!("-b{value}: mode not supported"))),
                    }
                }
                _ => o.ignored.push(format!("-{letter} {value}")),
            }
            // The value took the rest of the cluster.
            break;
        }
    }
    if let Some(why) = nothing {
        return Ok(Invocation::Nothing(why));
    }
    for rcpt in &o.recipients {
        single_line("a recipient", rcpt)?;
    }
    Ok(Invocation::Send(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(args: &[&str]) -> Options {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&args) {
            Ok(Invocation::Send(o)) => o,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    fn err(args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&args) {
            Err(UsageError(text)) => text,
            other => panic!("{args:?} should be refused: {other:?}"),
        }
    }

    #[test]
    fn flags_the_usual_callers_pass() {
        // PHP's default sendmail_path, cron (cronie), git send-email, logwatch, mailx.
        let php = send(&["-t", "-i"]);
        assert!(php.extract_recipients && !php.dot_ends_input && php.recipients.is_empty());
        let cron = send(&["-FCronDaemon", "-i", "-B8BITMIME", "-oem", "root"]);
        assert_eq!(cron.full_name.as_deref(), Some("CronDaemon"));
        assert_eq!(cron.eight_bit, Some(true));
        assert!(!cron.dot_ends_input);
        assert_eq!(cron.recipients, ["root"]);
        assert_eq!(cron.ignored, ["-oem"]);
        let git = send(&[
            "-i",
            "-f",
            "dev@example.com",
            "a@example.com",
            "b@example.com",
        ]);
        assert_eq!(git.sender.as_deref(), Some("dev@example.com"));
        assert_eq!(git.recipients, ["a@example.com", "b@example.com"]);
        let mailx = send(&["-oi", "-odi", "-oem", "-om", "-v", "x@example.com"]);
        assert!(!mailx.dot_ends_input && mailx.verbose);
        assert_eq!(mailx.ignored, ["-odi", "-oem", "-om"]);
    }

    #[test]
    fn table() {
        // (args, extract, dot ends input, sender, full name, recipients)
        type Row<'a> = (
            &'a [&'a str],
            bool,
            bool,
            Option<&'a str>,
            Option<&'a str>,
            &'a [&'a str],
        );
        let rows: &[Row] = &[
            (&[], false, true, None, None, &[]),
            (&["-ti"], true, false, None, None, &[]),
            (&["-it", "x@y"], true, false, None, None, &["x@y"]),
            (&["-fa@b"], false, true, Some("a@b"), None, &[]),
            (
                &["-f", "a@b", "c@d"],
                false,
                true,
                Some("a@b"),
                None,
                &["c@d"],
            ),
            (&["-r", "a@b"], false, true, Some("a@b"), None, &[]),
            (&["-ra@b"], false, true, Some("a@b"), None, &[]),
            (&["-f", ""], false, true, Some(""), None, &[]),
            (&["-f", "<>"], false, true, Some("<>"), None, &[]),
            (&["-tf", "a@b"], true, true, Some("a@b"), None, &[]),
            (
                &["-F", "Ann Smith", "x@y"],
                false,
                true,
                None,
                Some("Ann Smith"),
                &["x@y"],
            ),
            (&["-FAnn"], false, true, None, Some("Ann"), &[]),
            (&["-o", "i"], false, false, None, None, &[]),
            (&["-bm", "x@y"], false, true, None, None, &["x@y"]),
            (&["-b", "m"], false, true, None, None, &[]),
            (&["x@y", "-t"], true, true, None, None, &["x@y"]),
            (&["--", "-t"], false, true, None, None, &["-t"]),
            (
                &[
                    "-G", "-U", "-Am", "-Ac", "-N", "never", "-L", "x", "-X", "/tmp/log",
                ],
                false,
                true,
                None,
                None,
                &[],
            ),
            (
                &[
                    "-O",
                    "DeliveryMode=b",
                    "-R",
                    "hdrs",
                    "-h",
                    "5",
                    "-e",
                    "m",
                    "-p",
                    "smtp",
                ],
                false,
                true,
                None,
                None,
                &[],
            ),
            (
                &["-n", "-m", "-c", "-x", "-oA/etc/aliases", "-o7", "-o8"],
                false,
                true,
                None,
                None,
                &[],
            ),
        ];
        for (args, extract, dot, sender, name, rcpts) in rows {
            let o = send(args);
            assert_eq!(o.extract_recipients, *extract, "{args:?}");
            assert_eq!(o.dot_ends_input, *dot, "{args:?}");
            assert_eq!(o.sender.as_deref(), *sender, "{args:?}");
            assert_eq!(o.full_name.as_deref(), *name, "{args:?}");
            assert_eq!(o.recipients, *rcpts, "{args:?}");
            assert!(o.config_args.is_empty() && o.server.is_none(), "{args:?}");
        }
    }

    #[test]
    fn long_options_and_configuration_flags() {
        let o = send(&[
            "-t",
            "--server",
            "127.0.0.1:2525",
            "--starttls",
            "--auth-user=app",
            "--tls-ca",
            "/etc/ca.pem",
            "--timeout=5s",
            "--config",
            "/etc/idemrelay.toml",
            "--hostname=mail.example.com",
            "-C",
            "/other.toml",
        ]);
        assert_eq!(o.server.as_deref(), Some("127.0.0.1:2525"));
        assert_eq!(o.tls, Some(TlsChoice::StartTls));
        assert_eq!(o.auth_user.as_deref(), Some("app"));
        assert_eq!(o.tls_ca, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(o.timeout, Some(Duration::from_secs(5)));
        assert_eq!(
            o.config_args,
            [
                "--config",
                "/etc/idemrelay.toml",
                "--hostname",
                "mail.example.com",
                "--config",
                "/other.toml"
            ]
        );
        assert_eq!(send(&["--smtps"]).tls, Some(TlsChoice::Implicit));
        assert_eq!(send(&["--log-format", "json", "-t"]), send(&["-t"]));
        let args: Vec<String> = vec!["-t".into(), "--help".into()];
        assert_eq!(parse(&args), Ok(Invocation::Help));
        assert_eq!(parse(&["--version".to_string()]), Ok(Invocation::Version));
    }

    #[test]
    fn modes_with_nothing_to_do() {
        for args in [
            &["-bi"][..],
            &["-I"],
            &["-q"],
            &["-q30m"],
            &["-qRexample.com"],
        ] {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            assert!(
                matches!(parse(&args), Ok(Invocation::Nothing(_))),
                "{args:?}"
            );
        }
    }

    #[test]
    fn refusals() {
        for (args, says) in [
            (&["-z"][..], "unknown option -z"),
            (&["-tz"], "unknown option -z"),
            (&["-f"], "-f needs a value"),
            (&["-F"], "-F needs a value"),
            (&["-B", "BINARYMIME"], "-B needs 8BITMIME or 7BIT"),
            (&["-bp"], "idemrelay queue list"),
            (&["-bs"], "-bs: mode not supported"),
            (&["-bd"], "mode not supported"),
            (&["-V"], "VERP"),
            (&["--server"], "--server needs a value"),
            (&["--config"], "--config needs a value"),
            (&["--starttls=yes"], "takes no value"),
            (&["--timeout", "soon"], "--timeout"),
            (&["--timeout", "0s"], "positive"),
            (&["-f", "a@b\r\nRCPT TO:<x@y>"], "control character"),
            (&["-F", "Ann\nBcc: x@y"], "control character"),
            (&["a@b\r\nx"], "control character"),
        ] {
            let text = err(args);
            assert!(text.contains(says), "{args:?}: {text}");
        }
    }
}
