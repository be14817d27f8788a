//! The admin HTTP API over a real socket: health, readiness, the ledger by id and key, paged
//! lists, retry (with the duplicate-risk confirmation), cancel, the bearer token, and a
//! `/metrics` scrape after a scripted run whose every counter is known.

use crate::common;
mod console;
mod cross_site;

use std::time::Duration;

use common::backend::{self, WriteLock};
use common::http::{get, post_json, request, sample};
use common::{message, relay_for, start_sink, wait_state, Client, TestRelay};
use idemrelay::config::Secret;
use idemrelay::store::State;
use idemrelay_sink::{FaultRule, FaultStage};

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod guards;
mod metrics;
mod records;

const LIMIT: Duration = Duration::from_secs(20);

async fn submit(relay: &TestRelay, to: &str, msg: &[u8]) -> String {
    common::submit(relay, "sender@example.com", &[to], msg).await
}

fn no_such_user() -> FaultRule {
    FaultRule::reply(FaultStage::Rcpt, 550, "5.1.1 no such user").with_rcpt("nobody@")
}

/// `/metrics` with this `Accept` header (none: no header).
async fn scrape(admin: std::net::SocketAddr, accept: Option<&str>) -> common::http::HttpResponse {
    let headers: Vec<(&str, &str)> = accept.iter().map(|a| ("Accept", *a)).collect();
    common::http::send(
        admin,
        "GET",
        "/metrics",
        &headers,
        common::http::Body::Bytes(b""),
    )
    .await
}
