//! Gemma 4's per-layer inputs (PLE): a second token embedding, packed as `[vocab, layers * width]`,
//! mixed with a projection of the scaled input embedding, hands layer `i` its own `width`-wide
//! signal; after the layer's MLP residual, a gated branch projects that signal into the stream.

use ferrite_tensor::{ops, Activation, Tensor};

use crate::layers::{Linear, RmsNorm};
use crate::Result;

#[derive(Debug, Clone)]
pub struct PerLayerInputs {
    /// `embed_tokens_per_layer`, `[vocab, layers * width]`: layer `i` reads columns
    /// `i * width ..` of a token's row.
    pub table: Tensor,
    pub width: usize,
    /// `sqrt(width)` in the table's dtype.
    pub table_scale: f32,
    /// `per_layer_model_projection`, one `[width, hidden]` block of rows per layer.
    pub projections: Vec<Linear>,
    /// `hidden^-0.5`, applied to the projection before its norm.
    pub projection_scale: f32,
    /// `per_layer_projection_norm`, over `width`.
    pub projection_norm: RmsNorm,
    /// `2^-0.5`, applied to the sum of the projection and the embedding.
    pub combine_scale: f32,
    pub branches: Vec<PerLayerBranch>,
}

/// `h + norm(projection(act(gate(h)) * input))`.
#[derive(Debug, Clone)]
pub struct PerLayerBranch {
    pub gate: Linear,
    pub act: Activation,
    pub projection: Linear,
    pub norm: RmsNorm,
}

impl PerLayerInputs {
    /// The step's packed rows of the table, scaled: `[tokens, layers * width]`. Looked up by
    /// the step's own token ids, so a CUDA graph replays the lookup.
    pub fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        Ok(ops::scale(&ops::embedding(&self.table, tokens)?, self.table_scale)?)
    }

    /// Layer `layer`'s input from the packed rows `packed` ([`PerLayerInputs::embed`]) and the
    /// scaled token embeddings `embeds`: `(norm(projection(embeds) * s) + packed slice) * c`,
    /// transformers' `project_per_layer_inputs` restricted to one slice (every op is per element
    /// or per `width`-wide row, so the slice is the same bits).
    pub fn input(&self, layer: usize, packed: &Tensor, embeds: &Tensor) -> Result<Tensor> {
        let projected = ops::scale(&self.projections[layer].forward(embeds)?, self.projection_scale)?;
        let projected = self.projection_norm.forward(&projected)?;
        let embedded = ops::narrow_cols(packed, layer * self.width, self.width)?;
        Ok(ops::scale(&ops::add(&projected, &embedded)?, self.combine_scale)?)
    }

    /// The stream `h` after layer `layer`'s branch.
    pub fn apply(&self, layer: usize, h: &Tensor, input: &Tensor) -> Result<Tensor> {
        let b = &self.branches[layer];
        let gated = ops::act_mul(&b.gate.forward(h)?, input, b.act)?;
        let out = b.norm.forward(&b.projection.forward(&gated)?)?;
        Ok(ops::add(h, &out)?)
    }

    pub fn weight_bytes(&self) -> usize {
        let linears = self.projections.iter().chain(self.branches.iter().flat_map(|b| [&b.gate, &b.projection]));
        self.table.size_in_bytes() + linears.map(|l| l.weight.size_in_bytes()).sum::<usize>()
    }
}
