//! RFC 3464 delivery status notifications (docs/concepts/delivery.md): the failure notice of a
//! permanently failed message, and the "relayed" notice of a message an upstream without DSN
//! took for a recipient that asked to hear of success (RFC 3461 §4.1). Which recipients get
//! one, and what of the original it returns, is [`notice`]'s.
//!
//! The DSN is built as bytes from its inputs alone (no clock, no randomness): the relay sends
//! it exactly once under [`dsn_key`], and a retry must carry byte-identical content, so the
//! same input must always give the same message.
//!
//! Everything the relay writes is 7-bit ASCII with CRLF line endings and lines of at most 998
//! octets, whatever the upstream's reply or the original message contained; the only
//! exception is the `To:` header of a sender with a non-ASCII address, who can only be reached
//! over SMTPUTF8 anyway.
//!
//! `report` builds the bytes; `notice` decides which notice a job gets, for which
//! recipients, and with what of the original.

mod notice;
mod report;

pub(crate) use notice::notice_for;
