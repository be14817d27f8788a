//! `key derive`: the key the relay would store, from a message file as sent.

use super::*;

#[derive(Debug, PartialEq, Eq)]
struct Derived {
    key: String,
    source: String,
    fingerprint: String,
}

fn key_derive(file: &Path, from: &str, to: &[&str]) -> Derived {
    let mut cmd = idemrelay();
    cmd.args(["key", "derive"]).arg(file).args(["--from", from]);
    for rcpt in to {
        cmd.args(["--to", rcpt]);
    }
    let out = cmd.output().expect("run idemrelay key derive");
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "key derive {}: {}",
        file.display(),
        text(&out.stderr)
    );
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name:?} in key derive output:\n{stdout}"))
            .to_string()
    };
    Derived {
        key: field("key: "),
        source: field("source: "),
        fingerprint: field("fingerprint: "),
    }
}

/// The header section (up to the first empty line) of a CRLF message.
fn header_lines(msg: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(msg);
    text.split("\r\n")
        .take_while(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn has_field(headers: &[String], name: &str) -> bool {
    headers.iter().any(|l| {
        l.split_once(':')
            .is_some_and(|(n, _)| n.trim_end().eq_ignore_ascii_case(name))
    })
}

/// Corpus messages the relay accepts without a key of their own: a From: field, no key header
/// (malformed/ holds messages meant to be refused).
fn keyless_corpus() -> Vec<(String, Vec<u8>)> {
    corpus()
        .into_iter()
        .filter(|(name, _)| !name.starts_with("malformed/"))
        .filter(|(_, msg)| {
            let headers = header_lines(msg);
            has_field(&headers, "From") && !has_field(&headers, "X-Bird-Idempotency-Key")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_derive_matches_what_the_relay_stores() {
    const FROM: &str = "a@example.com";
    // The key binds the recipient *set*: order and repeats on the wire must not matter.
    const TO: &[&str] = &["b@example.com", "c@example.com"];
    const RCPT_ON_WIRE: &[&str] = &["c@example.com", "b@example.com", "c@example.com"];
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;

    let messages = keyless_corpus();
    assert!(messages.len() >= 5, "too few usable corpus messages");
    let mut sources = Vec::new();
    for (name, msg) in &messages {
        // What an SMTP client transmits always ends in CRLF before the dot; the file given
        // to `key derive` holds exactly the bytes the relay will receive.
        let mut sent = msg.clone();
        if !sent.ends_with(b"\r\n") {
            sent.extend_from_slice(b"\r\n");
        }
        let crlf_file = dir.path().join("message.eml");
        std::fs::write(&crlf_file, &sent).unwrap();
        let derived = key_derive(&crlf_file, FROM, TO);
        assert!(
            derived.key.starts_with("d1-") && derived.fingerprint.len() == 64,
            "{name}: {derived:?}"
        );

        // Files without a final newline: see key_derive_reads_a_file_without_final_newline_as_sent.
        let raw_file = corpus_dir().join("eml").join(name);
        if std::fs::read(&raw_file).unwrap().ends_with(b"\n") {
            assert_eq!(
                key_derive(&raw_file, FROM, TO),
                derived,
                "{name}: LF vs CRLF file"
            );
        }

        let first = client.submit(FROM, RCPT_ON_WIRE, &sent).await;
        let id = first
            .queue_id()
            .unwrap_or_else(|| panic!("{name} not accepted: {first:?}"));
        assert_eq!(first.line(), queued_line(&id), "{name}");
        let second = client.submit(FROM, RCPT_ON_WIRE, &sent).await;
        assert_eq!(second.line(), replay_line(&id), "{name}");

        let row = stored_row(&db, &id).await;
        assert_eq!(
            row.idem_key.as_deref(),
            Some(derived.key.as_str()),
            "{name}"
        );
        assert_eq!(row.key_source, derived.source, "{name}");
        assert_eq!(row.fingerprint_hex, derived.fingerprint, "{name}");
        let content = row.content.unwrap_or_else(|| panic!("{name}: no content"));
        let inserted: Vec<String> = header_lines(&content)
            .into_iter()
            .filter(|l| l.starts_with("X-Bird-Idempotency-Key:"))
            .collect();
        assert_eq!(
            inserted,
            vec![format!("X-Bird-Idempotency-Key: {}", derived.key)],
            "{name}"
        );
        assert!(content.ends_with(&sent), "{name}: submitted bytes altered");
        sources.push(derived.source);
    }
    client.quit().await;
    for source in ["message-id", "content"] {
        assert!(
            sources.iter().any(|s| s == source),
            "no corpus message exercised source {source}: {sources:?}"
        );
    }
}

/// `key derive` reads its file "as an SMTP client would send it"; a client always ends the
/// content with CRLF before the dot, so a file without a final newline must give the key the
/// relay derives for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_derive_reads_a_file_without_final_newline_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;
    let file = dir.path().join("no-final-newline.eml");
    let msg = b"From: a@example.com\nSubject: no final newline\n\nlast line";
    std::fs::write(&file, msg).unwrap();
    let derived = key_derive(&file, "a@example.com", &["b@example.com"]);
    assert_eq!(derived.source, "content");

    let crlf = common::to_crlf(msg);
    let answer = client
        .submit("a@example.com", &["b@example.com"], &crlf)
        .await;
    let id = answer.queue_id().expect("accepted");
    let row = stored_row(&db, &id).await;
    assert_eq!(row.idem_key.as_deref(), Some(derived.key.as_str()));
    client.quit().await;
}
