//! The client against `idemrelay sink` over real sockets: DSN parameters passed on byte for
//! byte or not at all, and REQUIRETLS never leaving in the clear.

use super::*;
use crate::mail::requests::RecipientRequests;
use crate::mail::DeliveryRequests;
use idemrelay_sink::{Sink, SinkConfig, SinkHandle};

const MESSAGE: &[u8] = b"Subject: t\r\nX-Bird-Idempotency-Key: ext-1\r\n\r\nbody\r\n";

fn dsn_requests() -> DeliveryRequests {
    let mut r = DeliveryRequests {
        ret: Some("hdrs".into()),
        envid: Some("QQ+2B314+3Dx".into()),
        ..Default::default()
    };
    r.recipients.insert(
        "b@example.com".into(),
        RecipientRequests {
            notify: Some("Success,FAILURE".into()),
            orcpt: Some("rfc822;b+2Bx@example.com".into()),
        },
    );
    r.recipients.insert(
        "c@example.com".into(),
        RecipientRequests {
            notify: Some("never".into()),
            orcpt: None,
        },
    );
    r
}

async fn send(client: &mut UpstreamClient, requests: &DeliveryRequests) -> Outcome {
    let rcpts = ["b@example.com".to_string(), "c@example.com".to_string()];
    let envelope = UpstreamEnvelope {
        mail_from: "a@example.com",
        rcpt_to: &rcpts,
        eight_bit: false,
        smtputf8: false,
        requests,
    };
    client.send(&envelope, MESSAGE, None).await
}

async fn sink(config: SinkConfig) -> SinkHandle {
    Sink::start(config).await.unwrap()
}

fn plain_client(sink: &SinkHandle) -> UpstreamClient {
    let url = format!("smtp://{}?tls=none", sink.smtp_addr());
    let target = UpstreamTarget::parse(&url, None).unwrap();
    UpstreamClient::new(target, "relay.test", PhaseTimeouts::default(), None).unwrap()
}

#[tokio::test]
async fn dsn_parameters_reach_a_dsn_upstream_byte_for_byte() {
    let sink = sink(SinkConfig {
        dsn: true,
        ..SinkConfig::default()
    })
    .await;
    let mut client = plain_client(&sink);
    let outcome = send(&mut client, &dsn_requests()).await;
    assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    assert_eq!(
        client.last_offered(),
        Some(Offered {
            dsn: true,
            requiretls: false
        })
    );
    let got = sink.messages();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].mail_command,
        "MAIL FROM:<a@example.com> RET=hdrs ENVID=QQ+2B314+3Dx"
    );
    assert_eq!(
        got[0].rcpt_commands,
        [
            "RCPT TO:<b@example.com> NOTIFY=Success,FAILURE ORCPT=rfc822;b+2Bx@example.com",
            "RCPT TO:<c@example.com> NOTIFY=never",
        ]
    );
    // Ordinary mail on the same connection: no parameters, and what it learnt is not claimed
    // for a message that did not ask.
    let outcome = send(&mut client, &DeliveryRequests::default()).await;
    assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    assert_eq!(client.last_offered(), None);
    // The same key: the sink replays it, and records the transaction.
    let got = sink.transactions();
    assert_eq!(got[1].mail_command, "MAIL FROM:<a@example.com>");
    assert_eq!(got[1].rcpt_commands[0], "RCPT TO:<b@example.com>");
}

#[tokio::test]
async fn dsn_parameters_are_not_sent_to_an_upstream_without_dsn() {
    // This sink refuses them with 555: the message would fail if they were sent.
    let sink = sink(SinkConfig::default()).await;
    let mut client = plain_client(&sink);
    let outcome = send(&mut client, &dsn_requests()).await;
    assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    assert_eq!(client.last_offered(), Some(Offered::default()));
    let got = sink.messages();
    assert_eq!(got[0].mail_command, "MAIL FROM:<a@example.com>");
    assert_eq!(
        got[0].rcpt_commands,
        ["RCPT TO:<b@example.com>", "RCPT TO:<c@example.com>"]
    );
}

fn require_tls() -> DeliveryRequests {
    DeliveryRequests {
        require_tls: true,
        ..Default::default()
    }
}

fn refused(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Permanent { phase: Phase::Ehlo, code: 550, reply }
        if reply == crate::delivery::extensions::REQUIRETLS_REFUSED)
}

#[tokio::test]
async fn requiretls_never_leaves_in_the_clear() {
    // The sink would take REQUIRETLS under TLS, but this session has none.
    let sink = sink(SinkConfig {
        requiretls: true,
        ..SinkConfig::default()
    })
    .await;
    let mut client = plain_client(&sink);
    let outcome = send(&mut client, &require_tls()).await;
    assert!(refused(&outcome), "{outcome:?}");
    assert!(sink.transactions().is_empty());
    assert!(sink.messages().is_empty());
    // The connection is still good for other mail.
    let outcome = send(&mut client, &DeliveryRequests::default()).await;
    assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
}

/// A STARTTLS sink with a certificate for `localhost`, and the client trusting it.
async fn tls_pair(requiretls: bool) -> (SinkHandle, UpstreamClient, tempfile::TempDir) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let sink = sink(SinkConfig {
        tls: Some((cert.clone(), key)),
        requiretls,
        dsn: true,
        ..SinkConfig::default()
    })
    .await;
    let url = format!("smtp://localhost:{}", sink.smtp_addr().port());
    let target = UpstreamTarget::parse(&url, None).unwrap();
    let client =
        UpstreamClient::new(target, "relay.test", PhaseTimeouts::default(), Some(&cert)).unwrap();
    (sink, client, dir)
}

#[tokio::test]
async fn requiretls_is_refused_when_the_tls_upstream_does_not_offer_it() {
    let (sink, mut client, _dir) = tls_pair(false).await;
    let outcome = send(&mut client, &require_tls()).await;
    assert!(refused(&outcome), "{outcome:?}");
    assert!(sink.transactions().is_empty());
}

#[tokio::test]
async fn requiretls_is_passed_on_over_verified_tls() {
    let (sink, mut client, _dir) = tls_pair(true).await;
    let mut requests = dsn_requests();
    requests.require_tls = true;
    let outcome = send(&mut client, &requests).await;
    assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    let got = sink.messages();
    assert_eq!(got.len(), 1);
    assert!(got[0].tls);
    assert_eq!(
        got[0].mail_command,
        "MAIL FROM:<a@example.com> RET=hdrs ENVID=QQ+2B314+3Dx REQUIRETLS"
    );
    // `TLS-Required: No` changes nothing: the bytes leave as they are, the header with them.
    let rcpts = ["b@example.com".to_string()];
    let no = b"TLS-Required: No\r\nSubject: t\r\nX-Bird-Idempotency-Key: ext-2\r\n\r\nbody\r\n";
    let envelope = UpstreamEnvelope {
        mail_from: "a@example.com",
        rcpt_to: &rcpts,
        eight_bit: false,
        smtputf8: false,
        requests: &require_tls(),
    };
    let outcome = client.send(&envelope, no, None).await;
    assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    let got = sink.messages();
    assert_eq!(got[1].bytes, no);
    assert_eq!(got[1].mail_command, "MAIL FROM:<a@example.com> REQUIRETLS");
}

#[tokio::test]
async fn requiretls_is_not_sent_to_an_unverified_certificate() {
    let (sink, _, _dir) = tls_pair(true).await;
    // The same upstream, without its CA: the handshake fails, nothing is sent.
    let url = format!("smtp://localhost:{}", sink.smtp_addr().port());
    let target = UpstreamTarget::parse(&url, None).unwrap();
    let mut client =
        UpstreamClient::new(target, "relay.test", PhaseTimeouts::default(), None).unwrap();
    let outcome = send(&mut client, &require_tls()).await;
    assert!(
        matches!(
            outcome,
            Outcome::Transient {
                phase: Phase::StartTls,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(sink.transactions().is_empty());
}

/// Our own EHLO costs a round trip only for a message that needs it, once per connection.
#[tokio::test]
async fn extensions_are_learnt_once_and_only_when_needed() {
    let (target, mut rx) = super::tests::recording_upstream(None).await;
    let mut client =
        UpstreamClient::new(target, "relay.test", PhaseTimeouts::default(), None).unwrap();
    for requests in [
        DeliveryRequests::default(),
        dsn_requests(),
        dsn_requests(),
        DeliveryRequests::default(),
    ] {
        let outcome = send(&mut client, &requests).await;
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    }
    let verbs: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
        .map(|(_, v)| v)
        .collect();
    let per_message = ["MAIL", "RCPT", "RCPT", "DATA"];
    let want: Vec<&str> = [&["EHLO"][..], &per_message, &["EHLO"], &per_message]
        .concat()
        .into_iter()
        .chain(per_message)
        .chain(per_message)
        .collect();
    assert_eq!(verbs, want);
}
