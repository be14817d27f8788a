use super::*;

#[test]
fn url_forms() {
    let t = UpstreamTarget::parse("smtp://me%40x:p%20w@smtp.example.com:587", None).unwrap();
    assert_eq!(
        (t.host.as_str(), t.port, t.tls),
        ("smtp.example.com", 587, TlsMode::StartTls)
    );
    assert_eq!(t.user.as_deref(), Some("me@x"));
    assert_eq!(t.password.as_deref(), Some("p w"));
    assert_eq!(t.mechanisms, vec![Mechanism::Plain, Mechanism::Login]);
    assert!(!format!("{t:?}").contains("p w"));

    let t = UpstreamTarget::parse("smtps://h", Some("env".into())).unwrap();
    assert_eq!(
        (t.port, t.tls, t.password.as_deref()),
        (465, TlsMode::Implicit, Some("env"))
    );
    let t = UpstreamTarget::parse("smtp://u@h?auth=login", Some("pw".into())).unwrap();
    assert_eq!(t.mechanisms, vec![Mechanism::Login]);
    assert_eq!(t.port, 587);
    let t = UpstreamTarget::parse("smtp://127.0.0.1:2525?tls=none", None).unwrap();
    assert_eq!((t.port, t.tls, t.user), (2525, TlsMode::None, None));
    let t = UpstreamTarget::parse("smtp://[::1]:25?tls=none", None).unwrap();
    assert_eq!(t.host, "::1");

    for bad in [
        "http://h",
        "smtps://h?tls=none",
        "smtp://h?x=1",
        "smtp://",
        "nonsense",
    ] {
        assert!(UpstreamTarget::parse(bad, None).is_err(), "{bad}");
    }
}

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A minimal upstream on a real socket: accepts every message, reports each command
/// (the connection's number first) and, on `close_after`, closes after that many messages
/// with nothing said, as a server whose idle timeout fired quietly would.
pub(super) async fn recording_upstream(
    close_after: Option<usize>,
) -> (UpstreamTarget, mpsc::UnboundedReceiver<(usize, String)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        for n in 0.. {
            let (stream, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                write.write_all(b"220 up ESMTP\r\n").await.unwrap();
                let (mut in_data, mut messages) = (false, 0);
                while let Ok(Some(line)) = lines.next_line().await {
                    if in_data {
                        if line == "." {
                            in_data = false;
                            messages += 1;
                            write.write_all(b"250 2.0.0 queued\r\n").await.unwrap();
                            if close_after == Some(messages) {
                                return;
                            }
                        }
                        continue;
                    }
                    let verb = line.split([' ', ':']).next().unwrap().to_ascii_uppercase();
                    let _ = tx.send((n, verb.clone()));
                    let reply: &[u8] = match verb.as_str() {
                        "EHLO" => b"250-up\r\n250 8BITMIME\r\n",
                        "DATA" => {
                            in_data = true;
                            b"354 go\r\n"
                        }
                        "QUIT" => b"221 bye\r\n",
                        _ => b"250 ok\r\n",
                    };
                    write.write_all(reply).await.unwrap();
                }
            });
        }
    });
    let target = UpstreamTarget::parse(&format!("smtp://127.0.0.1:{port}?tls=none"), None);
    (target.unwrap(), rx)
}

async fn send_one(client: &mut UpstreamClient) -> Outcome {
    let rcpt = ["r@example.com".to_string()];
    let envelope = UpstreamEnvelope {
        mail_from: "s@example.com",
        rcpt_to: &rcpt,
        eight_bit: false,
        smtputf8: false,
        requests: &Default::default(),
    };
    client
        .send(&envelope, b"Subject: t\r\n\r\nbody\r\n", None)
        .await
}

fn drain(rx: &mut mpsc::UnboundedReceiver<(usize, String)>) -> Vec<(usize, String)> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn client(target: UpstreamTarget) -> UpstreamClient {
    UpstreamClient::new(target, "relay.test", PhaseTimeouts::default(), None).unwrap()
}

#[tokio::test]
async fn a_connection_used_a_moment_ago_is_reused_without_a_noop() {
    let (target, mut rx) = recording_upstream(None).await;
    let mut client = client(target);
    for _ in 0..3 {
        assert!(matches!(
            send_one(&mut client).await,
            Outcome::Accepted { .. }
        ));
    }
    let seen = drain(&mut rx);
    assert!(seen.iter().all(|(conn, _)| *conn == 0), "{seen:?}");
    let verbs: Vec<&str> = seen.iter().map(|(_, v)| v.as_str()).collect();
    assert_eq!(
        verbs,
        ["EHLO", "MAIL", "RCPT", "DATA", "MAIL", "RCPT", "DATA", "MAIL", "RCPT", "DATA"]
    );
}

#[tokio::test]
async fn a_connection_idle_past_the_threshold_is_checked_with_a_noop() {
    let (target, mut rx) = recording_upstream(None).await;
    let mut client = client(target);
    client.noop_after_idle = Duration::ZERO;
    for _ in 0..2 {
        assert!(matches!(
            send_one(&mut client).await,
            Outcome::Accepted { .. }
        ));
    }
    let verbs: Vec<String> = drain(&mut rx).into_iter().map(|(_, v)| v).collect();
    assert_eq!(
        verbs,
        ["EHLO", "MAIL", "RCPT", "DATA", "NOOP", "MAIL", "RCPT", "DATA"]
    );
}

#[tokio::test]
async fn a_connection_closed_quietly_is_not_reused_and_costs_no_attempt() {
    let (target, mut rx) = recording_upstream(Some(1)).await;
    let mut client = client(target);
    assert!(matches!(
        send_one(&mut client).await,
        Outcome::Accepted { .. }
    ));
    // Let the close arrive; still well inside the no-NOOP threshold.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(matches!(
        send_one(&mut client).await,
        Outcome::Accepted { .. }
    ));
    let seen = drain(&mut rx);
    let second: Vec<&str> = seen
        .iter()
        .filter(|(conn, _)| *conn == 1)
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(second, ["EHLO", "MAIL", "RCPT", "DATA"], "{seen:?}");
}

#[test]
fn the_lease_outlasts_every_phase() {
    let t = PhaseTimeouts::default();
    assert!(t.worst_case() > t.connect + t.greeting + t.auth + t.mail + t.rcpt + t.data + t.dot);
}
