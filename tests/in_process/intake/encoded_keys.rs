//! Keys that mail libraries encode are still the application's keys.

use super::*;

/// A Cyrillic key as Python spells it: a B word, then a Q word.
const PYTHON_CYRILLIC_KEY: &str = "заказ-1234-квитанция";
const PYTHON_CYRILLIC_FIELD: &str =
    "=?utf-8?b?0LfQsNC60LDQty0xMjM0LdC60LLQuNGC0LDQvdGG?=\r\n =?utf-8?q?=D0=B8=D1=8F?=";

/// A path segment for the admin API: every byte but the unreserved ones percent-encoded.
fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The key is what the application set, whatever encoding its mail library chose: stored and
/// found under it, replayed on a retry of the same bytes, and written for the upstream in a
/// form every reader takes for that key.
#[tokio::test]
async fn keys_encoded_by_mail_libraries_are_the_applications_keys() {
    let relay = TestRelay::start().await;
    let long = python_message("r-205", PYTHON_LONG_FIELD);
    let cyrillic = python_message("r-20", PYTHON_CYRILLIC_FIELD);
    let mut ids = Vec::new();
    for (key, msg) in [(PYTHON_LONG_KEY, &long), (PYTHON_CYRILLIC_KEY, &cyrillic)] {
        let first = submit_once(&relay, &["user@example.com"], msg).await;
        let id = first
            .queue_id()
            .unwrap_or_else(|| panic!("{key}: not accepted: {first:?}"));
        let shown = common::http::get(
            relay.admin(),
            &format!("/api/v1/keys/default/{}", path_segment(key)),
            None,
        )
        .await;
        assert_eq!(shown.status, 200, "{key}: {}", shown.body);
        let shown = shown.json();
        assert_eq!(shown["id"], id.as_str());
        assert_eq!(shown["key"], key);
        assert_eq!(shown["key_source"], "header");
        assert_eq!(shown["upstream_key"], key);
        let again = submit_once(&relay, &["user@example.com"], msg).await;
        assert_eq!(
            again.line(),
            format!("250 2.0.0 OK queued as {id} (idempotent replay)")
        );
        ids.push(id);
    }
    assert_eq!(relay.count("messages").await, 2);

    // An ASCII key goes upstream plain, in place of the client's encoded field: every reader
    // finds it, whether or not it decodes encoded words (spelled encoded, this one is longer
    // than a key may be).
    let stored = relay.stored(&ids[0]).await.content.unwrap();
    let text = String::from_utf8(stored).unwrap();
    let header = &text[..text.find("\r\n\r\n").unwrap() + 2];
    assert!(
        header.contains(&format!(
            "\r\nX-Bird-Idempotency-Key: {PYTHON_LONG_KEY}\r\n"
        )),
        "{header}"
    );
    assert_eq!(
        header.matches("X-Bird-Idempotency-Key:").count(),
        1,
        "{header}"
    );
    assert!(!header.contains("=?utf-8?q?receipt"), "{header}");
    // A key that is not ASCII can only be written encoded in a message that is not SMTPUTF8:
    // the client's field goes as it came.
    let stored = relay.stored(&ids[1]).await.content.unwrap();
    let text = String::from_utf8(stored).unwrap();
    assert!(
        text.contains(&format!(
            "\r\nX-Bird-Idempotency-Key: {PYTHON_CYRILLIC_FIELD}\r\n"
        )),
        "{text}"
    );
    assert_eq!(text.matches("X-Bird-Idempotency-Key:").count(), 1, "{text}");
}

/// Earlier versions stored a key spelled in encoded words as spelled. A client's retry that
/// reaches an upgraded relay (within retention) must still replay that record, not become a
/// second message under the decoded key.
#[tokio::test]
async fn a_record_stored_under_the_encoded_spelling_still_replays() {
    let relay = TestRelay::start().await;
    let msg = python_message("r-20", PYTHON_CYRILLIC_FIELD);
    let first = submit_once(&relay, &["user@example.com"], &msg).await;
    let id = first.queue_id().expect("queued");
    // The record as an earlier version stored it: under the unfolded spelling.
    let spelled = PYTHON_CYRILLIC_FIELD.replace("\r\n", "");
    common::backend::execute(
        relay.settings.store.expose(),
        &format!("UPDATE messages SET idem_key = '{spelled}' WHERE id = '{id}'"),
    )
    .await;
    let again = submit_once(&relay, &["user@example.com"], &msg).await;
    assert_eq!(
        again.line(),
        format!("250 2.0.0 OK queued as {id} (idempotent replay)")
    );
    assert_eq!(relay.count("messages").await, 1);
    // And another message under that key is a reuse, as it was before the upgrade.
    let other = python_message("r-21", PYTHON_CYRILLIC_FIELD);
    let answer = submit_once(&relay, &["user@example.com"], &other).await;
    assert_eq!(answer.line(), E01005);
    assert_eq!(relay.count("messages").await, 1);
}
