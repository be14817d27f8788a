//! This host's name, read once per use from the system (a leaf: config, delivery and the
//! certificate generator all ask).

/// This host's name, as the system has it (the default `hostname`, a certificate's SAN).
pub(crate) fn system_hostname() -> String {
    gethostname::gethostname()
        .into_string()
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
