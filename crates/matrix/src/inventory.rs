//! The inventory file's schema and loader.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The vLLM registry dict a row was inventoried from. One variant per dict merged into
/// `_VLLM_MODELS`, so per-category counts can be compared with upstream one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    TextGeneration,
    Embedding,
    LateInteraction,
    Reward,
    TokenClassification,
    SequenceClassification,
    Multimodal,
    Speculative,
    TransformersSupported,
    TransformersBackend,
}

impl Category {
    /// In upstream declaration order, which is also the order every rendering uses.
    pub const ALL: [Category; 10] = [
        Category::TextGeneration,
        Category::Embedding,
        Category::LateInteraction,
        Category::Reward,
        Category::TokenClassification,
        Category::SequenceClassification,
        Category::Multimodal,
        Category::Speculative,
        Category::TransformersSupported,
        Category::TransformersBackend,
    ];

    /// The spelling used in `inventory.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::TextGeneration => "text-generation",
            Category::Embedding => "embedding",
            Category::LateInteraction => "late-interaction",
            Category::Reward => "reward",
            Category::TokenClassification => "token-classification",
            Category::SequenceClassification => "sequence-classification",
            Category::Multimodal => "multimodal",
            Category::Speculative => "speculative",
            Category::TransformersSupported => "transformers-supported",
            Category::TransformersBackend => "transformers-backend",
        }
    }

    /// The dict in `vllm/model_executor/models/registry.py` that this category mirrors.
    pub fn upstream_dict(self) -> &'static str {
        match self {
            Category::TextGeneration => "_TEXT_GENERATION_MODELS",
            Category::Embedding => "_EMBEDDING_MODELS",
            Category::LateInteraction => "_LATE_INTERACTION_MODELS",
            Category::Reward => "_REWARD_MODELS",
            Category::TokenClassification => "_TOKEN_CLASSIFICATION_MODELS",
            Category::SequenceClassification => "_SEQUENCE_CLASSIFICATION_MODELS",
            Category::Multimodal => "_MULTIMODAL_MODELS",
            Category::Speculative => "_SPECULATIVE_DECODING_MODELS",
            Category::TransformersSupported => "_TRANSFORMERS_SUPPORTED_MODELS",
            Category::TransformersBackend => "_TRANSFORMERS_BACKEND_MODELS",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far a row is engaged. The order is meaningful: each state claims everything the
/// previous ones do, which is how [`crate::check`] decides what evidence a row owes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Known upstream, nothing done here.
    Inventoried,
    /// A constructor is registered in `ferrite-models`; no parity test backs it yet.
    Implemented,
    /// Token-exact against Hugging Face transformers in a CPU test.
    GatedCpu,
    /// Token-exact in a CUDA test as well.
    GatedCuda,
    /// Gated, with a recorded throughput comparison against vLLM.
    Benchmarked,
}

impl State {
    /// In ascending order of claim.
    pub const ALL: [State; 5] =
        [State::Inventoried, State::Implemented, State::GatedCpu, State::GatedCuda, State::Benchmarked];

    /// The spelling used in `inventory.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Inventoried => "inventoried",
            State::Implemented => "implemented",
            State::GatedCpu => "gated-cpu",
            State::GatedCuda => "gated-cuda",
            State::Benchmarked => "benchmarked",
        }
    }

    /// What the state claims, for the documentation's legend.
    pub fn meaning(self) -> &'static str {
        match self {
            State::Inventoried => "known upstream, not started",
            State::Implemented => "a constructor is registered in `ferrite-models`; no parity test yet",
            State::GatedCpu => "token-exact against Hugging Face transformers in a CPU test",
            State::GatedCuda => "token-exact in a CUDA test as well",
            State::Benchmarked => "gated, with a recorded throughput comparison against vLLM",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the inventory was read from (the `[source]` table).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Upstream repository URL.
    pub repo: String,
    /// Upstream release the files were read at.
    pub version: String,
    /// Upstream commit the files were read at (possibly abbreviated).
    pub commit: String,
    /// The registry file inventoried.
    pub path: String,
    /// The file the example checkpoints come from, at the same commit.
    pub examples_path: String,
    /// Date the files were read, `YYYY-MM-DD`.
    pub read_on: String,
    /// How the rows were derived (markdown, rendered into the doc).
    pub method: String,
    /// How the counts compare with the prior inventory (markdown, rendered into the doc).
    pub crosscheck: String,
    /// Entries per registry dict at `commit`, recorded independently of the rows so that a
    /// dropped or duplicated row shows up as a count mismatch.
    pub counts: BTreeMap<Category, usize>,
}

/// One (architecture, category) membership (a `[[model]]` table).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// The `architectures` string of a Hugging Face `config.json`.
    pub architecture: String,
    pub category: Category,
    /// Grouping key for the documentation: the vLLM module that implements the row.
    pub family: String,
    /// Module as the upstream registry names it (bare names live in `vllm/model_executor/models/`).
    pub upstream_module: String,
    /// Class that upstream constructs for this architecture.
    pub upstream_class: String,
    /// Hub id of a checkpoint to test with; empty when upstream names none.
    #[serde(default)]
    pub example_checkpoint: String,
    pub state: State,
    /// Test ids backing the state, in the format [`crate::discover_test_ids`] produces.
    #[serde(default)]
    pub tests: Vec<String>,
    #[serde(default)]
    pub notes: String,
    /// Quantized checkpoint formats the architecture is gated with, each backed by its own tests.
    #[serde(default)]
    pub quantized: Vec<QuantizedGate>,
}

/// One quantized checkpoint format of a row (`quantized = [{ format = "...", tests = [...] }]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantizedGate {
    /// The format as a user knows it: the tool or method and the scheme
    /// (`compressed-tensors FP8_DYNAMIC`, `fp8 block 128x128`).
    pub format: String,
    pub tests: Vec<String>,
}

/// The whole inventory file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    pub source: Source,
    pub rows: Vec<Row>,
}

impl Inventory {
    /// Rows per category, for comparison with [`Source::counts`].
    pub fn counts(&self) -> BTreeMap<Category, usize> {
        let mut counts = BTreeMap::new();
        for row in &self.rows {
            *counts.entry(row.category).or_insert(0) += 1;
        }
        counts
    }

    /// Rows past `inventoried`, in rendering order.
    pub fn engaged(&self) -> Vec<&Row> {
        let mut rows: Vec<&Row> = self.rows.iter().filter(|r| r.state > State::Inventoried).collect();
        rows.sort_by(|a, b| (a.category, &a.architecture).cmp(&(b.category, &b.architecture)));
        rows
    }
}

/// The file's literal shape: rows live under the `[[model]]` key.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    source: Source,
    #[serde(default)]
    model: Vec<Row>,
}

/// Why an inventory could not be loaded. Both variants name the file; parse errors also carry
/// the line, column and key that toml reports.
#[derive(Debug)]
pub enum Error {
    Read { path: PathBuf, source: std::io::Error },
    Parse { path: PathBuf, source: toml::de::Error },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read { path, source } => write!(f, "{}: cannot read: {source}", path.display()),
            Error::Parse { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Read { source, .. } => Some(source),
            Error::Parse { source, .. } => Some(source),
        }
    }
}

/// Reads and parses an inventory file.
///
/// # Errors
/// [`Error::Read`] when the file cannot be read, [`Error::Parse`] when it is not a valid inventory.
pub fn load_inventory(path: impl AsRef<Path>) -> Result<Inventory, Error> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.to_path_buf(), source })?;
    parse_inventory(&text, path)
}

/// Parses inventory text; `path` only labels errors.
///
/// # Errors
/// [`Error::Parse`] when the text is not a valid inventory.
pub fn parse_inventory(text: &str, path: impl AsRef<Path>) -> Result<Inventory, Error> {
    let file: File =
        toml::from_str(text).map_err(|source| Error::Parse { path: path.as_ref().to_path_buf(), source })?;
    Ok(Inventory { source: file.source, rows: file.model })
}

/// Builders for the other modules' tests, which care about rows rather than TOML.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    pub(crate) fn source() -> Source {
        Source {
            repo: "https://github.com/vllm-project/vllm".into(),
            version: "v0.0.0".into(),
            commit: "abc1234".into(),
            path: "vllm/model_executor/models/registry.py".into(),
            examples_path: "tests/models/registry.py".into(),
            read_on: "2026-01-01".into(),
            method: "Parsed the dicts.".into(),
            crosscheck: "Compared with the reference.".into(),
            counts: BTreeMap::new(),
        }
    }

    pub(crate) fn row(architecture: &str, category: Category, family: &str, state: State, tests: &[&str]) -> Row {
        Row {
            architecture: architecture.into(),
            category,
            family: family.into(),
            upstream_module: family.into(),
            upstream_class: architecture.into(),
            example_checkpoint: format!("org/{architecture}"),
            state,
            tests: tests.iter().map(ToString::to_string).collect(),
            notes: String::new(),
            quantized: Vec::new(),
        }
    }

    pub(crate) fn inventory(rows: Vec<Row>) -> Inventory {
        let mut source = source();
        source.counts = Inventory { source: source.clone(), rows: rows.clone() }.counts();
        Inventory { source, rows }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = r#"
[source]
repo = "https://github.com/vllm-project/vllm"
version = "v0.0.0"
commit = "abc1234"
path = "vllm/model_executor/models/registry.py"
examples_path = "tests/models/registry.py"
read_on = "2026-01-01"
method = "parsed"
crosscheck = "compared"

[source.counts]
text-generation = 1
"#;

    #[test]
    fn parses_rows_and_defaults() {
        let text = format!(
            "{SOURCE}\n[[model]]\narchitecture = \"LlamaForCausalLM\"\ncategory = \"text-generation\"\n\
             family = \"llama\"\nupstream_module = \"llama\"\nupstream_class = \"LlamaForCausalLM\"\n\
             state = \"implemented\"\n"
        );
        let inv = parse_inventory(&text, "inventory.toml").unwrap();
        assert_eq!(inv.rows.len(), 1);
        let row = &inv.rows[0];
        assert_eq!(row.category, Category::TextGeneration);
        assert_eq!(row.state, State::Implemented);
        assert!(row.tests.is_empty() && row.notes.is_empty() && row.example_checkpoint.is_empty());
        assert_eq!(inv.source.counts[&Category::TextGeneration], 1);
        assert_eq!(inv.counts(), inv.source.counts);
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let text = format!(
            "{SOURCE}\n[[model]]\narchitecture = \"X\"\ncategory = \"text-generation\"\nfamily = \"x\"\n\
             upstream_module = \"x\"\nupstream_class = \"X\"\nstate = \"shipped\"\n"
        );
        let err = parse_inventory(&text, "models/inventory.toml").unwrap_err().to_string();
        assert!(err.starts_with("models/inventory.toml: "), "{err}");
        assert!(err.contains("shipped") && err.contains("state"), "{err}");

        let text = SOURCE.replace("text-generation = 1", "text-gen = 1");
        let err = parse_inventory(&text, "inv.toml").unwrap_err().to_string();
        assert!(err.contains("text-gen") && err.contains("text-generation"), "{err}");

        let text = format!("{SOURCE}\n[[model]]\narchitecture = \"X\"\ncategory = \"embedding\"\n");
        let err = parse_inventory(&text, "inv.toml").unwrap_err().to_string();
        assert!(err.contains("missing field `family`"), "{err}");
    }

    #[test]
    fn unreadable_file_names_the_path() {
        let err = load_inventory("/nonexistent/inventory.toml").unwrap_err().to_string();
        assert!(err.starts_with("/nonexistent/inventory.toml: cannot read"), "{err}");
    }

    #[test]
    fn states_order_by_claim() {
        assert!(State::ALL.windows(2).all(|w| w[0] < w[1]));
        assert!(Category::ALL.windows(2).all(|w| w[0] < w[1]));
    }
}
