//! Gemma 3n's and Gemma 4's per-layer inputs (PLE): a second token embedding, packed as
//! `[vocab, layers * width]`, mixed with a projection of the scaled input embedding, hands layer
//! `i` its own `width`-wide signal; after the layer's MLP residual, a gated branch projects that
//! signal into the stream (Gemma 3n: into every AltUp copy of the stream but the first).

use ferrite_tensor::{ops, Activation, Tensor};

use super::scalar_in_dtype;
use crate::layers::{Linear, RmsNorm};
use crate::loading::weights::Scope;
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
    /// The tensors under `model` (`model`, or `model.language_model` in a multimodal checkpoint):
    /// `embed_tokens_per_layer [vocab, layers * width]`, `per_layer_model_projection`,
    /// `per_layer_projection_norm`, and each layer's `per_layer_input_gate`,
    /// `per_layer_projection` and `post_per_layer_input_norm`.
    pub fn load(
        model: &Scope,
        layers: usize,
        hidden: usize,
        width: usize,
        vocab: usize,
        act: Activation,
        eps: f64,
    ) -> Result<PerLayerInputs> {
        let table = model.get("embed_tokens_per_layer.weight", &[vocab, layers * width])?;
        let projection = model.linear("per_layer_model_projection", hidden, layers * width, false)?;
        let branches = (0..layers)
            .map(|i| {
                let l = model.at(&format!("layers.{i}"));
                Ok(PerLayerBranch {
                    gate: l.linear("per_layer_input_gate", hidden, width, false)?,
                    act,
                    projection: l.linear("per_layer_projection", width, hidden, false)?,
                    norm: l.rms("post_per_layer_input_norm", hidden, eps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PerLayerInputs {
            table_scale: scalar_in_dtype((width as f64).sqrt(), table.dtype()),
            table,
            width,
            projections: projection.split_rows(&vec![width; layers])?,
            projection_scale: (hidden as f64).powf(-0.5) as f32,
            projection_norm: model.rms("per_layer_projection_norm", width, eps)?,
            combine_scale: 2f64.powf(-0.5) as f32,
            branches,
        })
    }

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
        Ok(ops::add(h, &self.branch(layer, h, input)?)?)
    }

    /// Layer `layer`'s branch output on the stream `h` and its input `input`.
    pub fn branch(&self, layer: usize, h: &Tensor, input: &Tensor) -> Result<Tensor> {
        let b = &self.branches[layer];
        let gated = ops::act_mul(&b.gate.forward(h)?, input, b.act)?;
        b.norm.forward(&b.projection.forward(&gated)?)
    }

    pub fn weight_bytes(&self) -> usize {
        let linears = self.projections.iter().chain(self.branches.iter().flat_map(|b| [&b.gate, &b.projection]));
        self.table.size_in_bytes() + linears.map(|l| l.weight.size_in_bytes()).sum::<usize>()
    }
}
