//! The committed `docs/openapi.json` and `contract/fixtures/*.json` are what the
//! contract types generate: the Go and Python SDK tests and API consumers read them.

use std::path::Path;

const REGENERATE: &str = "cargo run -p asyncd-contract --features openapi --bin contractgen";

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn fixtures_are_current() {
    let dir = crate_dir().join("fixtures");
    let mut committed: Vec<String> = std::fs::read_dir(&dir)
        .expect("contract/fixtures exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    committed.sort();
    let fixtures = asyncd_contract::fixtures::all();
    let generated: Vec<String> = fixtures
        .iter()
        .map(|f| format!("{}.json", f.name))
        .collect();
    assert_eq!(
        committed, generated,
        "contract/fixtures is stale: run\n  {REGENERATE}"
    );
    for fixture in fixtures {
        let path = dir.join(format!("{}.json", fixture.name));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text == fixture.text(),
            "{} is stale: run\n  {REGENERATE}",
            path.display()
        );
    }
}

#[test]
fn openapi_document_is_current() {
    let path = crate_dir().join("../docs/openapi.json");
    let committed = std::fs::read_to_string(&path).expect("docs/openapi.json exists");
    assert!(
        committed == asyncd_contract::openapi::text(),
        "docs/openapi.json is stale: run\n  {REGENERATE}"
    );
}
