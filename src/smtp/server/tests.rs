//! The connection loop's pure parts.

use super::*;

#[test]
fn the_session_limit_shortens_the_last_read() {
    let secs = Duration::from_secs;
    // Plenty of session left: an ordinary read timeout.
    assert_eq!(
        next_read(secs(600), secs(60), secs(10)),
        NextRead::Wait {
            limit: secs(60),
            session_ends: false
        }
    );
    // Less session left than a read timeout: the read waits only for what is left, and
    // its timing out is the session's end.
    assert_eq!(
        next_read(secs(600), secs(60), secs(570)),
        NextRead::Wait {
            limit: secs(30),
            session_ends: true
        }
    );
    // Exactly a read timeout left: the session's end too.
    assert_eq!(
        next_read(secs(600), secs(60), secs(540)),
        NextRead::Wait {
            limit: secs(60),
            session_ends: true
        }
    );
    // At the limit or past it: over, without another read.
    assert_eq!(
        next_read(secs(600), secs(60), secs(600)),
        NextRead::SessionOver
    );
    assert_eq!(
        next_read(secs(600), secs(60), secs(900)),
        NextRead::SessionOver
    );
}
