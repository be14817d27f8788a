//! Who a session authenticated as: what the SMTP session needs for the rest of the connection,
//! and what intake stores with the message. Checking a password is the relay's `auth`; this is
//! only its result, so that the protocol can name it without depending on the users file.

/// A user whose password checked out; what the session needs for the rest of the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    pub name: String,
    pub scope: String,
    pub allowed_senders: Vec<String>,
}

impl Authenticated {
    /// MAIL FROM check: the null sender is allowed only if allowed_senders is empty.
    ///
    /// `address` is the reverse-path without angle brackets (`""` is the null sender).
    /// Case is folded for ASCII only: a non-ASCII address must match byte for byte, so
    /// Unicode case mapping can never widen what a pattern admits.
    pub fn may_send_as(&self, address: &str) -> bool {
        if self.allowed_senders.is_empty() {
            return true;
        }
        let address = address
            .strip_prefix('<')
            .and_then(|a| a.strip_suffix('>'))
            .unwrap_or(address);
        if address.is_empty() {
            return false;
        }
        // The domain follows the last '@': a quoted local part may contain '@' itself.
        let domain = address.rsplit_once('@').map(|(_, domain)| domain);
        self.allowed_senders
            .iter()
            .any(|pattern| match (pattern.strip_prefix('@'), domain) {
                (Some(pattern_domain), Some(domain)) => pattern_domain.eq_ignore_ascii_case(domain),
                (Some(_), None) => false,
                (None, _) => pattern.eq_ignore_ascii_case(address),
            })
    }
}
