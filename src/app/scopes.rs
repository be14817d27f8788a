//! Where each scope's mail goes, and which scopes share an upstream: at start, and when a
//! reloaded users file is checked before it goes into service.

use std::collections::{BTreeMap, BTreeSet};

use crate::auth::Users;
use crate::delivery::upstream::UpstreamTarget;

/// Where each scope's mail goes: the listener's scope to the relay's upstream, each user's
/// scope to the relay's upstream (`None`) or to its own.
pub(super) fn scope_upstreams(
    default_scope: &str,
    users: Option<&Users>,
) -> BTreeMap<String, Option<String>> {
    std::iter::once((default_scope, None))
        .chain(users.into_iter().flat_map(|u| u.scopes()))
        .map(|(scope, url)| (scope.to_string(), url.map(str::to_string)))
        .collect()
}

/// Whether a reloaded users file can go into service without a restart; if so, the scopes
/// that now share an upstream. New scopes on the relay's upstream are fine; a scope whose
/// upstream is new or differs is not, because the delivery workers hold their upstream
/// connections from the start.
pub(super) fn admit_users(
    running: &BTreeMap<String, Option<String>>,
    default_scope: &str,
    new: &Users,
) -> anyhow::Result<BTreeSet<String>> {
    let wanted = scope_upstreams(default_scope, Some(new));
    for (scope, upstream) in &wanted {
        let before = running.get(scope).cloned().flatten();
        if *upstream != before {
            let shown = |u: &Option<String>| match u {
                Some(url) => crate::secret::SecretUrl(url.clone()).redacted(),
                None => "the relay's upstream".to_string(),
            };
            anyhow::bail!(
                "scope {scope:?} would send to {} instead of {}: restart the relay to change where a scope's mail goes",
                shown(upstream),
                shown(&before)
            );
        }
    }
    Ok(shared_scopes(&wanted))
}

/// Each scope's upstream key space (`intake::KeySpaces`): the account of the upstream a scope
/// alone on it sends to, `None` for a scope sharing its upstream with another here.
pub(super) fn key_spaces(
    scope_upstreams: &BTreeMap<String, Option<String>>,
    relay_upstream: Option<&str>,
) -> crate::intake::KeySpaces {
    let shared = shared_scopes(scope_upstreams);
    scope_upstreams
        .iter()
        .map(|(scope, own)| {
            let space = (!shared.contains(scope))
                .then(|| UpstreamTarget::key_space_of(own.as_deref().or(relay_upstream)));
            (scope.clone(), space)
        })
        .collect()
}

/// The scopes that send to an upstream together with another scope: the key that upstream
/// sees carries the scope.
pub(super) fn shared_scopes(
    scope_upstreams: &BTreeMap<String, Option<String>>,
) -> BTreeSet<String> {
    let mut by_upstream: BTreeMap<Option<&str>, Vec<&str>> = BTreeMap::new();
    for (scope, upstream) in scope_upstreams {
        by_upstream
            .entry(upstream.as_deref())
            .or_default()
            .push(scope);
    }
    by_upstream
        .into_values()
        .filter(|scopes| scopes.len() > 1)
        .flatten()
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reloaded_users_file_may_add_scopes_but_not_move_them() {
        // (user name, scope, upstream of its own)
        type Entry<'a> = (&'a str, &'a str, Option<&'a str>);
        let users = |entries: &[Entry]| {
            let mut users = Users::default();
            for (name, scope, upstream) in entries {
                let user = crate::auth::User {
                    password_hash: crate::auth::tests::cheap_hash("pw"),
                    scope: scope.to_string(),
                    allowed_senders: Vec::new(),
                    upstream: upstream.map(str::to_string),
                    before_queue: false,
                };
                users.insert(name, user).unwrap();
            }
            users
        };
        let at_start = users(&[("alice", "alice", Some("smtp://u:secret@a.example"))]);
        let running = scope_upstreams("default", Some(&at_start));

        // A new user with a scope of its own on the relay's upstream: it and the listener's
        // scope now share that upstream.
        let shared = admit_users(
            &running,
            "default",
            &users(&[
                ("alice", "alice", Some("smtp://u:secret@a.example")),
                ("carol", "carol", None),
            ]),
        )
        .unwrap();
        assert_eq!(shared, BTreeSet::from(["carol".into(), "default".into()]));
        // Removing a user is fine; the same file again shares nothing.
        assert!(admit_users(&running, "default", &users(&[]))
            .unwrap()
            .is_empty());

        let refusals: &[(&[Entry], &str)] = &[
            // A new scope with an upstream of its own.
            (&[("bob", "bob", Some("smtp://b.example"))], "scope \"bob\""),
            // A scope that changes upstream, or loses its own.
            (
                &[("alice", "alice", Some("smtp://other.example"))],
                "scope \"alice\"",
            ),
            (&[("alice", "alice", None)], "scope \"alice\""),
            // The listener's scope taken over by a user with an upstream of its own.
            (
                &[("dave", "default", Some("smtp://d.example"))],
                "scope \"default\"",
            ),
        ];
        for (entries, want) in refusals {
            let err = admit_users(&running, "default", &users(entries))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{entries:?}: {err}");
            assert!(err.contains("restart"), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn only_a_scope_alone_on_its_upstream_names_a_key_space() {
        let map: BTreeMap<String, Option<String>> = [
            ("default".to_string(), None),
            ("bob".to_string(), None),
            (
                "alice".to_string(),
                Some("smtp://u:secret@A.example".to_string()),
            ),
        ]
        .into_iter()
        .collect();
        let spaces = key_spaces(&map, Some("smtp://relay.example:2525?tls=none"));
        assert_eq!(spaces["default"], None);
        assert_eq!(spaces["bob"], None);
        assert_eq!(spaces["alice"].as_deref(), Some("u@a.example:587"));
        let alone: BTreeMap<String, Option<String>> =
            [("default".to_string(), None)].into_iter().collect();
        assert_eq!(
            key_spaces(&alone, Some("smtp://relay.example:2525?tls=none"))["default"].as_deref(),
            Some("relay.example:2525")
        );
        assert_eq!(
            key_spaces(&alone, None)["default"].as_deref(),
            Some("(no upstream)")
        );
    }

    #[test]
    fn scopes_sharing_an_upstream_are_told_apart() {
        let map = |pairs: &[(&str, Option<&str>)]| -> BTreeMap<String, Option<String>> {
            pairs
                .iter()
                .map(|(s, u)| (s.to_string(), u.map(str::to_string)))
                .collect()
        };
        let set =
            |names: &[&str]| -> BTreeSet<String> { names.iter().map(|s| s.to_string()).collect() };
        // One scope alone: the common case, nothing shared.
        assert_eq!(shared_scopes(&map(&[("default", None)])), set(&[]));
        // Users on the relay's upstream share it with the listener's scope.
        assert_eq!(
            shared_scopes(&map(&[
                ("default", None),
                ("bob", None),
                ("alice", Some("smtp://a"))
            ])),
            set(&["bob", "default"])
        );
        // Two scopes naming one upstream of their own share it too.
        assert_eq!(
            shared_scopes(&map(&[
                ("default", None),
                ("a", Some("smtp://x")),
                ("b", Some("smtp://x"))
            ])),
            set(&["a", "b"])
        );
    }
}
