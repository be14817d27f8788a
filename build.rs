//! Two facts the source cannot know by itself (the migrations are the store crate's build step,
//! crates/store/build.rs):
//! - the git commit it was built from (`--version`, the startup log, `idemrelay_build_info`),
//!   from `IDEMRELAY_GIT_COMMIT` when set (the Docker build has no `.git`), else from git;
//! - whether the tests that need Postgres can run: they are compiled as ignored unless
//!   IDEMRELAY_TEST_POSTGRES names a database, so a run without one reports them ignored
//!   instead of passing them (libtest cannot skip at run time).
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(idemrelay_test_postgres)");
    println!("cargo::rerun-if-env-changed=IDEMRELAY_TEST_POSTGRES");
    println!("cargo::rerun-if-env-changed=IDEMRELAY_GIT_COMMIT");
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("IDEMRELAY_TEST_POSTGRES").is_some_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=idemrelay_test_postgres");
    }
    let commit = match std::env::var("IDEMRELAY_GIT_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo::rustc-env=IDEMRELAY_GIT_COMMIT={commit}");
}

/// The short commit of HEAD, with the files that change when HEAD moves registered so that a
/// new commit rebuilds with the new id (and nothing else does).
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for path in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        // Only files that exist: Cargo takes a missing one as changed on every build, so the
        // script would rerun and the crate recompile each time (a checkout whose refs were
        // never packed has no packed-refs). The branch's ref is either loose (watched here) or
        // in packed-refs; packing it deletes the loose file, which reruns the script too.
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo::rerun-if-changed={p}");
            }
        }
    }
    Some(commit)
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}
