//! `idemrelay.example.toml` documents every setting with its default value.

use std::collections::BTreeSet;
use std::path::PathBuf;

use idemrelay::config::{Secret, SecretUrl, Settings, WebhookFields, WebhookSource, WebhookTypes};

const EXAMPLE: &str = include_str!("../../idemrelay.example.toml");

/// `key = value` lines, active or commented out (`# key = value`), as (table, key).
fn documented_keys(text: &str) -> BTreeSet<(String, String)> {
    let mut table = String::new();
    let mut keys = BTreeSet::new();
    for line in text.lines() {
        let header = line.strip_prefix('[').or_else(|| line.strip_prefix("# ["));
        if let Some(header) = header {
            table = header.trim_end_matches(']').to_string();
        } else if let Some(key) = setting_key(line.strip_prefix("# ").unwrap_or(line)) {
            keys.insert((table.clone(), key.to_string()));
        }
    }
    keys
}

/// The key of a `key = value` line, keys being lowercase words with underscores.
fn setting_key(line: &str) -> Option<&str> {
    let (key, _) = line.split_once(" = ")?;
    let is_key = !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    is_key.then_some(key)
}

/// Every (table, key) of a serialized value, nested tables by their dotted name.
fn serialized_keys(table: &toml::Table, prefix: &str, out: &mut BTreeSet<(String, String)>) {
    for (key, value) in table {
        match value {
            toml::Value::Table(inner) => {
                let name = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                serialized_keys(inner, &name, out);
            }
            _ => {
                out.insert((prefix.to_string(), key.clone()));
            }
        }
    }
}

/// The example with its commented-out settings switched on.
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest) if setting_key(rest).is_some() || rest.starts_with('[') => rest,
            _ => line,
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

#[test]
fn example_holds_the_defaults() {
    let mut parsed = Settings::from_toml(EXAMPLE).expect("the example parses");
    let defaults = Settings::default();
    // `hostname` is commented out, so the system hostname applies, as by default.
    assert_eq!(parsed.hostname, defaults.hostname);
    parsed.hostname = defaults.hostname.clone();
    assert_eq!(
        toml::to_string(&parsed).unwrap(),
        toml::to_string(&defaults).unwrap()
    );
    // Unset options are left out of the serialized form; check them one by one.
    assert!(parsed.tls_cert.is_none());
    assert!(parsed.tls_key.is_none());
    assert!(parsed.users_file.is_none());
    assert!(parsed.upstream.is_none());
    assert!(parsed.delivery.ca_file.is_none());
    assert!(parsed.admin_token.is_none());
    parsed.validate().expect("the example validates");
}

#[test]
fn example_documents_every_setting() {
    // Set every option so that serialization names it too.
    let mut all = Settings {
        tls_cert: Some(PathBuf::from("cert.pem")),
        tls_key: Some(PathBuf::from("key.pem")),
        users_file: Some(PathBuf::from("users.toml")),
        upstream: Some(SecretUrl("smtp://smtp.example.com:587".into())),
        admin_token: Some(Secret("0123456789abcdef".into())),
        webhook_listen: Some("127.0.0.1:8027".parse().unwrap()),
        ..Settings::default()
    };
    all.delivery.ca_file = Some(PathBuf::from("ca.pem"));
    all.webhooks.insert(
        "upstream".into(),
        WebhookSource {
            secrets: vec![Secret("whsec_c2Vjb25k".into())],
            fields: WebhookFields {
                event_type: "/type".into(),
                event_time: Some("/t".into()),
                key: Some("/k".into()),
                upstream_id: Some("/u".into()),
                message_id: Some("/m".into()),
                recipient: Some("/r".into()),
            },
            types: WebhookTypes::default(),
        },
    );

    let mut expected = BTreeSet::new();
    for settings in [&Settings::default(), &all] {
        let text = toml::to_string(settings).unwrap();
        let table: toml::Table = text.parse().unwrap();
        serialized_keys(&table, "", &mut expected);
    }
    // Guard against a broken walk: all three levels are there.
    for probe in [
        ("", "listen"),
        ("delivery", "rate"),
        ("delivery.timeouts", "dot"),
    ] {
        assert!(expected.contains(&(probe.0.to_string(), probe.1.to_string())));
    }

    let documented = documented_keys(EXAMPLE);
    let missing: Vec<_> = expected.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "settings missing from idemrelay.example.toml: {missing:?}"
    );
    let unknown: Vec<_> = documented.difference(&expected).collect();
    assert!(
        unknown.is_empty(),
        "idemrelay.example.toml documents unknown settings: {unknown:?}"
    );
}

#[test]
fn commented_out_examples_parse() {
    let text = uncommented(EXAMPLE);
    assert_ne!(text, EXAMPLE, "the example has commented-out settings");
    let s = Settings::from_toml(&text).expect("the uncommented example parses");
    assert_eq!(s.hostname, "relay.example.com");
    assert!(s.tls_cert.is_some() && s.tls_key.is_some() && s.users_file.is_some());
    assert!(s.delivery.ca_file.is_some());
    assert_eq!(
        s.admin_token.as_ref().map(Secret::expose),
        Some("a-long-random-string")
    );
    let upstream = s.upstream.as_ref().expect("upstream is set");
    assert_eq!(upstream.expose(), "smtp://user@smtp.example.com:587");
    assert!(s.webhook_listen.is_some());
    let source = &s.webhooks["upstream"];
    assert_eq!(source.types.accepted, ["injection", "delivery"]);
    assert_eq!(source.fields.recipient.as_deref(), Some("/rcpt_to"));
    s.validate().expect("the uncommented example validates");
}

#[test]
fn example_holds_no_password() {
    for line in EXAMPLE.lines() {
        for rest in line.split("://").skip(1) {
            let authority = rest.split(['/', '?', '"', ' ']).next().unwrap_or_default();
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                assert!(!userinfo.contains(':'), "a URL with a password: {line}");
            }
        }
    }
}
