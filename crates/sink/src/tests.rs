use super::*;
use clap::{CommandFactory, Parser};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    sink: SinkArgs,
}

fn parse(args: &[&str]) -> Result<SinkConfig, String> {
    let cli = Cli::try_parse_from(std::iter::once("sink").chain(args.iter().copied()))
        .map_err(|e| e.to_string())?;
    cli.sink.into_config().map_err(|e| e.to_string())
}

#[test]
fn secrets_are_read_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret pass\n").unwrap();
    let secrets = dir.path().join("secrets");
    std::fs::write(
        &secrets,
        "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD\n\nwhsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
    )
    .unwrap();
    let config = parse(&[
        "--auth-user",
        "relay",
        "--auth-password-file",
        password.to_str().unwrap(),
        "--webhook",
        "http://127.0.0.1:8027/webhooks/upstream",
        "--webhook-secret-file",
        secrets.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(
        config.require_auth,
        Some(("relay".into(), "s3cret pass".into()))
    );
    assert_eq!(config.webhook.unwrap().secrets.len(), 2);
    let missing = parse(&[
        "--auth-user",
        "relay",
        "--auth-password-file",
        "/nonexistent",
    ]);
    assert!(missing.unwrap_err().contains("/nonexistent"));
}

#[test]
fn cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn cli_flags_become_the_config() {
    let config = parse(&[
        "--listen",
        "127.0.0.1:0",
        "--api",
        "127.0.0.1:8025",
        "--window",
        "90s",
        "--fault",
        "phase=dot,action=drop,times=1,key=abc",
        "--fault",
        "phase=rcpt,action=reply,code=451,text=try later",
        "--auth-user",
        "relay",
        "--auth-password",
        "pw",
    ])
    .unwrap();
    assert_eq!(config.window, Duration::from_secs(90));
    assert_eq!(config.api, Some("127.0.0.1:8025".parse().unwrap()));
    assert_eq!(config.faults.len(), 2);
    assert_eq!(config.require_auth, Some(("relay".into(), "pw".into())));
    assert!(
        !format!("{config:?}").contains("pw\""),
        "password leaked into Debug"
    );

    let defaults = parse(&[]).unwrap();
    assert_eq!(defaults.window, Duration::from_secs(3 * 3600));
    assert_eq!(defaults.listen, "127.0.0.1:2526".parse().unwrap());

    assert!(defaults.webhook.is_none());

    let config = parse(&[
        "--webhook",
        "http://127.0.0.1:8027/webhooks/upstream",
        "--webhook-secret",
        "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
        "--webhook-bounce",
        "unknown@,nobody@",
        "--webhook-backoff",
        "20ms",
        "--webhook-attempts",
        "3",
    ])
    .unwrap();
    let webhook = config.webhook.as_ref().unwrap();
    assert_eq!(webhook.url.path(), "/webhooks/upstream");
    assert_eq!(webhook.secrets.len(), 1);
    assert_eq!(webhook.bounce, ["unknown@", "nobody@"]);
    assert_eq!(webhook.delivery_delay, Duration::from_millis(200));
    assert_eq!(webhook.retry.first, Duration::from_millis(20));
    assert_eq!(webhook.retry.max_attempts, 3);
    assert_eq!(webhook.timeout, Duration::from_secs(15));
    assert!(!format!("{config:?}").contains("C2FVsBQ"), "secret leaked");

    for bad in [
        &["--webhook", "http://127.0.0.1:8027/"][..],
        &["--webhook-secret", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"],
        &[
            "--webhook",
            "https://x.example/",
            "--webhook-secret",
            "whsec_AAAA",
        ],
        &[
            "--webhook",
            "http://x.example/",
            "--webhook-secret",
            "nope!",
        ],
        &[
            "--webhook",
            "http://x.example/",
            "--webhook-secret",
            "whsec_AAAA",
            "--webhook-attempts",
            "0",
        ],
        &["--fault", "phase=rcpt,action=drop"],
        &["--tls-cert", "c.pem"],
        &["--auth-user", "relay"],
        &["--implicit-tls"],
        &["--window", "soon"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?} was accepted");
    }
}
