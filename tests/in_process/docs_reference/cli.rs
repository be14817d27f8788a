//! `docs/reference/cli.md`: every command, subcommand and flag, walked from clap's own
//! definition (`Cli::command()`), so the page says what `--help` says.
//!
//! Not clap-markdown: it needs clap's default features (colour, suggestions), which a
//! dev-dependency would switch on for the tests' build of the crate as well (Cargo unifies
//! features), changing the very error texts the tests check and rebuilding clap twice; it also
//! leaves out each flag's environment variable, which is half of what this page is for. The
//! walk below is short and reads the same `clap::Command` accessors.

use std::collections::{BTreeMap, BTreeSet};

use clap::CommandFactory as _;

use super::{cell, check, code, page_head, prose};

/// The sendmail interface parses its own options (sendmail's syntax, which clap cannot
/// express); its `--help` text is a constant in its module, read here from the source.
const SENDMAIL_SOURCE: &str = include_str!("../../../src/sendmail/mod.rs");

fn sendmail_help() -> String {
    let start = "const HELP: &str = \"\\\n";
    let from = SENDMAIL_SOURCE
        .find(start)
        .expect("src/sendmail/mod.rs defines HELP as a string starting with \"\\")
        + start.len();
    let len = SENDMAIL_SOURCE[from..]
        .find("\";\n")
        .expect("HELP ends with \";");
    SENDMAIL_SOURCE[from..from + len]
        .replace("\\\"", "\"")
        .replace("\\\\", "\\")
}

fn help_text(text: Option<&clap::builder::StyledStr>) -> String {
    text.map(|t| t.to_string()).unwrap_or_default()
}

/// `--name <VALUE>`, `-s, --name`, `<FILE>`, `--flag [<BOOL>]`.
fn synopsis(arg: &clap::Arg) -> String {
    let value = || {
        let names: Vec<String> = arg
            .get_value_names()
            .map(|n| n.iter().map(|n| format!("<{n}>")).collect())
            .unwrap_or_else(|| vec![format!("<{}>", arg.get_id().as_str().to_uppercase())]);
        names.join(" ")
    };
    let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values())
        || (arg.get_num_args().is_none() && arg.get_action().takes_values());
    if arg.is_positional() {
        let multiple = arg.get_num_args().is_some_and(|n| n.max_values() > 1);
        let v = value();
        let v = if multiple { format!("{v}...") } else { v };
        return if arg.is_required_set() {
            v
        } else {
            format!("[{v}]")
        };
    }
    let mut names = Vec::new();
    if let Some(short) = arg.get_short() {
        names.push(format!("-{short}"));
    }
    if let Some(long) = arg.get_long() {
        names.push(format!("--{long}"));
    }
    let mut out = names.join(", ");
    if takes_value {
        let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
        if optional {
            out.push_str(&format!(" [{}]", value()));
        } else {
            out.push_str(&format!(" {}", value()));
        }
    }
    out
}

/// Notes after a flag's help: its variable, default and choices.
fn details(arg: &clap::Arg, keys: &BTreeMap<String, String>) -> String {
    let mut notes = Vec::new();
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| code(v.get_name()))
        .collect();
    // Boolean flags list true/false as their values: not worth saying.
    let is_bool = values.iter().all(|v| v == "`true`" || v == "`false`");
    if !values.is_empty() && !is_bool {
        notes.push(format!("one of {}", values.join(", ")));
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| match v.to_string_lossy() {
            v if v.is_empty() => "empty".to_string(),
            v => code(&v),
        })
        .collect();
    if !defaults.is_empty() && arg.get_action().takes_values() {
        notes.push(format!("default {}", defaults.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        notes.push(format!("variable {}", code(&env.to_string_lossy())));
    }
    if let Some(key) = keys.get(arg.get_id().as_str()) {
        notes.push(format!("sets {}", code(key)));
    }
    if arg.is_required_set() && !arg.is_positional() {
        notes.push("required".into());
    }
    notes.join("; ")
}

/// One row per argument, its short help in the table; a longer help (several paragraphs, or
/// a laid-out list) follows the table as preformatted text, as `--help` shows it.
fn arg_table(args: &[&clap::Arg], keys: &BTreeMap<String, String>) -> String {
    let mut out = String::from("| Argument | Description | Notes |\n|---|---|---|\n");
    let mut long = String::new();
    for arg in args {
        let short = help_text(arg.get_help().or(arg.get_long_help()));
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            code(&synopsis(arg)),
            cell(&short),
            details(arg, keys)
        ));
        let full = help_text(arg.get_long_help());
        if !full.is_empty() && full != short {
            long.push_str(&format!(
                "\n{}:\n\n```text\n{}\n```\n",
                code(&synopsis(arg)),
                full.trim_end()
            ));
        }
    }
    out.push_str(&long);
    out
}

fn is_shown(arg: &clap::Arg) -> bool {
    !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
}

fn walk(
    command: &clap::Command,
    path: &str,
    inherited: &BTreeSet<String>,
    keys: &BTreeMap<String, String>,
    out: &mut String,
) {
    let own: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|a| is_shown(a))
        // Global flags propagated from a parent are shown once, where they are defined.
        .filter(|a| !(a.is_global_set() && inherited.contains(a.get_id().as_str())))
        .collect();
    let level = path.split(' ').count().min(4) + 1;
    out.push_str(&format!("\n{} {}\n\n", "#".repeat(level), code(path)));
    let about = command.get_long_about().or(command.get_about());
    if let Some(about) = about {
        out.push_str(&format!("{}\n\n", prose(&about.to_string())));
    }
    let usage = command
        .clone()
        .render_usage()
        .to_string()
        .trim_start_matches("Usage:")
        .trim()
        .to_string();
    out.push_str(&format!("```text\n{usage}\n```\n"));
    if path == "idemrelay sendmail" {
        out.push_str(&format!(
            "\nIts options follow sendmail's syntax (`idemrelay sendmail --help`):\n\n```text\n{}```\n",
            sendmail_help()
        ));
    } else {
        let globals: Vec<&clap::Arg> = own.iter().copied().filter(|a| a.is_global_set()).collect();
        let locals: Vec<&clap::Arg> = own.iter().copied().filter(|a| !a.is_global_set()).collect();
        if !locals.is_empty() {
            out.push('\n');
            out.push_str(&arg_table(&locals, keys));
        }
        if !globals.is_empty() {
            let whom = if inherited.is_empty() {
                "every command".to_string()
            } else {
                format!("every {} command", code(path))
            };
            out.push_str(&format!(
                "\nGlobal options, accepted by {whom} (before or after the command name):\n\n"
            ));
            out.push_str(&arg_table(&globals, keys));
        }
    }
    let mut inherited = inherited.clone();
    inherited.extend(
        command
            .get_arguments()
            .filter(|a| a.is_global_set())
            .map(|a| a.get_id().to_string()),
    );
    for sub in command.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let sub_path = format!("{path} {}", sub.get_name());
        // Only the root's globals set configuration keys; a subcommand's own `--listen` (the
        // sink's) is another flag with the same id.
        walk(sub, &sub_path, &inherited, &BTreeMap::new(), out);
    }
}

pub fn render() -> String {
    let mut command = idemrelay::cli::Cli::command();
    // Building sets each subcommand's full name in its usage and propagates the globals.
    command.build();
    let mut out = page_head(
        "Command-line reference",
        "the command-line definition (clap)",
    );
    out.push('\n');
    out.push_str(
        "Every command of `idemrelay`, its arguments and options. Each configuration option \
         also reads the environment variable named beside it; a flag wins over its variable, \
         and both over the configuration file (see the [configuration reference](configuration.md)). \
         `idemrelay COMMAND --help` prints the same text, and `idemrelay man` the manual page.\n",
    );
    let subcommands: Vec<String> = command
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| {
            let about = s.get_about().map(|a| a.to_string()).unwrap_or_default();
            format!("| {} | {} |\n", code(s.get_name()), cell(&about))
        })
        .collect();
    out.push_str("\n| Command | What it does |\n|---|---|\n");
    out.push_str(&subcommands.concat());
    let keys = super::config::flag_keys();
    walk(&command, "idemrelay", &BTreeSet::new(), &keys, &mut out);
    out
}

#[test]
fn cli_page_is_current() {
    check("cli.md", &render());
}

/// The walk finds nested subcommands, global flags once, variables and defaults.
#[test]
fn cli_page_walk_finds_commands_flags_and_variables() {
    let page = render();
    for needle in [
        "## `idemrelay serve`",
        "### `idemrelay key derive`",
        "`--store <STORE>`",
        "variable `IDEMRELAY_STORE`",
        "idemrelay key derive [OPTIONS] --to <TO> <FILE>",
        "default `7BIT`",
        "default empty",
        "variable `IDEMRELAY_RETENTION`; sets `retention`",
        "-t               recipients from the To:",
    ] {
        assert!(page.contains(needle), "missing {needle:?} in\n{page}");
    }
    assert_eq!(
        page.matches("`--store <STORE>`").count(),
        1,
        "a global flag is listed once"
    );
}
