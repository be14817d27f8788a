//! sendmail's exit statuses, from sysexits.h.

pub const EX_OK: u8 = 0;
pub const EX_USAGE: u8 = 64;
pub const EX_DATAERR: u8 = 65;
pub const EX_UNAVAILABLE: u8 = 69;
pub const EX_OSERR: u8 = 71;
pub const EX_IOERR: u8 = 74;
pub const EX_TEMPFAIL: u8 = 75;
pub const EX_CONFIG: u8 = 78;
