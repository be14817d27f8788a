//! `idemrelay queue ...`: through the running relay's admin API by default, on the store itself
//! with `--direct`. Both paths answer with the same JSON (`admin::ops`), which is printed as is
//! (`--json`) or as tables for people.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::Value;

use clap::Subcommand;

use super::table::{or_dash, table};
use crate::admin::api::reason_or_default;
use crate::admin::client::AdminClient;
use crate::admin::ops::{self, OpError, OpResult};
use crate::admin::wire::{encode, ListQuery};
use crate::config::Settings;
use crate::store::{Operator, Resolution, Retention, Store};

#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// Resume delivery after a pause (the relay notices within a second).
    Resume {
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Pause delivery for the whole relay; accepted messages keep queueing.
    Pause {
        /// Why (shown by `queue status`, recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Show whether delivery is paused, and why, with the latest relay-wide operator actions.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// List records (oldest first unless --newest), with filters; says when more follow.
    List(ListArgs),
    /// Show one record (by id, or by idempotency key) with its replies, every attempt, its
    /// upstream events, its DSN links, why it waits, and its operator history.
    Show {
        /// An id; failing that, a key in `--scope` (default: the configured `scope`).
        #[arg(required_unless_present = "key")]
        id_or_key: Option<String>,
        /// Name the record by its idempotency key (in `--scope`).
        #[arg(long, conflicts_with = "id_or_key")]
        key: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Requeue a `failed`, `unresolved` or `cancelled` record for delivery now.
    Retry {
        #[command(flatten)]
        record: RecordArg,
        /// Required for an `unresolved` record: the upstream may already have it, so a retry
        /// can deliver a second copy.
        #[arg(long)]
        confirm_duplicate_risk: bool,
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Cancel a queued record that is not being delivered right now (state `cancelled`; no
    /// DSN is sent).
    Cancel {
        #[command(flatten)]
        record: RecordArg,
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Close an `unresolved` record as delivered or failed, without sending it again and
    /// without a DSN, once the upstream's own records (its logs, message search or support)
    /// have told what became of the lost attempt.
    Resolve {
        #[command(flatten)]
        record: RecordArg,
        /// How the record ends: `delivered` (the upstream has it) or `failed` (it never got
        /// there and will not be sent).
        #[arg(long = "as", value_name = "OUTCOME", value_parser = ["delivered", "failed"])]
        resolution: String,
        /// What the upstream's records showed (required: recorded with who did it).
        #[arg(long)]
        reason: String,
    },
    /// Make a queued record (or, with --all, every waiting one) due now; records a worker
    /// holds are left alone, and a pause still holds them all.
    Flush {
        /// The record's id.
        #[arg(required_unless_present_any = ["key", "all"])]
        id: Option<String>,
        /// Name the record by its idempotency key (in `--scope`).
        #[arg(long, conflicts_with = "id")]
        key: Option<String>,
        /// Every queued record that is not due yet.
        #[arg(long, conflicts_with_all = ["id", "key"])]
        all: bool,
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Delete records past the configured retention.
    Purge {
        /// Delete terminal records older than `retention` (the only purge there is).
        #[arg(long, required = true)]
        expired: bool,
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// The filters of `queue list` (those of `GET /api/v1/messages`).
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Only records in this state (queued, delivered, failed, unresolved, rejected,
    /// cancelled), or `deferred`: queued after at least one failed attempt.
    #[arg(long)]
    state: Option<String>,
    /// Only records of this scope (`--scope` is the relay's own setting).
    #[arg(long)]
    in_scope: Option<String>,
    /// Only records under this idempotency key (in any scope unless --in-scope).
    #[arg(long)]
    key: Option<String>,
    /// Only records with this envelope sender (MAIL FROM; ASCII case ignored).
    #[arg(long)]
    sender: Option<String>,
    /// Only records with this envelope recipient (RCPT TO; ASCII case ignored).
    #[arg(long)]
    recipient: Option<String>,
    /// Only records with this Message-ID header.
    #[arg(long)]
    message_id: Option<String>,
    /// Accepted at or after: an RFC 3339 time, or a duration ago (`2h`).
    #[arg(long)]
    since: Option<String>,
    /// Accepted before: an RFC 3339 time, or a duration ago.
    #[arg(long)]
    until: Option<String>,
    /// Newest first.
    #[arg(long)]
    newest: bool,
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Continue a listing: the cursor its last page printed (same filters).
    #[arg(long)]
    cursor: Option<String>,
    /// The API's JSON (`{"messages": [...], "next_cursor": ...}`) instead of a table.
    #[arg(long)]
    json: bool,
}

impl ListArgs {
    fn query(&self) -> ListQuery {
        ListQuery {
            state: self.state.clone(),
            scope: self.in_scope.clone(),
            key: self.key.clone(),
            sender: self.sender.clone(),
            recipient: self.recipient.clone(),
            message_id: self.message_id.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
            order: self.newest.then(|| "newest".to_string()),
            limit: Some(self.limit),
            cursor: self.cursor.clone(),
        }
    }
}

/// A record named by id, or by key in `--scope`.
#[derive(Debug, clap::Args)]
pub(crate) struct RecordArg {
    /// The record's id.
    #[arg(required_unless_present = "key")]
    id: Option<String>,
    /// Name the record by its idempotency key instead (in `--scope`, default: the configured
    /// scope).
    #[arg(long, conflicts_with = "id")]
    key: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum RecordAction {
    Retry,
    Cancel,
    Flush,
}

impl RecordAction {
    /// The API's path segment.
    fn as_str(self) -> &'static str {
        match self {
            RecordAction::Retry => "retry",
            RecordAction::Cancel => "cancel",
            RecordAction::Flush => "flush",
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum RelayAction {
    Pause,
    Resume,
    FlushAll,
    Purge,
}

impl RelayAction {
    /// The API's path segment.
    fn as_str(self) -> &'static str {
        match self {
            RelayAction::Pause => "pause",
            RelayAction::Resume => "resume",
            RelayAction::FlushAll => "flush",
            RelayAction::Purge => "purge",
        }
    }
}

/// Where the queue is read and changed.
enum Queue {
    Api(AdminClient),
    Direct {
        store: Arc<dyn Store>,
        retention: Retention,
    },
}

/// The local user, for actions taken with --direct (and named to the API as the person).
fn local_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        // SAFETY: getuid has no preconditions and cannot fail.
        .unwrap_or_else(|| format!("uid {}", unsafe { libc::getuid() }))
}

fn bad_request((code, message): (&'static str, String)) -> OpError {
    OpError::new(StatusCode::BAD_REQUEST, code, message)
}

impl Queue {
    /// `store_given`: the store named by `--store` or `IDEMRELAY_STORE`, which the relay asked
    /// must be serving (a config file's store is the relay's own business).
    async fn open(
        settings: &Settings,
        store_given: Option<String>,
        direct: bool,
    ) -> anyhow::Result<Queue> {
        if direct {
            let store =
                crate::store::open_existing(settings.store.expose(), settings.store_busy_timeout)
                    .await?;
            return Ok(Queue::Direct {
                store,
                retention: settings.retention_policy(),
            });
        }
        let Some(addr) = settings.admin.0 else {
            anyhow::bail!(
                "the admin API is off (admin = \"off\"), so there is no relay to ask; give \
                 --admin ADDR, or add --direct to work on the store itself"
            );
        };
        let token = settings
            .admin_token
            .as_ref()
            .map(|t| t.expose().to_string());
        let api = AdminClient::new(addr, token, local_user());
        if let Some(given) = store_given {
            let given = crate::secret::SecretUrl(given).redacted();
            let status = api.get("/api/v1/queue/status").await?;
            let served = status["store"].as_str().unwrap_or_default();
            anyhow::ensure!(
                served == given,
                "the relay at {} serves the store {served}, not {given} (--store / \
                 IDEMRELAY_STORE); add --direct to work on {given} itself",
                api.base()
            );
        }
        Ok(Queue::Api(api))
    }

    fn operator(reason: Option<String>) -> Operator {
        Operator {
            actor: format!("local user {}", local_user()),
            reason: reason_or_default(reason),
        }
    }

    fn body(reason: &Option<String>, confirm: bool) -> Value {
        let mut body = serde_json::json!({});
        if let Some(reason) = reason {
            body["reason"] = reason.clone().into();
        }
        if confirm {
            body["confirm"] = "duplicate-risk".into();
        }
        body
    }

    async fn list(&self, query: ListQuery) -> OpResult {
        match self {
            Queue::Api(api) => {
                api.get(&format!("/api/v1/messages?{}", query.to_query_string()))
                    .await
            }
            Queue::Direct { store, .. } => {
                let filter = query
                    .into_filter(crate::store::now_ms())
                    .map_err(bad_request)?;
                let relay = ops::relay_facts(store.as_ref(), None).await?;
                ops::list(store.as_ref(), &filter, &relay).await
            }
        }
    }

    async fn show(&self, id: &str) -> OpResult {
        match self {
            Queue::Api(api) => api.get(&format!("/api/v1/messages/{}", encode(id))).await,
            Queue::Direct { store, .. } => {
                let relay = ops::relay_facts(store.as_ref(), None).await?;
                ops::show(store.as_ref(), id, &relay).await
            }
        }
    }

    /// The id of the record under (scope, key).
    async fn resolve_key(&self, scope: &str, key: &str) -> Result<String, OpError> {
        match self {
            Queue::Api(api) => {
                let record = api
                    .get(&format!("/api/v1/keys/{}/{}", encode(scope), encode(key)))
                    .await?;
                Ok(record["id"].as_str().unwrap_or_default().to_string())
            }
            Queue::Direct { store, .. } => ops::resolve_key(store.as_ref(), scope, key).await,
        }
    }

    async fn id_of(&self, record: &RecordArg, scope: &str) -> Result<String, OpError> {
        match (&record.id, &record.key) {
            (Some(id), _) => Ok(id.clone()),
            (None, Some(key)) => self.resolve_key(scope, key).await,
            (None, None) => unreachable!("clap requires an id or --key"),
        }
    }

    /// An action on one record: POST `/api/v1/messages/{id}/{action}`, or the same operation
    /// on the store.
    async fn act(
        &self,
        id: &str,
        action: RecordAction,
        reason: Option<String>,
        confirm: bool,
    ) -> OpResult {
        match self {
            Queue::Api(api) => {
                let path = format!("/api/v1/messages/{}/{}", encode(id), action.as_str());
                api.post(&path, Queue::body(&reason, confirm)).await
            }
            Queue::Direct { store, .. } => {
                let store = store.as_ref();
                let by = Queue::operator(reason);
                match action {
                    RecordAction::Retry => ops::retry(store, id, confirm, &by).await,
                    RecordAction::Cancel => ops::cancel(store, id, &by).await,
                    RecordAction::Flush => ops::flush(store, id, &by).await,
                }
            }
        }
    }

    /// POST `/api/v1/messages/{id}/resolve`, or the same operation on the store.
    async fn resolve(&self, id: &str, resolution: Resolution, reason: String) -> OpResult {
        match self {
            Queue::Api(api) => {
                let path = format!("/api/v1/messages/{}/resolve", encode(id));
                let body = serde_json::json!({ "as": resolution.as_str(), "reason": reason });
                api.post(&path, body).await
            }
            Queue::Direct { store, .. } => {
                let by = Queue::operator(Some(reason));
                ops::resolve(store.as_ref(), id, resolution, &by).await
            }
        }
    }

    /// An action on the whole relay: POST `/api/v1/queue/{action}`, or the same operation on
    /// the store.
    async fn relay_act(&self, action: RelayAction, reason: Option<String>) -> OpResult {
        match self {
            Queue::Api(api) => {
                let path = format!("/api/v1/queue/{}", action.as_str());
                api.post(&path, Queue::body(&reason, false)).await
            }
            Queue::Direct { store, retention } => {
                let store = store.as_ref();
                let by = Queue::operator(reason);
                match action {
                    RelayAction::Pause => ops::pause(store, &by).await,
                    RelayAction::Resume => ops::resume(store, &by).await,
                    RelayAction::FlushAll => ops::flush_all(store, &by).await,
                    RelayAction::Purge => ops::purge(store, *retention, &by).await,
                }
            }
        }
    }

    async fn status(&self) -> OpResult {
        match self {
            Queue::Api(api) => api.get("/api/v1/queue/status").await,
            Queue::Direct { store, .. } => ops::status(store.as_ref()).await,
        }
    }
}

pub(crate) fn run(
    settings: &Settings,
    store_given: Option<String>,
    direct: bool,
    command: QueueCommand,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let queue = Queue::open(settings, store_given, direct).await?;
        let out = execute(&queue, settings, command).await.map_err(|e| {
            let mut message = e.message;
            if e.code == "confirmation_required" {
                // The API's hint names its own parameter; the command's is a flag.
                if let Some(cut) = message.find(", then POST again") {
                    message.truncate(cut);
                }
                message.push_str(", then rerun with --confirm-duplicate-risk");
            }
            anyhow::anyhow!(message)
        })?;
        print!("{out}");
        Ok(())
    })
}

async fn execute(
    queue: &Queue,
    settings: &Settings,
    command: QueueCommand,
) -> Result<String, OpError> {
    let scope = &settings.scope;
    Ok(match command {
        QueueCommand::Resume { reason } => {
            queue.relay_act(RelayAction::Resume, reason).await?;
            "delivery resumed\n".to_string()
        }
        QueueCommand::Pause { reason } => {
            let status = queue.relay_act(RelayAction::Pause, reason).await?;
            format!(
                "delivery paused: {}\n",
                status["reason"].as_str().unwrap_or_default()
            )
        }
        QueueCommand::Status { json } => {
            let status = queue.status().await?;
            if json {
                pretty(&status)
            } else {
                status_text(&status)
            }
        }
        QueueCommand::List(args) => {
            let page = queue.list(args.query()).await?;
            if args.json {
                pretty(&page)
            } else {
                list_table(&page)
            }
        }
        QueueCommand::Show {
            id_or_key,
            key,
            json,
        } => {
            let record = match (id_or_key, key) {
                (_, Some(key)) => {
                    let id = queue.resolve_key(scope, &key).await?;
                    queue.show(&id).await?
                }
                (Some(id_or_key), None) => match queue.show(&id_or_key).await {
                    Err(e) if e.status == StatusCode::NOT_FOUND => {
                        let id = queue.resolve_key(scope, &id_or_key).await.map_err(|_| {
                            OpError::new(
                                StatusCode::NOT_FOUND,
                                "not_found",
                                format!(
                                    "no record with id {id_or_key:?}, nor one with that key in \
                                     scope {scope:?}"
                                ),
                            )
                        })?;
                        queue.show(&id).await?
                    }
                    other => other?,
                },
                (None, None) => unreachable!("clap requires an id or --key"),
            };
            if json {
                pretty(&record)
            } else {
                show_text(&record)
            }
        }
        QueueCommand::Retry {
            record,
            confirm_duplicate_risk,
            reason,
        } => {
            let id = queue.id_of(&record, scope).await?;
            queue
                .act(&id, RecordAction::Retry, reason, confirm_duplicate_risk)
                .await?;
            format!("requeued {id}\n")
        }
        QueueCommand::Cancel { record, reason } => {
            let id = queue.id_of(&record, scope).await?;
            queue.act(&id, RecordAction::Cancel, reason, false).await?;
            format!("cancelled {id}: no DSN sent\n")
        }
        QueueCommand::Resolve {
            record,
            resolution,
            reason,
        } => {
            let id = queue.id_of(&record, scope).await?;
            let resolution = Resolution::parse(&resolution).expect("clap checks the values");
            queue.resolve(&id, resolution, reason).await?;
            format!(
                "resolved {id} as {}: not sent again, no DSN\n",
                resolution.as_str()
            )
        }
        QueueCommand::Flush {
            id,
            key,
            all,
            reason,
        } => {
            let answer = if all {
                let answer = queue.relay_act(RelayAction::FlushAll, reason).await?;
                let mut out = format!("flushed {} record(s)\n", answer["flushed"]);
                for id in answer["ids"].as_array().into_iter().flatten() {
                    out.push_str(&format!("  {}\n", id.as_str().unwrap_or_default()));
                }
                (answer, out)
            } else {
                let id = queue.id_of(&RecordArg { id, key }, scope).await?;
                let answer = queue.act(&id, RecordAction::Flush, reason, false).await?;
                let out = format!(
                    "flushed {id}: due now (was due at {})\n",
                    answer["was_due_at"].as_str().unwrap_or("-")
                );
                (answer, out)
            };
            let (answer, mut out) = answer;
            if answer["paused"] == true {
                out.push_str("note: delivery is paused; nothing goes until `queue resume`\n");
            }
            out
        }
        QueueCommand::Purge { expired, reason } => {
            debug_assert!(expired);
            let answer = queue.relay_act(RelayAction::Purge, reason).await?;
            format!(
                "purged {} expired record(s) (retention {}, parked {}, upstream window {})\n",
                answer["purged"],
                answer["retention"].as_str().unwrap_or("-"),
                answer["parked_retention"].as_str().unwrap_or("-"),
                answer["upstream_window"].as_str().unwrap_or("-"),
            )
        }
    })
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}

/// A JSON string or number as text, `-` for null.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn status_text(status: &Value) -> String {
    let reason = cell(&status["reason"]);
    let mut out = match (status["paused"] == true, status["by_relay"] == true) {
        (false, _) => "running\n".to_string(),
        (true, true) => format!("paused (resumes after a normal upstream probe): {reason}\n"),
        (true, false) => format!("paused by an operator: {reason}\n"),
    };
    let recent = status["recent_actions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !recent.is_empty() {
        out.push_str("recent operator actions (newest first):\n");
        out.push_str(&history_table(&recent));
    }
    out
}

fn history_table(actions: &[Value]) -> String {
    let rows: Vec<Vec<String>> = actions
        .iter()
        .map(|a| {
            vec![
                cell(&a["at"]),
                cell(&a["action"]),
                cell(&a["actor"]),
                cell(&a["reason"]),
                cell(&a["detail"]),
            ]
        })
        .collect();
    table(&["AT", "ACTION", "BY", "REASON", "DETAIL"], &rows)
}

fn list_table(page: &Value) -> String {
    let records = page["messages"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|s| {
            let last = match s["last_outcome"].as_str() {
                Some(outcome) => {
                    let mut last = outcome.to_string();
                    if let Some(phase) = s["last_phase"].as_str() {
                        last.push_str(&format!("@{phase}"));
                    }
                    if let Some(code) = s["last_code"].as_u64() {
                        last.push_str(&format!(" {code}"));
                    }
                    last
                }
                None if s["attempts"].as_u64().unwrap_or(0) > 0 => "open".to_string(),
                None => "-".to_string(),
            };
            let recipients = s["rcpt_to"]
                .as_array()
                .map(|r| r.iter().map(cell).collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            vec![
                cell(&s["id"]),
                cell(&s["state"]),
                cell(&s["scope"]),
                cell(&s["key"]),
                cell(&s["accepted_at"]),
                recipients,
                cell(&s["attempts"]),
                last,
                cell(&s["next_attempt_at"]),
                cell(&s["waiting"]["reason"]),
                cell(&s["upstream_reply"]),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "ID", "STATE", "SCOPE", "KEY", "ACCEPTED", "RCPT", "ATTEMPTS", "LAST", "NEXT",
            "WAITING", "REPLY",
        ],
        &rows,
    );
    if let Some(cursor) = page["next_cursor"].as_str() {
        out.push_str(&format!("more: --cursor {cursor}\n"));
    }
    out
}

fn show_text(m: &Value) -> String {
    let mut out = String::new();
    let mut field = |name: &str, value: String| out.push_str(&format!("{name:<16}{value}\n"));
    field("id", cell(&m["id"]));
    field("state", cell(&m["state"]));
    field("scope", cell(&m["scope"]));
    field(
        "key",
        format!("{} ({})", cell(&m["key"]), cell(&m["key_source"])),
    );
    field("upstream key", cell(&m["upstream_key"]));
    field("part", cell(&m["part"]));
    field("fingerprint", cell(&m["fingerprint"]));
    field("mail from", format!("<{}>", cell(&m["mail_from"])));
    let recipients = m["rcpt_to"]
        .as_array()
        .map(|r| r.iter().map(cell).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    field("rcpt to", recipients);
    field("accepted at", cell(&m["accepted_at"]));
    field(
        "finished at",
        or_dash(
            m["finished_at_ms"]
                .as_i64()
                .map(crate::admin::view::time_ms),
        ),
    );
    field("reply", cell(&m["reply"]));
    field("upstream reply", cell(&m["upstream_reply"]));
    field("message-id", cell(&m["message_id"]));
    if let Some(evidence) = m["resolved_by"].as_str() {
        field("resolved by", format!("upstream event {evidence}"));
    }
    if let Some(of) = m["dsn_of"].as_str() {
        field("dsn of", of.to_string());
    }
    let dsns: Vec<String> = m["dsns"]
        .as_array()
        .into_iter()
        .flatten()
        .map(cell)
        .collect();
    if !dsns.is_empty() {
        field("dsn sent", dsns.join(", "));
    }
    if m["state"] == "queued" {
        field("next attempt", cell(&m["next_attempt_at"]));
        field(
            "waiting",
            format!(
                "{}: {}",
                cell(&m["waiting"]["reason"]),
                cell(&m["waiting"]["detail"])
            ),
        );
    }
    field(
        "content",
        if m["content_stored"] == true {
            "stored"
        } else {
            "not stored"
        }
        .to_string(),
    );
    if let Some(damage) = m["damage"].as_str() {
        field("damage", damage.to_string());
    }
    let attempts = m["attempts"].as_array().cloned().unwrap_or_default();
    out.push_str(&format!("attempts        {}\n", attempts.len()));
    if !attempts.is_empty() {
        let rows: Vec<Vec<String>> = attempts
            .iter()
            .map(|a| {
                vec![
                    cell(&a["attempt"]),
                    cell(&a["started_at"]),
                    cell(&a["finished_at"]),
                    a["outcome"].as_str().unwrap_or("open").to_string(),
                    cell(&a["phase"]),
                    cell(&a["code"]),
                    cell(&a["upstream_id"]),
                    cell(&a["reply"]),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "#",
                "STARTED",
                "FINISHED",
                "OUTCOME",
                "PHASE",
                "CODE",
                "UPSTREAM-ID",
                "REPLY",
            ],
            &rows,
        ));
    }
    let events = m["events"].as_array().cloned().unwrap_or_default();
    out.push_str(&format!("upstream events {}\n", events.len()));
    if !events.is_empty() {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                let applied = match (e["applied"] == true, e["evidence"] == true) {
                    (_, true) => "evidence",
                    (true, false) => "applied",
                    (false, false) => "stale",
                };
                vec![
                    e["recipient"].as_str().unwrap_or("*").to_string(),
                    cell(&e["event_time"]),
                    cell(&e["type"]),
                    cell(&e["kind"]),
                    applied.to_string(),
                    format!(
                        "{}/{}#{}",
                        cell(&e["source"]),
                        cell(&e["webhook_id"]),
                        cell(&e["index"])
                    ),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "RECIPIENT",
                "EVENT TIME",
                "TYPE",
                "KIND",
                "APPLIED",
                "REQUEST",
            ],
            &rows,
        ));
    }
    let history = m["history"].as_array().cloned().unwrap_or_default();
    out.push_str(&format!("operator actions {}\n", history.len()));
    if !history.is_empty() {
        out.push_str(&history_table(&history));
    }
    out
}
