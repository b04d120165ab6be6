//! EXAONE 3 / 3.5 (`ExaoneForCausalLM`): Llama's architecture (transformers runs it as
//! `LlamaForCausalLM`) under EXAONE's own names: config keys `num_layers`, `layer_norm_epsilon`,
//! `activation_function`; weights `transformer.wte`, `transformer.h.{i}.{ln_1, attn.attention.
//! {q,k,v,out}_proj, ln_2, mlp.c_fc_0 (gate), c_fc_1 (up), c_proj (down)}`, `transformer.ln_f`.

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::{GatedMlp, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

/// transformers' ExaoneConfig: RoPE theta 500000 where the config names none.
const DEFAULT_THETA: f64 = 500_000.0;

/// EXAONE's config keys and the names transformers maps them to (its `attribute_map`).
const KEY_ALIASES: [(&str, &str); 3] = [
    ("num_layers", "num_hidden_layers"),
    ("layer_norm_epsilon", "rms_norm_eps"),
    ("activation_function", "hidden_act"),
];

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let mut value = raw.value.clone();
    if let Some(map) = value.as_object_mut() {
        for (from, to) in KEY_ALIASES {
            if let Some(v) = map.get(from).cloned() {
                map.entry(to).or_insert(v);
            }
        }
    }
    let raw = &RawConfig { path: raw.path.clone(), value };
    let d =
        raw.parse::<CommonConfig>()?.resolve(raw, Defaults { eps: 1e-5, max_positions: 4096, ..Defaults::LLAMA })?;
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks_at(w, "transformer.h", |_, l| {
        let attn =
            d.attention_named(&l.at("attn.attention"), ["q_proj", "k_proj", "v_proj", "out_proj"], false, false)?;
        let m = l.at("mlp");
        let mlp = GatedMlp {
            gate: m.linear("c_fc_0", d.hidden, inter, false)?,
            up: m.linear("c_fc_1", d.hidden, inter, false)?,
            down: m.linear("c_proj", inter, d.hidden, false)?,
            act: d.act,
        };
        Ok(Block::pre_norm(
            d.rms(l, "ln_1")?,
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            d.rms(l, "ln_2")?,
            ChannelMixer::Gated(mlp),
        ))
    })?;
    let names = Names {
        layers: "transformer.h",
        embed: "transformer.wte",
        embed_dim: None,
        lm_head: "lm_head",
        lm_head_bias: false,
    };
    let final_norm = Norm::Rms(d.rms(&w.at("transformer"), "ln_f")?);
    d.finish_at(raw, w, names, blocks, Some(final_norm), vec![d.rope(raw, DEFAULT_THETA)?])
}
