//! `idemrelay queue ...`: through the running relay's admin API by default, on the store itself
//! with `--direct`. Both paths answer with the same JSON (`admin::ops`), which is printed as is
//! (`--json`) or as tables for people.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::Value;

use crate::admin::api::reason_or_default;
use crate::admin::client::AdminClient;
use crate::admin::ops::{self, OpError, OpResult};
use crate::admin::wire::{encode, ListQuery};
use crate::config::Settings;
use crate::store::{Operator, Resolution, Retention, Store};

mod args;
mod render;

pub(crate) use args::QueueCommand;
use args::{BulkFilter, RecordAction, RecordArg, RelayAction};
use render::{list_table, list_table_wide, pretty, show_text, status_text};

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
                crate::config::DEFAULT_CONFIG
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
