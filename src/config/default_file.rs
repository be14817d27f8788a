//! Where the settings are found when no `--config` names a file.

use std::path::PathBuf;

/// The config file read when no `--config` (nor `IDEMRELAY_CONFIG`) names one, as Postfix
/// reads main.cf: where a packaged relay keeps its settings, so `idemrelay queue` on that host
/// finds that relay's admin address and token. `IDEMRELAY_DEFAULT_CONFIG` moves it (empty: none).
pub const DEFAULT_CONFIG: &str = "/etc/idemrelay/idemrelay.toml";

/// The variable that moves `DEFAULT_CONFIG` (packagers, tests).
const DEFAULT_CONFIG_VAR: &str = "IDEMRELAY_DEFAULT_CONFIG";

/// Where the settings come from when no `--config` is given: the default file, if it exists.
pub(crate) fn default_config_file() -> Option<PathBuf> {
    let path = match std::env::var_os(DEFAULT_CONFIG_VAR) {
        Some(path) if path.is_empty() => return None,
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(DEFAULT_CONFIG),
    };
    // Present but unreadable is an error Settings::load reports (naming the file), not a
    // reason to run on built-in defaults instead.
    std::fs::symlink_metadata(&path).is_ok().then_some(path)
}
