//! The tests that need Postgres are compiled as ignored unless IDEMRELAY_TEST_POSTGRES names a
//! database, so a run without one reports them ignored instead of passing them (libtest cannot
//! skip at run time). Nothing else depends on it.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(idemrelay_test_postgres)");
    println!("cargo::rerun-if-env-changed=IDEMRELAY_TEST_POSTGRES");
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("IDEMRELAY_TEST_POSTGRES").is_some_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=idemrelay_test_postgres");
    }
}
