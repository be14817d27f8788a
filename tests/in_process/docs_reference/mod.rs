//! The reference pages in `docs/reference/`, generated from the code, and the check that they
//! are not stale: each test renders one page and compares it with the checked-in file.
//! `IDEMRELAY_UPDATE_DOCS=1` writes the pages instead (see [`REGENERATE`]).
//!
//! The rendering lives here, in the test, rather than in the library: it is needed only to
//! write and check these pages, and the product should not carry Markdown writers. The
//! library exposes only what a test cannot reach otherwise (the metrics registry and the reply
//! constructors are crate-private), in one small module hidden from its docs,
//! `src/docs_reference.rs`: the registry's exposition with every family exercised, and the list
//! of reply constructors.

mod cli;
mod config;
mod metrics;
mod replies;

use std::path::PathBuf;

/// The one command that rewrites every page.
pub const REGENERATE: &str =
    "IDEMRELAY_UPDATE_DOCS=1 cargo test --locked --test in_process docs_reference";

const UPDATE_VARIABLE: &str = "IDEMRELAY_UPDATE_DOCS";

/// The head of every page: its title, then the line that says it is generated and how to
/// regenerate it. The title comes first because MkDocs takes a page's title from a `#`
/// heading only when it is the page's first element.
fn page_head(title: &str, source: &str) -> String {
    format!(
        "# {title}\n\n*Generated from {source} by a test; do not edit by hand. Regenerate with `{REGENERATE}`.*\n"
    )
}

/// Compares `text` with `docs/reference/{page}`, or writes it there when asked to.
fn check(page: &str, text: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/reference");
    let path = dir.join(page);
    let update = std::env::var(UPDATE_VARIABLE).is_ok_and(|v| !v.is_empty() && v != "0");
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current == text {
        return;
    }
    if update {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let first_difference = current
        .lines()
        .zip(text.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| current.lines().count().min(text.lines().count()));
    let line = |t: &str| {
        t.lines()
            .nth(first_difference)
            .unwrap_or("(end of file)")
            .to_string()
    };
    panic!(
        "docs/reference/{page} is stale (or missing): it differs from what the code says from line {} on.\n  in the file: {}\n  generated:   {}\nRegenerate every reference page with:\n  {REGENERATE}\nand commit docs/reference/.",
        first_difference + 1,
        line(&current),
        line(text),
    );
}

/// Markdown-safe prose: `<` and `>` outside code spans would be read as HTML tags (and
/// vanish from the page), so they become entities there.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, part) in text.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        if i % 2 == 1 {
            out.push_str(part);
        } else {
            out.push_str(&part.replace('<', "&lt;").replace('>', "&gt;"));
        }
    }
    out
}

/// A table cell: prose without line breaks, `|` escaped. A code span holding a `|` loses its
/// backticks: GitHub's tables need `\|` even inside code, where MkDocs' Markdown shows the
/// backslash, so only plain text reads the same in both.
fn cell(text: &str) -> String {
    let text = text.replace('\n', " ");
    let mut out = String::with_capacity(text.len());
    let parts: Vec<&str> = text.split('`').collect();
    for (i, part) in parts.iter().enumerate() {
        let is_code = i % 2 == 1 && i + 1 < parts.len();
        if is_code && !part.contains('|') {
            out.push('`');
            out.push_str(part);
            out.push('`');
        } else {
            if i % 2 == 1 && !is_code {
                out.push('`');
            }
            out.push_str(&prose(part).replace('|', "\\|"));
        }
    }
    out
}

/// Inline code for any text: a span fenced with more backticks than the text holds in a row.
fn code(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    if longest == 0 {
        format!("{fence}{text}{fence}")
    } else {
        format!("{fence} {text} {fence}")
    }
}

#[test]
fn prose_escapes_tags_outside_code_only() {
    assert_eq!(
        prose("MAILER-DAEMON@<hostname>, `<id>` and <b>"),
        "MAILER-DAEMON@&lt;hostname&gt;, `<id>` and &lt;b&gt;"
    );
    assert_eq!(code("a`b"), "`` a`b ``");
    assert_eq!(cell("a | b"), "a \\| b");
    assert_eq!(cell("`a | b` and `<c>`"), "a \\| b and `<c>`");
}
