//! The queue commands' answers for people: tables within 80 columns, ages, shortened values,
//! one record's page. `--json` prints the API's answer instead.

use serde_json::Value;

use crate::cli::table::{or_dash, table};

pub(super) fn pretty(value: &Value) -> String {
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

pub(super) fn status_text(status: &Value) -> String {
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
pub(super) fn list_table(page: &Value, now_ms: i64) -> String {
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
pub(super) fn list_table_wide(page: &Value) -> String {
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

pub(super) fn show_text(m: &Value) -> String {
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
