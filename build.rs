//! Three facts the source cannot know by itself:
//! - the git commit it was built from (`--version`, the startup log, `idemrelay_build_info`),
//!   from `IDEMRELAY_GIT_COMMIT` when set (the Docker build has no `.git`), else from git;
//! - whether the tests that need Postgres can run: they are compiled as ignored unless
//!   IDEMRELAY_TEST_POSTGRES names a database, so a run without one reports them ignored
//!   instead of passing them (libtest cannot skip at run time);
//! - the migrations of each dialect, listed from migrations/sqlite and migrations/postgres
//!   (`OUT_DIR/migrations.rs`, included by src/store/migrate.rs), so that adding a file is all
//!   a new migration takes. Not `sqlx::migrate!`: it would record descriptions with spaces
//!   for underscores ("daily counts"), unlike the rows existing stores already hold.
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
    migrations();
}

/// Writes `SQLITE` and `POSTGRES`: (version, name, SQL) per file `NNNN_name.sql`, in version
/// order. A misnamed file or a version taken twice stops the build rather than a relay start.
fn migrations() {
    // Read at run time: a build script binary reused from another checkout must list this one.
    let dir =
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
            .join("migrations");
    let mut out = String::new();
    for (konst, dialect) in [("SQLITE", "sqlite"), ("POSTGRES", "postgres")] {
        let path = dir.join(dialect);
        println!("cargo::rerun-if-changed={}", path.display());
        let mut steps = Vec::new();
        for entry in std::fs::read_dir(&path).expect("migrations directory") {
            let file = entry.expect("migrations directory entry").path();
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .expect("UTF-8 file name");
            let Some(stem) = name.strip_suffix(".sql") else {
                continue;
            };
            let (version, description) = stem
                .split_once('_')
                .and_then(|(v, d)| Some((v.parse::<i64>().ok()?, d)))
                .unwrap_or_else(|| panic!("migration {name}: expected NNNN_name.sql"));
            steps.push((version, description.to_owned(), file.clone()));
        }
        steps.sort();
        for pair in steps.windows(2) {
            assert!(
                pair[0].0 != pair[1].0,
                "migration version {} taken twice",
                pair[0].0
            );
        }
        out.push_str(&format!("pub(crate) const {konst}: Steps = &[\n"));
        for (version, description, file) in steps {
            out.push_str(&format!(
                "    ({version}, {description:?}, include_str!({:?})),\n",
                file.display().to_string()
            ));
        }
        out.push_str("];\n");
    }
    let target =
        std::path::Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("migrations.rs");
    std::fs::write(target, out).expect("writing migrations.rs");
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
