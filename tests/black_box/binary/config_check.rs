//! `check-config`: secrets redacted, bad settings refused.

use super::*;

#[test]
fn check_config_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(&dir.path().join("relay.db"));
    let base = ["--store", &store, "--listen", "127.0.0.1:2600"];

    let from_flag = check_config(
        &[&base[..], &["--upstream", "smtp://user:s3cret@host:587"]].concat(),
        &[],
    );
    let from_env = check_config(
        &base,
        &[("IDEMRELAY_UPSTREAM", "smtp://user:s3cret@host:587")],
    );
    for out in [&from_flag, &from_env] {
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{}: {stderr}", out.status);
        assert!(
            stdout.contains("upstream = \"smtp://user:********@host:587\""),
            "{stdout}"
        );
        assert!(
            !stdout.contains("s3cret") && !stderr.contains("s3cret"),
            "password shown:\n{stdout}\n{stderr}"
        );
        assert!(stdout.contains(&format!("store = \"{store}\"")), "{stdout}");
    }
    assert_eq!(from_flag.stdout, from_env.stdout);

    // What check-config prints is itself a valid configuration with the same meaning.
    let file = dir.path().join("effective.toml");
    std::fs::write(&file, &from_flag.stdout).unwrap();
    let reread = check_config(&["--config", file.to_str().unwrap()], &[]);
    assert!(reread.status.success(), "{}", text(&reread.stderr));
    assert_eq!(text(&reread.stdout), text(&from_flag.stdout));
}

#[test]
fn check_config_rejects_bad_settings() {
    let dir = tempfile::tempdir().unwrap();
    let unknown_key = dir.path().join("unknown.toml");
    std::fs::write(&unknown_key, "lisen = [\"127.0.0.1:2600\"]\n").unwrap();
    let bad_value = dir.path().join("bad-value.toml");
    std::fs::write(&bad_value, "retention = \"soon\"\n").unwrap();
    let missing = dir.path().join("missing.toml");

    let cases: &[(&[&str], &[&str])] = &[
        (&["--store", "mysql://x"], &["store", "mysql://x"]),
        (
            &["--config", unknown_key.to_str().unwrap()],
            &["lisen", "unknown.toml"],
        ),
        (
            &["--config", bad_value.to_str().unwrap()],
            &["retention", "bad-value.toml"],
        ),
        (&["--config", missing.to_str().unwrap()], &["missing.toml"]),
        (&["--retention", "soon"], &["--retention"]),
        // A key may not be freed while the upstream may still hold it (docs/concepts/contract.md).
        (&["--retention", "1h"], &["retention", "upstream_window"]),
        (
            &["--parked-retention", "1h"],
            &["parked_retention", "upstream_window"],
        ),
        (&["--listen", "nowhere"], &["--listen"]),
        (&["--scope", ""], &["scope"]),
        // The refusal names the problem without printing the password it refuses.
        (
            &["--upstream", "http://user:s3cret@host:25"],
            &["upstream", "user:********@host"],
        ),
    ];
    for (args, mentions) in cases {
        let out = check_config(args, &[]);
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} accepted:\n{}",
            text(&out.stdout)
        );
        assert!(out.stdout.is_empty(), "{args:?} printed settings anyway");
        for word in *mentions {
            assert!(
                stderr.contains(word),
                "{args:?}: stderr lacks {word:?}:\n{stderr}"
            );
        }
        assert!(
            !stderr.contains("s3cret"),
            "{args:?} leaked the password:\n{stderr}"
        );
    }
}
