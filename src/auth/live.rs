//! The users file in service: read at start, read again on SIGHUP. A file that does not load
//! (or that the caller refuses) leaves the users in service as they were.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::users::Users;

pub(crate) struct LiveUsers {
    path: PathBuf,
    current: RwLock<Arc<Users>>,
}

/// What a reload changed, by user name (names only: nothing else of a user is logged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UsersChange {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Password, scope, allowed senders or upstream differ.
    pub changed: Vec<String>,
    /// Users in service after the reload.
    pub total: usize,
}

impl UsersChange {
    fn between(old: &Users, new: &Users) -> UsersChange {
        let mut change = UsersChange {
            total: new.len(),
            ..UsersChange::default()
        };
        for name in new.names() {
            match old.get(name) {
                None => change.added.push(name.to_string()),
                Some(before) if Some(before) != new.get(name) => {
                    change.changed.push(name.to_string())
                }
                Some(_) => {}
            }
        }
        change.removed = old
            .names()
            .filter(|name| new.get(name).is_none())
            .map(str::to_string)
            .collect();
        change
    }
}

impl fmt::Display for UsersChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |names: &[String]| {
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(" ")
            }
        };
        write!(
            f,
            "{} users; added: {}; removed: {}; changed: {}",
            self.total,
            list(&self.added),
            list(&self.removed),
            list(&self.changed)
        )
    }
}

impl LiveUsers {
    /// Whether `name`'s submissions wait for the upstream's verdict (`before_queue = true` in
    /// the users file in service).
    pub(crate) fn waits_for_verdict(&self, name: &str) -> bool {
        self.current()
            .get(name)
            .is_some_and(|user| user.before_queue)
    }

    pub(crate) fn load(path: &Path) -> anyhow::Result<LiveUsers> {
        Ok(LiveUsers {
            current: RwLock::new(Arc::new(Users::load(path)?)),
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The users in service now; a session keeps what it got for one AUTH.
    pub(crate) fn current(&self) -> Arc<Users> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the file again and puts it in service once `admit` agrees (it sees the new users
    /// before any session can, so it can prepare for them or refuse them). On any error the
    /// users in service stay as they were.
    pub(crate) fn reload(
        &self,
        admit: impl FnOnce(&Users) -> anyhow::Result<()>,
    ) -> anyhow::Result<UsersChange> {
        let new = Users::load(&self.path)?;
        admit(&new)?;
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        let change = UsersChange::between(&current, &new);
        *current = Arc::new(new);
        Ok(change)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::cheap_hash;
    use super::*;

    fn file(entries: &[(&str, &str, &str)]) -> String {
        entries
            .iter()
            .map(|(name, password, scope)| {
                format!(
                    "[users.{name}]\npassword_hash = \"{}\"\nscope = \"{scope}\"\n\n",
                    cheap_hash(password)
                )
            })
            .collect()
    }

    #[test]
    fn reload_swaps_in_a_good_file_and_keeps_the_old_one_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.toml");
        std::fs::write(
            &path,
            file(&[("alice", "alice pw", "a"), ("bob", "bob pw", "b")]),
        )
        .unwrap();
        let live = LiveUsers::load(&path).unwrap();
        assert!(live.current().verify("alice", "alice pw").is_some());

        std::fs::write(
            &path,
            file(&[("alice", "alice pw", "a2"), ("carol", "carol pw", "c")]),
        )
        .unwrap();
        let change = live.reload(|_| Ok(())).unwrap();
        assert_eq!(
            change,
            UsersChange {
                added: vec!["carol".into()],
                removed: vec!["bob".into()],
                changed: vec!["alice".into()],
                total: 2,
            }
        );
        assert_eq!(
            change.to_string(),
            "2 users; added: carol; removed: bob; changed: alice"
        );
        assert!(live.current().verify("carol", "carol pw").is_some());
        assert!(live.current().verify("bob", "bob pw").is_none());

        // Refused by the caller: nothing changes.
        std::fs::write(&path, file(&[("dave", "dave pw", "d")])).unwrap();
        let err = live.reload(|_| anyhow::bail!("not now")).unwrap_err();
        assert_eq!(err.to_string(), "not now");
        assert!(live.current().verify("carol", "carol pw").is_some());
        assert!(live.current().get("dave").is_none());

        // A file that does not parse: the error names the file, the old users stay.
        std::fs::write(&path, "[users.eve]\npassword_hash = 1\n").unwrap();
        let err = format!("{:#}", live.reload(|_| Ok(())).unwrap_err());
        assert!(err.contains("users.toml"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert_eq!(live.current().len(), 2);

        // Gone: the same.
        std::fs::remove_file(&path).unwrap();
        assert!(live.reload(|_| Ok(())).is_err());
        assert_eq!(live.current().len(), 2);
    }
}
