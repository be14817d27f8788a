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
        /// The API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List records (oldest first unless --newest), with filters; says when more follow.
    List(ListArgs),
    /// Show one record (by id, or by idempotency key) with its replies, every attempt, its
    /// upstream events, its DSN links, why it waits, and its operator history.
    Show {
        /// An id (or its first 12 or more characters, as `queue list` shows them); failing
        /// that, a key in `--scope` (default: the configured `scope`).
        #[arg(required_unless_present = "key")]
        id_or_key: Option<String>,
        /// Name the record by its idempotency key (in `--scope`).
        #[arg(long, conflicts_with = "id_or_key")]
        key: Option<String>,
        /// The API's JSON instead of text.
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
    /// DSN is sent), or with --all every queued record the filters match (one recorded
    /// action with the count).
    Cancel {
        /// The record's id (or its first 12 or more characters, as `queue list` shows them).
        #[arg(required_unless_present_any = ["key", "all"])]
        id: Option<String>,
        /// Name the record by its idempotency key instead (in `--scope`, default: the
        /// configured scope).
        #[arg(long, conflicts_with = "id")]
        key: Option<String>,
        /// Every queued record that the filters (--state, --in-scope, --recipient, --sender,
        /// --older-than, ...) match; without filters, every queued record. Records being
        /// delivered right now are skipped (and counted).
        #[arg(long, conflicts_with_all = ["id", "key"])]
        all: bool,
        #[command(flatten)]
        filter: BulkFilter,
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
        /// The record's id (or its first 12 or more characters, as `queue list` shows them).
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

/// The filters of `queue cancel --all`: those of `queue list`, each requiring --all.
#[derive(Debug, clap::Args)]
pub(crate) struct BulkFilter {
    /// With --all: `queued` (the default) or `deferred` (queued after a failed attempt).
    #[arg(long = "state", requires = "all", value_name = "STATE")]
    bulk_state: Option<String>,
    /// With --all: only records of this scope.
    #[arg(long = "in-scope", requires = "all", value_name = "SCOPE")]
    bulk_scope: Option<String>,
    /// With --all: only records with this envelope sender (ASCII case ignored).
    #[arg(long = "sender", requires = "all", value_name = "ADDRESS")]
    bulk_sender: Option<String>,
    /// With --all: only records with this envelope recipient (ASCII case ignored).
    #[arg(long = "recipient", requires = "all", value_name = "ADDRESS")]
    bulk_recipient: Option<String>,
    /// With --all: only records with this Message-ID header.
    #[arg(long = "message-id", requires = "all", value_name = "ID")]
    bulk_message_id: Option<String>,
    /// With --all: only records accepted at least this long ago (`1h`, `2d`), or before an
    /// RFC 3339 time.
    #[arg(long = "older-than", requires = "all", value_name = "AGE|TIME")]
    older_than: Option<String>,
    /// With --all: only records accepted within this long (`30m`), or since an RFC 3339 time.
    #[arg(long = "newer-than", requires = "all", value_name = "AGE|TIME")]
    newer_than: Option<String>,
}

impl BulkFilter {
    fn query(&self) -> ListQuery {
        ListQuery {
            state: self.bulk_state.clone(),
            scope: self.bulk_scope.clone(),
            sender: self.bulk_sender.clone(),
            recipient: self.bulk_recipient.clone(),
            message_id: self.bulk_message_id.clone(),
            since: self.newer_than.clone(),
            until: self.older_than.clone(),
            ..ListQuery::default()
        }
    }

    /// The API's `filter` object.
    fn json(&self) -> Value {
        let q = self.query();
        let mut filter = serde_json::Map::new();
        for (name, value) in [
            ("state", q.state),
            ("scope", q.scope),
            ("sender", q.sender),
            ("recipient", q.recipient),
            ("message_id", q.message_id),
            ("since", q.since),
            ("until", q.until),
        ] {
            if let Some(value) = value {
                filter.insert(name.to_string(), value.into());
            }
        }
        Value::Object(filter)
    }
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
    /// At most this many records (1 to 1000); `more: --cursor ...` says when more follow.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Continue a listing: the cursor its last page printed (same filters).
    #[arg(long)]
    cursor: Option<String>,
    /// The API's JSON (`{"messages": [...], "next_cursor": ...}`) instead of a table.
    #[arg(long)]
    json: bool,
    /// Every column, full ids, keys and recipients and absolute times (UTC), however wide;
    /// by default rows fit 80 columns, with ages (`3m`, `2h`, `5d`) and shortened values.
    #[arg(long)]
    wide: bool,
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
    /// The record's id (or its first 12 or more characters, as `queue list` shows them).
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
        /// The store's URL, password redacted (to say what answered).
        url: String,
        /// Who acts (`local_user`).
        user: String,
    },
}

/// Where the relay asked comes from: what decides whether a change may be sent to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AdminSource {
    /// `--admin` or `IDEMRELAY_ADMIN`.
    Named,
    /// The `admin` setting of this config file.
    ConfigFile(std::path::PathBuf),
    /// Nothing named a relay: the built-in default address, where any relay may be listening.
    BuiltIn,
}

impl AdminSource {
    /// `config.config` is the file that will be read (given, or the default one found).
    pub(crate) fn of(config: &crate::config::ConfigArgs) -> AdminSource {
        if config.admin.is_some() {
            return AdminSource::Named;
        }
        let Some(path) = &config.config else {
            return AdminSource::BuiltIn;
        };
        // Settings::load reports a file it cannot read or parse; here only whether it
        // names the admin listener matters.
        let names_admin = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.parse::<toml::Table>().ok())
            .is_some_and(|table| table.contains_key("admin"));
        if names_admin {
            AdminSource::ConfigFile(path.clone())
        } else {
            AdminSource::BuiltIn
        }
    }
}

/// The person acting: `--by` (or IDEMRELAY_OPERATOR), else $USER, $LOGNAME, else the OS's name
/// for this process's real user (root in a container or a cron job has no $USER), else the
/// number. Recorded with every action (through the API beside the token's name).
fn local_user(by: Option<&str>) -> String {
    if let Some(by) = by {
        return by.to_string();
    }
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(os_user_name)
        // SAFETY: getuid has no preconditions and cannot fail.
        .unwrap_or_else(|| format!("uid {}", unsafe { libc::getuid() }))
}

/// The login name of this process's real user, from the OS's user database.
fn os_user_name() -> Option<String> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain data; getpwuid_r only writes into it and into `buf`.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and `buf.len()` is its size; the reentrant
    // form keeps no static state.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: on success pw_name points at a NUL-terminated string inside `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    name.to_str()
        .ok()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

/// `--by`: what the API records as the person (a plain word up to 64 characters).
fn check_by(by: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !by.is_empty() && by.len() <= 64 && by.chars().all(|c| c.is_ascii_graphic()),
        "--by {by:?}: a name of 1 to 64 printable ASCII characters without spaces"
    );
    Ok(())
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
        user: String,
    ) -> anyhow::Result<Queue> {
        if direct {
            let store =
                crate::store::open_existing(settings.store.expose(), settings.store_busy_timeout)
                    .await?;
            return Ok(Queue::Direct {
                store,
                retention: settings.retention_policy(),
                url: settings.store.redacted(),
                user,
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
        let api = AdminClient::new(addr, token, user);
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

    fn operator(user: &str, reason: Option<String>) -> Operator {
        Operator {
            actor: format!("local user {user}"),
            reason: reason_or_default(reason),
        }
    }

    /// What answered: the relay's admin address and name, or the store.
    fn answered_by(&self) -> Value {
        match self {
            Queue::Api(api) => serde_json::json!({
                "admin": api.base(),
                "instance": api.instance(),
            }),
            Queue::Direct { url, .. } => serde_json::json!({ "store": url, "direct": true }),
        }
    }

    /// `answered_by` for people: one line.
    fn answered_by_text(&self) -> String {
        match self {
            Queue::Api(api) => match api.instance() {
                Some(name) => format!("relay {name} at {}", api.base()),
                None => format!("the relay at {} (it gives no name)", api.base()),
            },
            Queue::Direct { url, .. } => format!("the store {url} (--direct)"),
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
    async fn id_of_key(&self, scope: &str, key: &str) -> Result<String, OpError> {
        match self {
            Queue::Api(api) => {
                let record = api
                    .get(&format!("/api/v1/keys/{}/{}", encode(scope), encode(key)))
                    .await?;
                Ok(record["id"].as_str().unwrap_or_default().to_string())
            }
            Queue::Direct { store, .. } => ops::id_of_key(store.as_ref(), scope, key).await,
        }
    }

    async fn id_of(&self, record: &RecordArg, scope: &str) -> Result<String, OpError> {
        match (&record.id, &record.key) {
            (Some(id), _) => self.expand_id(id).await,
            (None, Some(key)) => self.id_of_key(scope, key).await,
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
            Queue::Direct { store, user, .. } => {
                let store = store.as_ref();
                let by = Queue::operator(user, reason);
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
            Queue::Direct { store, user, .. } => {
                let by = Queue::operator(user, Some(reason));
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
            Queue::Direct {
                store,
                retention,
                user,
                ..
            } => {
                let store = store.as_ref();
                let by = Queue::operator(user, reason);
                match action {
                    RelayAction::Pause => ops::pause(store, &by).await,
                    RelayAction::Resume => ops::resume(store, &by).await,
                    RelayAction::FlushAll => ops::flush_all(store, &by).await,
                    RelayAction::Purge => ops::purge(store, *retention, &by).await,
                }
            }
        }
    }

    /// Cancels every queued record `filter` matches: POST `/api/v1/queue/cancel`, or the same
    /// operation on the store.
    async fn cancel_matching(&self, filter: &BulkFilter, reason: Option<String>) -> OpResult {
        match self {
            Queue::Api(api) => {
                let mut body = Queue::body(&reason, false);
                body["filter"] = filter.json();
                api.post("/api/v1/queue/cancel", body).await
            }
            Queue::Direct { store, user, .. } => {
                let by = Queue::operator(user, reason);
                ops::cancel_matching(store.as_ref(), filter.query(), &by).await
            }
        }
    }

    /// The one record whose id starts with `prefix` (as `queue list` shortens ids), or the
    /// prefix itself when none or several do (the caller then says it is not found). Ids sort
    /// by acceptance, so those with the prefix are the first ones after it.
    async fn expand_id(&self, prefix: &str) -> Result<String, OpError> {
        // At least the time part and a random digit: a short word that happens to be hex (a
        // key, given to `show`) is not taken for an id.
        if !(12..24).contains(&prefix.len()) || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(prefix.to_string());
        }
        let query = ListQuery {
            limit: Some(2),
            cursor: Some(crate::store::Cursor::after_id(&prefix.to_ascii_uppercase()).encode()),
            ..ListQuery::default()
        };
        let page = self.list(query).await?;
        let matching: Vec<&str> = page["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["id"].as_str())
            .filter(|id| id.starts_with(&prefix.to_ascii_uppercase()))
            .collect();
        Ok(match matching.as_slice() {
            [one] => one.to_string(),
            _ => prefix.to_string(),
        })
    }

    async fn status(&self) -> OpResult {
        match self {
            Queue::Api(api) => api.get("/api/v1/queue/status").await,
            Queue::Direct { store, .. } => ops::status(store.as_ref()).await,
        }
    }
}

impl QueueCommand {
    /// The name of a command that changes the queue (as the refusal says it), None for a read.
    fn change(&self) -> Option<&'static str> {
        match self {
            QueueCommand::Status { .. } | QueueCommand::List(_) | QueueCommand::Show { .. } => None,
            QueueCommand::Resume { .. } => Some("resume"),
            QueueCommand::Pause { .. } => Some("pause"),
            QueueCommand::Retry { .. } => Some("retry"),
            QueueCommand::Resolve { .. } => Some("resolve"),
            QueueCommand::Cancel { all: true, .. } => Some("cancel --all"),
            QueueCommand::Cancel { .. } => Some("cancel"),
            QueueCommand::Flush { all: true, .. } => Some("flush --all"),
            QueueCommand::Flush { .. } => Some("flush"),
            QueueCommand::Purge { .. } => Some("purge"),
        }
    }

    /// Whether the output is JSON (the relay that answered goes in it, not on stderr).
    fn json(&self) -> bool {
        match self {
            QueueCommand::Status { json } | QueueCommand::Show { json, .. } => *json,
            QueueCommand::List(args) => args.json,
            _ => false,
        }
    }
}

pub(crate) fn run(
    settings: &Settings,
    store_given: Option<String>,
    direct: bool,
    target: AdminSource,
    by: Option<String>,
    command: QueueCommand,
) -> anyhow::Result<()> {
    if let Some(by) = &by {
        check_by(by)?;
    }
    if !direct && target == AdminSource::BuiltIn {
        let default = crate::config::Settings::default().admin;
        if let (Some(change), Some(addr)) = (command.change(), settings.admin.0) {
            // Whatever relay listens on the default address would take the change: on a host
            // with two relays (or a test relay), not necessarily the one meant.
            anyhow::bail!(
                "refusing to {change}: no relay is named, and the built-in default {addr} is \
                 whichever relay listens there. Name the relay: --admin http://HOST:PORT (or \
                 IDEMRELAY_ADMIN), or --config FILE whose `admin` is its listener (read by \
                 default: {}), or add --direct to work on a store",
                super::DEFAULT_CONFIG
            );
        }
        eprintln!(
            "note: no relay named (--admin URL, IDEMRELAY_ADMIN or a config file's `admin`): \
             asking whichever relay listens on the built-in default {default}"
        );
    }
    let user = local_user(by.as_deref());
    let json = command.json();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let queue = Queue::open(settings, store_given, direct, user).await?;
        let out = execute(&queue, settings, command).await;
        // Said on stderr (stdout stays parseable), also when the relay refused: the refusal
        // is that relay's.
        let mut answered = queue.answered_by_text();
        if let (Queue::Api(_), AdminSource::ConfigFile(file)) = (&queue, &target) {
            answered.push_str(&format!(", the `admin` of {}", file.display()));
        }
        let out = out.map_err(|e| {
            let mut message = e.message;
            if e.code == "confirmation_required" {
                // The API's hint names its own parameter; the command's is a flag.
                if let Some(cut) = message.find(", then POST again") {
                    message.truncate(cut);
                }
                message.push_str(", then rerun with --confirm-duplicate-risk");
            }
            if e.code != "admin_unreachable" {
                message.push_str(&format!(" (answered by {answered})"));
            }
            anyhow::anyhow!(message)
        })?;
        match out {
            Output::Text(text) => {
                eprintln!("answered by {answered}");
                print!("{text}");
            }
            Output::Json(mut value) => {
                debug_assert!(json);
                if let Some(object) = value.as_object_mut() {
                    object.insert("answered_by".to_string(), queue.answered_by());
                }
                print!("{}", pretty(&value));
            }
        }
        Ok(())
    })
}

/// What a command prints: text for people, or the API's JSON (to which the relay that
/// answered is added).
enum Output {
    Text(String),
    Json(Value),
}

async fn execute(
    queue: &Queue,
    settings: &Settings,
    command: QueueCommand,
) -> Result<Output, OpError> {
    let scope = &settings.scope;
    Ok(Output::Text(match command {
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
                return Ok(Output::Json(status));
            }
            status_text(&status)
        }
        QueueCommand::List(args) => {
            let page = queue.list(args.query()).await?;
            if args.json {
                return Ok(Output::Json(page));
            }
            if args.wide {
                list_table_wide(&page)
            } else {
                list_table(&page, crate::store::now_ms())
            }
        }
        QueueCommand::Show {
            id_or_key,
            key,
            json,
        } => {
            let record = match (id_or_key, key) {
                (_, Some(key)) => {
                    let id = queue.id_of_key(scope, &key).await?;
                    queue.show(&id).await?
                }
                (Some(id_or_key), None) => {
                    match queue.show(&queue.expand_id(&id_or_key).await?).await {
                        Err(e) if e.status == StatusCode::NOT_FOUND => {
                            let id = queue.id_of_key(scope, &id_or_key).await.map_err(|_| {
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
                    }
                }
                (None, None) => unreachable!("clap requires an id or --key"),
            };
            if json {
                return Ok(Output::Json(record));
            }
            show_text(&record)
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
        QueueCommand::Cancel {
            all: true,
            filter,
            reason,
            ..
        } => {
            let answer = queue.cancel_matching(&filter, reason).await?;
            let mut out = format!("cancelled {} record(s): no DSN sent\n", answer["cancelled"]);
            for id in answer["ids"].as_array().into_iter().flatten() {
                out.push_str(&format!("  {}\n", id.as_str().unwrap_or_default()));
            }
            if answer["skipped_leased"].as_u64().unwrap_or(0) > 0 {
                out.push_str(&format!(
                    "{} matching record(s) were being delivered right now and were left alone\n",
                    answer["skipped_leased"]
                ));
            }
            out
        }
        QueueCommand::Cancel {
            id, key, reason, ..
        } => {
            let id = queue.id_of(&RecordArg { id, key }, scope).await?;
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
    }))
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

/// `queue list` for a terminal: rows within 80 columns, as Postfix's mailq. Ages instead of
/// times; ids, keys and recipients shortened (`--wide` shows them whole); a queued record's
/// state is why it waits (`backoff`, `paused`, ...).
fn list_table(page: &Value, now_ms: i64) -> String {
    const WIDTH: usize = 80;
    let records = page["messages"].as_array().cloned().unwrap_or_default();
    let mut rows: Vec<Vec<String>> = records
        .iter()
        .map(|s| {
            // A queued record that is not simply due says why it waits, in a word (the
            // precise reason is in `--wide` and `queue show`).
            let state = match (s["state"].as_str(), s["waiting"]["reason"].as_str()) {
                (Some("queued"), Some("held_by_breaker" | "breaker_open")) => "breaker".into(),
                (Some("queued"), Some("account_paused")) => "paused".into(),
                (Some("queued"), Some(reason)) if reason != "due" => reason.to_string(),
                _ => cell(&s["state"]),
            };
            let age = s["accepted_at_ms"]
                .as_i64()
                .map_or_else(|| "-".to_string(), |at| age(now_ms - at));
            let recipients: Vec<String> = s["rcpt_to"]
                .as_array()
                .map(|r| r.iter().map(cell).collect())
                .unwrap_or_default();
            let rcpt = match recipients.as_slice() {
                [] => "-".to_string(),
                [one] => one.clone(),
                [first, rest @ ..] => format!("{first} +{}", rest.len()),
            };
            vec![
                shorten(&cell(&s["id"]), SHORT_ID),
                state,
                age,
                cell(&s["attempts"]),
                shorten(&cell(&s["key"]), 16),
                rcpt,
            ]
        })
        .collect();
    let header = ["ID", "STATE", "AGE", "TRY", "KEY", "RCPT"];
    // The last column takes what the others leave of the 80.
    let used: usize = (0..header.len() - 1)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
                + 2
        })
        .sum();
    let room = WIDTH.saturating_sub(used).max(8);
    for row in &mut rows {
        let last = row.len() - 1;
        row[last] = shorten(&row[last], room);
    }
    let mut out = table(&header, &rows);
    if let Some(cursor) = page["next_cursor"].as_str() {
        out.push_str(&format!("more: --cursor {cursor}\n"));
    }
    out
}

/// How many characters of an id the narrow listing shows: the acceptance time (11) and 20
/// random bits, unique among the records of one millisecond but for a one-in-a-million
/// chance; every record command takes such a beginning of an id.
const SHORT_ID: usize = 16;

/// `text` in at most `max` characters: its head and tail around a `…` (keys and addresses
/// often share a beginning and differ at the end). An id keeps its head only.
fn shorten(text: &str, max: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max {
        return text.to_string();
    }
    if max == SHORT_ID && chars.iter().all(char::is_ascii_hexdigit) {
        return chars[..max].iter().collect();
    }
    let head = (max - 1) / 2;
    let tail = max - 1 - head;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// An age in one unit, as people say it: `45s`, `3m`, `2h`, `5d`.
fn age(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// `queue list --wide`: every column, whole values, absolute times.
fn list_table_wide(page: &Value) -> String {
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

#[cfg(test)]
mod tests {
    use super::{age, shorten, SHORT_ID};

    #[test]
    fn ages_and_shortened_values() {
        assert_eq!(age(-5), "0s");
        assert_eq!(age(59_999), "59s");
        assert_eq!(age(3 * 60_000), "3m");
        assert_eq!(age(2 * 3_600_000 + 5), "2h");
        assert_eq!(age(5 * 86_400_000), "5d");
        assert_eq!(shorten("short", 16), "short");
        let key = "order-2026-12-04-customer-1234567";
        let short = shorten(key, 16);
        assert_eq!(short.chars().count(), 16);
        assert!(
            short.starts_with("order-2") && short.ends_with("1234567"),
            "{short}"
        );
        assert_eq!(
            shorten("0190ABCDEF1234567890ABCD", SHORT_ID),
            "0190ABCDEF123456"
        );
    }
}
