//! `docs/reference/configuration.md`: every configuration key with its type, default,
//! variable, flag, description and an example.
//!
//! Where each part comes from, and why it is trustworthy:
//! - The keys, their order and grouping, the descriptions and the examples come from
//!   `idemrelay.example.toml`: the comment block above each `key = value` line is its
//!   description. Doc comments are not readable at run time, and the example file is already
//!   held to the code by `example_config`: it documents every setting and no unknown one, its
//!   active values are the defaults, and its commented-out examples parse and validate. So a
//!   setting cannot be missing here, and its description is the one users read in the file.
//! - Defaults: an active line's value (the defaults, as `example_holds_the_defaults` checks);
//!   for a commented-out line, what `Settings` holds when the key is left out of the
//!   uncommented example: absent (unset), a value, or a parse error (required).
//! - Types: the example's value, and for strings and empty lists what the `Settings`
//!   deserializer accepts (a duration, an address...); enumerations list the values of the
//!   flag that sets them.
//! - Variables and flags: the global flags of `Cli::command()` (clap's own definition). A flag
//!   sets the key named like its id, or `delivery.` and the id, or `delivery.` and the id
//!   without `upstream_` (`--upstream-connections` sets `delivery.connections`); flags that
//!   set no key are listed in their own section.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use clap::CommandFactory as _;
use idemrelay::config::Settings;

use super::{cell, check, code, page_head, prose};

const EXAMPLE: &str = include_str!("../../../idemrelay.example.toml");

/// Tables whose second segment is a name the user chooses (`[webhooks.NAME]`).
const NAMED_TABLES: &[&str] = &["webhooks"];

#[derive(Debug)]
enum Item {
    /// A banner in the example: a heading, and the text after its first `: ` or `. `.
    Group {
        title: String,
        text: String,
    },
    /// A table header and the comment block above it.
    Table {
        table: String,
        text: String,
    },
    Setting(Setting),
}

#[derive(Debug)]
struct Setting {
    /// Dotted table path as written in the example (`delivery.timeouts`, `webhooks.upstream`).
    table: String,
    key: String,
    /// The value as written.
    literal: String,
    /// Commented out in the example: unset by default (or required in its table).
    commented: bool,
    text: String,
}

impl Setting {
    fn path(&self) -> String {
        if self.table.is_empty() {
            self.key.clone()
        } else {
            format!("{}.{}", self.table, self.key)
        }
    }

    /// The path as users read it: `webhooks.<name>.fields.key`.
    fn shown_path(&self) -> String {
        shown_table(&self.path())
    }
}

fn shown_table(path: &str) -> String {
    let mut parts: Vec<String> = path.split('.').map(String::from).collect();
    if parts.len() > 1 && NAMED_TABLES.contains(&parts[0].as_str()) {
        parts[1] = "<name>".into();
    }
    parts.join(".")
}

/// The key of a `key = value` line (keys are lowercase words with underscores), and its value.
fn setting_line(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.split_once(" = ")?;
    let is_key = !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    is_key.then_some((key, value))
}

fn is_rule(line: &str) -> bool {
    line.strip_prefix("# ")
        .is_some_and(|rest| rest.len() > 10 && rest.bytes().all(|b| b == b'-' || b == b'='))
}

/// Joins comment lines into prose; a lone `#` separates paragraphs.
fn join(lines: &[String]) -> String {
    let mut out = String::new();
    for line in lines {
        if line.is_empty() {
            out.push_str("\n\n");
        } else {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push(' ');
            }
            out.push_str(line);
        }
    }
    out.trim().to_string()
}

fn parse_example(text: &str) -> Vec<Item> {
    let mut items = Vec::new();
    let mut table = String::new();
    let mut pending: Vec<String> = Vec::new();
    let mut in_banner = false;
    let mut seen_first_banner = false;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            pending.clear();
        } else if is_rule(line) {
            if in_banner {
                let banner = join(&pending);
                let cut = [": ", ". "].iter().filter_map(|sep| banner.find(sep)).min();
                let (title, text) = match cut {
                    Some(i) => (banner[..i].to_string(), banner[i + 2..].to_string()),
                    None => (banner.clone(), String::new()),
                };
                let mut text = text;
                if let Some(first) = text.get(..1) {
                    text = first.to_uppercase() + &text[1..];
                }
                items.push(Item::Group { title, text });
                seen_first_banner = true;
            }
            in_banner = !in_banner;
            pending.clear();
        } else if let Some(header) = line
            .strip_prefix('[')
            .or_else(|| line.strip_prefix("# ["))
            .and_then(|h| h.strip_suffix(']'))
        {
            table = header.to_string();
            items.push(Item::Table {
                table: table.clone(),
                text: join(&pending),
            });
            pending.clear();
        } else if let Some((key, literal)) = setting_line(line.strip_prefix("# ").unwrap_or(line)) {
            items.push(Item::Setting(Setting {
                table: table.clone(),
                key: key.to_string(),
                literal: literal.to_string(),
                commented: line.starts_with('#'),
                text: join(&pending),
            }));
            pending.clear();
        } else if let Some(comment) = line.strip_prefix('#') {
            // The file's own preamble (before the first banner) is about the file, not a key.
            if seen_first_banner || in_banner {
                pending.push(comment.trim_start().to_string());
            }
        }
    }
    items
}

/// The example with its commented-out settings and tables switched on.
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest) if setting_line(rest).is_some() || rest.starts_with('[') => rest,
            _ => line,
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

fn lookup<'a>(table: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let mut parts = path.split('.').peekable();
    let mut current = table;
    while let Some(part) = parts.next() {
        let value = current.get(part)?;
        if parts.peek().is_none() {
            return Some(value);
        }
        current = value.as_table()?;
    }
    None
}

fn remove(table: &mut toml::Table, path: &str) {
    let parts: Vec<&str> = path.split('.').collect();
    let mut current = table;
    for part in &parts[..parts.len() - 1] {
        current = current
            .get_mut(*part)
            .and_then(toml::Value::as_table_mut)
            .expect("the path exists");
    }
    current.remove(parts[parts.len() - 1]);
}

/// Whether the settings file `[table] key = literal` parses.
fn parses(table: &str, key: &str, literal: &str) -> bool {
    let text = if table.is_empty() {
        format!("{key} = {literal}\n")
    } else {
        format!("[{table}]\n{key} = {literal}\n")
    };
    Settings::from_toml(&text).is_ok()
}

fn value_of(literal: &str) -> toml::Value {
    let table: toml::Table = format!("v = {literal}").parse().expect("a TOML value");
    table["v"].clone()
}

fn string_type(s: &str) -> Option<&'static str> {
    if humantime::parse_duration(s).is_ok() {
        Some("duration")
    } else if s.parse::<SocketAddr>().is_ok() {
        Some("address")
    } else if s.parse::<ipnet::IpNet>().is_ok() {
        Some("network")
    } else if s.contains("://") {
        Some("URL")
    } else if [".pem", ".toml", ".db"].iter().any(|ext| s.ends_with(ext)) {
        // The example's file names (`certs/cert.pem`, `users.toml`): a path, not a word.
        Some("path")
    } else {
        None
    }
}

/// The type as users write it.
fn type_of(setting: &Setting, choices: Option<&Vec<String>>) -> String {
    let named = NAMED_TABLES
        .iter()
        .any(|t| setting.table == *t || setting.table.starts_with(&format!("{t}.")));
    let probe = |literal: &str| !named && parses(&setting.table, &setting.key, literal);
    match value_of(&setting.literal) {
        toml::Value::Boolean(_) => "boolean".into(),
        toml::Value::Integer(_) => "integer".into(),
        toml::Value::Float(_) => "number".into(),
        toml::Value::String(s) => {
            if let Some(choices) = choices {
                let list: Vec<String> = choices.iter().map(|c| code(&format!("\"{c}\""))).collect();
                return format!("one of {}", list.join(", "));
            }
            let kind = string_type(&s).unwrap_or("string");
            if kind == "address" && probe("\"off\"") {
                "address or `\"off\"`".into()
            } else {
                kind.into()
            }
        }
        toml::Value::Array(items) => {
            let element = match items.first() {
                Some(toml::Value::String(s)) => string_type(s).unwrap_or("string"),
                Some(_) => "value",
                // Empty by default: the first kind of string the deserializer takes.
                None if probe("[\"no such value\"]") => "string",
                None if probe("[\"127.0.0.1:1\"]") => "address",
                None if probe("[\"10.0.0.0/8\"]") => "network",
                None => "value",
            };
            let plural = if element == "address" {
                "addresses"
            } else {
                &format!("{element}s")
            };
            format!("list of {plural}")
        }
        other => other.type_str().into(),
    }
}

/// A flag of the command line, and the variable it reads.
struct Flag {
    long: String,
    env: Option<String>,
    help: String,
}

fn global_flags() -> BTreeMap<String, Flag> {
    let command = idemrelay::cli::Cli::command();
    command
        .get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version") && !a.is_hide_set())
        .filter_map(|a| {
            Some((
                a.get_id().to_string(),
                Flag {
                    long: a.get_long()?.to_string(),
                    env: a.get_env().map(|e| e.to_string_lossy().into_owned()),
                    help: a.get_help().map(|h| h.to_string()).unwrap_or_default(),
                },
            ))
        })
        .collect()
}

/// The values an enumeration flag takes.
fn flag_choices(id: &str) -> Option<Vec<String>> {
    let command = idemrelay::cli::Cli::command();
    let arg = command.get_arguments().find(|a| a.get_id() == id)?;
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    (!values.is_empty()).then_some(values)
}

/// The key a flag's id sets, if any (see the module comment).
fn key_of_flag(id: &str, keys: &[String]) -> Option<String> {
    let candidates = [
        Some(id.to_string()),
        Some(format!("delivery.{id}")),
        id.strip_prefix("upstream_")
            .map(|rest| format!("delivery.{rest}")),
    ];
    candidates.into_iter().flatten().find(|c| keys.contains(c))
}

/// The key each global flag sets, by the flag's id (for the command-line page too).
pub fn flag_keys() -> BTreeMap<String, String> {
    let keys: Vec<String> = parse_example(EXAMPLE)
        .iter()
        .filter_map(|i| match i {
            Item::Setting(s) => Some(s.path()),
            _ => None,
        })
        .collect();
    global_flags()
        .into_keys()
        .filter_map(|id| Some((id.clone(), key_of_flag(&id, &keys)?)))
        .collect()
}

pub fn render() -> String {
    let items = parse_example(EXAMPLE);
    let settings: Vec<&Setting> = items
        .iter()
        .filter_map(|i| match i {
            Item::Setting(s) => Some(s),
            _ => None,
        })
        .collect();
    let keys: Vec<String> = settings.iter().map(|s| s.path()).collect();

    let flags = global_flags();
    let mut flag_of_key: BTreeMap<String, (String, &Flag)> = BTreeMap::new();
    let mut other_flags = Vec::new();
    for (id, flag) in &flags {
        match key_of_flag(id, &keys) {
            Some(key) => {
                flag_of_key.insert(key, (id.clone(), flag));
            }
            None => other_flags.push(flag),
        }
    }

    let full: toml::Table = uncommented(EXAMPLE)
        .parse()
        .expect("the uncommented example");
    let host_name = Settings::default().hostname;
    let default_of = |s: &Setting| -> String {
        if !s.commented {
            return code(&s.literal);
        }
        let mut without = full.clone();
        remove(&mut without, &s.path());
        match Settings::from_toml(&toml::to_string(&without).unwrap()) {
            Err(_) => "required".into(),
            Ok(parsed) => {
                let shown: toml::Table = toml::to_string(&parsed).unwrap().parse().unwrap();
                match lookup(&shown, &s.path()) {
                    None => "unset".into(),
                    Some(toml::Value::String(v)) if *v == host_name => "this host's name".into(),
                    Some(v) => code(&v.to_string()),
                }
            }
        }
    };

    struct Row {
        path: String,
        kind: String,
        default: String,
        env: String,
        flag: String,
    }
    let rows: Vec<Row> = settings
        .iter()
        .map(|s| {
            let flag = flag_of_key.get(&s.path());
            let choices = flag.and_then(|(id, _)| flag_choices(id));
            Row {
                path: s.shown_path(),
                kind: type_of(s, choices.as_ref()),
                default: default_of(s),
                env: flag
                    .and_then(|(_, f)| f.env.as_deref())
                    .map(code)
                    .unwrap_or_default(),
                flag: flag
                    .map(|(_, f)| code(&format!("--{}", f.long)))
                    .unwrap_or_default(),
            }
        })
        .collect();
    let row_of = |path: &str| rows.iter().find(|r| r.path == path).expect("a row per key");

    let mut out = page_head(
        "Configuration reference",
        "`idemrelay.example.toml` and the settings code",
    );
    out.push('\n');
    out.push_str(
        "Every setting of the relay (`idemrelay serve` and the commands that read its settings). \
         Settings come from a TOML file given with `--config FILE` (or `IDEMRELAY_CONFIG`), then \
         from `IDEMRELAY_*` environment variables, then from flags: a flag wins over its \
         variable, and both over the file. Unknown keys in the file are refused. Durations are \
         written the human way: `500ms`, `30s`, `5m`, `3h`, `2days`. \
         `idemrelay check-config` prints the effective settings (validated, secrets redacted). \
         `idemrelay.example.toml` in the repository holds every setting at its default. Flags and \
         commands: the [command-line reference](cli.md).\n\n",
    );
    out.push_str("| Key | Type | Default | Variable | Flag |\n|---|---|---|---|---|\n");
    for r in &rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            code(&r.path),
            r.kind.replace('|', "\\|"),
            r.default.replace('|', "\\|"),
            r.env,
            r.flag
        ));
    }

    for item in &items {
        match item {
            Item::Group { title, text } => {
                out.push_str(&format!("\n## {}\n", prose(title)));
                if !text.is_empty() {
                    out.push_str(&format!("\n{}\n", prose(text)));
                }
            }
            // A table's keys are shown with their full path; its heading only carries a text.
            Item::Table { table, text } if !text.is_empty() => {
                let heading = code(&format!("[{}]", shown_table(table)));
                out.push_str(&format!("\n### {heading}\n\n{}\n", prose(text)));
            }
            Item::Table { .. } => {}
            Item::Setting(s) => {
                let r = row_of(&s.shown_path());
                out.push_str(&format!("\n### {}\n\n", code(&r.path)));
                if !s.text.is_empty() {
                    out.push_str(&format!("{}\n\n", prose(&s.text)));
                }
                out.push_str(&format!("- Type: {}\n- Default: {}\n", r.kind, r.default));
                if !r.env.is_empty() {
                    out.push_str(&format!("- Variable: {}\n", r.env));
                }
                if !r.flag.is_empty() {
                    out.push_str(&format!("- Flag: {}\n", r.flag));
                }
                out.push_str("\n```toml\n");
                if !s.table.is_empty() {
                    out.push_str(&format!("[{}]\n", s.table));
                }
                out.push_str(&format!("{} = {}\n```\n", s.key, s.literal));
            }
        }
    }

    out.push_str("\n## Flags that set no key\n\n");
    out.push_str("Global flags (accepted before or after any command) that are not settings of the file.\n\n");
    out.push_str("| Flag | Variable | Description |\n|---|---|---|\n");
    for f in other_flags {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            code(&format!("--{}", f.long)),
            f.env.as_deref().map(code).unwrap_or_default(),
            cell(&f.help)
        ));
    }
    out
}

#[test]
fn configuration_page_is_current() {
    check("configuration.md", &render());
}

/// The walk reads what it should: a setting of each level, its description, default, type,
/// variable and flag, and a named table's keys under `<name>`.
#[test]
fn configuration_page_walk_finds_every_kind_of_setting() {
    let page = render();
    for needle in [
        "| `listen` | list of addresses | `[\"127.0.0.1:2525\"]` | `IDEMRELAY_LISTEN` | `--listen` |",
        "| `delivery.connections` | integer | `4` | `IDEMRELAY_UPSTREAM_CONNECTIONS` | `--upstream-connections` |",
        "| `delivery.timeouts.dot` | duration | `\"10m\"` |",
        "| `hostname` | string | this host's name | `IDEMRELAY_HOSTNAME` | `--hostname` |",
        "| `missing_key` | one of `\"derive\"`, `\"pass\"`, `\"reject\"` |",
        "| `admin` | address or `\"off\"` |",
        "| `tls_cert` | path | unset |",
        "| `admin_hosts` | list of strings | `[]` |",
        "| `webhooks.<name>.fields.event_type` | string | required |",
        "| `webhooks.<name>.types.accepted` | list of strings | `[]` |",
        "| `submission_allow_networks` | list of networks | `[]` |",
        "Sending the body and waiting for the reply to the final dot",
        "| `--config` | `IDEMRELAY_CONFIG` |",
    ] {
        assert!(page.contains(needle), "missing {needle:?} in\n{page}");
    }
}
