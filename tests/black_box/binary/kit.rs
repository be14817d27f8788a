//! The operator's kit, through the built binary: SIGHUP reloads the users
//! file, `user add` refuses short passwords, `--version` and the startup line name the commit
//! (and the build script finds it, or says `unknown`, without making every build a rebuild),
//! a second relay on one SQLite file is warned about, the systemd unit verifies, and the shell
//! completions and man page come out of the CLI definition.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::common::process::{idemrelay, serve_args, RelayProcess};
use super::common::{auth_plain, Client};
use super::{run_checked, text, QUICK_EXIT};

/// `idemrelay user add NAME --users FILE` with the password on stdin, whatever it exits with.
fn user_add(users: &Path, name: &str, password: &str) -> Output {
    use std::io::Write;
    let mut child = idemrelay()
        .args(["user", "add", name, "--users"])
        .arg(users)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run idemrelay user add");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(format!("{password}\n").as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// The reply code to `AUTH PLAIN` on a fresh connection (the plain listener offers AUTH to
/// loopback clients).
async fn auth(addr: SocketAddr, user: &str, password: &str) -> u16 {
    let (mut client, greeting) = Client::connect(addr).await;
    assert_eq!(greeting.code, 220, "{greeting:?}");
    let ehlo = client.cmd("EHLO client.test").await;
    assert!(
        ehlo.lines.iter().any(|l| l.starts_with("AUTH ")),
        "{ehlo:?}"
    );
    let code = client.cmd(&auth_plain(user, password)).await.code;
    client.quit().await;
    code
}

/// Submits a message under the key `shared-key`, after AUTH if `login` is given (its scope),
/// else as a loopback client (the listener's scope); returns the queue id.
async fn submit_keyed(addr: SocketAddr, login: Option<(&str, &str)>) -> String {
    let (mut client, _) = Client::connect(addr).await;
    client.cmd("EHLO client.test").await;
    if let Some((user, password)) = login {
        assert_eq!(client.cmd(&auth_plain(user, password)).await.code, 235);
    }
    let message = super::common::message(Some("shared-key"), "shared", "one key, two scopes");
    let answer = client
        .submit("app@example.com", &["user@example.com"], &message)
        .await;
    client.quit().await;
    answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"))
}

/// The `n`th line (from 1) of the relay's log that contains `needle`, once it is there.
async fn log_line(relay: &RelayProcess, needle: &str, n: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = relay.log();
        if let Some(line) = log.lines().filter(|l| l.contains(needle)).nth(n - 1) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no line {n} with {needle:?} in the log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_users_file_and_a_bad_file_keeps_the_users_in_service() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    let added = user_add(&users, "alice", "alice's long password");
    assert!(added.status.success(), "{}", text(&added.stderr));
    let users_arg = users.to_str().unwrap();
    let certs = dir.path().join("certs");
    run_checked(
        idemrelay().args(["certs", "generate", "--out"]).arg(&certs),
        None,
    );
    let (cert, key) = (certs.join("cert.pem"), certs.join("key.pem"));
    let mut relay = RelayProcess::spawn(&serve_args(
        &dir.path().join("relay.db"),
        &[
            "--users-file",
            users_arg,
            "--submissions-listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    ))
    .ready()
    .await;
    assert_eq!(
        auth(relay.addr, "alice", "alice's long password").await,
        235
    );
    assert_eq!(
        auth(relay.addr, "carol", "carol's long password").await,
        535
    );

    // Written while the relay runs: not in service until the HUP.
    let added = user_add(&users, "carol", "carol's long password");
    assert!(added.status.success(), "{}", text(&added.stderr));
    assert_eq!(
        auth(relay.addr, "carol", "carol's long password").await,
        535
    );
    relay.signal("HUP");
    let line = log_line(&relay, "users file reloaded", 1).await;
    assert!(
        line.contains("2 users; added: carol; removed: none"),
        "{line}"
    );
    assert!(line.contains(users_arg), "{line}");
    // The certificate too, although its files did not change.
    log_line(&relay, "TLS certificate reloaded", 1).await;
    assert_eq!(
        auth(relay.addr, "carol", "carol's long password").await,
        235
    );
    // carol's scope is new on the relay's upstream, which the listener's scope uses too: the
    // same client key from both must reach the upstream as two keys, each carrying its scope.
    let carols = submit_keyed(relay.addr, Some(("carol", "carol's long password"))).await;
    let anonymous = submit_keyed(relay.addr, None).await;
    let db = dir.path().join("relay.db");
    let upstream_key = |id: &str| -> String {
        let shown = super::queue_json(&db, &["show", id, "--json"]);
        shown["upstream_key"].as_str().unwrap().to_string()
    };
    let (carols, anonymous) = (upstream_key(&carols), upstream_key(&anonymous));
    assert!(
        carols.starts_with("u1-") && carols.ends_with("-1-shared-key"),
        "{carols}"
    );
    assert!(anonymous.starts_with("u1-"), "{anonymous}");
    assert_ne!(carols, anonymous);

    // A file that does not load: the log says why (by line, quoting nothing of the file), and
    // the users in service stay.
    std::fs::write(
        &users,
        "[users.carol]\npassword_hash = \"not-a-hash-secret\"\n",
    )
    .unwrap();
    relay.signal("HUP");
    let line = log_line(&relay, "users file reload failed", 1).await;
    assert!(line.contains("previous users stay in service"), "{line}");
    assert!(line.contains("line 2"), "{line}");
    assert!(!line.contains("not-a-hash-secret"), "{line}");
    assert_eq!(
        auth(relay.addr, "carol", "carol's long password").await,
        235
    );
    assert_eq!(
        auth(relay.addr, "alice", "alice's long password").await,
        235
    );

    // Passwords never reach the log.
    relay.signal("TERM");
    assert!(relay.wait_exit(QUICK_EXIT).await.success());
    let log = relay.log();
    assert!(!log.contains("long password"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_without_anything_to_reload_does_not_stop_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::spawn(&serve_args(&dir.path().join("relay.db"), &[]))
        .ready()
        .await;
    relay.signal("HUP");
    log_line(&relay, "SIGHUP: nothing to reload", 1).await;
    assert!(relay.try_exit().is_none(), "{}", relay.log());
    let (_client, greeting) = Client::connect(relay.addr).await;
    assert_eq!(greeting.code, 220);
    relay.signal("TERM");
    assert!(relay.wait_exit(QUICK_EXIT).await.success());
}

#[test]
fn user_add_refuses_a_password_under_12_characters() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    let short = user_add(&users, "bob", "eleven char");
    assert_eq!(short.status.code(), Some(1), "{short:?}");
    let stderr = text(&short.stderr);
    assert!(stderr.contains("too short (11 characters)"), "{stderr}");
    assert!(stderr.contains("at least 12 characters"), "{stderr}");
    assert!(
        !stderr.contains("eleven char"),
        "the password was echoed: {stderr}"
    );
    assert!(!users.exists(), "a refused user wrote the file");

    // Counted in characters, not bytes: 12 characters in more than 12 bytes is enough.
    let ok = user_add(&users, "bob", "pässwörd 🔑xy");
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(std::fs::read_to_string(&users)
        .unwrap()
        .contains("[users.bob]"));
}

/// `(commit X)` in a version text.
fn commit_in(version: &str) -> &str {
    let rest = &version[version.find("(commit ").expect(version) + "(commit ".len()..];
    &rest[..rest.find(')').expect(version)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_and_the_startup_line_name_the_commit() {
    let out = run_checked(idemrelay().arg("--version"), None);
    let version = text(&out.stdout);
    assert!(
        version.starts_with(&format!("idemrelay {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    let commit = commit_in(&version).to_string();
    // Built in a git checkout (here, and in CI): the commit of that checkout's HEAD.
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| text(&o.stdout).trim().to_string());
    match (head, std::env::var("IDEMRELAY_GIT_COMMIT")) {
        (_, Ok(forced)) if !forced.trim().is_empty() => assert_eq!(commit, forced.trim()),
        (Some(head), _) => assert_eq!(commit, head),
        (None, _) => assert_eq!(commit, "unknown"),
    }

    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProcess::spawn(&serve_args(&dir.path().join("relay.db"), &[]))
        .ready()
        .await;
    let log = relay.log();
    let first = log.lines().next().unwrap_or_default();
    let want = format!(
        "idemrelay {} (commit {commit}) starting",
        env!("CARGO_PKG_VERSION")
    );
    assert!(first.contains(&want), "first line {first:?}, want {want:?}");
    assert!(
        first.contains(&format!("commit=\"{commit}\""))
            || first.contains(&format!("commit={commit}")),
        "{first}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_sqlite_file_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    // Delivery is what heartbeats; an upstream nobody listens on is enough for that.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("smtp://{}", closed.local_addr().unwrap());
    drop(closed);
    let args = serve_args(&db, &["--upstream", &upstream]);
    let first = RelayProcess::spawn(&args).ready().await;
    const WARNING: &str = "another relay process is serving this SQLite store too";
    // Alone, for a few heartbeats: no warning.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!first.log().contains(WARNING), "{}", first.log());

    let second = RelayProcess::spawn(&args).ready().await;
    let seen_by_second = log_line(&second, WARNING, 1).await;
    let seen_by_first = log_line(&first, WARNING, 1).await;
    // Each names the other by the id its heartbeat row has (host/pid/random): the same pid in
    // two containers still tells them apart.
    let field = |line: &str, name: &str| -> String {
        let rest = &line[line.find(&format!("{name}=")).expect(line) + name.len() + 1..];
        rest.trim_start_matches('"')
            .split(['"', ' '])
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        field(&seen_by_second, "other_process"),
        field(&seen_by_first, "this_process")
    );
    assert_eq!(
        field(&seen_by_first, "other_process"),
        field(&seen_by_second, "this_process")
    );
    // Once per other process.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(second.log().matches(WARNING).count(), 1);

    // A relay that was SIGKILLed leaves a heartbeat row behind: no evidence of a sibling.
    first.kill();
    second.kill();
    let third = RelayProcess::spawn(&args).ready().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!third.log().contains(WARNING), "{}", third.log());
}

#[test]
fn the_systemd_unit_is_hardened_and_verifies() {
    let unit_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/idemrelay.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let settings: Vec<(&str, &str)> = unit
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .collect();
    let value = |key: &str| -> Vec<&str> {
        settings
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .collect()
    };
    for (key, want) in [
        ("DynamicUser", "yes"),
        ("StateDirectory", "idemrelay"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("SystemCallFilter", "@system-service"),
        ("CapabilityBoundingSet", ""),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
    ] {
        assert_eq!(value(key), [want], "{key}");
    }
    // The default listeners need no capability; binding 25/465/587 is a documented opt-in.
    assert!(value("AmbientCapabilities").is_empty());
    assert!(unit.contains("#AmbientCapabilities=CAP_NET_BIND_SERVICE"));
    let exec = value("ExecStart");
    assert_eq!(exec.len(), 1);
    assert!(
        exec[0].starts_with("/usr/local/bin/idemrelay serve"),
        "{exec:?}"
    );

    // systemd's own check, on the unit pointed at the binary under test (verify insists that
    // ExecStart exists). It exits 0 on unknown keys and bad values, so any output fails.
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs systemd: systemd-analyze is missing"
        );
        eprintln!("SKIPPED systemd-analyze verify: systemd-analyze is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let under_test = dir.path().join("idemrelay.service");
    std::fs::write(
        &under_test,
        unit.replace("/usr/local/bin/idemrelay", super::common::process::BIN),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&under_test)
        .output()
        .unwrap();
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success() && report.trim().is_empty(), "{report}");
}

/// `idemrelay completions bash | head` and `idemrelay man | head`: a reader that stops early
/// is not an error of the command's (no panic, no backtrace, exit 0). Here the pipe's
/// reading end is closed before the command starts, so every write meets a closed pipe.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    for args in [&["completions", "bash"][..], &["man"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = idemrelay()
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked"),
            "{args:?}: {:?} {stderr}",
            out.status
        );
    }
}

#[test]
fn completions_and_the_man_page_come_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let script = text(&run_checked(idemrelay().args(["completions", shell]), None).stdout);
        for word in ["check-config", "healthcheck", "store", "users-file"] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
        std::fs::write(dir.path().join(shell), &script).unwrap();
    }
    let bash = dir.path().join("bash");
    let syntax = Command::new("bash").arg("-n").arg(&bash).output().unwrap();
    assert!(syntax.status.success(), "{}", text(&syntax.stderr));
    // Sourced, it registers a completion for the command; asked, it completes a subcommand.
    let script = format!(
        "source {}; complete -p idemrelay; COMP_WORDS=(idemrelay chec); COMP_CWORD=1; \
         COMP_LINE='idemrelay chec'; COMP_POINT=${{#COMP_LINE}}; \
         $(complete -p idemrelay | sed -E 's/.*-F ([^ ]+).*/\\1/') idemrelay chec idemrelay; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        bash.display()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with("complete ") && stdout.lines().next().unwrap().ends_with(" idemrelay"),
        "{stdout}"
    );
    assert!(stdout.lines().any(|l| l == "check-config"), "{stdout}");
    for (shell, check) in [("zsh", "-n"), ("fish", "--no-execute")] {
        match Command::new(shell)
            .arg(check)
            .arg(dir.path().join(shell))
            .output()
        {
            Ok(out) => assert!(out.status.success(), "{shell}: {}", text(&out.stderr)),
            Err(_) => eprintln!("SKIPPED {shell} {check}: {shell} is not installed"),
        }
    }

    let man = text(&run_checked(idemrelay().arg("man"), None).stdout);
    for section in [
        ".TH idemrelay 1",
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH SUBCOMMANDS",
        ".SH VERSION",
    ] {
        assert!(man.contains(section), "no {section}:\n{man}");
    }
    let page = dir.path().join("idemrelay.1");
    std::fs::write(&page, &man).unwrap();
    // Rendered as a reader sees it: by groff, warnings on, or else by man.
    let rendered = if Command::new("groff").arg("--version").output().is_ok() {
        let out = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .arg(&page)
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "groff: {}",
            text(&out.stderr)
        );
        let out = Command::new("groff")
            .args(["-man", "-Tutf8"])
            .arg(&page)
            .output()
            .unwrap();
        text(&out.stdout)
    } else if Command::new("man").arg("--version").output().is_ok() {
        let out = Command::new("man")
            .arg("-l")
            .arg(&page)
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        assert!(out.status.success(), "man: {}", text(&out.stderr));
        text(&out.stdout)
    } else {
        eprintln!("SKIPPED rendering the man page: neither groff nor man is installed");
        return;
    };
    // Formatting may embolden with backspaces; compare letters only.
    let plain: String = rendered
        .chars()
        .collect::<Vec<_>>()
        .windows(2)
        .filter_map(|w| (w[1] != '\u{8}' && w[0] != '\u{8}').then_some(w[0]))
        .collect();
    for word in ["NAME", "SYNOPSIS", "check-config", "exactly-once"] {
        assert!(plain.contains(word), "rendered page lacks {word}:\n{plain}");
    }
}

/// Every manual page, from `idemrelay man` down through the pages each names under
/// SUBCOMMANDS (`idemrelay-queue(1)`, then `idemrelay-queue-list(1)`): (subcommand path, page).
fn man_pages() -> Vec<(Vec<String>, String)> {
    let mut pages = Vec::new();
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = todo.pop() {
        let page = text(&run_checked(idemrelay().arg("man").args(&path), None).stdout);
        let name = std::iter::once("idemrelay".to_string())
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join("-");
        assert!(
            page.contains(&format!(".TH {name} 1")),
            "{path:?}: not the page of {name}:\n{page}"
        );
        let named = format!("{}\\-", name.replace('-', "\\-"));
        for line in page
            .lines()
            .filter(|l| l.starts_with(&named) && l.ends_with("(1)"))
        {
            let mut next = path.clone();
            next.push(line[named.len()..line.len() - 3].replace("\\-", "-"));
            todo.push(next);
        }
        pages.push((path, page));
    }
    pages
}

/// `idemrelay serve --help` (and every other command's) gives each flag a line of help: in
/// clap's long help a flag's text is on the next line, indented deeper, not straight away its
/// `[env: ...]` or the next flag.
#[test]
fn every_flag_of_every_command_has_help() {
    let mut missing = Vec::new();
    let mut flags_seen = 0;
    let mut commands: Vec<Vec<String>> = man_pages().into_iter().map(|(path, _)| path).collect();
    commands.sort();
    assert!(commands.iter().any(|c| c == &["serve"]), "{commands:?}");
    for command in &commands {
        if command.first().map(String::as_str) == Some("sendmail") {
            // Its --help is sendmail's own (`idemrelay sendmail --help`), not clap's.
            continue;
        }
        let out = run_checked(idemrelay().args(command).arg("--help"), None);
        let help = text(&out.stdout);
        let lines: Vec<&str> = help.lines().collect();
        let indent = |l: &str| l.len() - l.trim_start().len();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            // Flags at 2 or 6 columns; deeper lines are help text (which may quote a flag).
            let is_flag = (1..=6).contains(&indent(line))
                && (trimmed.starts_with("--")
                    || (trimmed.starts_with('-')
                        && trimmed
                            .chars()
                            .nth(1)
                            .is_some_and(|c| c.is_ascii_alphabetic())));
            if !is_flag {
                continue;
            }
            flags_seen += 1;
            let next = lines.get(i + 1).copied().unwrap_or("");
            let has_text = !next.trim().is_empty()
                && !next.trim().starts_with('[')
                && indent(next) > indent(line);
            if !has_text {
                missing.push(format!("idemrelay {} --help: {trimmed}", command.join(" ")));
            }
        }
    }
    assert!(flags_seen > 100, "{flags_seen} flags seen");
    assert!(
        missing.is_empty(),
        "flags without help:\n{}",
        missing.join("\n")
    );
}

/// Every page a page names under SUBCOMMANDS can be had (`idemrelay man queue list`), renders
/// without a groff warning, and `idemrelay man --dir` writes each of them.
#[test]
fn every_man_page_named_can_be_generated_and_renders() {
    let pages = man_pages();
    assert!(pages.len() > 20, "{} pages", pages.len());
    assert!(pages.iter().any(|(path, _)| path == &["queue", "list"]));
    let dir = tempfile::tempdir().unwrap();
    if Command::new("groff").arg("--version").output().is_ok() {
        for (path, page) in &pages {
            let file = dir.path().join("page.1");
            std::fs::write(&file, page).unwrap();
            let out = Command::new("groff")
                .args(["-man", "-Tutf8", "-ww", "-z"])
                .arg(&file)
                .output()
                .unwrap();
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "{path:?}: {}",
                text(&out.stderr)
            );
        }
    } else {
        assert!(std::env::var_os("CI").is_none(), "CI installs groff-base");
        eprintln!("SKIPPED rendering: groff is not installed");
    }
    let all = dir.path().join("man1");
    let out = run_checked(idemrelay().args(["man", "--dir"]).arg(&all), None);
    assert!(
        text(&out.stdout).starts_with("wrote "),
        "{}",
        text(&out.stdout)
    );
    let mut written: Vec<String> = std::fs::read_dir(&all)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    let mut named: Vec<String> = pages
        .iter()
        .map(|(path, _)| {
            let mut name = vec!["idemrelay".to_string()];
            name.extend(path.iter().cloned());
            format!("{}.1", name.join("-"))
        })
        .collect();
    named.sort();
    assert_eq!(written, named);
}

/// build.rs, compiled and run as Cargo runs it, in a fresh git checkout (one commit, refs loose,
/// no packed-refs), outside any checkout, and with IDEMRELAY_GIT_COMMIT: the commit it hands to
/// `--version` in each case, and every file it asks Cargo to watch exists. A watched file that
/// does not exist is stale forever, so each build would rerun the script and recompile the crate.
#[test]
fn the_build_script_names_the_commit_and_watches_only_files_that_exist() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("build-script");
    let out = Command::new("rustc")
        .args(["--edition", "2021", "-o"])
        .arg(&script)
        .arg(manifest.join("build.rs"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));

    // A package directory like the repository's: build.rs and the migrations it lists.
    let package = |at: &Path| {
        std::fs::create_dir_all(at).unwrap();
        std::fs::copy(manifest.join("build.rs"), at.join("build.rs")).unwrap();
        for dialect in ["sqlite", "postgres"] {
            let to = at.join("migrations").join(dialect);
            std::fs::create_dir_all(&to).unwrap();
            for entry in std::fs::read_dir(manifest.join("migrations").join(dialect)).unwrap() {
                let from = entry.unwrap().path();
                std::fs::copy(&from, to.join(from.file_name().unwrap())).unwrap();
            }
        }
    };
    // Runs the script in `at` as Cargo would; (commit, watched paths resolved against `at`).
    let run = |at: &Path, forced: Option<&str>| -> (String, Vec<std::path::PathBuf>) {
        let out_dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(&script);
        cmd.current_dir(at)
            .env("CARGO_MANIFEST_DIR", at)
            .env("OUT_DIR", out_dir.path())
            .env_remove("IDEMRELAY_GIT_COMMIT")
            .env_remove("IDEMRELAY_TEST_POSTGRES")
            .env_remove("GIT_DIR")
            // No checkout above the temporary directory is found (TMPDIR may lie inside one).
            .env("GIT_CEILING_DIRECTORIES", at.parent().unwrap());
        if let Some(commit) = forced {
            cmd.env("IDEMRELAY_GIT_COMMIT", commit);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let commit = stdout
            .lines()
            .find_map(|l| l.strip_prefix("cargo::rustc-env=IDEMRELAY_GIT_COMMIT="))
            .expect(&stdout)
            .to_string();
        let watched = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("cargo::rerun-if-changed="))
            .map(|p| at.join(p))
            .collect();
        (commit, watched)
    };
    let git = |at: &Path, args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .current_dir(at)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    };

    let checkout = dir.path().join("checkout");
    package(&checkout);
    git(&checkout, &["init", "-q"]);
    git(&checkout, &["add", "."]);
    git(&checkout, &["commit", "-qm", "one"]);
    assert!(!checkout.join(".git/packed-refs").exists());
    let head = git(&checkout, &["rev-parse", "--short=12", "HEAD"]);
    let (commit, watched) = run(&checkout, None);
    assert_eq!(commit, head);
    for path in &watched {
        assert!(
            path.exists(),
            "watches {} that does not exist",
            path.display()
        );
    }
    // The files that move with HEAD are among them: a new commit rebuilds with its id.
    let branch = git(&checkout, &["symbolic-ref", "-q", "HEAD"]);
    assert!(
        watched.iter().any(|p| p.ends_with(&branch)),
        "{branch} not watched: {watched:?}"
    );

    let loose = dir.path().join("no-checkout");
    package(&loose);
    let (commit, watched) = run(&loose, None);
    assert_eq!(commit, "unknown");
    for path in &watched {
        assert!(
            path.exists(),
            "watches {} that does not exist",
            path.display()
        );
    }
    let (commit, _) = run(&loose, Some("0123456789ab"));
    assert_eq!(commit, "0123456789ab");
}
