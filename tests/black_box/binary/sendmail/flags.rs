//! The command line: -t, -f and -F, the lone dot and -i, -bm and the flags callers pass.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t_takes_to_cc_and_bcc_and_the_bcc_field_is_not_sent() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let input = b"From: App <app@example.com>\n\
To: Ann <ann@example.com>, root\n\
Cc: \"Doe, Bob\" <bob@example.com>\n\
Bcc: hidden@example.com,\n secret@example.com\n\
Subject: t\n\
\n\
Bcc: a body line, not a field\n";
    // -t and a recipient argument: both count, as Postfix's sendmail does.
    let out = sendmail_to(
        relay.addr,
        &[
            "-t",
            "-i",
            "-v",
            "--hostname",
            "sender.test",
            "extra@example.com",
        ],
        input,
    );
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.id();
    let record = show(&db, &id);
    assert_eq!(record["mail_from"], "app@example.com");
    assert_eq!(
        strings(&record["rcpt_to"]),
        [
            "extra@example.com",
            "ann@example.com",
            "root@sender.test",
            "bob@example.com",
            "hidden@example.com",
            "secret@example.com",
        ]
    );
    assert_eq!(
        sent_bytes(&db, &id).await,
        "From: App <app@example.com>\r\n\
To: Ann <ann@example.com>, root\r\n\
Cc: \"Doe, Bob\" <bob@example.com>\r\n\
Subject: t\r\n\
\r\n\
Bcc: a body line, not a field\r\n"
    );

    // Without -t the header names nobody: no recipient is an error, nothing is sent.
    let out = sendmail_to(relay.addr, &["-i"], input);
    assert_eq!(out.code, 64, "{out:?}");
    assert!(out.stderr.contains("no recipients"), "{out:?}");
    // -t and a header without addresses: the message is at fault.
    let out = sendmail_to(
        relay.addr,
        &["-t"],
        b"From: a@example.com\nSubject: x\n\nx\n",
    );
    assert_eq!(out.code, 65, "{out:?}");
    assert_eq!(record_count(&db), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f_sets_the_sender_and_f_name_the_from_field_only_when_missing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);

    // No From: field: sendmail adds one from -f, with -F as the display name.
    let out = sendmail_to(
        relay.addr,
        &[
            "-v",
            "-F",
            "Build Bot",
            "-fbounce@example.com",
            "dev@example.com",
        ],
        b"Subject: build 17\n\nok\n",
    );
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.id();
    assert_eq!(show(&db, &id)["mail_from"], "bounce@example.com");
    assert_eq!(
        sent_bytes(&db, &id).await,
        "Subject: build 17\r\nFrom: \"Build Bot\" <bounce@example.com>\r\n\r\nok\r\n"
    );

    // A From: field is kept as it is; -r is -f.
    let out = sendmail_to(
        relay.addr,
        &[
            "-v",
            "-F",
            "Ignored",
            "-r",
            "bounce@example.com",
            "dev@example.com",
        ],
        b"From: Ann <ann@example.com>\nSubject: s\n\nok\n",
    );
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.id();
    assert_eq!(show(&db, &id)["mail_from"], "bounce@example.com");
    assert_eq!(
        sent_bytes(&db, &id).await,
        "From: Ann <ann@example.com>\r\nSubject: s\r\n\r\nok\r\n"
    );

    // Without -f the envelope sender is the From: address...
    let out = sendmail_to(
        relay.addr,
        &["-v", "dev@example.com"],
        b"From: Ann <ann@example.com>\nSubject: s2\n\nok\n",
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(show(&db, &out.id())["mail_from"], "ann@example.com");

    // ...and without either, the user running sendmail at the configured host name.
    let out = sendmail_to(
        relay.addr,
        &["-v", "--hostname", "sender.test", "dev@example.com"],
        b"Subject: s3\n\nok\n",
    );
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.id();
    let mail_from = show(&db, &id)["mail_from"].as_str().unwrap().to_string();
    let (login, domain) = mail_from.split_once('@').unwrap();
    assert!(!login.is_empty() && domain == "sender.test", "{mail_from}");
    assert_eq!(
        sent_bytes(&db, &id).await,
        format!("Subject: s3\r\nFrom: {mail_from}\r\n\r\nok\r\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_dot_ends_the_message_unless_i_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let input =
        b"From: a@example.com\r\nSubject: dots\r\n\r\nline 1\r\n..two dots\r\n.\r\nline 3\r\n";

    let out = sendmail_to(relay.addr, &["-v", "r@example.com"], input);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        sent_bytes(&db, &out.id()).await,
        "From: a@example.com\r\nSubject: dots\r\n\r\nline 1\r\n..two dots\r\n"
    );

    // With -i (or -oi) the dot is data: dot-stuffed on the wire, stored as it was read.
    for flag in ["-i", "-oi"] {
        let out = sendmail_to(relay.addr, &["-v", flag, "r@example.com"], input);
        assert_eq!(out.code, 0, "{flag}: {out:?}");
        assert_eq!(
            sent_bytes(&db, &out.id()).await,
            "From: a@example.com\r\nSubject: dots\r\n\r\nline 1\r\n..two dots\r\n.\r\nline 3\r\n",
            "{flag}"
        );
    }
    // The same message with LF line endings is the same message.
    let lf = text(input).replace("\r\n", "\n");
    let out = sendmail_to(relay.addr, &["-v", "-i", "r@example.com"], lf.as_bytes());
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("(idempotent replay)"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bm_and_the_flags_callers_pass_are_accepted_unknown_ones_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let out = sendmail_to(
        relay.addr,
        &[
            "-bm",
            "-odi",
            "-odb",
            "-oem",
            "-oee",
            "-om",
            "-o7",
            "-Am",
            "-Ac",
            "-G",
            "-U",
            "-n",
            "-N",
            "never",
            "-L",
            "app",
            "-X",
            "/dev/null",
            "-O",
            "DeliveryMode=b",
            "-h",
            "5",
            "-R",
            "full",
            "-B8BITMIME",
            "-v",
            "r@example.com",
        ],
        "From: a@example.com\nSubject: flags\n\nsmørrebrød\n".as_bytes(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(show(&db, &out.id())["state"], "queued");

    // Nothing to do: no alias database, no queue of our own to flush.
    for args in [&["-bi"][..], &["-I"], &["-q"], &["-q15m"]] {
        let out = sendmail_to(relay.addr, args, b"");
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
    }
    // Usage errors exit 64 before anything is read or sent.
    for (args, says) in [
        (&["-z", "r@example.com"][..], "unknown option -z"),
        (&["-bs"], "-bs"),
        (&["-bp"], "idemrelay queue list"),
        (&["-V", "r@example.com"], "VERP"),
        (&["-B", "BINARYMIME", "r@example.com"], "-B"),
        (
            &["--no-such-setting", "1", "r@example.com"],
            "no-such-setting",
        ),
        (&["--server", "nowhere", "r@example.com"], "HOST:PORT"),
    ] {
        let out = sendmail_to(relay.addr, args, b"From: a@example.com\n\nx\n");
        assert_eq!(out.code, 64, "{args:?}: {out:?}");
        assert!(out.stderr.contains(says), "{args:?}: {out:?}");
    }
    assert_eq!(record_count(&db), 1);

    let help = sendmail(&["--help"], b"");
    assert_eq!(help.code, 0);
    for line in [
        "-oi",
        "-odi",
        "-oem",
        "Exit status",
        "75",
        "--server HOST:PORT",
    ] {
        assert!(
            help.stdout.contains(line),
            "--help lacks {line:?}:\n{}",
            help.stdout
        );
    }
}
