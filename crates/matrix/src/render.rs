//! Renderings of the inventory: the committed doc, the terminal view and the README table.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::inventory::{Category, Inventory, State};

/// The command that regenerates `docs/model-matrix.md`; the doc and the stale-doc test quote it.
pub const REGENERATE: &str = "ferrite matrix --markdown > docs/model-matrix.md";

/// Marks where [`splice_readme`] puts the supported-models table in `README.md`.
pub const README_START: &str = "<!-- model-table:start -->";
/// Closes the block opened by [`README_START`].
pub const README_END: &str = "<!-- model-table:end -->";

/// The content of `docs/model-matrix.md`.
pub fn render_markdown(inventory: &Inventory) -> String {
    let mut out = String::new();
    header(&mut out, inventory);
    states(&mut out);
    test_ids(&mut out);
    summary(&mut out, inventory);
    engaged_rows(&mut out, inventory);
    not_started(&mut out, inventory);
    provenance(&mut out, inventory);
    out
}

// The section writers below `write!` into a String, which cannot fail; that is the only reason
// their results are discarded.

fn header(out: &mut String, inventory: &Inventory) {
    let source = &inventory.source;
    let _ = writeln!(out, "# Model matrix\n");
    let _ = writeln!(
        out,
        "<!-- Generated from models/inventory.toml by ferrite-matrix; do not edit. Regenerate: `{REGENERATE}` -->\n"
    );
    let _ = writeln!(out, "Every architecture in vLLM's model registry, and how far ferrite has engaged each one.\n");
    let _ = writeln!(
        out,
        "- Upstream: [{repo}]({url}) {version}, commit `{commit}`: `{path}`, with example checkpoints from \
         `{examples}` at the same commit; read {read}.",
        repo = source.repo.trim_start_matches("https://github.com/"),
        url = source.repo,
        version = source.version,
        commit = source.commit,
        path = source.path,
        examples = source.examples_path,
        read = source.read_on,
    );
    let _ = writeln!(
        out,
        "- Source of truth: `models/inventory.toml`, one row per (architecture, category) membership. \
         Regenerate this file with `{REGENERATE}`; the `ferrite-matrix` consistency test fails while it is stale."
    );
    let _ =
        writeln!(out, "- {} rows, {} engaged (past `inventoried`).\n", inventory.rows.len(), inventory.engaged().len());
}

fn provenance(out: &mut String, inventory: &Inventory) {
    let source = &inventory.source;
    let _ = writeln!(out, "## How the inventory was built\n\n{}\n", source.method.trim());
    let _ = writeln!(out, "## Cross-check with the prior inventory\n\n{}", source.crosscheck.trim());
}

fn states(out: &mut String) {
    let _ = writeln!(out, "## States\n");
    let _ = writeln!(out, "| State | Claims | Evidence the consistency test requires |");
    let _ = writeln!(out, "|---|---|---|");
    for state in State::ALL {
        let _ = writeln!(out, "| `{state}` | {} | {} |", state.meaning(), evidence(state));
    }
    let _ = writeln!(out);
}

fn test_ids(out: &mut String) {
    let _ = writeln!(out, "## Test ids\n");
    let _ = writeln!(
        out,
        "A row's `tests` are ids of the form `<package>::<module path>::<fn>`, found by scanning \
         `crates/*/tests/*.rs` and `crates/*/src/**/*.rs` for functions marked `#[test]` or \
         `#[tokio::test]`. The package is the crate's `[package] name`. For an integration test the \
         module path starts with the file stem: `fn llama` in `crates/models/tests/parity.rs` is \
         `ferrite-models::parity::llama`. For a unit test it is the module path inside the crate, inline \
         modules included: `fn lists_llama` in `mod tests` of `crates/models/src/registry.rs` is \
         `ferrite-models::registry::tests::lists_llama`. Tests that a `macro_rules!` macro in the same \
         file generates from `ident` arguments count as well: `parity! {{ llama => \"llama\" }}` defines \
         `llama`.\n"
    );
}

fn summary(out: &mut String, inventory: &Inventory) {
    let counts = counts_by_category_and_state(inventory);
    let _ = writeln!(out, "## Summary\n");
    let mut header = String::from("| Category | vLLM dict |");
    let mut rule = String::from("|---|---|");
    for state in State::ALL {
        let _ = write!(header, " {state} |");
        rule.push_str("---:|");
    }
    let _ = writeln!(out, "{header} total |\n{rule}---:|");
    for category in Category::ALL {
        let _ = write!(out, "| {category} | `{}` |", category.upstream_dict());
        for state in State::ALL {
            let _ = write!(out, " {} |", counts.get(&(category, state)).unwrap_or(&0));
        }
        let _ = writeln!(out, " {} |", inventory.rows.iter().filter(|r| r.category == category).count());
    }
    let _ = write!(out, "| **total** | |");
    for state in State::ALL {
        let _ = write!(out, " {} |", inventory.rows.iter().filter(|r| r.state == state).count());
    }
    let _ = writeln!(out, " {} |\n", inventory.rows.len());
}

fn engaged_rows(out: &mut String, inventory: &Inventory) {
    let _ = writeln!(out, "## Engaged rows\n");
    let engaged = inventory.engaged();
    if engaged.is_empty() {
        let _ = writeln!(out, "None yet.\n");
        return;
    }
    let _ =
        writeln!(out, "| Architecture | Category | Family | State | Tests | Quantized formats | Example checkpoint |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for row in &engaged {
        let tests = if row.tests.is_empty() {
            "none".to_string()
        } else {
            row.tests.iter().map(|t| format!("`{}`", cell(t))).collect::<Vec<_>>().join("<br>")
        };
        let quantized = if row.quantized.is_empty() {
            "-".to_string()
        } else {
            row.quantized
                .iter()
                .map(|q| {
                    let tests = q.tests.iter().map(|t| format!("`{}`", cell(t))).collect::<Vec<_>>().join(", ");
                    format!("{} ({tests})", cell(&q.format))
                })
                .collect::<Vec<_>>()
                .join("<br>")
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | `{}` | `{}` | {} | {} | {} |",
            cell(&row.architecture),
            row.category,
            cell(&row.family),
            row.state,
            tests,
            quantized,
            checkpoint_link(&row.example_checkpoint),
        );
    }
    let _ = writeln!(out);
}

fn not_started(out: &mut String, inventory: &Inventory) {
    let _ = writeln!(out, "## Not started\n");
    let _ = writeln!(out, "The `inventoried` rows, per category and family (the vLLM module).\n");
    for category in Category::ALL {
        let mut by_family: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for row in inventory.rows.iter().filter(|r| r.category == category && r.state == State::Inventoried) {
            by_family.entry(&row.family).or_default().push(&row.architecture);
        }
        if by_family.is_empty() {
            continue;
        }
        let total: usize = by_family.values().map(Vec::len).sum();
        let _ = writeln!(
            out,
            "### {category} ({}, {})\n",
            plural(total, "row", "rows"),
            plural(by_family.len(), "family", "families")
        );
        let _ = writeln!(out, "| Family | Rows | Architectures |");
        let _ = writeln!(out, "|---|---:|---|");
        // Case-blind so that `AXK1` sorts among the a's, where a reader looks for it.
        let mut families: Vec<(&str, Vec<&str>)> = by_family.into_iter().collect();
        families.sort_by_cached_key(|(family, _)| (family.to_lowercase(), family.to_string()));
        for (family, mut architectures) in families {
            architectures.sort_by_cached_key(|a| (a.to_lowercase(), a.to_string()));
            let _ =
                writeln!(out, "| `{}` | {} | {} |", cell(family), architectures.len(), cell(&architectures.join(", ")));
        }
        let _ = writeln!(out);
    }
}

/// The terminal view printed by `ferrite matrix`: counts per category and state, then the
/// engaged rows. The long inventoried tail is left to the doc.
pub fn render_table(inventory: &Inventory) -> String {
    let source = &inventory.source;
    let engaged = inventory.engaged();
    let mut out = format!(
        "vLLM {} ({}), read {}: {} rows, {} engaged\n\n",
        source.version,
        source.commit,
        source.read_on,
        inventory.rows.len(),
        engaged.len()
    );
    let counts = counts_by_category_and_state(inventory);
    let mut summary = vec![std::iter::once("CATEGORY".to_string())
        .chain(State::ALL.iter().map(|s| s.as_str().to_uppercase()))
        .chain(std::iter::once("TOTAL".to_string()))
        .collect::<Vec<_>>()];
    for category in Category::ALL {
        let mut line = vec![category.to_string()];
        line.extend(State::ALL.iter().map(|&s| counts.get(&(category, s)).unwrap_or(&0).to_string()));
        line.push(inventory.rows.iter().filter(|r| r.category == category).count().to_string());
        summary.push(line);
    }
    let mut total = vec!["total".to_string()];
    total.extend(State::ALL.iter().map(|&s| inventory.rows.iter().filter(|r| r.state == s).count().to_string()));
    total.push(inventory.rows.len().to_string());
    summary.push(total);
    out.push_str(&aligned(&summary, 1));

    if !engaged.is_empty() {
        out.push('\n');
        let mut rows = vec![["ARCHITECTURE", "CATEGORY", "STATE", "TESTS", "EXAMPLE"].map(String::from).to_vec()];
        for row in engaged {
            rows.push(vec![
                row.architecture.clone(),
                row.category.to_string(),
                row.state.to_string(),
                if row.tests.is_empty() { "-".to_string() } else { row.tests.join(", ") },
                if row.example_checkpoint.is_empty() { "-".to_string() } else { row.example_checkpoint.clone() },
            ]);
        }
        out.push_str(&aligned(&rows, usize::MAX));
    }
    out
}

/// A compact markdown table of the engaged rows, for `README.md` (see [`splice_readme`]).
pub fn supported_models_table(inventory: &Inventory) -> String {
    let engaged = inventory.engaged();
    let mut out = String::from("| Architecture | Category | State | Example checkpoint |\n|---|---|---|---|\n");
    for row in &engaged {
        let _ = writeln!(
            out,
            "| `{}` | {} | `{}` | {} |",
            cell(&row.architecture),
            row.category,
            row.state,
            checkpoint_link(&row.example_checkpoint)
        );
    }
    let _ = writeln!(
        out,
        "\n{} of the {} rows of vLLM {}'s model registry are engaged; the full matrix is in \
         [docs/model-matrix.md](docs/model-matrix.md).",
        engaged.len(),
        inventory.rows.len(),
        inventory.source.version
    );
    out
}

/// Replaces whatever sits between [`README_START`] and [`README_END`] in `readme` with `table`.
/// Without both markers (in that order) the marked block is appended, so the result always
/// holds the table exactly once and splicing again is idempotent.
pub fn splice_readme(readme: &str, table: &str) -> String {
    let block = format!("{README_START}\n{}\n{README_END}", table.trim_end());
    if let Some(start) = readme.find(README_START) {
        if let Some(end) = readme[start..].find(README_END).map(|e| start + e + README_END.len()) {
            return format!("{}{block}{}", &readme[..start], &readme[end..]);
        }
    }
    let mut out = readme.trim_end().to_string();
    if !out.is_empty() {
        out.push_str("\n\n");
    }
    out.push_str(&block);
    out.push('\n');
    out
}

fn evidence(state: State) -> &'static str {
    match state {
        State::Inventoried => "none",
        State::Implemented => "the architecture is in `ferrite_models::registry::architectures()`",
        State::GatedCpu | State::GatedCuda | State::Benchmarked => {
            "the constructor, and a non-empty `tests` list whose ids all exist"
        }
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn counts_by_category_and_state(inventory: &Inventory) -> BTreeMap<(Category, State), usize> {
    let mut counts = BTreeMap::new();
    for row in &inventory.rows {
        *counts.entry((row.category, row.state)).or_insert(0) += 1;
    }
    counts
}

fn checkpoint_link(checkpoint: &str) -> String {
    if checkpoint.is_empty() {
        "none".to_string()
    } else {
        format!("[{0}](https://huggingface.co/{0})", cell(checkpoint))
    }
}

/// Keeps a value from splitting a markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// Left-aligns columns before `numeric_from` and right-aligns the rest, two spaces apart.
fn aligned(rows: &[Vec<String>], numeric_from: usize) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|v| v.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, value) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            if c >= numeric_from {
                let _ = write!(line, "{value:>width$}", width = widths[c]);
            } else {
                let _ = write!(line, "{value:<width$}", width = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::testing::{inventory, row};
    use crate::inventory::Category::*;
    use crate::inventory::State::*;

    fn sample() -> Inventory {
        inventory(vec![
            row("Qwen2ForCausalLM", TextGeneration, "qwen2", GatedCpu, &["ferrite-models::parity::qwen2"]),
            row("LlamaForCausalLM", TextGeneration, "llama", Implemented, &[]),
            row("LlamaForCausalLM", Embedding, "llama", Inventoried, &[]),
            row("AquilaForCausalLM", TextGeneration, "llama", Inventoried, &[]),
            row("GPT2LMHeadModel", TextGeneration, "gpt2", Inventoried, &[]),
        ])
    }

    #[test]
    fn markdown_has_summary_engaged_rows_and_tail() {
        let doc = render_markdown(&sample());
        assert!(doc.starts_with("# Model matrix\n"));
        assert!(doc.contains("commit `abc1234`"));
        assert!(doc.contains(REGENERATE));
        assert!(doc.contains("| text-generation | `_TEXT_GENERATION_MODELS` | 2 | 1 | 1 | 0 | 0 | 4 |"), "{doc}");
        assert!(doc.contains("| **total** | | 3 | 1 | 1 | 0 | 0 | 5 |"), "{doc}");
        // Engaged rows are ordered by category, then name, whatever the file order.
        let llama = doc.find("| `LlamaForCausalLM` | text-generation | `llama` | `implemented` | none |").unwrap();
        let qwen = doc
            .find("| `Qwen2ForCausalLM` | text-generation | `qwen2` | `gated-cpu` | `ferrite-models::parity::qwen2` |")
            .unwrap();
        assert!(llama < qwen);
        assert!(doc.contains("### text-generation (2 rows, 2 families)"));
        assert!(doc.contains("| `llama` | 1 | AquilaForCausalLM |"));
        assert!(doc.contains("### embedding (1 row, 1 family)"));
        assert!(doc.ends_with("Compared with the reference.\n"));
    }

    #[test]
    fn markdown_is_deterministic_in_row_order() {
        let mut reversed = sample();
        reversed.rows.reverse();
        assert_eq!(render_markdown(&sample()), render_markdown(&reversed));
    }

    #[test]
    fn terminal_table_aligns_counts() {
        let table = render_table(&sample());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "vLLM v0.0.0 (abc1234), read 2026-01-01: 5 rows, 2 engaged");
        let header = lines.iter().find(|l| l.starts_with("CATEGORY")).unwrap();
        let text = lines.iter().find(|l| l.starts_with("text-generation")).unwrap();
        assert_eq!(header.len(), text.len(), "counts are right-aligned under their headers");
        assert!(text.ends_with("  4"));
        assert!(
            table.contains("Qwen2ForCausalLM  text-generation  gated-cpu    ferrite-models::parity::qwen2"),
            "{table}"
        );
    }

    #[test]
    fn readme_table_lists_engaged_rows_only() {
        let table = supported_models_table(&sample());
        assert!(table.contains("| `LlamaForCausalLM` | text-generation | `implemented` | [org/LlamaForCausalLM](https://huggingface.co/org/LlamaForCausalLM) |"));
        assert!(!table.contains("GPT2LMHeadModel"));
        assert!(table.contains("2 of the 5 rows"));
    }

    #[test]
    fn splice_replaces_between_markers_and_is_idempotent() {
        let readme = format!("# ferrite\n\n{README_START}\nold\n{README_END}\n\nMore.\n");
        let once = splice_readme(&readme, "| new |\n");
        assert_eq!(once, format!("# ferrite\n\n{README_START}\n| new |\n{README_END}\n\nMore.\n"));
        assert_eq!(splice_readme(&once, "| new |\n"), once);
    }

    #[test]
    fn splice_appends_when_markers_are_missing() {
        let once = splice_readme("# ferrite\n", "| t |");
        assert_eq!(once, format!("# ferrite\n\n{README_START}\n| t |\n{README_END}\n"));
        assert_eq!(splice_readme(&once, "| t |"), once);
        // An end marker before the start marker does not count as a pair.
        let backwards = format!("{README_END}\n{README_START}\n");
        assert_eq!(splice_readme(&backwards, "| t |").matches(README_START).count(), 2);
    }
}
