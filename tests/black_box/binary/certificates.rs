//! The generated certificate, accepted by msmtp for IPv4 and IPv6 loopback.

use super::*;

/// `certs generate` put only `localhost` in the certificate, so msmtp refused `host 127.0.0.1`,
/// and its validity (1975-4096) was flagged. With the defaults, msmtp (GnuTLS, verifying
/// against the generated certificate) submits over implicit TLS to 127.0.0.1 and to ::1.
#[test]
fn msmtp_accepts_the_generated_certificate_for_ipv4_and_ipv6_loopback() {
    if Command::new("msmtp").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "msmtp is required in CI (apt-get install -y msmtp)"
        );
        eprintln!("SKIPPED msmtp: msmtp is not installed (apt-get install -y msmtp)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    run_checked(
        idemrelay().args(["certs", "generate", "--out", certs.to_str().unwrap()]),
        None,
    );
    let cert = certs.join("cert.pem");
    let users = dir.path().join("users.toml");
    let password = "correct horse battery staple";
    run_checked(
        idemrelay().args(["user", "add", "alice", "--users", users.to_str().unwrap()]),
        Some(format!("{password}\n").as_bytes()),
    );
    let relay = start_relay(
        &dir.path().join("relay.db"),
        &[
            "--submissions-listen",
            "127.0.0.1:0,[::1]:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            certs.join("key.pem").to_str().unwrap(),
            "--users-file",
            users.to_str().unwrap(),
        ],
    );
    let listeners = logged_listeners(&relay, "ImplicitTls", 2);
    for addr in &listeners {
        let host = addr.ip().to_string();
        let msg = format!(
            "From: app@example.com\r\nTo: user@example.net\r\nSubject: msmtp over {host}\r\n\
             X-Bird-Idempotency-Key: msmtp-{host}\r\n\r\nhello\r\n"
        );
        let out = run_checked(
            Command::new("msmtp").args([
                &format!("--host={host}"),
                &format!("--port={}", addr.port()),
                "--tls=on",
                "--tls-starttls=off",
                &format!("--tls-trust-file={}", cert.display()),
                "--auth=plain",
                "--user=alice",
                &format!("--passwordeval=echo {password}"),
                "--from=app@example.com",
                "--domain=client.test",
                "user@example.net",
            ]),
            Some(msg.as_bytes()),
        );
        assert!(
            out.status.success(),
            "msmtp to {host}: {}",
            text(&out.stderr)
        );
    }
    let listed = queue_json(&dir.path().join("relay.db"), &["list", "--json"]);
    let keys: Vec<&str> = listed["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2, "{listed}");
    assert!(
        keys.contains(&"msmtp-127.0.0.1") && keys.contains(&"msmtp-::1"),
        "{keys:?}"
    );
}
