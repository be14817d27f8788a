//! The built binary as a user runs it: webhooks from its flags, listed over HTTP.

use super::*;

/// The built binary as a child process, killed when dropped.
struct SinkProcess {
    child: std::process::Child,
    smtp: SocketAddr,
    api: SocketAddr,
}

impl Drop for SinkProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_sink_binary(args: &[&str], env: &[(&str, &str)]) -> SinkProcess {
    use std::io::BufRead;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_idemrelay"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("IDEMRELAY_") {
            cmd.env_remove(name);
        }
    }
    let mut child = cmd
        .arg("sink")
        .args(["--listen", "127.0.0.1:0", "--api", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // `sink smtp=ADDR api=ADDR`
    let field = |name: &str| -> SocketAddr {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .parse()
            .unwrap()
    };
    SinkProcess {
        smtp: field("smtp="),
        api: field("api="),
        child,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_posts_webhooks_from_its_flags_and_lists_the_posts_over_http() {
    let receiver = Receiver::start().await;
    receiver.fail_first(1);
    let url = receiver.url().to_string();
    let sink = spawn_sink_binary(
        &[
            "--webhook",
            &url,
            "--webhook-backoff",
            "20ms",
            "--webhook-delivery-delay",
            "100ms",
            "--webhook-bounce",
            "nobody@",
            "--fault",
            "phase=webhook,action=duplicate,times=1",
        ],
        // The secret from the environment, where `ps` does not show it.
        &[("IDEMRELAY_SINK_WEBHOOK_SECRET", SECRET)],
    );
    let mut c = session(sink.smtp).await;
    let reply = c
        .submit(
            "app@example.com",
            &["a@example.net", "nobody@example.net"],
            &message(Some("wh-bin"), "x"),
        )
        .await
        .unwrap();
    let id = id_of(&reply);
    // injection: 500 then 200, duplicate: 200; delivery: 500, 200; bounce: 500, 200.
    receiver.wait_for(7).await;
    let deadline = Instant::now() + WAIT;
    let stats = loop {
        let stats = get_json(sink.api, "/stats").await;
        if stats["webhooks"]["pending"] == 0 || Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        stats["webhooks"],
        serde_json::json!({"batches": 3, "attempts": 7, "delivered": 4, "failed": 0,
                           "dropped": 0, "pending": 0})
    );
    assert!(receiver
        .hooks()
        .iter()
        .all(|h| signature_verifies(SECRET, h)));
    let posts = get_json(sink.api, "/webhooks?key=wh-bin").await;
    let posts = posts.as_array().unwrap();
    assert_eq!(posts.len(), 7);
    let first = &posts[0];
    assert_eq!(first["seq"], 1);
    assert_eq!(first["webhook_id"], format!("msg_{id}_injection"));
    assert_eq!(first["type"], "injection");
    assert_eq!(first["message_id"], id.as_str());
    assert_eq!(first["events"], 2);
    assert_eq!(first["copy"], 1);
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["status"], 500);
    assert_eq!(first["outcome"], "retrying");
    assert_eq!(first["fault"], "phase=webhook,action=duplicate,times=1");
    assert!(first["webhook_timestamp"].as_i64().unwrap() > 0);
    let sent_at = first["sent_at_ms"].as_u64().unwrap();
    assert!(sent_at > 0);
    assert_eq!(first["sent_at"], rfc3339(sent_at));
    let copies: Vec<(&str, u64, u64)> = posts
        .iter()
        .filter(|p| p["outcome"] == "delivered")
        .map(|p| {
            (
                p["type"].as_str().unwrap(),
                p["copy"].as_u64().unwrap(),
                p["attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut copies = copies;
    copies.sort();
    assert_eq!(
        copies,
        [
            ("bounce", 1, 2),
            ("delivery", 1, 2),
            ("injection", 1, 2),
            ("injection", 2, 1)
        ]
    );
    assert_eq!(
        get_json(sink.api, &format!("/webhooks?id={id}")).await,
        Value::Array(posts.clone())
    );
    assert_eq!(
        get_json(sink.api, "/webhooks?key=other").await,
        serde_json::json!([])
    );
    let (status, _) = http(sink.api, "POST", "/reset", "").await;
    assert_eq!(status, 204);
    assert_eq!(get_json(sink.api, "/webhooks").await, serde_json::json!([]));
}
