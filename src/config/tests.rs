use super::*;

const WEBHOOKS: &str = r#"
webhook_listen = "127.0.0.1:8027"
[webhooks.upstream]
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_c2Vjb25k"]
[webhooks.upstream.fields]
event_type = "/type"
event_time = "/timestamp"
key = "/idempotency_key"
upstream_id = "/message_id"
message_id = "/headers/message-id"
recipient = "/rcpt_to"
[webhooks.upstream.types]
accepted = ["injection", "delivery"]
bounced = ["bounce"]
"#;

#[test]
fn webhook_sources_are_read_checked_and_their_secrets_never_shown() {
    let s = Settings::from_toml(WEBHOOKS).unwrap();
    s.validate().unwrap();
    let source = &s.webhooks["upstream"];
    assert_eq!(source.keys().unwrap()[1], b"second");
    assert_eq!(
        source.fields.message_id.as_deref(),
        Some("/headers/message-id")
    );
    let shown = s.to_redacted_toml();
    assert!(!shown.contains("whsec_"), "{shown}");
    assert!(!format!("{s:?}").contains("whsec_"));
    assert!(shown.contains("[webhooks.upstream.fields]"), "{shown}");

    let broken = |from: &str, to: &str, expect: &str| {
        let text = WEBHOOKS.replace(from, to);
        let err = match Settings::from_toml(&text) {
            Ok(s) => s.validate().unwrap_err(),
            Err(e) => e,
        };
        let err = format!("{err:#}");
        assert!(err.contains(expect), "{from} -> {to}: {err}");
        assert!(!err.contains("MfKQ9r8G"), "a secret in an error: {err}");
    };
    broken(r#""/type""#, r#""type""#, "fields.event_type");
    broken(r#""/rcpt_to""#, r#""/a~2b""#, "fields.recipient");
    broken("whsec_c2Vjb25k", "c2Vjb25k", "secrets[1]");
    broken("whsec_c2Vjb25k", "whsec_!!", "secrets[1]");
    broken("event_type = \"/type\"\n", "", "event_type");
    broken(
            "key = \"/idempotency_key\"\nupstream_id = \"/message_id\"\nmessage_id = \"/headers/message-id\"\n",
            "",
            "at least one of key",
        );
    broken(
        r#"bounced = ["bounce"]"#,
        r#"bounced = ["delivery"]"#,
        "both",
    );
    broken("webhooks.upstream", "webhooks.\"up stream\"", "source name");

    let lonely = Settings {
        webhook_listen: Some("127.0.0.1:8027".parse().unwrap()),
        ..Settings::default()
    };
    let err = lonely.validate().unwrap_err().to_string();
    assert!(err.contains("no webhook source"), "{err}");
}

#[test]
fn file_values_are_overridden_by_flags() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(
            &path,
            "listen = [\"127.0.0.1:2600\"]\nretention = \"5h\"\nscope = \"file\"\nmissing_key = \"pass\"\n",
        )
        .unwrap();
    let args = ConfigArgs {
        config: Some(path),
        scope: Some("flag".into()),
        ..Default::default()
    };
    let s = Settings::load(&args).unwrap();
    assert_eq!(s.listen, vec!["127.0.0.1:2600".parse().unwrap()]);
    assert_eq!(s.retention, Duration::from_secs(5 * 3600));
    assert_eq!(s.scope, "flag");
    assert_eq!(s.missing_key, MissingKey::Pass);
}

#[test]
fn proxy_protocol_networks_per_listener_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(
            &path,
            "proxy_protocol_from = [\"10.0.0.5/32\"]\nsubmission_proxy_protocol_from = [\"10.0.1.0/24\", \"fd00::/8\"]\n",
        )
        .unwrap();
    let args = ConfigArgs {
        config: Some(path.clone()),
        ..Default::default()
    };
    let s = Settings::load(&args).unwrap();
    assert_eq!(s.proxy_protocol_from, vec!["10.0.0.5/32".parse().unwrap()]);
    assert_eq!(s.submission_proxy_protocol_from.len(), 2);
    // The flag replaces the plain listeners' list and leaves the TLS listeners' alone.
    let args = ConfigArgs {
        config: Some(path),
        proxy_protocol_from: vec!["192.0.2.0/24".parse().unwrap()],
        ..Default::default()
    };
    let s = Settings::load(&args).unwrap();
    assert_eq!(s.proxy_protocol_from, vec!["192.0.2.0/24".parse().unwrap()]);
    assert_eq!(s.submission_proxy_protocol_from.len(), 2);
    assert!(Settings::default().proxy_protocol_from.is_empty());
    assert!(Settings::from_toml("proxy_protocol_from = [\"not a network\"]").is_err());
}

/// A key given up while the upstream may still hold it would make a new operation under
/// it look like a reuse there (docs/concepts/contract.md "What the relay answers at the end of DATA" Retention).
#[test]
fn retention_may_not_be_shorter_than_the_upstream_window() {
    let mut s = Settings::default();
    s.validate().unwrap();
    s.retention = Duration::from_secs(3600);
    let err = s.validate().unwrap_err().to_string();
    assert!(err.contains("upstream_window"), "{err}");
    s.delivery.upstream_window = Duration::from_secs(3600);
    s.validate().unwrap();
    s.parked_retention = Duration::from_secs(600);
    assert!(s.validate().is_err());
}

#[test]
fn parse_errors_do_not_quote_the_line() {
    for text in [
        "upstream = \"smtp://u:s3cret@h:587\n",
        "upstream = [\"smtp://u:s3cret@h:587\"]\n",
        "retention = \"3h\"\nupstream = 5 # s3cret\n",
    ] {
        let err = format!("{:#}", Settings::from_toml(text).unwrap_err());
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.starts_with("line "), "{err}");
    }
}

#[test]
fn admin_listener_and_token() {
    let s = Settings::from_toml("admin = \"off\"\nadmin_token = \"0123456789abcdef-secret\"\n")
        .unwrap();
    assert_eq!(s.admin, AdminListen(None));
    s.validate().unwrap();
    let shown = s.to_redacted_toml();
    assert!(shown.contains("admin = \"off\""), "{shown}");
    assert!(!shown.contains("0123456789abcdef") && !format!("{s:?}").contains("0123456789abcdef"));
    let s = Settings::from_toml("admin = \"0.0.0.0:9000\"").unwrap();
    assert_eq!(s.admin.0, Some("0.0.0.0:9000".parse().unwrap()));
    assert!(Settings::from_toml("admin = \"nowhere\"").is_err());
    let short = Settings::from_toml("admin_token = \"short\"").unwrap();
    assert!(short.validate().is_err());
    for weak in [
        "passwordpassword",
        "aaaaaaaaaaaaaaaaaaaa",
        "abababab12121212",
    ] {
        let s = Settings::from_toml(&format!("admin_token = \"{weak}\"")).unwrap();
        assert!(s.validate().is_err(), "{weak}");
    }
}

#[test]
fn unknown_keys_and_bad_values_are_refused() {
    assert!(Settings::from_toml("lisen = []").is_err());
    assert!(Settings::from_toml("retention = \"soon\"").is_err());
    let s = Settings::from_toml("store = \"mysql://x\"").unwrap();
    assert!(s.validate().is_err());
}

#[test]
fn auth_lockout_settings() {
    let s = Settings::default();
    assert_eq!(
        (
            s.max_auth_failures,
            s.max_auth_failures_per_user,
            s.max_auth_failures_per_ip,
            s.auth_failure_window
        ),
        (3, 10, 50, Duration::from_secs(900))
    );
    let s = Settings::from_toml(
            "max_auth_failures = 2\nmax_auth_failures_per_user = 4\nmax_auth_failures_per_ip = 4\nauth_failure_window = \"1h\"\n",
        )
        .unwrap();
    s.validate().unwrap();
    assert_eq!(s.max_auth_failures, 2);
    assert_eq!(s.max_auth_failures_per_user, 4);
    assert_eq!(s.max_auth_failures_per_ip, 4);
    assert_eq!(s.auth_failure_window, Duration::from_secs(3600));
    for bad in [
        "max_auth_failures = 0",
        "max_auth_failures_per_user = 0",
        "max_auth_failures_per_user = 0\nmax_auth_failures_per_ip = 0",
        "auth_failure_window = \"0s\"",
        "max_auth_failures_per_user = 20\nmax_auth_failures_per_ip = 19",
    ] {
        let s = Settings::from_toml(bad).unwrap();
        assert!(s.validate().is_err(), "{bad}");
    }
    assert!(Settings::from_toml("max_auth_failures_per_ip = -1").is_err());
}

#[test]
fn upstream_password_is_redacted_everywhere() {
    let url = SecretUrl("smtp://user:s3cret@smtp.example:587?tls=required".into());
    assert_eq!(
        url.redacted(),
        "smtp://user:********@smtp.example:587?tls=required"
    );
    assert!(!format!("{url:?}").contains("s3cret"));
    let s = Settings {
        upstream: Some(url),
        ..Default::default()
    };
    let shown = s.to_redacted_toml();
    assert!(!shown.contains("s3cret") && shown.contains("********"));
    assert!(!format!("{s:?}").contains("s3cret"));
    assert_eq!(
        SecretUrl("smtp://host:2525?tls=none".into()).redacted(),
        "smtp://host:2525?tls=none"
    );
}

#[test]
fn store_passwords_are_redacted_whatever_they_contain() {
    let cases = [
        (
            "postgresql://root:pw@127.0.0.1:5432/idemrelay",
            "postgresql://root:********@127.0.0.1:5432/idemrelay",
        ),
        // `@`, `/`, `?` and `#` in a password (written bare, as people do).
        (
            "postgresql://root:p@ss@db.example/idemrelay",
            "postgresql://root:********@db.example/idemrelay",
        ),
        ("postgres://root:pa/ss@db/x", "postgres://********@db/x"),
        ("smtp://u:pa?ss@host:587", "smtp://********@host:587"),
        ("smtp://u:pa#ss@host:587", "smtp://********@host:587"),
        (
            "sqlite:///var/lib/idemrelay/queue.db",
            "sqlite:///var/lib/idemrelay/queue.db",
        ),
        ("/var/lib/idemrelay/queue.db", "/var/lib/idemrelay/queue.db"),
        ("smtp://user@host:587", "smtp://user@host:587"),
    ];
    for (url, want) in cases {
        assert_eq!(SecretUrl(url.into()).redacted(), want, "{url}");
    }
}
