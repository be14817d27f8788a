//! The storage contract both backends must keep, driven through the `Store` trait with two
//! independent handles on one database, as two relay instances would hold. Runs on SQLite
//! always and on Postgres when `IDEMRELAY_TEST_POSTGRES` names a database.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::backend;
use idemrelay::mail::Fingerprint;
use idemrelay::mail::{BodyType, Envelope};
use idemrelay::store::{
    self, AttemptResult, EventKind, Insert, KeySource, NewRecord, OutcomeKind, Phase, Retention,
    Settle, State, Store, UpstreamEvent, WebhookApplied, WebhookOutcome, WebhookReceipt,
};

const RETENTION: Retention = Retention {
    replay: Duration::from_secs(3600),
    upstream_window: Duration::from_secs(3600),
    parked: Duration::from_secs(3600),
};
const LONG_LEASE: Duration = Duration::from_secs(600);

fn operator() -> store::Operator {
    store::Operator {
        actor: "local user tester".into(),
        reason: "contract test".into(),
    }
}

fn record(id: &str, key: &str, fp: u8) -> NewRecord {
    NewRecord {
        id: id.into(),
        scope: "s".into(),
        key: Some(key.into()),
        key_source: Some(KeySource::Header),
        fingerprint: Fingerprint::from_bytes([fp; 32]),
        envelope: Envelope {
            mail_from: "a@example.com".into(),
            rcpt_to: vec!["b@example.com".into()],
            body: BodyType::SevenBit,
            smtputf8: false,
            requests: Default::default(),
        },
        content: Some(b"Subject: x\r\n\r\nbody\r\n".to_vec()),
        size: 20,
        state: State::Queued,
        reply: format!("250 2.0.0 OK queued as {id}"),
        dsn_of: None,
        part: 1,
        message_fp: Fingerprint::from_bytes([100; 32]),
        upstream_key: Some(key.into()),
        message_id: None,
    }
}

/// Two handles on one fresh store: (name, first, second).
async fn instances(
    dir: &tempfile::TempDir,
    backend: Backend,
) -> Vec<(&'static str, Arc<dyn Store>, Arc<dyn Store>)> {
    instances_with_urls(dir, backend)
        .await
        .into_iter()
        .map(|(name, a, b, _)| (name, a, b))
        .collect()
}

type Instances = Vec<(&'static str, Arc<dyn Store>, Arc<dyn Store>, String)>;

/// `instances`, with the store's URL for SQL from outside.
async fn instances_with_urls(dir: &tempfile::TempDir, backend: Backend) -> Instances {
    let timeout = Duration::from_secs(5);
    let (name, url) = match backend {
        Backend::Sqlite => (
            "sqlite",
            format!("sqlite://{}", dir.path().join("s.db").display()),
        ),
        Backend::Postgres => {
            let base = backend::postgres_base().unwrap_or_else(|| {
                panic!("built for Postgres, but {} is unset", backend::POSTGRES_ENV)
            });
            ("postgres", backend::fresh_schema(&base).await)
        }
    };
    vec![(
        name,
        store::open(&url, timeout).await.unwrap(),
        store::open(&url, timeout).await.unwrap(),
        url,
    )]
}

#[derive(Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// Each contract is two tests, `NAME::sqlite` and `NAME::postgres`; the second is compiled as
/// ignored unless IDEMRELAY_TEST_POSTGRES was set for the build (build.rs), so a run without a
/// database reports it ignored instead of passing it.
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            #[cfg_attr(
                not(idemrelay_test_postgres),
                ignore = "set IDEMRELAY_TEST_POSTGRES=postgres://USER@HOST/DB to run it"
            )]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await
            }
        }
    };
}

fn accepted() -> AttemptResult {
    AttemptResult {
        outcome: OutcomeKind::Accepted,
        phase: Some(Phase::Dot),
        code: Some(250),
        reply: "250 ok".into(),
    }
}

/// Claims the next job, which must be `id`, and settles one attempt with `result`.
async fn attempt_once(store: &Arc<dyn Store>, id: &str, result: AttemptResult, settle: Settle) {
    let job = store.claim("w", LONG_LEASE).await.unwrap().unwrap();
    assert_eq!(job.id, id);
    let n = job.attempts + 1;
    assert!(store.begin_attempt(id, job.token, n).await.unwrap());
    assert!(store
        .settle(id, job.token, Some((n, &result)), &settle)
        .await
        .unwrap());
}

/// The before-queue mode's writes: leasing one record by id, and settling it with the reply
/// its client heard.
mod immediate;

#[path = "store_contract_delay.rs"]
mod delay_notice;

// The tests, by subject, declared after the macro they use; each reads this file's helpers
// with `use super::*`.
mod instances;
mod listings;
mod webhook_events;
