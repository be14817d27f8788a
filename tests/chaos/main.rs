//! The chaos test (`chaos`) and the power cuts (`chaos::power_loss`), run against the relay
//! binary built with its crash points: `cargo test --locked --features failpoints --test chaos`
//! (Cargo.toml declares this binary with `required-features = ["failpoints"]`).

#[path = "../common/mod.rs"]
mod common;

mod chaos;
