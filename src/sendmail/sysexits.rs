//! sendmail's exit statuses, from sysexits.h.

pub(crate) const EX_OK: u8 = 0;
pub(crate) const EX_USAGE: u8 = 64;
pub(crate) const EX_DATAERR: u8 = 65;
pub(crate) const EX_UNAVAILABLE: u8 = 69;
pub(crate) const EX_OSERR: u8 = 71;
pub(crate) const EX_IOERR: u8 = 74;
pub(crate) const EX_TEMPFAIL: u8 = 75;
pub(crate) const EX_CONFIG: u8 = 78;
