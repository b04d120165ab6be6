//! GPT-NeoX / Pythia (`GPTNeoXForCausalLM`): a fused `query_key_value` projection interleaved per
//! head (`[q_h, k_h, v_h]` for each head h, de-interleaved at load), partial rotary embeddings
//! (`rotary_pct`, default 0.25; base `rotary_emb_base`), LayerNorms with bias, ungated GELU MLP,
//! and the parallel residual `h = (mlp(ln2(h)) + attn(ln1(h))) + h` unless
//! `use_parallel_residual: false`.
//!
//! Checkpoint names: `gpt_neox.{embed_in, final_layer_norm, layers.{i}.{input_layernorm,
//! post_attention_layernorm, attention.query_key_value, attention.dense, mlp.dense_h_to_4h,
//! mlp.dense_4h_to_h}}`, `lm_head` (older checkpoints: `embed_out`).

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, ParallelSum, SelfAttention, TokenMixer, Wiring};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{Attention, DenseMlp, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct GptNeoXConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default = "default_true")]
    use_parallel_residual: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: GptNeoXConfig = raw.parse()?;
    // Biased attention unless the config says otherwise.
    let bias = raw.value.get("attention_bias").and_then(Value::as_bool).unwrap_or(true);
    let defaults = Defaults { eps: 1e-5, layer_norm: true, act: "gelu", ..Defaults::LLAMA };
    let mut d = CommonConfig { num_key_value_heads: None, head_dim: None, ..cfg.common }.resolve(raw, defaults)?;
    d.head_dim = d.hidden / d.heads;
    let (h, hd, inter) = (d.hidden, d.head_dim, d.intermediate(raw)?);
    let blocks = d.blocks_at(w, "gpt_neox.layers", |_, l| {
        let qkv = l.linear("attention.query_key_value", h, 3 * h, bias)?;
        // Interleaved per head: `[q_h, k_h, v_h]`.
        let part = |j: usize| {
            qkv.select_rows(&(0..d.heads).map(|i| (3 * i + j) * hd..(3 * i + j + 1) * hd).collect::<Vec<_>>())
        };
        let o = l.linear("attention.dense", h, h, bias)?;
        let attn = Attention {
            q: part(0)?,
            k: part(1)?,
            v: part(2)?,
            o,
            q_norm: None,
            k_norm: None,
            query_scale: None,
            params: d.attention_params((hd as f64).powf(-0.5)),
        };
        let mlp = DenseMlp {
            fc1: l.linear("mlp.dense_h_to_4h", h, inter, true)?,
            fc2: l.linear("mlp.dense_4h_to_h", inter, h, true)?,
            act: d.act.into(),
        };
        Ok(Block {
            attn_norm: Some(Norm::Layer(d.layer_norm(l, "input_layernorm", true)?)),
            mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            attn_out_norm: None,
            mlp_norm: Some(Norm::Layer(d.layer_norm(l, "post_attention_layernorm", true)?)),
            mlp: ChannelMixer::Dense(mlp),
            mlp_out_norm: None,
            wiring: match cfg.use_parallel_residual {
                true => Wiring::Parallel(ParallelSum::BranchesFirst),
                false => Wiring::Sequential { residual_scale: None },
            },
        })
    })?;
    let legacy_base = raw.value.get("rotary_emb_base").and_then(Value::as_f64).unwrap_or(10000.0);
    let mut rope_params = RopeParameters::from_config(raw, legacy_base)?;
    let legacy_pct = raw.value.get("rotary_pct").and_then(Value::as_f64).unwrap_or(0.25);
    rope_params.partial_rotary_factor = rope_params.partial_rotary_factor.or(Some(legacy_pct));
    let rope = Rope::new(&rope_params, hd, d.max_positions, raw)?;
    let lm_head = if w.contains("embed_out.weight") { "embed_out" } else { "lm_head" };
    let names = Names { layers: "gpt_neox.layers", embed: "gpt_neox.embed_in", lm_head, ..Names::LLAMA };
    let final_norm = Norm::Layer(d.layer_norm(&w.at("gpt_neox"), "final_layer_norm", true)?);
    d.finish_at(raw, w, names, blocks, Some(final_norm), vec![rope])
}
