//! Submitting with swaks, and the replay of a key.

use super::*;

/// Runs the real swaks against the relay and returns its transcript (stdout and stderr).
///
/// swaks stamps Date, Message-Id and a Subject containing the current time into every
/// message; fixing all three is what makes two runs byte-identical, as a retrying client is.
fn swaks(addr: SocketAddr, key: &str, body: Option<&str>) -> (ExitStatus, String) {
    let mut cmd = Command::new("swaks");
    cmd.args(["--server", &addr.to_string()])
        .args(["--helo", "client.test"])
        .args(["--from", "sender@example.com", "--to", "rcpt@example.com"])
        .args(["--header", "Date: Sun, 29 Nov 2026 10:00:00 +0000"])
        .args(["--header", "Message-Id: <fixed@example.com>"])
        .args(["--header", "Subject: swaks replay test"])
        .args(["--header", &format!("X-Bird-Idempotency-Key: {key}")])
        .args(["--timeout", "20"]);
    if let Some(body) = body {
        cmd.args(["--body", body]);
    }
    let out = match cmd.output() {
        Ok(out) => out,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
            "swaks is not installed (needed by this test): `apt-get install swaks` \
             (CI installs it)"
        ),
        Err(err) => panic!("cannot run swaks: {err}"),
    };
    let transcript = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, transcript)
}

/// The server's reply to the final dot in a swaks transcript. swaks marks server lines with
/// `<-` (or `<**` for errors) and echoes the dot it sent as ` -> .`.
fn swaks_data_reply(transcript: &str) -> String {
    let mut lines = transcript.lines().skip_while(|l| l.trim() != "-> .");
    lines
        .find_map(|l| {
            let l = l.trim_start();
            l.starts_with('<').then(|| {
                l.trim_start_matches(['<', '-', '*', '~'])
                    .trim()
                    .to_string()
            })
        })
        .unwrap_or_else(|| panic!("no reply to the final dot in swaks transcript:\n{transcript}"))
}

// Plain #[test]: everything async here happens in the relay process and in swaks.
#[test]
fn swaks_submits_and_replays() {
    // CI installs swaks and must run this; on a developer machine without it, say so loudly.
    if std::env::var_os("CI").is_none() && Command::new("swaks").arg("--version").output().is_err()
    {
        eprintln!(
            "SKIPPED swaks_submits_and_replays: swaks is not installed (apt-get install -y swaks)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(&dir.path().join("relay.db"), &[]);

    let (status, first) = swaks(relay.addr, "swaks-key-1", None);
    assert!(status.success(), "swaks failed ({status}):\n{first}");
    let reply = swaks_data_reply(&first);
    let id = reply
        .strip_prefix("250 2.0.0 OK queued as ")
        .unwrap_or_else(|| panic!("not accepted: {reply}\n{first}"))
        .to_string();
    assert!(!id.is_empty() && !id.contains(' '), "{reply}");

    let (status, second) = swaks(relay.addr, "swaks-key-1", None);
    assert!(status.success(), "swaks failed ({status}):\n{second}");
    assert_eq!(swaks_data_reply(&second), replay_line(&id), "{second}");

    let (status, third) = swaks(relay.addr, "swaks-key-1", Some("other"));
    assert!(
        !status.success(),
        "swaks should report the rejection:\n{third}"
    );
    assert_eq!(swaks_data_reply(&third), KEY_REUSE_LINE, "{third}");
}
