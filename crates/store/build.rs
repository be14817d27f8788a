//! The store's build step: the migrations of each dialect, listed from the workspace's
//! migrations/sqlite and migrations/postgres (`OUT_DIR/migrations.rs`, included by
//! src/migrate.rs), so that adding a file is all a new migration takes. Not `sqlx::migrate!`: it would record descriptions
//! with spaces for underscores ("daily counts"), unlike the rows existing stores already hold.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    migrations();
}

/// Writes `SQLITE` and `POSTGRES`: (version, name, SQL) per file `NNNN_name.sql`, in version
/// order. A misnamed file or a version taken twice stops the build rather than a relay start.
fn migrations() {
    // Read at run time: a build script binary reused from another checkout must list this one.
    // At the top of the workspace, where operators and the project's card expect them.
    let dir =
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
            .join("../../migrations");
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
