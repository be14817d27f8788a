//! How idemrelay writes a moment for people and JSON: the admin API, the console and the test
//! upstream's pages all show the ledger's Unix milliseconds the same way.

/// RFC 3339 UTC with milliseconds, from Unix milliseconds, clamped to what RFC 3339 can
/// write (1970 to the end of 9999): the formatter panics past the year 9999, and a stored
/// time must never make a record unviewable.
pub fn time_ms(ms: i64) -> String {
    const LATEST_MS: i64 = 253_402_300_799_999;
    let ms = ms.clamp(0, LATEST_MS) as u64;
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}
