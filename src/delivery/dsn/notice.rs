//! Which notices the end of a message brings, to whom, and what of the original they return
//! (RFC 3461 §4, RFC 8689 §5; docs/concepts/delivery.md), as the records queued in the commit
//! that settles the message. Pure: ids and times come in from the caller.
//!
//! - A failure notice reports the recipients whose NOTIFY includes FAILURE (or who sent no
//!   NOTIFY); with none of them left, there is no notice at all.
//! - A "relayed" notice reports the recipients whose NOTIFY includes SUCCESS, when an upstream
//!   without DSN took the message; an upstream that offers DSN was handed NOTIFY and has the
//!   duty itself.
//! - A delay notice reports the recipients whose NOTIFY includes DELAY, once per record, when
//!   a retry is scheduled for a message queued at least `delay_notice_after` (whatever the
//!   upstream offers: the message has not left the relay). Queued in the commit that
//!   schedules the retry, under a key derived from the record with a context of its own:
//!   every later retry settles with the same key, and the store's insert is then a no-op, so
//!   the notice is queued once. A recipient without NOTIFY gets none (RFC 3461 §4.1 leaves
//!   delay notices to the MTA's discretion; the relay sends them only when asked).
//! - Never a notice to the null sender.

use super::report::{
    build_dsn, dsn_key, header_section, is_clean_7bit, split_crlf, Action, DsnInput, Returned,
    MAX_RETURNED,
};
use crate::delivery::extensions::is_requiretls_refusal;
use crate::delivery::outcome::Outcome;
use crate::delivery::retry::{Next, RetryPolicy};
use crate::mail::requests::Ret;
use crate::mail::DeliveryRequests;
use crate::store::{Claimed, KeySource, NewRecord};

/// The recipients a notice of `action` reports on, in envelope order.
pub(crate) fn notified(job: &Claimed, action: Action) -> Vec<String> {
    job.rcpt_to
        .iter()
        .filter(|r| {
            let on = job.requests.notify_on(r);
            match action {
                Action::Failed => on.failure,
                Action::Relayed => on.success,
                Action::Delayed { .. } => on.delay,
            }
        })
        .cloned()
        .collect()
}

/// What of the original a notice returns: the whole message only for a failure, with RET=FULL,
/// and never for a REQUIRETLS message (RFC 8689 §5: its notice carries the headers only, since
/// the notice's own path may be less protected than the message's).
pub(crate) fn returned(job: &Claimed, action: Action) -> Returned {
    let full = action == Action::Failed
        && !job.requests.require_tls
        && job.requests.ret() == Some(Ret::Full);
    if !full {
        return Returned::Headers;
    }
    let message = &job.content;
    if message.len() > MAX_RETURNED {
        return Returned::HeadersTooLarge;
    }
    // message/rfc822 cannot be re-encoded: every line must already travel as it is, and its
    // header section must be ASCII (UTF-8 headers would need message/global).
    let lines_fit = split_crlf(message)
        .iter()
        .all(|l| l.len() <= 998 && !l.contains(&b'\r') && !l.contains(&b'\n'));
    let eight_bit_declared = job.eight_bit || message.is_ascii();
    if !lines_fit || !eight_bit_declared || !is_clean_7bit(header_section(message)) {
        return Returned::HeadersUnfit;
    }
    Returned::Full
}

/// The sender's notice queued with an attempt's outcome (docs/concepts/delivery.md,
/// "Delivery status notifications"): the failure notice, or the "relayed" notice when an
/// upstream without DSN (`upstream_offers_dsn` false) took a message some recipient asked to
/// hear of success about, or the delay notice of a message retried after waiting long
/// (`policy`'s `delay_notice_after`). `id` is the notice's queue id, `now_ms` the time of the
/// outcome.
#[allow(clippy::too_many_arguments)]
pub(crate) fn notice_for(
    job: &Claimed,
    next: Next,
    outcome: &Outcome,
    policy: &RetryPolicy,
    upstream_offers_dsn: bool,
    reporting_mta: &str,
    id: String,
    now_ms: i64,
) -> Option<NewRecord> {
    match next {
        Next::Delivered => relayed_dsn_for(
            job,
            &outcome.reply_text(),
            upstream_offers_dsn,
            reporting_mta,
            id,
            now_ms / 1000,
        ),
        Next::Failed => dsn_for(job, outcome, reporting_mta, id, now_ms / 1000),
        Next::RetryAfter(_) => delay_dsn_for(job, outcome, policy, reporting_mta, id, now_ms),
        Next::Unresolved => None,
    }
}

/// The RFC 3464 notice for `job`'s permanent failure, as the record queued in the failure's
/// commit, keyed from the original so that it is itself sent once. None for the null sender
/// (never notify a notification) and when no recipient asked for it.
pub(crate) fn dsn_for(
    job: &Claimed,
    outcome: &Outcome,
    reporting_mta: &str,
    id: String,
    now_unix: i64,
) -> Option<NewRecord> {
    let recipients = notified(job, Action::Failed);
    if job.mail_from.is_empty() || recipients.is_empty() {
        return None;
    }
    // Per record, not per key: a key reused after retention may fail again and deserves its
    // own notice.
    let key = dsn_key(&job.scope, &job.id);
    let report = build_dsn(&DsnInput {
        action: Action::Failed,
        returned: returned(job, Action::Failed),
        reporting_mta,
        original_id: &job.id,
        original_envelope_from: &job.mail_from,
        recipients: &recipients,
        phase: outcome.phase().map_or("dot", |p| p.as_str()),
        remote_code: outcome.code().unwrap_or(550),
        remote_reply: &outcome.reply_text(),
        arrival_unix: job.accepted_at_ms / 1000,
        now_unix,
        original_message: &job.content,
        dsn_message_id: &format!("{id}@{reporting_mta}"),
        refused_by_relay: is_requiretls_refusal(outcome),
        requests: &job.requests,
    });
    Some(record(job, key, id, report))
}

/// The "relayed" notice (RFC 3461 §4.1, RFC 3464 `Action: relayed`) for the recipients of an
/// accepted `job` that asked to hear of success, when the upstream does not offer DSN and so
/// will not tell them itself. Queued in the commit that marks the message delivered, under a
/// key of its own derived from the record: a redelivery (the first outcome lost) settles
/// again with the same key, and the notice is still sent once.
pub(crate) fn relayed_dsn_for(
    job: &Claimed,
    accepted_reply: &str,
    upstream_offers_dsn: bool,
    reporting_mta: &str,
    id: String,
    now_unix: i64,
) -> Option<NewRecord> {
    let recipients = notified(job, Action::Relayed);
    if upstream_offers_dsn || job.mail_from.is_empty() || recipients.is_empty() {
        return None;
    }
    let key = relayed_dsn_key(&job.scope, &job.id);
    let report = build_dsn(&DsnInput {
        action: Action::Relayed,
        returned: returned(job, Action::Relayed),
        reporting_mta,
        original_id: &job.id,
        original_envelope_from: &job.mail_from,
        recipients: &recipients,
        phase: "dot",
        remote_code: crate::delivery::outcome::leading_code(accepted_reply).unwrap_or(250),
        remote_reply: accepted_reply,
        arrival_unix: job.accepted_at_ms / 1000,
        now_unix,
        original_message: &job.content,
        dsn_message_id: &format!("{id}@{reporting_mta}"),
        refused_by_relay: false,
        requests: &job.requests,
    });
    Some(record(job, key, id, report))
}

/// The key of a relayed notice: as [`dsn_key`], under a context of its own, so that a record
/// that failed once and was delivered after an operator's requeue has two distinct notices.
pub(crate) fn relayed_dsn_key(scope: &str, original_id: &str) -> String {
    let mut h = blake3::Hasher::new_derive_key("idemrelay 2026 relayed dsn idempotency key v1");
    for field in [scope, original_id] {
        h.update(&(field.len() as u64).to_le_bytes());
        h.update(field.as_bytes());
    }
    format!("dsn-{}", &h.finalize().to_hex()[..40])
}

/// The queued record of a notice to `job`'s sender. A notice on a REQUIRETLS message is sent
/// with REQUIRETLS itself (RFC 8689 §5): it cannot leave in the clear either, and when the
/// upstream cannot take it so, it fails in turn, and (sent from the null sender) ends there.
pub(super) fn record(job: &Claimed, key: String, id: String, report: Vec<u8>) -> NewRecord {
    use crate::mail::KEY_HEADER;
    use crate::mail::{BodyType, Envelope};
    use crate::reply::Reply;
    use crate::store::State;
    use idemrelay_model::fingerprint::{fingerprint, message_fingerprint};

    let mut content = format!("{KEY_HEADER}: {key}\r\n").into_bytes();
    content.extend_from_slice(&report);
    let envelope = Envelope {
        mail_from: String::new(),
        rcpt_to: vec![job.mail_from.clone()],
        body: if job.eight_bit {
            BodyType::EightBitMime
        } else {
            BodyType::SevenBit
        },
        smtputf8: job.smtputf8,
        requests: DeliveryRequests {
            require_tls: job.requests.require_tls,
            ..Default::default()
        },
    };
    NewRecord {
        fingerprint: fingerprint(&job.scope, &envelope, &content),
        message_fp: message_fingerprint(&job.scope, &envelope, &content),
        reply: Reply::queued(&id).line(),
        id,
        scope: job.scope.clone(),
        // Unique per record and scope already: the upstream sees it as it is.
        upstream_key: Some(key.clone()),
        part: 1,
        key: Some(key),
        key_source: Some(KeySource::Dsn),
        envelope,
        size: content.len(),
        content: Some(content),
        state: State::Queued,
        dsn_of: Some(job.id.clone()),
        // Events name the message the DSN reports on, not the DSN.
        message_id: None,
    }
}

/// The delay notice for `job`, whose attempt just ended with a retry scheduled at `now_ms`.
/// None unless delay notices are on, the message has waited at least `delay_notice_after`,
/// the sender is not null and some recipient asked (NOTIFY=DELAY).
pub(crate) fn delay_dsn_for(
    job: &Claimed,
    outcome: &Outcome,
    policy: &RetryPolicy,
    reporting_mta: &str,
    id: String,
    now_ms: i64,
) -> Option<NewRecord> {
    let after = policy.delay_notice_after;
    let waited_ms = now_ms.saturating_sub(job.accepted_at_ms);
    let due = !after.is_zero() && u128::try_from(waited_ms).is_ok_and(|w| w >= after.as_millis());
    if !due || job.mail_from.is_empty() {
        return None;
    }
    let action = Action::Delayed {
        will_retry_until: will_retry_until_unix(job.accepted_at_ms, policy),
    };
    let recipients = notified(job, action);
    if recipients.is_empty() {
        return None;
    }
    let key = delayed_dsn_key(&job.scope, &job.id);
    let reply = outcome.reply_text();
    let report = build_dsn(&DsnInput {
        action,
        returned: returned(job, action),
        reporting_mta,
        original_id: &job.id,
        original_envelope_from: &job.mail_from,
        recipients: &recipients,
        phase: outcome.phase().map_or("dot", |p| p.as_str()),
        remote_code: outcome.code().unwrap_or(0),
        remote_reply: &reply,
        arrival_unix: job.accepted_at_ms / 1000,
        now_unix: now_ms / 1000,
        original_message: &job.content,
        dsn_message_id: &format!("{id}@{reporting_mta}"),
        refused_by_relay: false,
        requests: &job.requests,
    });
    Some(record(job, key, id, report))
}

/// The relay's deadline for the message (acceptance plus `[delivery] deadline`), in Unix
/// seconds; None when it is beyond what a date can say.
fn will_retry_until_unix(accepted_at_ms: i64, policy: &RetryPolicy) -> Option<i64> {
    let deadline_ms = i64::try_from(policy.deadline.as_millis()).ok()?;
    Some(accepted_at_ms.checked_add(deadline_ms)? / 1000)
}

/// The key of a delay notice: as the other notices' keys, under a context of its own, so that
/// a record with a delay notice and then a failure notice has both.
pub(crate) fn delayed_dsn_key(scope: &str, original_id: &str) -> String {
    let mut h = blake3::Hasher::new_derive_key("idemrelay 2026 delayed dsn idempotency key v1");
    for field in [scope, original_id] {
        h.update(&(field.len() as u64).to_le_bytes());
        h.update(field.as_bytes());
    }
    format!("dsn-{}", &h.finalize().to_hex()[..40])
}

#[cfg(test)]
#[path = "notice_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "delay_tests.rs"]
mod delay_tests;
