//! The delay notice (RFC 3461 §4.1 NOTIFY=DELAY, RFC 3464 `Action: delayed`): a message still
//! queued `delay_notice_after` since acceptance, with a retry scheduled, tells its sender so,
//! once per record, naming only the recipients that asked for delay notices. A recipient
//! without NOTIFY gets none (RFC 3461 §4.1 leaves delay notices to the MTA's discretion; the
//! relay sends them only when asked).
//!
//! Sent whatever the upstream offers: the message has not left the relay, so no upstream has
//! the duty yet. Queued in the commit that schedules the retry, under a key derived from the
//! record with a context of its own: every later retry settles with the same key, and the
//! store's insert is then a no-op, so the notice is queued once.

use super::notice::{notified, record, returned};
use super::{build_dsn, clean, rfc822_date, wrap, Action, DsnInput};
use crate::delivery::outcome::{EnhancedCode, Outcome};
use crate::delivery::retry::RetryPolicy;
use crate::store::{Claimed, NewRecord};

pub(super) const SUBJECT: &str = "Delivery Status Notification (Delay)";

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

/// The status of a delay notice: the reply's own 4.x.x enhanced code, else 4.0.0.
pub(super) fn status_code(reply: &str) -> String {
    match EnhancedCode::from_reply(reply) {
        Some(e) if e.class == 4 => e.to_string(),
        _ => "4.0.0".to_string(),
    }
}

/// The per-recipient `Will-Retry-Until` field of a delay notice (RFC 3464 §2.3.9); nothing
/// for the other notices, or when the deadline is not known.
pub(super) fn will_retry_until(action: Action) -> String {
    match action {
        Action::Delayed {
            will_retry_until: Some(until),
        } => super::fold("Will-Retry-Until", &rfc822_date(until)),
        _ => String::new(),
    }
}

pub(super) fn human_part(input: &DsnInput<'_>, will_retry_until: Option<i64>) -> String {
    let mta = clean(input.reporting_mta);
    let mut out = String::new();
    out += &wrap(&format!("This is the mail delivery system at {mta}."), "");
    out += "\r\n";
    out += "Your message has not yet been delivered to the following recipients:\r\n\r\n";
    for r in input.recipients {
        out += &wrap(&super::recipient_for_humans(r), "    ");
    }
    out += "\r\n";
    let until = match will_retry_until {
        Some(at) => format!(" until {}", rfc822_date(at)),
        None => String::new(),
    };
    out += &wrap(
        &format!(
            "You asked to be told of delays. The relay keeps trying{until}; this is only a \
             warning, and you do not need to send the message again. This is the only delay \
             notice you will get about it."
        ),
        "",
    );
    let diagnostic = super::diagnostic_text(input);
    if !diagnostic.is_empty() {
        out += "\r\n";
        out += &wrap("The last attempt ended with:", "");
        out += &wrap(&diagnostic, "    ");
    }
    out += "\r\n";
    out += &wrap(
        &format!("Relay message id: {}", clean(input.original_id)),
        "",
    );
    out += &wrap(
        &format!("Received by the relay: {}", rfc822_date(input.arrival_unix)),
        "",
    );
    out += "\r\n";
    out += &wrap(super::returned_text(input.returned), "");
    out
}

#[cfg(test)]
#[path = "delay_tests.rs"]
mod tests;
