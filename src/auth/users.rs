//! Submission users: who they are (name, scope, allowed senders, own upstream), the rules
//! their names, scopes, patterns and passwords follow, and the password check. The users file
//! (`file.rs`) and its live reload (`live.rs`) build on this; it names neither.

use std::collections::BTreeMap;

use anyhow::bail;
use argon2::{Argon2, PasswordHash, PasswordHasher as _};

use super::verify;
use crate::secret::SecretUrl;
pub use idemrelay_model::Authenticated;

/// Longest user name; SMTP AUTH names are short, and a bound keeps them loggable.
pub const MAX_NAME_LEN: usize = 64;
/// Longest scope, the same bound the idempotency key has (docs/concepts/contract.md "What the relay answers at the end of DATA").
pub const MAX_SCOPE_LEN: usize = 255;
/// Longest sender pattern: an RFC 5321 path is at most 256 octets including `<>`.
pub const MAX_PATTERN_LEN: usize = 254;
/// Shortest password `user add` takes, in characters. AUTH is reachable from wherever the
/// submission listener is; the per-user throttle slows guessing, it cannot make `secret` safe.
pub const MIN_PASSWORD_CHARS: usize = 12;

/// Verified for unknown user names so that a miss costs as much as a wrong password.
/// Made with `Params::DEFAULT` like [`hash_password`]; a test keeps the two in step.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$/vInwvf23mup6TIs4TNmyw$ImOj4q61U52OiJPDtkhtEMBtK+wY4s/GGoQtXzFHzCU";

/// One submission user.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct User {
    /// PHC string, argon2id.
    pub password_hash: String,
    /// Idempotency scope (docs/concepts/contract.md "What the relay answers at the end of DATA").
    pub scope: String,
    /// `a@example.com` exact (case-insensitive) or `@example.com` domain; empty = any sender.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_senders: Vec<String>,
    /// An upstream of the user's own (URL as for `upstream`; may hold a password): the
    /// scope's mail goes there instead of to the relay's upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// The user's submissions wait for the upstream's verdict on every listener
    /// (docs/guides/before-queue.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_queue: bool,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("password_hash", &"<redacted>")
            .field("scope", &self.scope)
            .field("allowed_senders", &self.allowed_senders)
            .field(
                "upstream",
                &self
                    .upstream
                    .as_ref()
                    .map(|u| SecretUrl(u.clone()).redacted()),
            )
            .finish()
    }
}

/// The users file: TOML `[users.<name>]` tables.
#[derive(Debug, Clone, Default)]
pub struct Users {
    pub(super) users: BTreeMap<String, User>,
}

impl Users {
    pub(crate) fn get(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    pub(crate) fn len(&self) -> usize {
        self.users.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Every user's scope with the upstream of its own, if it has one.
    pub(crate) fn scopes(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.users
            .values()
            .map(|u| (u.scope.as_str(), u.upstream.as_deref()))
    }

    /// User names in sorted order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    /// Adds or replaces a user in memory after the same checks the file gets; returns the
    /// user it replaced.
    pub(crate) fn insert(&mut self, name: &str, user: User) -> anyhow::Result<Option<User>> {
        validate_name(name)?;
        validate_scope(&user.scope)?;
        for pattern in &user.allowed_senders {
            validate_sender_pattern(pattern)?;
        }
        if !is_argon2id_phc(&user.password_hash) {
            bail!("the password hash of user {name:?} is not an argon2id PHC string");
        }
        // A scope's mail goes to one upstream: its users must agree on it.
        if let Some((other, _)) = self
            .users
            .iter()
            .find(|(n, u)| *n != name && u.scope == user.scope && u.upstream != user.upstream)
        {
            bail!(
                "users {other:?} and {name:?} share scope {:?} but not their upstream",
                user.scope
            );
        }
        Ok(self.users.insert(name.to_string(), user))
    }

    /// Verifies a password. CPU-heavy (argon2), and blocks while every memory slot is busy:
    /// callers run it in spawn_blocking. Unknown
    /// users still spend one verification against a fixed dummy hash so that timing does not
    /// reveal which names exist.
    pub(crate) fn verify(&self, user: &str, password: &str) -> Option<Authenticated> {
        let Some(entry) = self.users.get(user) else {
            std::hint::black_box(password_matches(DUMMY_HASH, password));
            return None;
        };
        password_matches(&entry.password_hash, password).then(|| Authenticated {
            name: user.to_string(),
            scope: entry.scope.clone(),
            allowed_senders: entry.allowed_senders.clone(),
        })
    }
}

/// argon2id PHC hash with a random salt and the crate's default parameters.
pub fn hash_password(password: &str) -> anyhow::Result<String> {
    let hash = Argon2::default()
        .hash_password(password.as_bytes())
        .map_err(|e| anyhow::anyhow!("hashing password: {e}"))?;
    Ok(hash.to_string())
}

/// In the process's argon2 memory pool (`verify`): a check never allocates its own.
fn password_matches(phc: &str, password: &str) -> bool {
    verify::pool().password_matches(phc, password)
}

/// Checks everything `verify` will need, so a bad hash fails at load time, not at AUTH time.
pub(super) fn is_argon2id_phc(phc: &str) -> bool {
    let Ok(hash) = PasswordHash::new(phc) else {
        return false;
    };
    hash.algorithm == argon2::ARGON2ID_IDENT
        && hash.salt.is_some()
        && hash.hash.is_some()
        && hash
            .version
            .is_none_or(|v| argon2::Version::try_from(v).is_ok())
        && argon2::Params::try_from(&hash).is_ok()
}

pub(super) const NAME_RULE: &str = "use 1-64 characters of A-Z a-z 0-9 . _ @ + -";
pub(super) const SCOPE_RULE: &str =
    "use 1-255 printable characters without leading or trailing blanks";
pub(super) const PATTERN_RULE: &str =
    "use user@example.com (one address) or @example.com (a whole domain)";

pub(super) fn name_ok(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._@+-".contains(c);
    !name.is_empty() && name.len() <= MAX_NAME_LEN && name.chars().all(allowed)
}

pub(super) fn scope_ok(scope: &str) -> bool {
    let length = scope.chars().count();
    // Surrounding blanks would make "acme" and "acme " two scopes that look the same.
    (1..=MAX_SCOPE_LEN).contains(&length)
        && !scope.chars().any(char::is_control)
        && scope.trim() == scope
}

pub(super) fn sender_pattern_ok(pattern: &str) -> bool {
    pattern.len() <= MAX_PATTERN_LEN
        && !pattern
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || "<>,;".contains(c))
        && match pattern.strip_prefix('@') {
            Some(domain) => !domain.contains('@') && domain_ok(domain),
            None => pattern
                .rsplit_once('@')
                .is_some_and(|(local, domain)| !local.is_empty() && domain_ok(domain)),
        }
}

/// Loose on purpose (IDNs, address literals): it only rejects what can never match.
fn domain_ok(domain: &str) -> bool {
    !domain.is_empty()
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !domain.contains("..")
}

// The validate_* forms quote the offending value: they serve `add_user`, whose values the
// operator just typed. The users file reports by line instead (see `file`).

pub(super) fn validate_name(name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(name_ok(name), "invalid user name {name:?}: {NAME_RULE}");
    Ok(())
}

pub(super) fn validate_scope(scope: &str) -> anyhow::Result<()> {
    anyhow::ensure!(scope_ok(scope), "invalid scope {scope:?}: {SCOPE_RULE}");
    Ok(())
}

pub(super) fn validate_sender_pattern(pattern: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        sender_pattern_ok(pattern),
        "invalid sender pattern {pattern:?}: {PATTERN_RULE}"
    );
    Ok(())
}

pub(super) fn validate_password(name: &str, password: &str) -> anyhow::Result<()> {
    if password.is_empty() {
        bail!("the password must not be empty");
    }
    let chars = password.chars().count();
    if chars < MIN_PASSWORD_CHARS {
        bail!(
            "the password is too short ({chars} characters): use at least {MIN_PASSWORD_CHARS} \
             characters, e.g. four random words"
        );
    }
    // PLAIN carries "\0name\0password" in one response; a password that cannot fit there, or
    // that contains NUL, could never be presented, so refuse it now rather than at login.
    if password.contains('\0') {
        bail!("the password must not contain NUL");
    }
    let limit = idemrelay_smtp::sasl::MAX_DECODED_LEN - 2 - name.len();
    if password.len() > limit {
        bail!("the password is too long: at most {limit} bytes for user {name:?}");
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn users_of_one_scope_must_agree_on_their_upstream() {
        let user = |upstream: Option<&str>| User {
            password_hash: cheap_hash("pw"),
            scope: "shared".into(),
            allowed_senders: Vec::new(),
            upstream: upstream.map(str::to_string),
            before_queue: false,
        };
        let mut users = Users::default();
        users.insert("a", user(Some("smtp://x"))).unwrap();
        users.insert("b", user(Some("smtp://x"))).unwrap();
        let err = users.insert("c", user(None)).unwrap_err().to_string();
        assert!(err.contains("share scope"), "{err}");
        assert!(!format!("{:?}", user(Some("smtp://u:secret@x"))).contains("secret"));
    }

    use super::*;

    /// Hashes with tiny parameters: verification follows the parameters stored in the hash,
    /// so tests exercise the real code path without paying for default-cost argon2.
    pub(crate) fn cheap_hash(password: &str) -> String {
        use argon2::CustomizedPasswordHasher as _;
        let params = argon2::Params::new(8, 1, 1, None).expect("valid params");
        Argon2::default()
            .hash_password_with_params(password.as_bytes(), b"fixed-test-salt", params)
            .expect("hash")
            .to_string()
    }

    fn authenticated(allowed_senders: &[&str]) -> Authenticated {
        Authenticated {
            name: "alice".into(),
            scope: "alice".into(),
            allowed_senders: allowed_senders.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn dummy_hash_costs_what_new_hashes_cost() {
        let dummy = PasswordHash::new(DUMMY_HASH).expect("dummy parses");
        let params = argon2::Params::try_from(&dummy).expect("dummy params");
        let default = argon2::Params::DEFAULT;
        assert_eq!(dummy.algorithm, argon2::ARGON2ID_IDENT);
        assert_eq!(
            (params.m_cost(), params.t_cost(), params.p_cost()),
            (default.m_cost(), default.t_cost(), default.p_cost())
        );
        assert!(is_argon2id_phc(DUMMY_HASH));
    }

    #[test]
    fn may_send_as() {
        let cases: &[(&[&str], &str, bool)] = &[
            (&[], "anyone@anywhere.example", true),
            (&[], "", true),
            (&["alice@example.com"], "alice@example.com", true),
            (&["alice@example.com"], "ALICE@Example.COM", true),
            (&["ALICE@EXAMPLE.COM"], "alice@example.com", true),
            (&["alice@example.com"], "<alice@example.com>", true),
            (&["alice@example.com"], "bob@example.com", false),
            (&["alice@example.com"], "alice@example.com.evil", false),
            (&["alice@example.com"], "xalice@example.com", false),
            (&["alice@example.com"], "", false),
            (&["alice@example.com"], "<>", false),
            (&["@example.com"], "bob@example.com", true),
            (&["@example.com"], "Bob@EXAMPLE.com", true),
            (&["@example.com"], "\"a@b\"@example.com", true),
            (&["@example.com"], "bob@sub.example.com", false),
            (&["@example.com"], "bob@evilexample.com", false),
            (&["@example.com"], "example.com", false),
            (&["@example.com"], "", false),
            (
                &["@example.com", "ops@other.example"],
                "ops@other.example",
                true,
            ),
            (
                &["@example.com", "ops@other.example"],
                "dev@other.example",
                false,
            ),
            // ASCII folding only: the Kelvin sign must not stand in for 'k'.
            (&["k@example.com"], "\u{212a}@example.com", false),
            (&["jürgen@example.com"], "JÜRGEN@example.com", false),
            (&["jürgen@example.com"], "JüRGEN@example.com", true),
        ];
        for (patterns, address, want) in cases {
            assert_eq!(
                authenticated(patterns).may_send_as(address),
                *want,
                "{patterns:?} {address:?}"
            );
        }
    }

    #[test]
    fn name_validation() {
        let long = "a".repeat(MAX_NAME_LEN);
        let too_long = "a".repeat(MAX_NAME_LEN + 1);
        let cases: &[(&str, bool)] = &[
            ("alice", true),
            ("alice@example.com", true),
            ("a.b_c+d-e", true),
            ("A9", true),
            (&long, true),
            (&too_long, false),
            ("", false),
            ("al ice", false),
            ("alice\n", false),
            ("jürgen", false),
            ("a/b", false),
            ("a\"b", false),
            ("a]b", false),
        ];
        for (name, want) in cases {
            assert_eq!(validate_name(name).is_ok(), *want, "{name:?}");
        }
    }

    #[test]
    fn scope_validation() {
        let long = "s".repeat(MAX_SCOPE_LEN);
        let too_long = "s".repeat(MAX_SCOPE_LEN + 1);
        let long_utf8 = "é".repeat(MAX_SCOPE_LEN);
        let cases: &[(&str, bool)] = &[
            ("acme", true),
            ("acme prod", true),
            ("tenant/42:eu", true),
            (&long, true),
            (&long_utf8, true),
            (&too_long, false),
            ("", false),
            (" acme", false),
            ("acme ", false),
            ("ac\tme", false),
            ("acme\r\n", false),
            ("ac\u{7f}me", false),
        ];
        for (scope, want) in cases {
            assert_eq!(validate_scope(scope).is_ok(), *want, "{scope:?}");
        }
    }

    #[test]
    fn sender_pattern_validation() {
        let too_long = format!("{}@example.com", "a".repeat(MAX_PATTERN_LEN));
        let cases: &[(&str, bool)] = &[
            ("alice@example.com", true),
            ("@example.com", true),
            ("\"a@b\"@example.com", true),
            ("jürgen@bücher.example", true),
            ("@[192.0.2.1]", true),
            ("", false),
            ("@", false),
            ("alice@", false),
            ("example.com", false),
            ("@@example.com", false),
            ("alice@.example.com", false),
            ("alice@example.com.", false),
            ("alice@example..com", false),
            ("alice @example.com", false),
            ("<alice@example.com>", false),
            ("alice@example.com,bob@example.com", false),
            ("alice@example.com\n", false),
            (&too_long, false),
        ];
        for (pattern, want) in cases {
            assert_eq!(
                validate_sender_pattern(pattern).is_ok(),
                *want,
                "{pattern:?}"
            );
        }
    }

    #[test]
    fn password_validation() {
        let cases: &[(&str, &str, bool)] = &[
            ("alice", "secret", false),
            ("alice", "eleven char", false),
            ("alice", "twelve chars", true),
            // Characters, not bytes: 11 characters in 14 bytes is still too short.
            ("alice", "pässwörd 🔑x", false),
            ("alice", "pässwörd 🔑xy", true),
            ("alice", "", false),
            ("alice", "long sec\0ret", false),
            ("alice", &"p".repeat(1024 - 2 - 5), true),
            ("alice", &"p".repeat(1024 - 2 - 5 + 1), false),
        ];
        for (name, password, want) in cases {
            assert_eq!(
                validate_password(name, password).is_ok(),
                *want,
                "{name:?} password of {} bytes",
                password.len()
            );
        }
    }

    #[test]
    fn verify() {
        let users = Users::parse(&format!(
            "[users.alice]\npassword_hash = \"{}\"\nscope = \"acme\"\n\
             allowed_senders = [\"@example.com\"]\n\n\
             [users.bob]\npassword_hash = \"{}\"\nscope = \"bob\"\n",
            cheap_hash("right"),
            cheap_hash("pässwörd🔑"),
        ))
        .expect("parses");
        let alice = Authenticated {
            name: "alice".into(),
            scope: "acme".into(),
            allowed_senders: vec!["@example.com".into()],
        };
        let bob = Authenticated {
            name: "bob".into(),
            scope: "bob".into(),
            allowed_senders: vec![],
        };
        let cases: &[(&str, &str, Option<&Authenticated>)] = &[
            ("alice", "right", Some(&alice)),
            ("alice", "wrong", None),
            ("alice", "", None),
            ("alice", "right ", None),
            ("alice", "Right", None),
            ("Alice", "right", None),
            ("bob", "pässwörd🔑", Some(&bob)),
            ("bob", "passwörd🔑", None),
            ("bob", "right", None),
            ("mallory", "right", None),
            ("", "", None),
        ];
        for (user, password, want) in cases {
            assert_eq!(
                users.verify(user, password).as_ref(),
                *want,
                "{user:?} {password:?}"
            );
        }
    }

    #[test]
    fn unknown_user_spends_a_full_verification() {
        // Not a timing benchmark, only a guard against the dummy path being skipped: a
        // default-cost argon2 run takes far longer than a map lookup.
        let users = Users::default();
        let start = std::time::Instant::now();
        assert_eq!(users.verify("nobody", "whatever"), None);
        assert!(start.elapsed() > std::time::Duration::from_millis(5));
    }

    #[test]
    fn hash_password_round_trip() {
        let hash = hash_password("correct horse").expect("hash");
        assert!(
            hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{hash}"
        );
        assert!(is_argon2id_phc(&hash));
        assert!(password_matches(&hash, "correct horse"));
        assert!(!password_matches(&hash, "correct horse "));
    }

    #[test]
    fn insert_validates() {
        let good = User {
            password_hash: cheap_hash("pw"),
            scope: "acme".into(),
            allowed_senders: vec!["@example.com".into()],
            upstream: None,
            before_queue: false,
        };
        let cases: &[(&str, User, bool)] = &[
            ("alice", good.clone(), true),
            ("bad name", good.clone(), false),
            (
                "alice",
                User {
                    scope: String::new(),
                    ..good.clone()
                },
                false,
            ),
            (
                "alice",
                User {
                    allowed_senders: vec!["example.com".into()],
                    ..good.clone()
                },
                false,
            ),
            (
                "alice",
                User {
                    password_hash: "plaintext".into(),
                    ..good.clone()
                },
                false,
            ),
        ];
        for (name, user, want) in cases {
            let mut users = Users::default();
            assert_eq!(users.insert(name, user.clone()).is_ok(), *want, "{user:?}");
            assert_eq!(users.len(), usize::from(*want));
        }
    }

    #[test]
    fn debug_redacts_hashes() {
        let hash = cheap_hash("pw");
        let users = Users::parse(&format!(
            "[users.alice]\npassword_hash = \"{hash}\"\nscope = \"acme\"\n"
        ))
        .expect("parses");
        let user = users.get("alice").expect("alice").clone();
        for text in [
            format!("{users:?}"),
            format!("{users:#?}"),
            format!("{user:?}"),
        ] {
            assert!(text.contains("acme"), "{text}");
            assert!(!text.contains(&hash), "{text}");
            assert!(!text.contains("argon2"), "{text}");
        }
    }
}
