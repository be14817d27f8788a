//! Finding records (`queue list`, `GET /api/v1/messages`, the console) and the operator's
//! record of what was done to them: the filter, its page and cursor, and the SQL both
//! backends run for it (one text, two placeholder styles), so that the two cannot drift.

use base64::Engine;

use super::record::{self, MessageSummary, QueueStats, State, StoreError};

/// Which records a listing wants. Empty filters match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub state: Option<StateFilter>,
    pub scope: Option<String>,
    /// The client's idempotency key (in any scope unless `scope` is given too).
    pub key: Option<String>,
    /// MAIL FROM, compared without regard to ASCII case.
    pub sender: Option<String>,
    /// One of the RCPT TO addresses, compared without regard to ASCII case.
    pub recipient: Option<String>,
    /// The Message-ID header's value, with or without angle brackets.
    pub message_id: Option<String>,
    /// Accepted at or after this time (Unix milliseconds).
    pub since_ms: Option<i64>,
    /// Accepted before this time (Unix milliseconds).
    pub until_ms: Option<i64>,
    /// Newest first instead of oldest first.
    pub newest_first: bool,
    /// At most this many records per page (at least 1).
    pub limit: usize,
    /// Continue after the page that gave this cursor.
    pub cursor: Option<Cursor>,
}

impl ListFilter {
    /// Oldest first, everything, one page of `limit`.
    pub fn all(limit: usize) -> Self {
        ListFilter {
            limit,
            ..ListFilter::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    Is(State),
    /// Queued with at least one failed (transient or unknown) attempt: waiting to retry.
    Deferred,
}

impl StateFilter {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "deferred" => Some(StateFilter::Deferred),
            other => State::parse(other).map(StateFilter::Is),
        }
    }

    /// The names `parse` takes, for error messages.
    pub fn names() -> String {
        let mut names: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
        names.push("deferred");
        names.join(", ")
    }
}

/// Where the next page starts: opaque to callers (a string they hand back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last record id of the page before.
    pub(crate) after_id: String,
    /// The order it was made for: a cursor from a newest-first listing continues only one.
    pub(crate) newest_first: bool,
}

impl Cursor {
    /// Continue (oldest first) after this record id.
    pub fn after_id(id: &str) -> Self {
        Cursor {
            after_id: id.to_string(),
            newest_first: false,
        }
    }

    pub fn encode(&self) -> String {
        let order = if self.newest_first { 'n' } else { 'o' };
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!("1{order}{}", self.after_id))
    }

    pub fn decode(text: &str) -> Result<Self, String> {
        let bad = || format!("cursor {text:?} is not one this relay gave out");
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| bad())?;
        let raw = String::from_utf8(raw).map_err(|_| bad())?;
        let newest_first = match raw.get(..2) {
            Some("1n") => true,
            Some("1o") => false,
            _ => return Err(bad()),
        };
        Ok(Cursor {
            after_id: raw[2..].to_string(),
            newest_first,
        })
    }
}

/// One page of a listing; `next_cursor` is `None` on the last page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub records: Vec<MessageSummary>,
    pub next_cursor: Option<Cursor>,
}

/// A value bound to a listing's SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Param {
    Text(String),
    Int(i64),
}

/// The listing's parameters bound in order, on either backend.
pub(crate) fn bind<'q, DB: sqlx::Database>(
    mut query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    params: Vec<Param>,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    for param in params {
        query = match param {
            Param::Text(text) => query.bind(text),
            Param::Int(n) => query.bind(n),
        };
    }
    query
}

/// Ids begin with the acceptance time in milliseconds (`{ms:011X}`, see
/// `mail::new_queue_id`), so a time range bounds an id range and walks the primary key. The
/// id is made a moment before the row's `accepted_at` (a commit later): the id bound is
/// widened by this much and `accepted_at` decides exactly.
const ID_TIME_SLACK_MS: i64 = 10 * 60 * 1000;

fn id_at(ms: i64) -> String {
    format!("{:011X}", ms.max(0))
}

/// The few words the two dialects spell differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// With the store's clock (this process's) at the read.
    Sqlite {
        now_ms: i64,
    },
    Postgres,
}

impl Dialect {
    fn placeholder(self, n: usize) -> String {
        match self {
            Dialect::Sqlite { .. } => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }

    fn now(self) -> String {
        match self {
            Dialect::Sqlite { now_ms } => now_ms.to_string(),
            Dialect::Postgres => "idemrelay_now_ms()".into(),
        }
    }

    /// SQL for "position of `needle` in `haystack`, 0 if absent".
    fn position(self, haystack: &str, needle: &str) -> String {
        match self {
            Dialect::Sqlite { .. } => format!("instr({haystack}, {needle})"),
            Dialect::Postgres => format!("strpos({haystack}, {needle})"),
        }
    }
}

/// The SELECT for `filter` (one row more than the page, to tell whether another follows).
pub(crate) fn list_sql(
    filter: &ListFilter,
    dialect: Dialect,
) -> Result<(String, Vec<Param>), String> {
    let placeholder = |n| dialect.placeholder(n);
    let now = dialect.now();
    let mut params = Vec::new();
    let mut conditions: Vec<String> = Vec::new();
    let bind = |p: Param, params: &mut Vec<Param>| {
        params.push(p);
        placeholder(params.len())
    };
    match filter.state {
        Some(StateFilter::Is(state)) => {
            let p = bind(Param::Text(state.as_str().into()), &mut params);
            conditions.push(format!("m.state = {p}"));
            // The state indexes hold finished records only (queued ones are not indexed by
            // state at intake): saying so lets the planner use them.
            if state != State::Queued {
                conditions.push("m.state <> 'queued'".into());
            }
        }
        Some(StateFilter::Deferred) => conditions.push(
            "m.state = 'queued' AND EXISTS (SELECT 1 FROM attempts f WHERE f.message_id = m.id
                AND f.outcome IN ('transient', 'unknown'))"
                .into(),
        ),
        None => {}
    }
    if let Some(scope) = &filter.scope {
        let p = bind(Param::Text(scope.clone()), &mut params);
        conditions.push(format!("m.scope = {p}"));
    }
    if let Some(key) = &filter.key {
        let p = bind(Param::Text(key.clone()), &mut params);
        conditions.push(format!("m.idem_key = {p}"));
        if filter.scope.is_none() {
            conditions.push(format!("m.scope IN ({EVERY_SCOPE})"));
        }
    }
    if let Some(sender) = &filter.sender {
        let p = bind(Param::Text(sender.to_ascii_lowercase()), &mut params);
        conditions.push(format!("lower(m.mail_from) = {p}"));
    }
    if let Some(recipient) = &filter.recipient {
        // rcpt_to is the addresses joined by LF: match one whole line.
        let p = bind(
            Param::Text(format!("\n{}\n", recipient.to_ascii_lowercase())),
            &mut params,
        );
        let haystack = "'\n' || lower(m.rcpt_to) || '\n'";
        conditions.push(format!("{} > 0", dialect.position(haystack, &p)));
    }
    if let Some(message_id) = &filter.message_id {
        let bare = message_id
            .trim()
            .trim_start_matches('<')
            .trim_end_matches('>');
        let finished = bind(Param::Text(bare.to_string()), &mut params);
        let queued = bind(Param::Text(bare.to_string()), &mut params);
        // Only finished records are indexed by Message-ID (intake does not write that index):
        // queued ones are found by reading the queue.
        conditions.push(format!(
            "m.id IN (SELECT f.id FROM messages f
                      WHERE f.header_message_id = {finished} AND f.state <> 'queued'
                      UNION ALL
                      SELECT j.message_id FROM delivery_jobs j
                      WHERE (SELECT q.header_message_id FROM messages q
                             WHERE q.id = j.message_id) = {queued})"
        ));
    }
    if let Some(since) = filter.since_ms {
        let low = bind(
            Param::Text(id_at(since.saturating_sub(ID_TIME_SLACK_MS))),
            &mut params,
        );
        let p = bind(Param::Int(since), &mut params);
        conditions.push(format!("m.id >= {low} AND m.accepted_at >= {p}"));
    }
    if let Some(until) = filter.until_ms {
        let high = bind(
            Param::Text(id_at(until.saturating_add(ID_TIME_SLACK_MS))),
            &mut params,
        );
        let p = bind(Param::Int(until), &mut params);
        conditions.push(format!("m.id < {high} AND m.accepted_at < {p}"));
    }
    if let Some(cursor) = &filter.cursor {
        if cursor.newest_first != filter.newest_first {
            return Err("this cursor belongs to a listing in the other order".into());
        }
        let p = bind(Param::Text(cursor.after_id.clone()), &mut params);
        let op = if filter.newest_first { "<" } else { ">" };
        conditions.push(format!("m.id {op} {p}"));
    }
    let limit = bind(
        Param::Int(i64::try_from(filter.limit.max(1)).unwrap_or(i64::MAX - 1) + 1),
        &mut params,
    );
    let filter_sql = if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conditions.join(" AND "))
    };
    let order = if filter.newest_first { "DESC" } else { "ASC" };
    Ok((
        format!(
            "SELECT m.id, m.scope, m.idem_key, m.state, m.accepted_at, m.upstream_reply,
                m.mail_from, m.rcpt_to, m.header_message_id, m.dsn_of,
                (SELECT COUNT(*) FROM attempts a WHERE a.message_id = m.id) AS attempts,
                (SELECT COUNT(*) FROM attempts a WHERE a.message_id = m.id
                    AND a.outcome IN ('transient', 'unknown')) AS failed_attempts,
                l.outcome, l.phase, l.code, l.reply AS last_reply,
                j.due_at, j.lease_until, {now} AS now_ms
             FROM messages m
             LEFT JOIN attempts l ON l.message_id = m.id
                AND l.attempt = (SELECT MAX(attempt) FROM attempts x WHERE x.message_id = m.id)
             LEFT JOIN delivery_jobs j ON j.message_id = m.id
             {filter_sql}
             ORDER BY m.id {order}
             LIMIT {limit}"
        ),
        params,
    ))
}

/// Cuts the extra row off and makes the cursor for the next page.
pub(crate) fn page(mut records: Vec<MessageSummary>, filter: &ListFilter) -> Page {
    let limit = filter.limit.max(1);
    let more = records.len() > limit;
    records.truncate(limit);
    let next_cursor = more.then(|| records.last()).flatten().map(|last| Cursor {
        after_id: last.id.clone(),
        newest_first: filter.newest_first,
    });
    Page {
        records,
        next_cursor,
    }
}

/// An attempt that failed: transient or unknown (the breaker counts both; a permanent
/// refusal is the message's, not the upstream's health).
const FAILED: &str = "outcome IN ('transient', 'unknown')";

/// The statements `Store::relay_health` runs, in a dialect. They read the whole attempt
/// ledger (no index orders it by time): a few tens of milliseconds per hundred thousand
/// attempts, paid only by a console overview.
pub(crate) struct HealthSql {
    /// One row: last_delivery_at, deferred, now_ms.
    pub summary: String,
    /// The newest failed attempt: `message_id` and the ledger's columns.
    pub newest_failure: String,
    /// The first failed attempt started after the time bound as the first parameter.
    pub failing_since: String,
}

pub(crate) fn health_sql(dialect: Dialect) -> HealthSql {
    let now = dialect.now();
    HealthSql {
        summary: format!(
            "SELECT (SELECT MAX(finished_at) FROM attempts WHERE outcome = 'accepted')
                    AS last_delivery_at,
                (SELECT COUNT(*) FROM delivery_jobs j
                    WHERE EXISTS (SELECT 1 FROM attempts f
                                  WHERE f.message_id = j.message_id AND f.{FAILED}))
                    AS deferred,
                {now} AS now_ms"
        ),
        newest_failure: format!(
            "SELECT message_id, attempt, owner, started_at, finished_at, outcome, phase, code,
                reply, upstream_id
             FROM attempts WHERE {FAILED}
             ORDER BY COALESCE(finished_at, started_at) DESC, message_id DESC LIMIT 1"
        ),
        failing_since: format!(
            "SELECT MIN(started_at) FROM attempts WHERE {FAILED} AND started_at > {}",
            dialect.placeholder(1)
        ),
    }
}

/// Every scope that holds records, found by walking the first column of the unique
/// (scope, idem_key, part) index, one probe per scope: a key is looked up in every scope
/// through that index, instead of through an index of its own that every intake would write.
/// Same text in both dialects.
pub(crate) const EVERY_SCOPE: &str = "WITH RECURSIVE s (scope) AS (
        SELECT MIN(scope) FROM messages
        UNION ALL
        SELECT (SELECT MIN(n.scope) FROM messages n WHERE n.scope > s.scope)
        FROM s WHERE s.scope IS NOT NULL)
    SELECT scope FROM s WHERE scope IS NOT NULL";

/// The queue's figures (`queue status`, metrics), on either dialect's pool: the statements
/// and their decoding are the same in both, only the driver differs.
pub(crate) async fn queue_stats<DB>(pool: &sqlx::Pool<DB>) -> Result<QueueStats, StoreError>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    (String, i64): for<'r> sqlx::FromRow<'r, DB::Row>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
    (Option<i64>,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let counts: Vec<(String, i64)> = sqlx::query_as(queue_stats_sql::STATES)
        .fetch_all(pool)
        .await?;
    let oldest: Option<i64> = sqlx::query_scalar(queue_stats_sql::OLDEST_QUEUED)
        .fetch_one(pool)
        .await?;
    let damaged: i64 = sqlx::query_scalar(queue_stats_sql::DAMAGED)
        .fetch_one(pool)
        .await?;
    let unmatched: i64 = sqlx::query_scalar(queue_stats_sql::UNMATCHED_EVENTS)
        .fetch_one(pool)
        .await?;
    let by_scope: Vec<(String, i64)> = sqlx::query_as(queue_stats_sql::QUEUED_BY_SCOPE)
        .fetch_all(pool)
        .await?;
    Ok(record::queue_stats(
        counts, oldest, damaged, unmatched, by_scope,
    ))
}

/// The statements of `queue_stats`. Queued records are counted by their delivery jobs (a
/// queued record has exactly one, and only a queued record has one): the state indexes hold
/// finished records only.
mod queue_stats_sql {
    /// Records per state.
    pub(crate) const STATES: &str =
        "SELECT state, COUNT(*) FROM messages WHERE state <> 'queued' GROUP BY state
         UNION ALL SELECT 'queued', COUNT(*) FROM delivery_jobs";
    /// When the oldest queued record was accepted.
    pub(crate) const OLDEST_QUEUED: &str = "SELECT MIN(m.accepted_at)
         FROM delivery_jobs j JOIN messages m ON m.id = j.message_id";
    pub(crate) const DAMAGED: &str = "SELECT COUNT(*) FROM messages WHERE damage IS NOT NULL";
    pub(crate) const UNMATCHED_EVENTS: &str =
        "SELECT COUNT(*) FROM upstream_events WHERE record_id IS NULL";
    /// Queued records per scope.
    pub(crate) const QUEUED_BY_SCOPE: &str =
        "SELECT scope, COUNT(*) FROM delivery_jobs GROUP BY scope";
}

/// Every relay process's liveness row, oldest first (same text in both dialects).
pub(crate) const PROCESSES: &str =
    "SELECT id, started_at, heartbeat_at FROM relay_processes ORDER BY started_at, id";
