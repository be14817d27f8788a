//! `docs/reference/replies.md`: every SMTP reply line the relay sends, with its code, enhanced
//! status code, text and when it is sent.
//!
//! The lines come from the reply constructors themselves (`idemrelay::docs_reference::reply_catalogue`,
//! which calls each with placeholders such as `<hostname>`); "when" is each constructor's doc
//! comment in `crates/model/src/reply.rs`, read from the source since doc comments do not exist at run
//! time. The checks below keep that honest: every constructor of `Reply` is in the catalogue
//! and has a doc comment, and no reply is built outside `crates/model/src/reply.rs` except the ones listed
//! in [`BUILT_ELSEWHERE`] (a reply built inline elsewhere would be missing from the page).

use std::collections::BTreeSet;
use std::path::Path;

use idemrelay::reply::Reply;

use super::{cell, check, code, page_head};

const REPLY_SOURCE: &str = include_str!("../../../crates/model/src/reply.rs");

/// Replies built outside `crates/model/src/reply.rs`, on purpose: (file, what it builds, when).
const BUILT_ELSEWHERE: &[(&str, &str, &str)] = &[(
    "crates/smtp/src/session/auth.rs",
    "334 <base64 challenge>",
    "During AUTH LOGIN (and AUTH PLAIN without an initial response): the server's challenge, \
         answered by the client with the next base64 line.",
)];

/// Constructors of `Reply` that are not replies the relay sends on their own.
const NOT_REPLIES: &[&str] = &[
    "new",
    "multi",
    "from_line",
    "replayed",
    "line",
    "is_positive",
    "write_to",
    "to_bytes",
];

/// Each `fn` of `impl Reply` that returns `Self`, with its doc comment joined into one line.
fn constructors() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    for line in REPLY_SOURCE.lines() {
        let trimmed = line.trim();
        if let Some(text) = trimmed.strip_prefix("///") {
            doc.push(text.trim());
            continue;
        }
        let signature = trimmed
            .strip_prefix("pub(crate) fn ")
            .or_else(|| trimmed.strip_prefix("pub fn "));
        if let Some(signature) = signature {
            if line.starts_with("    ") && signature.contains("-> Self") {
                let name = signature.split('(').next().unwrap_or_default().to_string();
                if !NOT_REPLIES.contains(&name.as_str()) {
                    out.push((name, doc.join(" ")));
                }
            }
        }
        if !trimmed.starts_with("#[") {
            doc.clear();
        }
    }
    out
}

/// `src/**.rs` and `crates/**.rs` files (the test upstream, `crates/sink`, aside: it is not the
/// relay) that build a reply with `Reply::new` or `Reply::multi`.
fn files_building_replies(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let relative = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if path.is_dir() {
            if relative != "crates/sink" {
                files_building_replies(&path, root, out);
            }
        } else if relative.ends_with(".rs") && relative != "crates/model/src/reply.rs" {
            let text = std::fs::read_to_string(&path).unwrap();
            if text.contains("Reply::new(") || text.contains("Reply::multi(") {
                out.insert(relative);
            }
        }
    }
}

fn enhanced_code(reply: &Reply) -> (String, String) {
    let first = &reply.lines[0];
    let (head, rest) = first.split_once(' ').unwrap_or((first, ""));
    let is_enhanced = head.split('.').count() == 3
        && head
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if is_enhanced {
        let mut lines = vec![rest.to_string()];
        lines.extend(reply.lines[1..].iter().cloned());
        (head.to_string(), lines.join(" / "))
    } else {
        (String::new(), reply.lines.join(" / "))
    }
}

pub fn render() -> String {
    let docs = constructors();
    let mut out = page_head(
        "SMTP replies",
        "the reply constructors in `crates/model/src/reply.rs`",
    );
    out.push('\n');
    out.push_str(&format!(
        "Every reply the relay sends to an SMTP client, in the order of a session: connection, \
         commands, then the end of DATA. Words in angle brackets stand for what the reply \
         carries (`<id>` is the queue id). A multi-line reply shows its lines separated by \
         ` / `. A retry answered from the stored record gets the original line with {} \
         appended. Replies with an `E01xxx` code are the idempotency outcomes described in \
         [the idempotency contract](../concepts/contract.md#what-the-relay-answers-at-the-end-of-data).\n\n",
        code(idemrelay::reply::REPLAY_SUFFIX)
    ));
    out.push_str("| Code | Enhanced | Text | When |\n|---|---|---|---|\n");
    for (name, reply) in idemrelay::docs_reference::reply_catalogue() {
        let when = docs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.as_str())
            .unwrap_or_default();
        let (enhanced, text) = enhanced_code(&reply);
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            reply.code,
            if enhanced.is_empty() {
                String::new()
            } else {
                code(&enhanced)
            },
            code(&text),
            cell(when)
        ));
    }
    for (_, line, when) in BUILT_ELSEWHERE {
        let (code_part, text) = line.split_once(' ').unwrap_or((line, ""));
        out.push_str(&format!(
            "| {code_part} |  | {} | {} |\n",
            code(text),
            cell(when)
        ));
    }
    out
}

#[test]
fn replies_page_is_current() {
    check("replies.md", &render());
}

/// The catalogue names every constructor, each has a "when", and no reply is built elsewhere
/// unlisted: so the page cannot miss a reply.
#[test]
fn every_reply_is_in_the_catalogue_with_a_when() {
    let listed: BTreeSet<&str> = idemrelay::docs_reference::reply_catalogue()
        .iter()
        .map(|(name, _)| *name)
        .collect();
    let constructors = constructors();
    assert!(
        constructors.len() > 40,
        "the source walk found {constructors:?}"
    );
    for (name, doc) in &constructors {
        assert!(
            listed.contains(name.as_str()),
            "Reply::{name} is missing from reply_catalogue() in src/docs_reference.rs"
        );
        assert!(
            !doc.is_empty(),
            "Reply::{name} needs a doc comment saying when it is sent (docs/reference/replies.md shows it)"
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = BTreeSet::new();
    files_building_replies(&root.join("src"), root, &mut found);
    files_building_replies(&root.join("crates"), root, &mut found);
    let allowed: BTreeSet<String> = BUILT_ELSEWHERE
        .iter()
        .map(|(f, _, _)| f.to_string())
        .collect();
    // Also keeps the scan honest: it must find the files listed.
    let gone: Vec<_> = allowed.difference(&found).collect();
    assert!(
        gone.is_empty(),
        "BUILT_ELSEWHERE lists files that build no reply (any more): {gone:?}"
    );
    let unlisted: Vec<_> = found.difference(&allowed).collect();
    assert!(
        unlisted.is_empty(),
        "replies built outside crates/model/src/reply.rs: {unlisted:?}; add a constructor there (and to reply_catalogue() in src/docs_reference.rs) or list them in BUILT_ELSEWHERE"
    );
}
