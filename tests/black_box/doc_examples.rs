//! Examples that cannot rot: every fenced block of the getting started page and the client
//! guides is read from the Markdown and run against the built binary, so a command edited in
//! the docs that no longer works fails the suite. The commands live only in the docs; this
//! file knows the convention (docs/contributing/tests.md, "Examples in the docs"):
//!
//! - An HTML comment on the line before each fence (MkDocs does not render it) says what the
//!   block is: `<!-- example: file NAME -->` (the block is written to NAME),
//!   `<!-- example: run -->` (run with `bash -e` in the session's folder; exit 0),
//!   `<!-- example: run, check output -->` (and every full-line `# ` comment after the first
//!   command is a line the output must show, in order; `run, check output within 10s`: the
//!   block runs again until it does, for a state the docs say is reached soon),
//!   `<!-- example: rerun, check output -->`
//!   (the block is only output: the page's previous run block runs again and must show it),
//!   `<!-- example: run, continuing the previous block -->` (a fragment that belongs at the end
//!   of the previous run block: the two run as one script, once),
//!   `<!-- example: background ADDR... -->` (a long-running command: started, then each
//!   address must accept connections; one holding an address an earlier one holds first stops
//!   that one with SIGINT, as the reader's Ctrl-C), `<!-- example: skip (REASON) -->`.
//!   A block without a marker, an unknown marker or a skip without a reason fails.
//! - `<!-- examples: after PAGE -->` on a page: its examples need PAGE's (the relay it started,
//!   the message it queued), so they run after PAGE's, in the same session.
//! - Queue ids (24 upper-case hex digits) are masked when output is compared, and `...` in an
//!   expected line matches anything. An id the docs show in an expected line stands for the id
//!   the run printed there: later commands get the real one, and a later expected line with
//!   the same docs id must show the same real id (a replay answers with the first id).
//! - Rewrites, the only ones: absolute paths under `/usr/sbin/`, `/etc/` and `/tmp/` go under
//!   the session's folder (`ROOT/usr/sbin` is first on PATH), so `ln -s ... /usr/sbin/sendmail`
//!   works without touching the machine. Ports are the docs' own (2525, 8025, 2526, 8026): no
//!   other test binds them, and a session checks they are free first.
//! - `curl` runs with `--fail-with-body` added (a wrapper first on PATH), so an example whose
//!   URL or body the API refuses fails instead of printing the error and exiting 0.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::process::BIN;

/// The pages whose examples run. Every fenced block in them needs a marker.
const PAGES: &[&str] = &[
    "docs/getting-started.md",
    "docs/operations/api.md",
    "docs/guides/sendmail.md",
    "docs/guides/ci-testing.md",
    "docs/guides/client-retries.md",
];

/// The tools the examples call besides `idemrelay` (CI installs them: .ci/run).
const TOOLS: &[&str] = &["swaks", "curl", "python3", "php"];

/// The ports the docs use: the relay's SMTP and admin defaults, the sink's in the guides.
const DOC_PORTS: [u16; 4] = [2525, 8025, 2526, 8026];

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    File(String),
    Run {
        check_output: bool,
        within: Option<Duration>,
    },
    Rerun,
    /// Runs as the end of the page's previous run block, in the same script.
    Continuing,
    Background(Vec<SocketAddr>),
    Skip,
}

#[derive(Debug, Clone)]
struct Block {
    page: String,
    /// 1-based line of the opening fence, for messages.
    line: usize,
    info: String,
    kind: Kind,
    text: String,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{} (```{})", self.page, self.line, self.info)
    }
}

#[derive(Debug)]
struct Page {
    path: String,
    after: Option<String>,
    blocks: Vec<Block>,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `<!-- example: ... -->` → the words inside, else None.
fn marker<'a>(line: &'a str, word: &str) -> Option<&'a str> {
    let inner = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim();
    Some(inner.strip_prefix(word)?.strip_prefix(':')?.trim())
}

fn parse_kind(spec: &str) -> Result<Kind, String> {
    let (word, rest) = spec.split_once(' ').unwrap_or((spec, ""));
    let rest = rest.trim();
    match word.trim_end_matches(',') {
        "file" if !rest.is_empty() => Ok(Kind::File(rest.to_string())),
        "run" if rest.is_empty() => Ok(Kind::Run {
            check_output: false,
            within: None,
        }),
        "run" if rest == "check output" => Ok(Kind::Run {
            check_output: true,
            within: None,
        }),
        "run" if rest.starts_with("check output within ") && rest.ends_with('s') => rest
            ["check output within ".len()..rest.len() - 1]
            .parse()
            .map(|secs| Kind::Run {
                check_output: true,
                within: Some(Duration::from_secs(secs)),
            })
            .map_err(|e| format!("{spec:?}: {e}")),
        "rerun" if rest == "check output" => Ok(Kind::Rerun),
        "run" if rest == "continuing the previous block" => Ok(Kind::Continuing),
        "background" if !rest.is_empty() => rest
            .split_whitespace()
            .map(|a| a.parse().map_err(|e| format!("address {a:?}: {e}")))
            .collect::<Result<_, _>>()
            .map(Kind::Background),
        "skip" if rest.starts_with('(') && rest.ends_with(')') && rest.len() > 2 => Ok(Kind::Skip),
        _ => Err(format!(
            "unknown example marker {spec:?} (file NAME | run | run, check output [within Ns] | \
             run, continuing the previous block | rerun, check output | background ADDR... | skip (REASON))"
        )),
    }
}

fn parse_page(path: &str) -> Result<Page, String> {
    let text = std::fs::read_to_string(repo().join(path)).map_err(|e| format!("{path}: {e}"))?;
    parse_text(path, &text)
}

fn parse_text(path: &str, text: &str) -> Result<Page, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut page = Page {
        path: path.to_string(),
        after: None,
        blocks: Vec::new(),
    };
    let mut errors = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(after) = marker(lines[i], "examples") {
            match after.strip_prefix("after ") {
                Some(p) => page.after = Some(format!("docs/{}", p.trim())),
                None => errors.push(format!("{path}:{}: unknown page marker", i + 1)),
            }
        }
        let trimmed = lines[i].trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != "```" {
            body.push(lines[i].get(indent..).unwrap_or(lines[i].trim_start()));
            i += 1;
        }
        i += 1;
        let kind = match start
            .checked_sub(1)
            .and_then(|p| marker(lines[p], "example"))
        {
            Some(spec) => parse_kind(spec),
            None => Err("no `<!-- example: ... -->` marker on the line before it".to_string()),
        };
        match kind {
            Ok(kind) => page.blocks.push(Block {
                page: path.to_string(),
                line: start + 1,
                info: info.trim().to_string(),
                kind,
                text: body.join("\n") + "\n",
            }),
            Err(e) => errors.push(format!("{path}:{} (```{}): {e}", start + 1, info.trim())),
        }
    }
    if errors.is_empty() {
        Ok(page)
    } else {
        Err(errors.join("\n"))
    }
}

fn pages() -> Vec<Page> {
    let (pages, errors): (Vec<_>, Vec<_>) =
        PAGES.iter().map(|p| parse_page(p)).partition(Result::is_ok);
    let errors: Vec<String> = errors.into_iter().map(|e| e.unwrap_err()).collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    pages.into_iter().map(Result::unwrap).collect()
}

/// Sessions: a page and, in order, the pages that run after it.
fn sessions(pages: Vec<Page>) -> Vec<Vec<Page>> {
    let mut sessions: Vec<Vec<Page>> = Vec::new();
    for page in pages {
        match &page.after {
            Some(after) => {
                let session = sessions
                    .iter_mut()
                    .find(|s| s.iter().any(|p| &p.path == after))
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: `examples: after {after}` names no page listed before it",
                            page.path
                        )
                    });
                session.push(page);
            }
            None => sessions.push(vec![page]),
        }
    }
    sessions
}

#[test]
fn every_block_carries_a_marker() {
    let pages = pages();
    let blocks: usize = pages.iter().map(|p| p.blocks.len()).sum();
    assert!(
        blocks >= 10,
        "the pages hold {blocks} blocks: are they read?"
    );
    assert!(parse_kind("skip").is_err(), "a skip needs a reason");
    assert!(parse_kind("skip ()").is_err(), "a skip needs a reason");
    assert!(parse_kind("skip (needs network)").is_ok());
    assert!(parse_kind("run, check outptu").is_err());
    assert_eq!(
        parse_kind("run, check output within 10s"),
        Ok(Kind::Run {
            check_output: true,
            within: Some(Duration::from_secs(10))
        })
    );
    let unmarked = parse_text("x.md", "text\n\n```sh\nidemrelay --version\n```\n");
    assert!(
        unmarked.err().unwrap().contains("no `<!-- example"),
        "an unmarked block fails"
    );
    let marked = parse_text(
        "x.md",
        "<!-- example: run -->\n```sh\nidemrelay --version\n```\n",
    );
    assert_eq!(
        marked.unwrap().blocks[0].kind,
        Kind::Run {
            check_output: false,
            within: None
        }
    );
}

/// A queue id: 24 upper-case hex digits, not inside a longer word.
fn ids(line: &str) -> Vec<(usize, &str)> {
    let bytes = line.as_bytes();
    let is_id = |b: u8| b.is_ascii_digit() || (b'A'..=b'F').contains(&b);
    let word = |b: u8| b.is_ascii_alphanumeric();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 24 <= bytes.len() {
        if (i == 0 || !word(bytes[i - 1]))
            && bytes[i..i + 24].iter().all(|&b| is_id(b))
            && bytes.get(i + 24).is_none_or(|&b| !word(b))
        {
            found.push((i, &line[i..i + 24]));
            i += 24;
        } else {
            i += 1;
        }
    }
    found
}

fn mask(line: &str) -> String {
    let mut out = line.to_string();
    for (at, _) in ids(line).into_iter().rev() {
        out.replace_range(at..at + 24, "<ID>");
    }
    out
}

/// `expected` (with `...` as a wildcard) matches all of `actual`, ids masked in both.
fn matches(expected: &str, actual: &str) -> bool {
    let (expected, actual) = (mask(expected.trim()), mask(actual.trim()));
    let parts: Vec<&str> = expected.split("...").collect();
    let mut rest = actual.as_str();
    for (n, part) in parts.iter().enumerate() {
        if n == 0 {
            let Some(r) = rest.strip_prefix(part) else {
                return false;
            };
            rest = r;
        } else if n == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            let Some(at) = rest.find(part) else {
                return false;
            };
            rest = &rest[at + part.len()..];
        }
    }
    rest.is_empty()
}

/// The full-line comments after the block's first command: the output it shows.
fn expected_lines(block: &Block) -> Vec<String> {
    let mut seen_command = block.kind == Kind::Rerun;
    let mut expected = Vec::new();
    for line in block.text.lines() {
        let line = line.trim();
        if let Some(comment) = line.strip_prefix("# ") {
            if seen_command {
                expected.push(comment.to_string());
            }
        } else if !line.is_empty() {
            seen_command = true;
        }
    }
    expected
}

#[test]
fn output_comparison_masks_ids_and_takes_wildcards() {
    let doc = "<-  250 2.0.0 OK queued as 1A2297034CC21CBAB1B81652 (idempotent replay)";
    assert!(matches(
        doc,
        "<-  250 2.0.0 OK queued as 1A23B0C6D2E0F8A9B8C7D6E5 (idempotent replay)"
    ));
    assert!(!matches(
        doc,
        "<-  250 2.0.0 OK queued as 1A23B0C6D2E0F8A9B8C7D6E5"
    ));
    assert!(!matches(
        doc,
        "<-  554 5.6.0 X-Bird-Idempotency-Key already used"
    ));
    assert!(matches(
        r#"{"keys":{"k":{"accepted":1,...}},...}"#,
        r#"{"keys":{"k":{"accepted":1,"x":2}},"y":3}"#
    ));
    assert!(!matches(
        r#"{"keys":{"k":{"accepted":1,...}},...}"#,
        r#"{"keys":{"k":{"accepted":2}}}"#
    ));
}

/// One session: a temp folder, its background processes, the ids learnt so far.
struct Session {
    dir: tempfile::TempDir,
    env_path: String,
    background: Vec<(Vec<SocketAddr>, Child, PathBuf, String)>,
    /// Docs id → the id the run printed in its place.
    ids: HashMap<String, String>,
    /// The page's last run block, for `rerun`.
    last_run: Option<Block>,
}

impl Drop for Session {
    fn drop(&mut self) {
        while let Some((_, child, _, _)) = self.background.pop() {
            stop(child, "KILL");
        }
    }
}

/// Signals the process group (the shell and what it started), then waits for the shell.
fn stop(mut child: Child, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{}", child.id()))
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}

impl Session {
    fn new() -> Session {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["usr/sbin", "etc", "tmp", ".example-bin"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        // curl with --fail-with-body: an HTTP error status fails the block.
        let curl = which("curl").unwrap_or_else(|| "curl".into());
        let wrapper = dir.path().join(".example-bin/curl");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec {} --fail-with-body \"$@\"\n",
                curl.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin_dir = Path::new(BIN).parent().unwrap();
        let env_path = format!(
            "{}:{}:{}:{}",
            dir.path().join(".example-bin").display(),
            dir.path().join("usr/sbin").display(),
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Session {
            dir,
            env_path,
            background: Vec::new(),
            ids: HashMap::new(),
            last_run: None,
        }
    }

    /// The block's text as run: root paths under the session folder, learnt ids replaced.
    fn rewrite(&self, text: &str) -> String {
        let root = self.dir.path().display().to_string();
        let mut out = String::new();
        let mut prev: Option<char> = None;
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let at_word =
                prev.is_none_or(|p| matches!(p, ' ' | '\t' | '\n' | '"' | '\'' | '=' | '('));
            if at_word
                && ["/usr/sbin/", "/etc/", "/tmp/"]
                    .iter()
                    .any(|p| rest.starts_with(p))
            {
                out.push_str(&root);
            }
            out.push(c);
            prev = Some(c);
            rest = &rest[c.len_utf8()..];
        }
        for (doc, real) in &self.ids {
            out = out.replace(doc.as_str(), real);
        }
        out
    }

    fn command(&self, script: &str) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg("-e").arg("-c").arg(script);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("IDEMRELAY_") {
                cmd.env_remove(name);
            }
        }
        // Never the host's own /etc/idemrelay/idemrelay.toml.
        cmd.env("IDEMRELAY_DEFAULT_CONFIG", "")
            .env("PATH", &self.env_path)
            .env("HOME", self.dir.path())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .process_group(0);
        cmd
    }

    fn logs(&self) -> String {
        self.background
            .iter()
            .map(|(_, _, log, at)| {
                format!(
                    "--- background {at}:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            })
            .collect()
    }

    /// `following`: the `continuing` blocks right after this one.
    fn run_block(&mut self, block: &Block, following: &[Block]) {
        match &block.kind {
            Kind::Skip => eprintln!("doc example {} skipped by its marker", block.at()),
            Kind::File(name) => {
                let path = PathBuf::from(self.rewrite(name));
                let path = self.dir.path().join(path);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, self.rewrite(&block.text)).unwrap();
                if block.text.starts_with("#!") {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                        .unwrap();
                }
            }
            Kind::Background(addrs) => self.start(block, addrs),
            Kind::Run {
                check_output,
                within,
            } => {
                let mut script = block.text.clone();
                for next in following {
                    script.push_str(&next.text);
                }
                // `within`: what the reader would see after waiting that long at most (a
                // delivery "within a second"): the block runs again until its output shows it.
                let deadline = Instant::now() + within.unwrap_or_default();
                loop {
                    let output = self.run_script(block, &script);
                    match check_output.then(|| self.check_output(block, &output)) {
                        Some(Err(_)) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(250))
                        }
                        Some(Err(e)) => panic!("{e}"),
                        _ => break,
                    }
                }
                self.last_run = Some(block.clone());
            }
            Kind::Rerun => {
                let previous = self.last_run.clone().unwrap_or_else(|| {
                    panic!(
                        "{}: `rerun` with no run block before it on the page",
                        block.at()
                    )
                });
                let output = self.run_script(block, &previous.text);
                if let Err(e) = self.check_output(block, &output) {
                    panic!("{e}");
                }
            }
            // Ran as the end of the run block before it.
            Kind::Continuing => assert!(
                self.last_run.is_some(),
                "{}: `continuing` with no run block before it on the page",
                block.at()
            ),
        }
    }

    fn run_script(&self, block: &Block, text: &str) -> String {
        let script = self.rewrite(text);
        let out_path = self.dir.path().join(".example-output");
        let out = std::fs::File::create(&out_path).unwrap();
        // Output to a file, not a pipe: a block that leaves a child running must not hold
        // the test on the pipe.
        let mut child = self
            .command(&script)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn bash");
        let deadline = Instant::now() + RUN_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // Whatever the block left behind in its process group goes with it.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = child.wait();
        let output = std::fs::read_to_string(&out_path).unwrap_or_default();
        match status {
            Some(s) if s.success() => output,
            other => panic!(
                "doc example {} failed ({}):\n{script}\n--- its output:\n{output}{}",
                block.at(),
                other.map_or("timed out".to_string(), |s| s.to_string()),
                self.logs()
            ),
        }
    }

    /// Checks the output against the block's `# ` lines; on success learns the ids it shows.
    fn check_output(&mut self, block: &Block, output: &str) -> Result<(), String> {
        let expected = expected_lines(block);
        assert!(
            !expected.is_empty(),
            "{}: `check output` but no `# ` output line after a command",
            block.at()
        );
        let lines: Vec<&str> = output.lines().collect();
        let mut learnt = self.ids.clone();
        let mut from = 0;
        for want in &expected {
            let Some(n) = lines[from..].iter().position(|l| matches(want, l)) else {
                return Err(format!(
                    "doc example {}: the output does not show {want:?} (ids masked, `...` any \
                     text){}:\n{output}",
                    block.at(),
                    if from > 0 {
                        " after the lines before it"
                    } else {
                        ""
                    }
                ));
            };
            let got = lines[from + n];
            for ((_, doc), (_, real)) in ids(want).into_iter().zip(ids(got)) {
                match learnt.get(doc) {
                    Some(known) if known != real => {
                        return Err(format!(
                            "doc example {}: {doc} stands for {known} earlier on the page, but \
                             this output shows {real}:\n{output}",
                            block.at()
                        ))
                    }
                    Some(_) => {}
                    None => {
                        learnt.insert(doc.to_string(), real.to_string());
                    }
                }
            }
            from += n + 1;
        }
        self.ids = learnt;
        Ok(())
    }

    fn start(&mut self, block: &Block, addrs: &[SocketAddr]) {
        // The reader stops what holds the address first (the docs' "Stop the relay").
        while let Some(i) = self
            .background
            .iter()
            .position(|(held, ..)| held.iter().any(|a| addrs.contains(a)))
        {
            let (_, child, _, _) = self.background.remove(i);
            stop(child, "INT");
        }
        let log = self
            .dir
            .path()
            .join(format!(".background-{}.log", block.line));
        let out = std::fs::File::create(&log).unwrap();
        let script = self.rewrite(&block.text);
        let mut child = self
            .command(&format!("exec {}", script.trim()))
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn bash");
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        for addr in addrs {
            while TcpStream::connect_timeout(addr, Duration::from_millis(200)).is_err() {
                let exited = child.try_wait().unwrap();
                if exited.is_some() || Instant::now() > deadline {
                    panic!(
                        "doc example {}: nothing listens on {addr} ({}):\n{script}\n--- its output:\n{}",
                        block.at(),
                        exited.map_or("timed out".to_string(), |s| format!("exited, {s}")),
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.background
            .push((addrs.to_vec(), child, log, block.at()));
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(tool))
            .find(|p| p.is_file())
    })
}

/// Every example of every page, page by page, sessions one after the other (they share the
/// docs' fixed ports).
#[test]
fn the_examples_in_the_docs_run() {
    let sessions = sessions(pages());
    let used = |tool: &str| {
        sessions.iter().flatten().flat_map(|p| &p.blocks).any(|b| {
            b.kind != Kind::Skip
                && b.text
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .any(|w| w == tool)
        })
    };
    let missing: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| used(t) && which(t).is_none())
        .collect();
    if !missing.is_empty() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the docs' examples need {missing:?} under CI"
        );
        eprintln!("SKIPPED the_examples_in_the_docs_run: {missing:?} not installed (apt-get install -y swaks curl php-cli python3)");
        return;
    }
    for pages in sessions {
        let names: Vec<&str> = pages.iter().map(|p| p.path.as_str()).collect();
        // The docs' fixed ports, also those a block binds by itself (the CI guide's job):
        // a relay left running there would answer instead of the example's.
        let declared = pages
            .iter()
            .flat_map(|p| &p.blocks)
            .filter_map(|b| match &b.kind {
                Kind::Background(a) => Some(a.clone()),
                _ => None,
            });
        for addr in declared
            .flatten()
            .chain(DOC_PORTS.map(|p| SocketAddr::from(([127, 0, 0, 1], p))))
        {
            if let Err(e) = TcpListener::bind(addr) {
                panic!("the examples of {names:?} use {addr}, which is taken ({e}): stop what listens there");
            }
        }
        let mut session = Session::new();
        for page in &pages {
            session.last_run = None;
            for (i, block) in page.blocks.iter().enumerate() {
                let rest = &page.blocks[i + 1..];
                let n = rest
                    .iter()
                    .take_while(|b| b.kind == Kind::Continuing)
                    .count();
                session.run_block(block, &rest[..n]);
            }
        }
        eprintln!("doc examples of {names:?}: ran");
        let _ = std::io::stderr().flush();
    }
}
