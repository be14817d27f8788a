//! Intake over real sockets: every row of the reply table of docs/concepts/contract.md, derived keys, the
//! concurrent same-key race, retention, and store unavailability.

use crate::common;

use std::time::Duration;

use common::backend::WriteLock;
use common::{message, Client, TestRelay};
use idemrelay::mail::MissingKey;
use idemrelay::store::State;

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod encoded_keys;
mod keys;
mod stored;

const E01005: &str = "554 5.6.0 X-Bird-Idempotency-Key already used for a different message (E01005 IdempotencyKeyReuse); use a new key";
const E01004: &str = "451 4.3.0 a message with this X-Bird-Idempotency-Key is still being processed (E01004 RequestInProgress); retry later";
const E01001: &str = "554 5.6.0 X-Bird-Idempotency-Key must be 1-255 printable characters (E01001); message not accepted";
const E01033: &str = "451 4.3.0 idempotency store unavailable; message not accepted, retry later (E01033 IdempotencyUnavailable)";

async fn submit_once(relay: &TestRelay, to: &[&str], msg: &[u8]) -> common::Answer {
    let mut c = Client::ready(relay.addr).await;
    let answer = c.submit("sender@example.com", to, msg).await;
    c.quit().await;
    answer
}

/// What Python's `email.message.EmailMessage` with `policy=email.policy.SMTP` writes for a key
/// header (Python 3.11, byte for byte): past 77 characters, or with non-ASCII text, the value is
/// RFC 2047-encoded and folded.
pub(crate) fn python_message(message_id: &str, key_field: &str) -> Vec<u8> {
    format!(
        "From: app@example.com\r\nTo: user@example.com\r\nSubject: Receipt\r\n\
         Date: Sun, 29 Nov 2026 10:00:00 +0000\r\nMessage-ID: <{message_id}@example.com>\r\n\
         X-Bird-Idempotency-Key: {key_field}\r\n\
         Content-Type: text/plain; charset=\"utf-8\"\r\nContent-Transfer-Encoding: 7bit\r\n\
         MIME-Version: 1.0\r\n\r\nThank you.\r\n"
    )
    .into_bytes()
}

/// A 205-character key (inside 1-255) as Python spells it: four Q words, 273 characters.
pub(crate) const PYTHON_LONG_KEY: &str = "receipt-2026-11-29-0000-0001-0002-0003-0004-0005-0006-0007-0008-0009-0010-0011-0012-0013-0014-0015-0016-0017-0018-0019-0020-0021-0022-0023-0024-0025-0026-0027-0028-0029-0030-0031-0032-0033-0034-0035-0036-0";
pub(crate) const PYTHON_LONG_FIELD: &str = "=?utf-8?q?receipt-2026-11-29-0000-0001-0002-0003-000?=\r\n =?utf-8?q?4-0005-0006-0007-0008-0009-0010-0011-0012-0013-0014-0015-0016-001?=\r\n =?utf-8?q?7-0018-0019-0020-0021-0022-0023-0024-0025-0026-0027-0028-0029-003?=\r\n =?utf-8?q?0-0031-0032-0033-0034-0035-0036-0?=";
