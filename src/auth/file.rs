//! Reading and writing the users file.
//!
//! Parsing walks toml's spanned document tree instead of using serde, for two reasons:
//! every error can name its line, and no error text can quote a value from the file
//! (serde's "invalid type" messages and toml's snippets both would, hashes included).
//!
//! ```toml
//! [users.alice]
//! password_hash = "$argon2id$v=19$..."
//! scope = "acme"                          # optional, defaults to the user name
//! allowed_senders = ["@example.com"]      # optional, empty = any sender
//! upstream = "smtp://user:pass@smtp.example.net:587"  # optional: an upstream of its own
//! before_queue = true                     # optional: hears the upstream's verdict at DATA
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::Path;

use anyhow::{anyhow, Context as _};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::users::{
    hash_password, is_argon2id_phc, name_ok, scope_ok, sender_pattern_ok, validate_name,
    validate_password, validate_scope, validate_sender_pattern, User, Users, NAME_RULE,
    PATTERN_RULE, SCOPE_RULE,
};

const HEADER: &str = "# idemrelay users file, written by `idemrelay user add`.\n\
                      # Hand edits are fine; comments are not kept on the next write.\n\n";

/// The users file's side of `Users`: reading it and writing one user into it.
impl Users {
    /// Reads and validates a users file; errors name the file and line, never a hash.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Users> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading users file {}", path.display()))?;
        Users::parse(&text).with_context(|| format!("users file {}", path.display()))
    }

    /// Parses and validates the text of a users file.
    pub(crate) fn parse(text: &str) -> anyhow::Result<Users> {
        parse(text)
    }

    /// Adds or replaces a user and writes the file atomically (tmp + rename, mode 0600),
    /// keeping other users; validates scope (1-255 printable chars) and sender patterns.
    ///
    /// A missing file is created; an existing file that does not parse is left alone and
    /// reported, since rewriting it would drop the users we could not read. Comments in the
    /// file are not preserved.
    pub fn add_user(
        path: &Path,
        name: &str,
        password: &str,
        scope: &str,
        allowed_senders: &[String],
    ) -> anyhow::Result<()> {
        validate_name(name)?;
        validate_password(name, password)?;
        validate_scope(scope)?;
        for pattern in allowed_senders {
            validate_sender_pattern(pattern)?;
        }
        let mut users = match std::fs::read_to_string(path) {
            Ok(text) => Users::parse(&text)
                .with_context(|| format!("users file {} (not modified)", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Users::default(),
            Err(e) => {
                return Err(e).with_context(|| format!("reading users file {}", path.display()))
            }
        };
        let user = User {
            password_hash: hash_password(password)?,
            scope: scope.to_string(),
            allowed_senders: allowed_senders.to_vec(),
            // Set in the file by hand; a password change keeps it.
            upstream: users.get(name).and_then(|u| u.upstream.clone()),
            before_queue: users.get(name).is_some_and(|u| u.before_queue),
        };
        users.insert(name, user)?;
        write_atomically(path, &render(&users)?)
            .with_context(|| format!("writing users file {}", path.display()))
    }
}

fn parse(text: &str) -> anyhow::Result<Users> {
    let root =
        DeTable::parse(text).map_err(|e| at(text, e.span().map_or(0, |s| s.start), e.message()))?;
    let mut users = Users::default();
    for (key, value) in root.get_ref().iter() {
        if key.get_ref() != "users" {
            return Err(at(
                text,
                key.span().start,
                &format!(
                    "unknown top-level key {:?}: users go in [users.<name>] tables",
                    key.get_ref().as_ref()
                ),
            ));
        }
        let DeValue::Table(table) = value.get_ref() else {
            return Err(at(
                text,
                key.span().start,
                "`users` must be a table of [users.<name>] tables",
            ));
        };
        for (name, entry) in table.iter() {
            let name_text: &str = name.get_ref();
            // First, so that later messages can quote the name as is.
            if !name_ok(name_text) {
                return Err(at(
                    text,
                    name.span().start,
                    &format!("invalid user name {name_text:?}: {}", NAME_RULE),
                ));
            }
            let user = parse_user(text, name_text, entry)?;
            users
                .insert(name_text, user)
                .map_err(|e| at(text, name.span().start, &e.to_string()))?;
        }
    }
    Ok(users)
}

fn parse_user(text: &str, name: &str, entry: &Spanned<DeValue<'_>>) -> anyhow::Result<User> {
    let DeValue::Table(fields) = entry.get_ref() else {
        return Err(at(
            text,
            entry.span().start,
            &format!("user {name:?} must be a table"),
        ));
    };
    let mut password_hash = None;
    let mut scope = None;
    let mut allowed_senders = Vec::new();
    let mut upstream = None;
    let mut before_queue = false;
    for (key, value) in fields.iter() {
        let line = value.span().start;
        match key.get_ref().as_ref() {
            "password_hash" => {
                let hash = string(value).ok_or_else(|| {
                    at(
                        text,
                        line,
                        &format!("users.{name}.password_hash must be a string"),
                    )
                })?;
                // Checked here too so the error points at the hash's own line.
                if !is_argon2id_phc(hash) {
                    return Err(at(
                        text,
                        line,
                        &format!(
                            "users.{name}.password_hash is not an argon2id PHC string \
                             (set it with `idemrelay user add`)"
                        ),
                    ));
                }
                password_hash = Some(hash.to_string());
            }
            "scope" => {
                let value = string(value).ok_or_else(|| {
                    at(text, line, &format!("users.{name}.scope must be a string"))
                })?;
                if !scope_ok(value) {
                    return Err(at(
                        text,
                        line,
                        &format!("users.{name}.scope is invalid: {}", SCOPE_RULE),
                    ));
                }
                scope = Some(value.to_string());
            }
            "allowed_senders" => {
                let not_strings = || {
                    at(
                        text,
                        line,
                        &format!("users.{name}.allowed_senders must be an array of strings"),
                    )
                };
                let DeValue::Array(items) = value.get_ref() else {
                    return Err(not_strings());
                };
                for item in items.iter() {
                    let pattern = string(item).ok_or_else(not_strings)?;
                    if !sender_pattern_ok(pattern) {
                        return Err(at(
                            text,
                            item.span().start,
                            &format!(
                                "users.{name}.allowed_senders has an invalid pattern: {}",
                                PATTERN_RULE
                            ),
                        ));
                    }
                    allowed_senders.push(pattern.to_string());
                }
            }
            "upstream" => {
                let value = string(value)
                    .filter(|u| u.starts_with("smtp://") || u.starts_with("smtps://"))
                    .ok_or_else(|| {
                        at(
                            text,
                            line,
                            &format!("users.{name}.upstream must be an smtp:// or smtps:// URL"),
                        )
                    })?;
                upstream = Some(value.to_string());
            }
            "before_queue" => {
                let DeValue::Boolean(on) = value.get_ref() else {
                    return Err(at(
                        text,
                        line,
                        &format!("users.{name}.before_queue must be true or false"),
                    ));
                };
                before_queue = *on;
            }
            other => {
                return Err(at(
                    text,
                    key.span().start,
                    &format!(
                        "unknown key {other:?} for user {name:?} \
                         (expected password_hash, scope, allowed_senders, upstream, before_queue)"
                    ),
                ))
            }
        }
    }
    let password_hash = password_hash.ok_or_else(|| {
        at(
            text,
            entry.span().start,
            &format!("user {name:?} has no password_hash"),
        )
    })?;
    Ok(User {
        password_hash,
        // docs/concepts/contract.md "What the relay answers at the end of DATA": keys are scoped by the authenticated user unless told otherwise.
        scope: scope.unwrap_or_else(|| name.to_string()),
        allowed_senders,
        upstream,
        before_queue,
    })
}

fn string<'a>(value: &'a Spanned<DeValue<'_>>) -> Option<&'a str> {
    value.get_ref().as_str()
}

/// An error that names a line and column and nothing else from the file.
fn at(text: &str, offset: usize, message: &str) -> anyhow::Error {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    anyhow!("line {line}, column {column}: {message}")
}

fn render(users: &Users) -> anyhow::Result<String> {
    #[derive(serde::Serialize)]
    struct File<'a> {
        users: &'a BTreeMap<String, User>,
    }
    let body = toml::to_string(&File {
        users: &users.users,
    })
    .context("serialising users")?;
    Ok(format!("{HEADER}{body}"))
}

/// Replaces `path` so that readers see the old file or the new one, never a torn write, and
/// the new file is never readable by others, not even between create and chmod.
fn write_atomically(path: &Path, contents: &str) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| anyhow!("{} is not a file path", path.display()))?;
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".{}.{}.{nonce}.tmp",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = write_then_rename(path, &tmp, dir, contents);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn write_then_rename(path: &Path, tmp: &Path, dir: &Path, contents: &str) -> anyhow::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        // The umask may only remove bits, but an explicit chmod makes "0600" a fact.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        // When root edits a file the relay reads as its own user, keep that user's ownership
        // or the relay could no longer read it. Best effort: an unprivileged editor cannot
        // give files away, and then ownership is already what it can be.
        if let Ok(old) = fs::metadata(path) {
            let _ = std::os::unix::fs::fchown(&file, Some(old.uid()), Some(old.gid()));
        }
    }
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    drop(file);
    fs::rename(tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    // The rename itself is durable only once the directory entry is on disk.
    #[cfg(unix)]
    fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::cheap_hash;
    use super::*;

    fn user_table(name: &str, body: &str) -> String {
        format!("[users.{name}]\n{body}")
    }

    #[test]
    fn parse_valid() {
        let hash = cheap_hash("pw");
        // (case, file text, [(user, scope, allowed senders)])
        type Expected = Vec<(&'static str, &'static str, Vec<&'static str>)>;
        let cases: Vec<(&str, String, Expected)> = vec![
            ("empty file", String::new(), vec![]),
            ("comments only", "# nobody yet\n".into(), vec![]),
            ("empty users table", "[users]\n".into(), vec![]),
            (
                "scope defaults to the name",
                user_table("alice", &format!("password_hash = \"{hash}\"\n")),
                vec![("alice", "alice", vec![])],
            ),
            (
                "all fields, quoted name",
                user_table(
                    "\"ops@example.com\"",
                    &format!(
                        "password_hash = '{hash}'\nscope = \"acme prod\"\n\
                         allowed_senders = [\"@example.com\", \"Boss@Other.example\"]\n"
                    ),
                ),
                vec![(
                    "ops@example.com",
                    "acme prod",
                    vec!["@example.com", "Boss@Other.example"],
                )],
            ),
            (
                "inline tables",
                format!("users = {{ a = {{ password_hash = \"{hash}\", scope = \"s\" }} }}\n"),
                vec![("a", "s", vec![])],
            ),
            (
                "two users",
                format!(
                    "{}\n{}",
                    user_table("a", &format!("password_hash = \"{hash}\"\n")),
                    user_table("b", &format!("password_hash = \"{hash}\"\nscope = \"a\"\n")),
                ),
                vec![("a", "a", vec![]), ("b", "a", vec![])],
            ),
        ];
        for (name, text, want) in cases {
            let users = parse(&text).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert_eq!(users.len(), want.len(), "{name}");
            assert_eq!(users.is_empty(), want.is_empty(), "{name}");
            for (user, scope, senders) in want {
                let got = users.get(user).unwrap_or_else(|| panic!("{name}: {user}"));
                assert_eq!(got.password_hash, hash, "{name}");
                assert_eq!(got.scope, scope, "{name}");
                assert_eq!(got.allowed_senders, senders, "{name}");
            }
        }
    }

    #[test]
    fn parse_errors_name_the_line_and_never_the_hash() {
        let hash = cheap_hash("pw");
        let ok = format!("password_hash = \"{hash}\"\n");
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "unterminated hash string",
                format!("[users.alice]\npassword_hash = \"{hash}\nscope = \"s\"\n"),
                "line 2,",
            ),
            (
                "bare hash",
                format!("[users.alice]\npassword_hash = {hash}\n"),
                "line 2,",
            ),
            (
                "junk after the hash",
                format!("[users.alice]\npassword_hash = \"{hash}\" x\n"),
                "line 2,",
            ),
            (
                "duplicate key",
                format!("[users.alice]\n{ok}password_hash = \"{hash}\"\n"),
                "line 3, column 1: duplicate key",
            ),
            (
                "hash is not argon2id",
                format!(
                    "[users.alice]\npassword_hash = \"{}\"\n",
                    hash.replace("argon2id", "argon2i")
                ),
                "line 2, column 17: users.alice.password_hash is not an argon2id PHC string",
            ),
            (
                "hash is plaintext",
                "[users.alice]\npassword_hash = \"hunter2-secret\"\n".into(),
                "line 2, column 17: users.alice.password_hash is not",
            ),
            (
                "hash in the wrong field",
                format!("[users.alice]\n{ok}allowed_senders = \"{hash}\"\n"),
                "line 3, column 19: users.alice.allowed_senders must be an array of strings",
            ),
            (
                "hash under an unknown key",
                format!("[users.alice]\n{ok}password = \"{hash}\"\n"),
                "line 3, column 1: unknown key \"password\" for user \"alice\"",
            ),
            (
                "hash as the scope",
                format!("[users.alice]\n{ok}scope = \"{hash}\\n\"\n"),
                "line 3, column 9: users.alice.scope is invalid",
            ),
            (
                "hash is not a string",
                "[users.alice]\npassword_hash = 42\n".into(),
                "line 2, column 17: users.alice.password_hash must be a string",
            ),
            (
                "no hash",
                "# users\n\n[users.alice]\nscope = \"s\"\n".into(),
                "line 3, column 1: user \"alice\" has no password_hash",
            ),
            (
                "bad user name",
                format!("[users.\"al ice\"]\n{ok}"),
                "line 1, column 8: invalid user name \"al ice\"",
            ),
            (
                "bad sender pattern",
                format!("[users.a]\n{ok}allowed_senders = [\"@x.example\", \"x.example\"]\n"),
                "line 3, column 34: users.a.allowed_senders has an invalid pattern",
            ),
            (
                "sender pattern not a string",
                format!("[users.a]\n{ok}allowed_senders = [1]\n"),
                "line 3, column 19: users.a.allowed_senders must be an array of strings",
            ),
            (
                "empty scope",
                format!("[users.a]\n{ok}scope = \"\"\n"),
                "line 3, column 9: users.a.scope is invalid",
            ),
            (
                "user is not a table",
                "[users]\nalice = \"x\"\n".into(),
                "line 2, column 9: user \"alice\" must be a table",
            ),
            (
                "users is not a table",
                format!("users = \"{hash}\"\n"),
                "line 1, column 1: `users` must be a table",
            ),
            (
                "typo in the table name",
                format!("[user.alice]\n{ok}"),
                "line 1, column 2: unknown top-level key \"user\"",
            ),
        ];
        for (name, text, want) in cases {
            let err = format!("{:#}", parse(&text).expect_err(name));
            assert!(err.contains(want), "{name}: {err}");
            assert!(!err.contains(&hash), "{name} echoes the hash: {err}");
            assert!(!err.contains("hunter2"), "{name} echoes the value: {err}");
            assert!(!err.contains("$argon2"), "{name} echoes the hash: {err}");
        }
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("users.toml");
        let hash = cheap_hash("pw");
        let cases: Vec<(&str, Option<String>, Option<&str>)> = vec![
            ("missing file", None, Some("reading users file")),
            (
                "malformed",
                Some(format!("[users.a]\npassword_hash = \"{hash}\n")),
                Some("line 2,"),
            ),
            (
                "valid",
                Some(format!("[users.a]\npassword_hash = \"{hash}\"\n")),
                None,
            ),
        ];
        for (name, contents, want_error) in cases {
            let _ = fs::remove_file(&path);
            if let Some(contents) = contents {
                fs::write(&path, contents).expect("write");
            }
            match (Users::load(&path), want_error) {
                (Ok(users), None) => assert_eq!(users.len(), 1, "{name}"),
                (Err(e), Some(want)) => {
                    let e = format!("{e:#}");
                    assert!(e.contains(&path.display().to_string()), "{name}: {e}");
                    assert!(e.contains(want), "{name}: {e}");
                    assert!(!e.contains(&hash), "{name}: {e}");
                }
                (result, _) => panic!("{name}: {result:?}"),
            }
        }
    }

    #[test]
    fn add_user_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("users.toml");
        let senders = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();

        Users::add_user(&path, "alice", "first password", "acme", &[]).expect("add alice");
        Users::add_user(
            &path,
            "ops@example.com",
            "pässwörd🔑 für ops",
            "ops",
            &senders(&["@example.com"]),
        )
        .expect("add ops");
        // Replacing keeps the other user and takes the new password, scope and senders.
        Users::add_user(
            &path,
            "alice",
            "second password",
            "acme2",
            &senders(&["a@example.com"]),
        )
        .expect("replace alice");

        let users = Users::load(&path).expect("load");
        assert_eq!(
            users.names().collect::<Vec<_>>(),
            ["alice", "ops@example.com"]
        );
        // (user, password, Some((scope, allowed senders)) if it verifies)
        type Outcome = Option<(&'static str, &'static [&'static str])>;
        let cases: &[(&str, &str, Outcome)] = &[
            (
                "alice",
                "second password",
                Some(("acme2", &["a@example.com"])),
            ),
            ("alice", "first password", None),
            (
                "ops@example.com",
                "pässwörd🔑 für ops",
                Some(("ops", &["@example.com"])),
            ),
        ];
        for (user, password, want) in cases {
            let got = users.verify(user, password);
            let got = got
                .as_ref()
                .map(|a| (a.scope.as_str(), a.allowed_senders.clone()));
            let want = want.map(|(scope, s)| (scope, senders(s)));
            assert_eq!(got, want, "{user} {password}");
        }

        let text = fs::read_to_string(&path).expect("read");
        assert!(text.starts_with("# idemrelay users file"), "{text}");
        assert!(text.contains("[users.\"ops@example.com\"]"), "{text}");
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .filter(|n| n != "users.toml")
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = fs::metadata(&path).expect("metadata").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    #[cfg(unix)]
    fn add_user_tightens_an_open_file() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("users.toml");
        fs::write(&path, "").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        Users::add_user(&path, "alice", "a long enough pw", "alice", &[]).expect("add");
        let mode = fs::metadata(&path).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn add_user_refuses_bad_input_and_leaves_the_file_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("users.toml");
        let hash = cheap_hash("pw");
        let original = format!("[users.keep]\npassword_hash = \"{hash}\"\n");
        let malformed = format!("[users.keep]\npassword_hash = \"{hash}\n");
        let many = |s: &str| vec![s.to_string()];
        let long_scope = "s".repeat(256);
        // (case, file before, user, password, senders, scope, expected error)
        type Refusal<'a> = (
            &'a str,
            &'a str,
            &'a str,
            &'a str,
            Vec<String>,
            &'a str,
            &'a str,
        );
        let cases: Vec<Refusal> = vec![
            (
                "bad name",
                &original,
                "al ice",
                "a long enough pw",
                vec![],
                "s",
                "invalid user name",
            ),
            (
                "empty name",
                &original,
                "",
                "a long enough pw",
                vec![],
                "s",
                "invalid user name",
            ),
            (
                "short password",
                &original,
                "alice",
                "eleven char",
                vec![],
                "s",
                "at least 12 characters",
            ),
            (
                "empty password",
                &original,
                "alice",
                "",
                vec![],
                "s",
                "password must not be empty",
            ),
            (
                "empty scope",
                &original,
                "alice",
                "a long enough pw",
                vec![],
                "",
                "invalid scope",
            ),
            (
                "control in scope",
                &original,
                "alice",
                "a long enough pw",
                vec![],
                "a\u{1b}b",
                "invalid scope",
            ),
            (
                "long scope",
                &original,
                "alice",
                "a long enough pw",
                vec![],
                &long_scope,
                "invalid scope",
            ),
            (
                "bad pattern",
                &original,
                "alice",
                "a long enough pw",
                many("example.com"),
                "s",
                "invalid sender pattern",
            ),
            (
                "malformed file",
                &malformed,
                "alice",
                "a long enough pw",
                vec![],
                "s",
                "not modified",
            ),
        ];
        for (name, contents, user, password, senders, scope, want) in cases {
            fs::write(&path, contents).expect("write");
            let err = Users::add_user(&path, user, password, scope, &senders).expect_err(name);
            let err = format!("{err:#}");
            assert!(err.contains(want), "{name}: {err}");
            assert!(!err.contains(&hash), "{name}: {err}");
            assert_eq!(
                fs::read_to_string(&path).expect("read"),
                *contents,
                "{name}"
            );
        }
    }

    #[test]
    fn error_position() {
        let cases: &[(&str, usize, &str)] = &[
            ("", 0, "line 1, column 1: m"),
            ("abc", 2, "line 1, column 3: m"),
            ("a\nbc\n", 2, "line 2, column 1: m"),
            ("a\nbc\n", 4, "line 2, column 3: m"),
            ("é\nü", 5, "line 2, column 2: m"),
            ("é\nü", 4, "line 2, column 1: m"),
            ("abc", 99, "line 1, column 4: m"),
        ];
        for (text, offset, want) in cases {
            assert_eq!(
                at(text, *offset, "m").to_string(),
                *want,
                "{text:?} {offset}"
            );
        }
    }
}
