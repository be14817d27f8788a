//! `IDEMRELAY_*` variables: which ones something reads, and errors that name the variable a bad
//! value came from. Pure: the command tree, the variables and the arguments are passed in.

use std::collections::BTreeSet;
use std::ffi::OsString;

/// Read outside clap: by the logger, the upstream client, the crash points and the test suite.
/// A variable missing here would be warned about although something reads it.
const READ_ELSEWHERE: &[&str] = &[
    "IDEMRELAY_LOG",
    "IDEMRELAY_UPSTREAM_PASSWORD",
    // `idemrelay sendmail --auth-user`'s password.
    "IDEMRELAY_SENDMAIL_PASSWORD",
    // Where the config file is looked for without --config (`config::DEFAULT_CONFIG`).
    "IDEMRELAY_DEFAULT_CONFIG",
    "IDEMRELAY_FAILPOINTS",
    "IDEMRELAY_FAILPOINT_SEED",
    // The test suite's own (tests/, benches/, .ci/run): they reach relays it starts.
    "IDEMRELAY_TEST_POSTGRES",
    "IDEMRELAY_TEST_BACKEND",
    "IDEMRELAY_CORPUS",
    // Rewrites the generated reference pages under docs/reference/ (tests/in_process).
    "IDEMRELAY_UPDATE_DOCS",
    "IDEMRELAY_LAZYFS",
    "IDEMRELAY_POWER_LOSS_EATMYDATA",
    "IDEMRELAY_CRASH_SEED",
    "IDEMRELAY_CHAOS_SEED",
    "IDEMRELAY_CHAOS_MESSAGES",
];

/// Every variable a flag of `command` or of its subcommands reads, and those read elsewhere.
pub fn known_variables(command: &clap::Command) -> BTreeSet<String> {
    fn walk(command: &clap::Command, into: &mut BTreeSet<String>) {
        for arg in command.get_arguments() {
            if let Some(env) = arg.get_env() {
                into.insert(env.to_string_lossy().into_owned());
            }
        }
        for sub in command.get_subcommands() {
            walk(sub, into);
        }
    }
    let mut known: BTreeSet<String> = READ_ELSEWHERE.iter().map(|v| v.to_string()).collect();
    walk(command, &mut known);
    known
}

/// One warning per `IDEMRELAY_*` variable that nothing reads. `file_only` are the settings the
/// config file takes without a variable (e.g. `max_errors`): a variable named after one of them
/// gets a hint instead of a silent no-op.
pub fn unknown_variable_warnings(
    known: &BTreeSet<String>,
    file_only: &BTreeSet<String>,
    names: impl IntoIterator<Item = OsString>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for name in names {
        let Some(name) = name.to_str() else { continue };
        let Some(suffix) = name.strip_prefix("IDEMRELAY_") else {
            continue;
        };
        if known.contains(name) {
            continue;
        }
        let setting = suffix.to_ascii_lowercase();
        if file_only.contains(&setting) {
            warnings.push(format!(
                "{name} is ignored: `{setting}` has no variable or flag; set it in the config file (--config)"
            ));
        } else {
            warnings.push(format!("{name} is ignored: it matches no setting"));
        }
    }
    warnings.sort();
    warnings
}

/// When clap refused a value that came from a variable, not from the command line, its message
/// names the flag; this one names the variable. None when the value came from the command line
/// or the error is of another kind.
pub fn blame_variable(
    error: &clap::Error,
    command: &clap::Command,
    args: &[OsString],
    env: impl Fn(&str) -> Option<OsString>,
) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let Some(ContextValue::String(shown)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    // clap shows the argument as `--long-name <VALUE>`.
    let long = shown.strip_prefix("--")?.split([' ', '=']).next()?;
    let variable = find_long(command, long)?
        .get_env()?
        .to_string_lossy()
        .into_owned();
    env(&variable)?;
    let flag = format!("--{long}");
    let on_command_line = args.iter().skip(1).any(|a| {
        a.to_str()
            .is_some_and(|a| a == flag || a.starts_with(&format!("{flag}=")))
    });
    if on_command_line {
        return None;
    }
    let message = error.render().to_string();
    Some(message.replace(
        &format!("'{shown}'"),
        &format!("{variable} (the variable of {flag})"),
    ))
}

fn find_long<'a>(command: &'a clap::Command, long: &str) -> Option<&'a clap::Arg> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_long(sub, long))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    use crate::cli::Cli;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn every_variable_a_flag_reads_is_known_and_others_are_warned_about() {
        let known = known_variables(&Cli::command());
        for v in [
            "IDEMRELAY_STORE",
            "IDEMRELAY_SINK_LISTEN",
            "IDEMRELAY_LOG_FORMAT",
            "IDEMRELAY_LOG",
        ] {
            assert!(known.contains(v), "{v}");
        }
        let file_only = BTreeSet::from(["max_errors".to_string()]);
        let warnings = unknown_variable_warnings(
            &known,
            &file_only,
            os(&[
                "PATH",
                "IDEMRELAY_STORE",
                "IDEMRELAY_MAX_ERRORS",
                "IDEMRELAY_STROE",
            ]),
        );
        assert_eq!(
            warnings,
            [
                "IDEMRELAY_MAX_ERRORS is ignored: `max_errors` has no variable or flag; set it in the config file (--config)",
                "IDEMRELAY_STROE is ignored: it matches no setting",
            ]
        );
    }

    #[test]
    fn a_bad_value_from_a_variable_names_the_variable_and_one_from_a_flag_names_the_flag() {
        let env = |name: &str| (name == "IDEMRELAY_MAX_RECIPIENTS").then(|| OsString::from("abc"));
        let from_flag = os(&["idemrelay", "check-config", "--max-recipients", "abc"]);
        let error = Cli::try_parse_from(&from_flag).unwrap_err();
        assert_eq!(
            blame_variable(&error, &Cli::command(), &from_flag, env),
            None
        );

        // clap words a value read from the variable as it words the flag's: only the command
        // line tells them apart.
        let from_env = os(&["idemrelay", "check-config"]);
        let message = blame_variable(&error, &Cli::command(), &from_env, env).unwrap();
        assert!(
            message.contains("invalid value 'abc' for IDEMRELAY_MAX_RECIPIENTS (the variable of --max-recipients)"),
            "{message}"
        );
        let unset = |_: &str| None;
        assert_eq!(
            blame_variable(&error, &Cli::command(), &from_env, unset),
            None
        );
    }
}
