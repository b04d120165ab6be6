//! GPT-J (`GPTJForCausalLM`): one LayerNorm feeding attention and MLP in parallel,
//! `h = (attn + mlp) + h`; rotary embeddings on the first `rotary_dim` dims of each head, rotating
//! adjacent pairs (`rotate_every_two`); q/k/v/out projections without biases, a biased tanh-GELU
//! MLP, and an untied LM head with a bias.
//!
//! Checkpoint names: `transformer.{wte, ln_f, h.{i}.{ln_1, attn.{q_proj, k_proj, v_proj, out_proj},
//! mlp.{fc_in, fc_out}}}`, `lm_head`.

use ferrite_tensor::RopeStyle;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, ParallelSum, SelfAttention, TokenMixer};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{DenseMlp, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let mapped = raw.renamed(&[
        ("n_embd", "hidden_size"),
        ("n_layer", "num_hidden_layers"),
        ("n_head", "num_attention_heads"),
        ("n_positions", "max_position_embeddings"),
        ("n_inner", "intermediate_size"),
        ("layer_norm_epsilon", "layer_norm_eps"),
        ("activation_function", "hidden_act"),
    ]);
    let common = CommonConfig { num_key_value_heads: None, head_dim: None, ..mapped.parse::<CommonConfig>()? };
    let defaults = Defaults { eps: 1e-5, layer_norm: true, act: "gelu_new", ..Defaults::LLAMA };
    let d = common.resolve(&mapped, defaults)?;
    // transformers sizes the sin/cos table by `rotary_dim or hidden_size`, which only fits heads
    // when there is one: real checkpoints all give it.
    let rotary_dim = match raw.value.get("rotary_dim").and_then(serde_json::Value::as_u64) {
        Some(r) if r > 0 && r as usize <= d.head_dim && r % 2 == 0 => r as usize,
        _ => {
            return Err(
                raw.error(format!("`rotary_dim` must be an even number of dims up to the head dim {}", d.head_dim))
            )
        }
    };
    let (h, inner) = (d.hidden, d.intermediate.unwrap_or(4 * d.hidden));
    let blocks = d.blocks_at(w, "transformer.h", |_, l| {
        let attn = d.attention_named(&l.at("attn"), ["q_proj", "k_proj", "v_proj", "out_proj"], false, false)?;
        let mlp = DenseMlp {
            fc1: l.linear("mlp.fc_in", h, inner, true)?,
            fc2: l.linear("mlp.fc_out", inner, h, true)?,
            act: d.act.into(),
        };
        Ok(Block::parallel(
            Norm::Layer(d.layer_norm(l, "ln_1", true)?),
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            ChannelMixer::Dense(mlp),
            ParallelSum::BranchesFirst,
        ))
    })?;
    let params = RopeParameters {
        rope_theta: Some(10000.0),
        partial_rotary_factor: Some(rotary_dim as f64 / d.head_dim as f64),
        ..RopeParameters::default()
    };
    let rope = Rope::new(&params, d.head_dim, d.max_positions, raw)?.with_style(RopeStyle::Interleaved);
    let names = Names { layers: "transformer.h", embed: "transformer.wte", lm_head_bias: true, ..Names::LLAMA };
    let final_norm = Norm::Layer(d.layer_norm(&w.at("transformer"), "ln_f", true)?);
    d.finish_at(raw, w, names, blocks, Some(final_norm), vec![rope])
}
