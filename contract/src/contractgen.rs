//! Writes `docs/openapi.json` and `contract/fixtures/*.json` from the contract types:
//! `cargo run -p asyncd-contract --features openapi --bin contractgen`. `tests/drift.rs`
//! fails when the committed files differ.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let openapi = crate_dir.join("../docs/openapi.json");
    std::fs::write(&openapi, asyncd_contract::openapi::text())?;
    println!("wrote {}", openapi.display());
    let dir = crate_dir.join("fixtures");
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            std::fs::remove_file(path)?;
        }
    }
    for fixture in asyncd_contract::fixtures::all() {
        let path = dir.join(format!("{}.json", fixture.name));
        std::fs::write(&path, fixture.text())?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
