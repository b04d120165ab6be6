//! The inventory against the code: every claim is backed, no row is dropped, and the committed
//! doc is what the renderer makes of the inventory.

use std::path::{Path, PathBuf};

use ferrite_matrix::{check, discover_test_ids, load_inventory, render_markdown, Inventory, REGENERATE};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn inventory() -> Inventory {
    load_inventory(workspace_root().join("models/inventory.toml")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn inventory_matches_code() {
    let inventory = inventory();
    let registry = ferrite_models::registry::architectures();
    let problems = check(&inventory, &registry, &discover_test_ids(workspace_root()));
    let report: Vec<String> = problems.iter().map(|p| format!("  - {p}")).collect();
    assert!(problems.is_empty(), "models/inventory.toml disagrees with the code:\n{}", report.join("\n"));
}

#[test]
fn rows_match_recorded_upstream_counts() {
    let inventory = inventory();
    assert_eq!(
        inventory.counts(),
        inventory.source.counts,
        "rows per category differ from [source.counts] in models/inventory.toml (counts of vLLM's \
         registry dicts at commit {}): a row was dropped or added without re-inventorying",
        inventory.source.commit
    );
}

#[test]
fn doc_is_current() {
    let path = workspace_root().join("docs/model-matrix.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(committed == render_markdown(&inventory()), "docs/model-matrix.md is stale: run `{REGENERATE}`");
}

/// Writes docs/model-matrix.md without building the CLI:
/// `cargo test -p ferrite-matrix --test consistency -- --ignored write_doc`.
#[test]
#[ignore = "writes docs/model-matrix.md"]
fn write_doc() {
    let path = workspace_root().join("docs/model-matrix.md");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, render_markdown(&inventory())).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
