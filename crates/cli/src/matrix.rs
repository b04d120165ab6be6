//! `ferrite matrix`: the model matrix (every architecture of vLLM's registry and what backs our
//! claim for it), as a terminal table or as the markdown of docs/model-matrix.md.

use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::Args, Debug)]
pub struct MatrixArgs {
    /// Print docs/model-matrix.md instead of the terminal table.
    #[arg(long)]
    pub markdown: bool,
    /// Print the README's supported-model table.
    #[arg(long, conflicts_with = "markdown")]
    pub readme_table: bool,
    /// The inventory to read.
    #[arg(long, default_value = "models/inventory.toml")]
    pub inventory: PathBuf,
}

pub fn run(args: MatrixArgs) -> Result<()> {
    let inventory = ferrite_matrix::load_inventory(&args.inventory).with_context(|| {
        format!("reading {} (run from the repository root or pass --inventory)", args.inventory.display())
    })?;
    let text = if args.markdown {
        ferrite_matrix::render_markdown(&inventory)
    } else if args.readme_table {
        ferrite_matrix::supported_models_table(&inventory)
    } else {
        ferrite_matrix::render_table(&inventory)
    };
    print!("{text}");
    Ok(())
}
