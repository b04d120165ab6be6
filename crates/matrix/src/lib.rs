//! The model matrix: which vLLM architectures ferrite knows about and how far each one is engaged.
//!
//! `models/inventory.toml` is the single source of truth: one row per (architecture, category)
//! membership of vLLM's model registry at a recorded commit. Everything else is derived from it:
//! `docs/model-matrix.md` ([`render_markdown`]), the `ferrite matrix` terminal view
//! ([`render_table`]) and the README's supported-models table ([`supported_models_table`],
//! [`splice_readme`]). [`check`] keeps the claims honest against the model registry and the
//! test ids that [`discover_test_ids`] finds in the workspace.

mod check;
mod discover;
mod inventory;
mod render;

pub use check::{check, Problem};
pub use discover::discover_test_ids;
pub use inventory::{load_inventory, parse_inventory, Category, Error, Inventory, Row, Source, State};
pub use render::{
    render_markdown, render_table, splice_readme, supported_models_table, README_END, README_START, REGENERATE,
};
