//! Several Postgres hosts in one store URL, written the way libpq takes them:
//! `postgres://USER@HOST1:PORT1,HOST2:PORT2/DB?target_session_attrs=read-write`.
//!
//! sqlx 0.8 connects to the one host of its URL and ignores `target_session_attrs` (a URL with
//! two hosts does not even parse), so the relay picks the host itself, as libpq would: each
//! host in the URL's order, the first whose server takes writes. `read-write` (the default
//! with several hosts) asks `SHOW transaction_read_only`, libpq's own test; `primary` asks
//! `pg_is_in_recovery()`. The pool's connections go to that host; each new one is checked the
//! same way, so none is ever made to a standby; and when the store's health probe fails, the
//! list is walked again, so that after a failover the pool's next connections go to the
//! promoted standby, and connections made before the move are not handed out again.
//!
//! A URL with one host and no `target_session_attrs` is used exactly as sqlx reads it.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::Connection;

use crate::record::StoreError;

/// What a server must be for the store to use it (`target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// Whatever answers (libpq's `any`; the default with one host).
    Any,
    /// Takes writes by default (libpq's `read-write`; the default with several hosts).
    ReadWrite,
    /// Not in recovery (libpq's `primary`).
    Primary,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Any => "any",
            Target::ReadWrite => "read-write",
            Target::Primary => "primary",
        }
    }
}

/// A store URL split into one single-host URL per host (credentials, database and the other
/// parameters repeated in each), in the URL's order.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Split {
    /// (`host[:port]` as written, for logs: never the credentials; the URL for sqlx).
    pub(super) hosts: Vec<(String, String)>,
    pub(super) target: Target,
}

/// Splits `url`; pure, so that the forms operators write are unit-tested.
pub(super) fn split(url: &str) -> Result<Split, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(Split {
            hosts: vec![(String::new(), url.to_string())],
            target: Target::Any,
        });
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // A password may hold `@` only percent-encoded, so the last `@` ends the user part.
    let (userinfo, host_list) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    let (tail, target) = take_target(tail)?;
    let hosts: Vec<&str> = host_list.split(',').collect();
    if hosts.len() > 1 && hosts.iter().any(|h| h.is_empty()) {
        return Err(format!("empty host in the host list {host_list:?}"));
    }
    let target = match target {
        Some(t) => t,
        // Several hosts exist to find the one that takes writes: libpq's default (`any`)
        // would stay on a standby listed first and fail every write.
        None if hosts.len() > 1 => Target::ReadWrite,
        None => Target::Any,
    };
    Ok(Split {
        hosts: hosts
            .into_iter()
            .map(|h| (h.to_string(), format!("{scheme}://{userinfo}{h}{tail}")))
            .collect(),
        target,
    })
}

/// Takes `target_session_attrs` out of the path-and-query part (sqlx would warn that it
/// ignores it); the other parameters are kept byte for byte.
fn take_target(tail: &str) -> Result<(String, Option<Target>), String> {
    let (before_fragment, fragment) = match tail.find('#') {
        Some(i) => tail.split_at(i),
        None => (tail, ""),
    };
    let Some((path, query)) = before_fragment.split_once('?') else {
        return Ok((tail.to_string(), None));
    };
    let mut target = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "target_session_attrs" {
            kept.push(pair);
            continue;
        }
        target = Some(match value {
            "any" => Target::Any,
            "read-write" => Target::ReadWrite,
            "primary" => Target::Primary,
            other => {
                return Err(format!(
                    "target_session_attrs={other}: the store writes, so it takes any, \
                     read-write or primary"
                ))
            }
        });
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    Ok((format!("{path}{query}{fragment}"), target))
}

struct Host {
    label: String,
    options: PgConnectOptions,
}

/// The store's hosts and which one its pool connects to.
pub(super) struct Hosts {
    hosts: Vec<Host>,
    target: Target,
    /// The host the pool's new connections go to (an index into `hosts`).
    current: AtomicUsize,
    /// When the pool last moved to another host: connections older than that were made to
    /// the host it left.
    moved_at: Mutex<Option<Instant>>,
    /// One walk of the list at a time (several tasks may find the store failing at once).
    walking: tokio::sync::Mutex<()>,
}

impl Hosts {
    /// Reads the URL; `tune` is applied to every host's options (the application name).
    pub(super) fn parse(
        url: &str,
        tune: impl Fn(PgConnectOptions) -> PgConnectOptions,
    ) -> Result<Hosts, StoreError> {
        let split = split(url).map_err(|e| StoreError::Config(format!("store URL: {e}")))?;
        let mut hosts = Vec::with_capacity(split.hosts.len());
        for (label, one) in split.hosts {
            hosts.push(Host {
                label,
                options: tune(PgConnectOptions::from_str(&one)?),
            });
        }
        Ok(Hosts {
            hosts,
            target: split.target,
            current: AtomicUsize::new(0),
            moved_at: Mutex::new(None),
            walking: tokio::sync::Mutex::new(()),
        })
    }

    /// Whether there is another host to move to.
    pub(super) fn several(&self) -> bool {
        self.hosts.len() > 1
    }

    /// The options of the host the pool connects to.
    pub(super) fn current(&self) -> PgConnectOptions {
        self.hosts[self.current.load(Ordering::Relaxed)]
            .options
            .clone()
    }

    /// Whether the server of `conn` is one the store may use.
    async fn suits(&self, conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        Ok(match self.target {
            Target::Any => true,
            Target::ReadWrite => {
                let read_only: String = sqlx::query_scalar("SHOW transaction_read_only")
                    .fetch_one(&mut *conn)
                    .await?;
                read_only == "off"
            }
            Target::Primary => {
                let recovering: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                    .fetch_one(&mut *conn)
                    .await?;
                !recovering
            }
        })
    }

    /// For the pool's `after_connect`: refuses a connection to a server that does not suit
    /// (a standby, or a primary not promoted yet), so it is closed instead of used.
    pub(super) async fn check(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        if self.suits(conn).await? {
            return Ok(());
        }
        let label = &self.hosts[self.current.load(Ordering::Relaxed)].label;
        Err(sqlx::Error::Configuration(
            format!(
                "the server at {label} is not {} (target_session_attrs)",
                self.target.name()
            )
            .into(),
        ))
    }

    /// For the pool's `before_acquire`: false for a connection made before the pool moved to
    /// another host (it may still reach the old one, demoted or cut off).
    pub(super) fn fresh(&self, age: Duration) -> bool {
        let moved_at = *self.moved_at.lock().unwrap_or_else(|e| e.into_inner());
        moved_at.is_none_or(|at| age < at.elapsed())
    }

    /// The first host, in the URL's order, whose server suits; each is given `within` to
    /// answer. With one host and no target, that host, unasked (as before hosts were lists).
    pub(super) async fn first_suitable(&self, within: Duration) -> Result<usize, StoreError> {
        if self.hosts.len() == 1 && self.target == Target::Any {
            return Ok(0);
        }
        let mut why = Vec::new();
        for (i, host) in self.hosts.iter().enumerate() {
            let tried = tokio::time::timeout(within, async {
                let mut conn = PgConnection::connect_with(&host.options).await?;
                let suits = self.suits(&mut conn).await;
                let _ = conn.close().await;
                suits
            })
            .await;
            match tried {
                Ok(Ok(true)) => return Ok(i),
                Ok(Ok(false)) => why.push(format!("{}: not {}", host.label, self.target.name())),
                Ok(Err(err)) => why.push(format!("{}: {err}", host.label)),
                Err(_) => why.push(format!("{}: no answer within {within:?}", host.label)),
            }
        }
        Err(StoreError::Unavailable(sqlx::Error::Configuration(
            format!(
                "no host is {} (target_session_attrs): {}",
                self.target.name(),
                why.join("; ")
            )
            .into(),
        )))
    }

    /// Makes `i` the host new connections go to (at start, before the pool exists).
    pub(super) fn start_at(&self, i: usize) {
        self.current.store(i, Ordering::Relaxed);
        if self.several() {
            tracing::info!(
                target: "idemrelay::store",
                host = %self.hosts[i].label,
                hosts = self.hosts.len(),
                target_session_attrs = self.target.name(),
                "the store's connections go to this host of the URL"
            );
        }
    }

    /// Walks the list again and moves `pool` to the first host that suits, if that is not
    /// the one it uses; `tune` turns a host's options into the pool's (session settings).
    pub(super) async fn follow(
        &self,
        pool: &PgPool,
        within: Duration,
        tune: impl Fn(PgConnectOptions) -> PgConnectOptions,
    ) -> Result<(), StoreError> {
        let _one_walk = self.walking.lock().await;
        let found = self.first_suitable(within).await?;
        let was = self.current.load(Ordering::Relaxed);
        if found != was {
            pool.set_connect_options(tune(self.hosts[found].options.clone()));
            *self.moved_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            self.current.store(found, Ordering::Relaxed);
            tracing::warn!(
                target: "idemrelay::store",
                from = %self.hosts[was].label,
                to = %self.hosts[found].label,
                "the store's connections now go to another host of the URL (failover)"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(split: &Split) -> Vec<&str> {
        split.hosts.iter().map(|(_, u)| u.as_str()).collect()
    }

    #[test]
    fn one_host_without_a_target_is_used_as_written() {
        for url in [
            "postgres://relay@db.example:5432/idemrelay",
            "postgresql://relay:s3cr%40t@db/idemrelay?sslmode=require&options[search_path]=x",
            "postgres:///idemrelay?host=/run/postgresql",
            "postgres://localhost",
        ] {
            let split = split(url).unwrap();
            assert_eq!(urls(&split), vec![url]);
            assert_eq!(split.target, Target::Any, "{url}");
        }
    }

    #[test]
    fn several_hosts_become_one_url_each_and_default_to_read_write() {
        let split = split(
            "postgres://relay:pw%2Fx@10.0.0.1:5432,10.0.0.2:5433,db3/idemrelay\
             ?sslmode=require&options[search_path]=relay",
        )
        .unwrap();
        assert_eq!(split.target, Target::ReadWrite);
        assert_eq!(
            split.hosts,
            vec![
                (
                    "10.0.0.1:5432".to_string(),
                    "postgres://relay:pw%2Fx@10.0.0.1:5432/idemrelay\
                     ?sslmode=require&options[search_path]=relay"
                        .to_string()
                ),
                (
                    "10.0.0.2:5433".to_string(),
                    "postgres://relay:pw%2Fx@10.0.0.2:5433/idemrelay\
                     ?sslmode=require&options[search_path]=relay"
                        .to_string()
                ),
                (
                    "db3".to_string(),
                    "postgres://relay:pw%2Fx@db3/idemrelay\
                     ?sslmode=require&options[search_path]=relay"
                        .to_string()
                ),
            ]
        );
        // Each is one sqlx reads: its own host and port, the shared user, password, database.
        let options: Vec<PgConnectOptions> = urls(&split)
            .into_iter()
            .map(|u| PgConnectOptions::from_str(u).unwrap())
            .collect();
        let hosts: Vec<(&str, u16)> = options
            .iter()
            .map(|o| (o.get_host(), o.get_port()))
            .collect();
        assert_eq!(
            hosts,
            vec![("10.0.0.1", 5432), ("10.0.0.2", 5433), ("db3", 5432)]
        );
        for o in &options {
            assert_eq!(o.get_username(), "relay");
            assert_eq!(o.get_database(), Some("idemrelay"));
            assert_eq!(o.get_options(), Some("-c search_path=relay"));
        }
    }

    #[test]
    fn target_session_attrs_is_read_and_taken_out() {
        let parsed = split("postgres://u@a:1,b:2/db?target_session_attrs=primary").unwrap();
        assert_eq!(parsed.target, Target::Primary);
        assert_eq!(
            urls(&parsed),
            vec!["postgres://u@a:1/db", "postgres://u@b:2/db"]
        );

        let parsed =
            split("postgres://u@a/db?sslmode=disable&target_session_attrs=read-write&x=1").unwrap();
        assert_eq!(parsed.target, Target::ReadWrite);
        assert_eq!(urls(&parsed), vec!["postgres://u@a/db?sslmode=disable&x=1"]);

        // `any` is libpq's, kept for a URL shared with other tools.
        let parsed = split("postgres://a:1,b:2/db?target_session_attrs=any").unwrap();
        assert_eq!(parsed.target, Target::Any);
    }

    #[test]
    fn bracketed_ipv6_hosts_keep_their_ports() {
        let split = split("postgres://u@[::1]:5432,[fd00::2]:5433/db").unwrap();
        assert_eq!(
            urls(&split),
            vec![
                "postgres://u@[::1]:5432/db",
                "postgres://u@[fd00::2]:5433/db"
            ]
        );
        let ports: Vec<u16> = urls(&split)
            .into_iter()
            .map(|u| PgConnectOptions::from_str(u).unwrap().get_port())
            .collect();
        assert_eq!(ports, vec![5432, 5433]);
    }

    #[test]
    fn targets_that_cannot_write_and_empty_hosts_are_refused() {
        for attrs in ["read-only", "standby", "prefer-standby", ""] {
            let url = format!("postgres://a,b/db?target_session_attrs={attrs}");
            let err = split(&url).unwrap_err();
            assert!(err.contains("target_session_attrs"), "{url}: {err}");
        }
        assert!(split("postgres://a,,b/db")
            .unwrap_err()
            .contains("empty host"));
        assert!(split("postgres://a,/db")
            .unwrap_err()
            .contains("empty host"));
    }

    #[test]
    fn a_parsed_list_starts_at_its_first_host_and_names_no_credentials() {
        let hosts = Hosts::parse("postgres://u:secret@h1:1,h2:2/db", |o| o).unwrap();
        assert!(hosts.several());
        assert_eq!(hosts.current().get_host(), "h1");
        hosts.start_at(1);
        assert_eq!(hosts.current().get_port(), 2);
        assert!(hosts.hosts.iter().all(|h| !h.label.contains("secret")));
        assert!(hosts.fresh(Duration::from_secs(3600)), "never moved");
        *hosts.moved_at.lock().unwrap() = Some(Instant::now() - Duration::from_secs(10));
        assert!(hosts.fresh(Duration::from_secs(5)), "made after the move");
        assert!(
            !hosts.fresh(Duration::from_secs(20)),
            "made before the move"
        );
    }
}
