//! Delay notices (docs/concepts/delivery.md, "Delivery status notifications"): a client asks
//! for one over a real socket with NOTIFY=DELAY, the upstream (`idemrelay sink`) defers every
//! attempt, and once the message has waited `delay_notice_after` the sender gets exactly one
//! `Action: delayed` notice, naming only the recipients that asked, however many retries
//! follow.

use crate::common;

use std::time::Duration;

use common::{eventually, message, relay_for, Client, TestRelay};
use idemrelay_sink::{FaultRule, FaultStage, Sink, SinkHandle};

const LIMIT: Duration = Duration::from_secs(20);

/// Submits one message from sender@example.com over SMTP; its queue id.
async fn submit(relay: &TestRelay, key: &str, rcpts: &[&str]) -> String {
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(c.cmd("MAIL FROM:<sender@example.com>").await.code, 250);
    for rcpt in rcpts {
        assert_eq!(c.cmd(rcpt).await.code, 250, "{rcpt}");
    }
    let answer = c.data(&message(Some(key), "s", "b")).await;
    c.quit().await;
    answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"))
}

/// The original's recipients are deferred at RCPT, every time; the sender's notices go
/// through.
fn deferring(sink: &SinkHandle, rcpts: &[&str]) {
    let rules = rcpts
        .iter()
        .map(|r| FaultRule::reply(FaultStage::Rcpt, 451, "4.2.1 mailbox busy").with_rcpt(*r))
        .collect();
    sink.set_faults(rules).unwrap();
}

/// What the upstream received from the null sender: the relay's notices.
fn notices(sink: &SinkHandle) -> Vec<idemrelay_sink::ReceivedMessage> {
    sink.messages()
        .into_iter()
        .filter(|m| m.mail_from.is_empty())
        .collect()
}

async fn attempts(relay: &TestRelay, id: &str) -> usize {
    relay.store().attempts(id).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_deferred_message_brings_one_delay_notice_for_the_recipients_that_asked() {
    let sink = Sink::start(Default::default()).await.unwrap();
    deferring(&sink, &["a@example.org", "b@example.org", "c@example.org"]);
    let relay = relay_for(&sink, |s| {
        s.delivery.delay_notice_after = Duration::from_millis(200);
        // Retried for as long as the test waits: giving up would bring a failure notice.
        s.delivery.max_attempts = 1000;
    })
    .await;
    let asked = submit(
        &relay,
        "delay-asked-1",
        &[
            "RCPT TO:<a@example.org> NOTIFY=DELAY,FAILURE",
            "RCPT TO:<b@example.org>",
        ],
    )
    .await;
    let not_asked = submit(
        &relay,
        "delay-not-asked-1",
        &["RCPT TO:<c@example.org> NOTIFY=FAILURE"],
    )
    .await;
    // Past delay_notice_after, and retried several times more.
    eventually(LIMIT, "retries past delay_notice_after", || async {
        (attempts(&relay, &asked).await >= 6 && attempts(&relay, &not_asked).await >= 6)
            .then_some(())
    })
    .await;
    // The notice is a message of its own, delivered beside the retries: on a loaded machine it
    // may still be on its way. Once it has arrived, both messages are retried three times
    // more, and those retries must not bring another.
    eventually(LIMIT, "the delay notice at the upstream", || async {
        (!notices(&sink).is_empty()).then_some(())
    })
    .await;
    let (asked_then, not_asked_then) = (
        attempts(&relay, &asked).await,
        attempts(&relay, &not_asked).await,
    );
    eventually(LIMIT, "three retries after the notice", || async {
        (attempts(&relay, &asked).await >= asked_then + 3
            && attempts(&relay, &not_asked).await >= not_asked_then + 3)
            .then_some(())
    })
    .await;
    let notices = notices(&sink);
    assert_eq!(notices.len(), 1, "one notice in all: {notices:?}");
    assert_eq!(notices[0].rcpt_to, ["sender@example.com"]);
    let text = String::from_utf8(notices[0].bytes.clone()).unwrap();
    assert!(
        text.contains(&format!("X-Idemrelay-Id: {asked}\r\n")),
        "{text}"
    );
    assert!(
        text.contains("Final-Recipient: rfc822; a@example.org\r\n"),
        "{text}"
    );
    assert!(!text.contains("b@example.org"), "b sent no NOTIFY: {text}");
    assert!(text.contains("Action: delayed\r\n"), "{text}");
    assert!(text.contains("Status: 4.2.1\r\n"), "{text}");
    assert!(text.contains("Will-Retry-Until: "), "{text}");
    assert!(!text.contains("\r\nb\r\n"), "headers only: {text}");
    // The record names its notice; the other message has none.
    assert_eq!(relay.stored(&asked).await.dsns.len(), 1);
    assert!(relay.stored(&not_asked).await.dsns.is_empty());
}
