//! The webhook sender: posts each accepted message's event batches to `--webhook`, signed,
//! retried with backoff, with the `phase=webhook` faults applied. The final dot only plans
//! (in memory, under the state lock); tasks do the posting, so a slow or dead receiver never
//! delays an SMTP reply. Pending batches are bounded: past the bound a message's batches are
//! dropped and counted, never queued without limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE, HOST, RETRY_AFTER, USER_AGENT};
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Semaphore};
use url::{Host, Url};

use super::faults::{FaultAction, FaultRule, WebhookFault};
use super::life::{self, Life};
use super::webhook::{self, Accepted, Batch, EventType, RetryPolicy, Secret};

/// Batches waiting or being posted, across all messages.
const MAX_PENDING_BATCHES: usize = 10_000;
/// Requests in flight at once.
const MAX_REQUESTS: usize = 16;
/// How much of a response body is kept in the attempt record.
const RESPONSE_EXCERPT: usize = 200;

/// Where and how the sink posts its events.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// `http://host[:port]/path`.
    pub url: Url,
    /// Each signs every request (`webhook-signature` gets one entry per secret).
    pub secrets: Vec<Secret>,
    /// How long after acceptance the delivery (or bounce) batch is due.
    pub delivery_delay: Duration,
    /// Recipients containing one of these (ASCII case-insensitive) bounce instead of being
    /// delivered.
    pub bounce: Vec<String>,
    pub retry: RetryPolicy,
    /// For one request, connection included.
    pub timeout: Duration,
}

impl WebhookConfig {
    pub fn new(url: Url, secrets: Vec<Secret>) -> Self {
        WebhookConfig {
            url,
            secrets,
            delivery_delay: Duration::from_millis(200),
            bounce: Vec::new(),
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(15),
        }
    }

    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        Target::of(&self.url)?;
        anyhow::ensure!(
            !self.secrets.is_empty(),
            "the webhook needs a secret (--webhook-secret)"
        );
        anyhow::ensure!(
            self.retry.max_attempts > 0,
            "webhook attempts must be at least 1"
        );
        anyhow::ensure!(
            !self.timeout.is_zero(),
            "the webhook timeout must be positive"
        );
        Ok(())
    }
}

/// How one post of a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// 2xx: the batch is delivered.
    Delivered,
    /// 2xx, but a `lose_ack` rule treats it as lost: the batch is posted again.
    AckLost,
    /// Failed; another post follows after the backoff.
    Retrying,
    /// Failed, and attempts or time are used up: this copy of the batch is given up.
    GaveUp,
}

/// One post of one batch, as `GET /webhooks` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WebhookAttempt {
    /// Order of the posts' ends, from 1; not reset by `clear`.
    pub seq: u64,
    pub webhook_id: String,
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// The sink's id of the message the events are about.
    pub message_id: String,
    pub key: Option<String>,
    /// Events in the batch (one per recipient).
    pub events: usize,
    /// 1, or 2 for the second delivery of a `duplicate` batch.
    pub copy: u32,
    /// Posts of this copy so far, this one included (from 1).
    pub attempt: u32,
    /// The `webhook-timestamp` sent (fresh on every post, and signed with it).
    pub webhook_timestamp: i64,
    /// The receiver's status, when it answered.
    pub status: Option<u16>,
    /// Why there was no answer (connection refused, timeout, ...).
    pub error: Option<String>,
    /// The start of the receiver's response body.
    pub response: Option<String>,
    pub outcome: AttemptOutcome,
    /// The `phase=webhook` rule that fired on this batch, in CLI syntax.
    pub fault: Option<String>,
    /// When the post started, Unix ms.
    pub sent_at: u64,
}

/// Webhook counts for `/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WebhookStats {
    /// Batches planned for accepted messages.
    pub batches: u64,
    /// Posts made.
    pub attempts: u64,
    /// Batch copies that got their 2xx (a `duplicate` batch counts twice).
    pub delivered: u64,
    /// Batch copies given up after their last attempt.
    pub failed: u64,
    /// Batches never posted because too many were pending.
    pub dropped: u64,
    /// Batches planned and not finished yet.
    pub pending: u64,
}

/// The parts of the URL a request needs.
#[derive(Debug, Clone)]
struct Target {
    host: Host<String>,
    port: u16,
    /// The `Host` header.
    authority: String,
    /// Path and query.
    path: String,
}

impl Target {
    fn of(url: &Url) -> anyhow::Result<Target> {
        anyhow::ensure!(
            url.scheme() == "http",
            "the sink posts webhooks over plain http only, not {}://",
            url.scheme()
        );
        let host = url
            .host()
            .map(|h| h.to_owned())
            .ok_or_else(|| anyhow::anyhow!("the webhook URL has no host"))?;
        let port = url.port_or_known_default().unwrap_or(80);
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        let mut path = url.path().to_string();
        if let Some(query) = url.query() {
            path.push('?');
            path.push_str(query);
        }
        Ok(Target {
            host,
            port,
            authority,
            path,
        })
    }
}

/// Where the sender reports its posts: the sink's shared state, which sits above the sender
/// (it owns one) and so is reached through this rather than named.
pub(crate) trait AttemptLog: Send + Sync + 'static {
    /// Records one post of a batch (and says so to whoever waits for changes).
    fn record(&self, attempt: WebhookAttempt);
    /// Something changed that a waiter may be looking for (a batch ended).
    fn notify(&self);
    fn life(&self) -> watch::Receiver<Life>;
}

pub(crate) struct Sender {
    pub config: WebhookConfig,
    target: Target,
    pending: Arc<Semaphore>,
    requests: Arc<Semaphore>,
}

/// A batch with what the faults make of it.
struct Post {
    batch: Batch,
    message_id: String,
    key: Option<String>,
    /// The rule that fired on it, in CLI syntax, for the record.
    rule: Option<String>,
    fault: Option<WebhookFault>,
}

impl Sender {
    pub(crate) fn new(config: WebhookConfig) -> anyhow::Result<Self> {
        config.validate()?;
        Ok(Sender {
            target: Target::of(&config.url)?,
            config,
            pending: Arc::new(Semaphore::new(MAX_PENDING_BATCHES)),
            requests: Arc::new(Semaphore::new(MAX_REQUESTS)),
        })
    }

    pub(crate) fn pending(&self) -> u64 {
        (MAX_PENDING_BATCHES - self.pending.available_permits()) as u64
    }

    /// The event types `message` gets batches for, in planning order (the order in which
    /// the `phase=webhook` rules are tried).
    pub(crate) fn event_types(&self, rcpt_to: &[String]) -> Vec<EventType> {
        webhook::event_types(rcpt_to, &self.config.bounce)
    }

    /// Starts posting the batches of an accepted message; `faults` has the rule fired for
    /// each batch, in `event_types` order. Returns how many batches were dropped (all or
    /// none: a message's batches are pending together).
    pub(crate) fn schedule<L: AttemptLog>(
        &self,
        shared: &Arc<L>,
        message: Accepted,
        faults: Vec<Option<FaultRule>>,
    ) -> usize {
        let accepted = Instant::now();
        let batches = webhook::batches(&message, &self.config.bounce, self.config.delivery_delay);
        let Ok(mut permits) = self
            .pending
            .clone()
            .try_acquire_many_owned(u32::try_from(batches.len()).unwrap_or(u32::MAX))
        else {
            tracing::warn!(
                id = %message.id,
                batches = batches.len(),
                "sink webhook queue full; events dropped"
            );
            return batches.len();
        };
        let mut posts: Vec<Post> = batches
            .into_iter()
            .zip(faults.into_iter().chain(std::iter::repeat(None)))
            .map(|(batch, rule)| {
                let fault = match rule.as_ref().map(|r| &r.action) {
                    Some(FaultAction::Webhook(f)) => Some(*f),
                    _ => None,
                };
                Post {
                    batch,
                    message_id: message.id.clone(),
                    key: message.key.clone(),
                    rule: rule.map(|r| r.to_string()),
                    fault,
                }
            })
            .collect();
        // The injection batch of a `reorder` waits for every later batch of the message to
        // be done: it holds the receiving end, the later ones a sender each.
        let reorder = posts.first().is_some_and(|p| {
            p.batch.event_type == EventType::Injection && p.fault == Some(WebhookFault::Reorder)
        });
        let (done_tx, done_rx) = mpsc::channel::<()>(1);
        let mut first_waits = reorder.then_some(done_rx);
        let later_signal = reorder.then_some(done_tx);
        for (i, post) in posts.drain(..).enumerate() {
            let permit = permits.split(1).expect("one permit per batch");
            let wait_for = if i == 0 { first_waits.take() } else { None };
            let signal = if i == 0 { None } else { later_signal.clone() };
            let task = Task {
                shared: shared.clone() as Arc<dyn AttemptLog>,
                target: self.target.clone(),
                secrets: self.config.secrets.clone(),
                retry: self.config.retry,
                timeout: self.config.timeout,
                requests: self.requests.clone(),
            };
            let late = match post.fault {
                Some(WebhookFault::Late(late)) => late,
                _ => Duration::ZERO,
            };
            let due = accepted + post.batch.due + late;
            let mut life = shared.life();
            let shared = shared.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = task.run(&post, due, wait_for) => {}
                    () = life::shutting_down(&mut life) => {}
                }
                // A reordered injection batch waits for every `signal` to be dropped.
                drop(signal);
                drop(permit);
                shared.notify();
            });
        }
        0
    }
}

/// One batch's task: what it needs to post, and what it holds until it is done.
struct Task {
    shared: Arc<dyn AttemptLog>,
    target: Target,
    secrets: Vec<Secret>,
    retry: RetryPolicy,
    timeout: Duration,
    requests: Arc<Semaphore>,
}

impl Task {
    async fn run(&self, post: &Post, due: Instant, wait_for: Option<mpsc::Receiver<()>>) {
        tokio::time::sleep_until(due.into()).await;
        if let Some(mut later) = wait_for {
            // `None` once every later batch's task has ended.
            while later.recv().await.is_some() {}
        }
        self.deliver(post, 1).await;
        if post.fault == Some(WebhookFault::Duplicate) {
            self.deliver(post, 2).await;
        }
    }

    /// Posts one copy of the batch until a 2xx or until the retry policy gives up. The
    /// webhook-id and body never change; the timestamp and signature are fresh on every
    /// post, as Standard Webhooks senders do.
    async fn deliver(&self, post: &Post, copy: u32) {
        let first = Instant::now();
        let mut lose_ack = post.fault == Some(WebhookFault::LoseAck) && copy == 1;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let sent_at = life::unix_ms();
            let timestamp = i64::try_from(sent_at / 1000).unwrap_or(i64::MAX);
            let signature = webhook::signature_header(
                &self.secrets,
                &post.batch.webhook_id,
                timestamp,
                &post.batch.body,
            );
            let result = {
                let _slot = self.requests.acquire().await;
                tokio::time::timeout(
                    self.timeout,
                    post_once(&self.target, post, timestamp, &signature),
                )
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.timeout)))
            };
            let (status, retry_after, response, error) = match result {
                Ok(answer) => (
                    Some(answer.status),
                    answer.retry_after,
                    Some(answer.excerpt),
                    None,
                ),
                Err(error) => (None, None, None, Some(error)),
            };
            let success = status.is_some_and(|s| (200..300).contains(&s));
            let wait = self.retry.backoff(attempt, fastrand::f64(), retry_after);
            let outcome = if success && lose_ack {
                lose_ack = false;
                AttemptOutcome::AckLost
            } else if success {
                AttemptOutcome::Delivered
            } else if self.retry.may_retry(attempt, first.elapsed(), wait) {
                AttemptOutcome::Retrying
            } else {
                AttemptOutcome::GaveUp
            };
            tracing::info!(
                webhook_id = %post.batch.webhook_id,
                event_type = post.batch.event_type.as_str(),
                copy,
                attempt,
                status = status.unwrap_or(0),
                error = error.as_deref().unwrap_or("-"),
                outcome = ?outcome,
                "sink webhook post"
            );
            self.shared.record(WebhookAttempt {
                seq: 0,
                webhook_id: post.batch.webhook_id.clone(),
                event_type: post.batch.event_type,
                message_id: post.message_id.clone(),
                key: post.key.clone(),
                events: post.batch.events,
                copy,
                attempt,
                webhook_timestamp: timestamp,
                status,
                error,
                response,
                outcome,
                fault: post.rule.clone(),
                sent_at,
            });
            match outcome {
                AttemptOutcome::Delivered | AttemptOutcome::GaveUp => return,
                AttemptOutcome::Retrying => tokio::time::sleep(wait).await,
                // The sender saw no 2xx, so it retries like after any failure.
                AttemptOutcome::AckLost => {
                    tokio::time::sleep(self.retry.backoff(1, fastrand::f64(), None)).await
                }
            }
        }
    }
}

struct Answer {
    status: u16,
    retry_after: Option<Duration>,
    excerpt: String,
}

/// One POST over a fresh connection: a sender whose connection broke must not reuse it, and
/// a test upstream gains nothing from pooling.
async fn post_once(
    target: &Target,
    post: &Post,
    timestamp: i64,
    signature: &str,
) -> Result<Answer, String> {
    let stream = match &target.host {
        Host::Domain(name) => TcpStream::connect((name.as_str(), target.port)).await,
        Host::Ipv4(ip) => TcpStream::connect((*ip, target.port)).await,
        Host::Ipv6(ip) => TcpStream::connect((*ip, target.port)).await,
    }
    .map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Body>(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("http: {e}"))?;
    let connection = tokio::spawn(connection);
    let header = |value: &str| HeaderValue::from_str(value).map_err(|e| format!("header: {e}"));
    let request = hyper::Request::post(target.path.as_str())
        .header(HOST, header(&target.authority)?)
        .header(CONTENT_TYPE, "application/json")
        .header(USER_AGENT, "idemrelay-sink")
        .header(CONNECTION, "close")
        .header("webhook-id", header(&post.batch.webhook_id)?)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", header(signature)?)
        .body(Body::from(post.batch.body.clone()))
        .map_err(|e| format!("request: {e}"))?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("http: {e}"))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(webhook::retry_after);
        // The status is the answer; a body that breaks off or runs long only shortens the
        // excerpt.
        let body = axum::body::to_bytes(Body::new(response.into_body()), 64 * 1024)
            .await
            .unwrap_or_default();
        let excerpt: String = String::from_utf8_lossy(&body)
            .chars()
            .take(RESPONSE_EXCERPT)
            .collect();
        Ok(Answer {
            status,
            retry_after,
            excerpt,
        })
    }
    .await;
    connection.abort();
    result
}
