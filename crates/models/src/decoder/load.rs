//! What family loaders share: the `config.json` keys most decoders spell Llama's way
//! ([`CommonConfig`], flattened into each family's config), their resolution against the family's
//! defaults ([`Dims`]), and the loading of Llama-named checkpoints (`model.embed_tokens`,
//! `model.layers.{i}.self_attn.{q,k,v,o}_proj`, `model.norm`, `lm_head`).

use ferrite_tensor::kv::Fp8KvScales;
use ferrite_tensor::{Activation, AttentionParams, Tensor};
use serde::Deserialize;

use super::{Block, ChannelMixer, Decoder, LayerCache, SelfAttention, SharedKvAttention, TokenMixer};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{Attention, Embedding, LayerNorm, Linear, Norm, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::{ModelError, Result};

/// The `config.json` keys most decoder families share, under Llama's names. Keys whose default
/// differs between families are optional here and resolved by [`CommonConfig::resolve`].
#[derive(Debug, Clone, Deserialize)]
pub struct CommonConfig {
    pub hidden_size: usize,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub layer_norm_eps: Option<f64>,
    pub max_position_embeddings: Option<usize>,
    pub vocab_size: usize,
    pub tie_word_embeddings: Option<bool>,
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    pub sliding_window: Option<usize>,
    pub layer_types: Option<Vec<String>>,
}

/// A family's defaults for the keys its transformers config class fills in when absent.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub eps: f64,
    /// The norms are LayerNorms and read `layer_norm_eps` (else RMSNorms, `rms_norm_eps`).
    pub layer_norm: bool,
    pub max_positions: usize,
    pub act: &'static str,
    pub tie: bool,
    /// `None`: as many KV heads as query heads.
    pub kv_heads: Option<usize>,
    /// `None`: `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
}

impl Defaults {
    pub const LLAMA: Defaults = Defaults {
        eps: 1e-6,
        layer_norm: false,
        max_positions: 2048,
        act: "silu",
        tie: false,
        kv_heads: None,
        head_dim: None,
    };
}

/// A family's dimensions and options, resolved and checked.
#[derive(Debug, Clone)]
pub struct Dims {
    pub hidden: usize,
    pub intermediate: Option<usize>,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f64,
    pub max_positions: usize,
    pub vocab: usize,
    pub tie: bool,
    pub act: Activation,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub sliding_window: Option<usize>,
    pub layer_types: Option<Vec<String>>,
}

impl CommonConfig {
    pub fn resolve(&self, raw: &RawConfig, defaults: Defaults) -> Result<Dims> {
        let heads = self.num_attention_heads;
        let kv_heads = self.num_key_value_heads.or(defaults.kv_heads).unwrap_or(heads);
        check_heads(raw, heads, kv_heads)?;
        let act = activation(raw, "hidden_act", self.hidden_act.as_deref().unwrap_or(defaults.act))?;
        if let Some(types) = &self.layer_types {
            if types.len() != self.num_hidden_layers {
                return Err(raw.error(format!(
                    "`layer_types` has {} entries for {} layers",
                    types.len(),
                    self.num_hidden_layers
                )));
            }
        }
        let eps = if defaults.layer_norm { self.layer_norm_eps } else { self.rms_norm_eps };
        let head_dim = self.head_dim.or(defaults.head_dim).unwrap_or(self.hidden_size / heads);
        check_dims(
            raw,
            &[
                ("hidden_size", self.hidden_size),
                ("num_attention_heads", heads),
                ("head_dim", head_dim),
                ("num_hidden_layers", self.num_hidden_layers),
                ("vocab_size", self.vocab_size),
                ("intermediate_size", self.intermediate_size.unwrap_or(1)),
                ("num_attention_heads * head_dim", heads.saturating_mul(head_dim)),
            ],
        )?;
        Ok(Dims {
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            layers: self.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            eps: eps.unwrap_or(defaults.eps),
            max_positions: self.max_position_embeddings.unwrap_or(defaults.max_positions),
            vocab: self.vocab_size,
            tie: self.tie_word_embeddings.unwrap_or(defaults.tie),
            act,
            attention_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            sliding_window: self.sliding_window,
            layer_types: self.layer_types.clone(),
        })
    }
}

impl Dims {
    /// `intermediate_size`, for families that require it.
    pub fn intermediate(&self, raw: &RawConfig) -> Result<usize> {
        self.intermediate.ok_or_else(|| raw.error("missing field `intermediate_size`"))
    }

    /// The rotary table from the config's rope section, over `head_dim`.
    pub fn rope(&self, raw: &RawConfig, default_theta: f64) -> Result<Rope> {
        Rope::new(&RopeParameters::from_config(raw, default_theta)?, self.head_dim, self.max_positions, raw)
    }

    /// Whether layer `i` slides, by `layer_types`; `None` when the config has none.
    pub fn sliding(&self, raw: &RawConfig, i: usize) -> Result<Option<bool>> {
        self.layer_types.as_deref().map(|types| is_sliding(raw, types, i)).transpose()
    }

    /// `{q,k,v,o}_proj` under `s` (a `self_attn` scope), scaled by `head_dim^-0.5`, no window.
    pub fn attention(&self, s: &Scope, qkv_bias: bool, o_bias: bool) -> Result<Attention> {
        self.attention_named(s, ["q_proj", "k_proj", "v_proj", "o_proj"], qkv_bias, o_bias)
    }

    /// As [`Dims::attention`], for checkpoints that name the projections otherwise.
    pub fn attention_named(
        &self,
        s: &Scope,
        [q, k, v, o]: [&str; 4],
        qkv_bias: bool,
        o_bias: bool,
    ) -> Result<Attention> {
        let (h, q_rows, kv_rows) = (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        Ok(Attention {
            q: s.linear(q, h, q_rows, qkv_bias)?,
            k: s.linear(k, h, kv_rows, qkv_bias)?,
            v: s.linear(v, h, kv_rows, qkv_bias)?,
            o: s.linear(o, q_rows, h, o_bias)?,
            q_norm: None,
            k_norm: None,
            query_scale: None,
            params: self.attention_params((self.head_dim as f64).powf(-0.5)),
        })
    }

    pub fn attention_params(&self, scale: f64) -> AttentionParams {
        attention_params(self.heads, self.kv_heads, self.head_dim, scale, None, None)
    }

    /// An RMSNorm over the hidden size.
    pub fn rms(&self, s: &Scope, leaf: &str) -> Result<RmsNorm> {
        s.rms(leaf, self.hidden, self.eps)
    }

    /// A LayerNorm over the hidden size.
    pub fn layer_norm(&self, s: &Scope, leaf: &str, bias: bool) -> Result<LayerNorm> {
        s.layer_norm(leaf, self.hidden, self.eps, bias)
    }

    /// Llama's layer around `attn` (on rotary table 0) and `mlp`, under `l`'s `input_layernorm`
    /// and `post_attention_layernorm`.
    pub fn llama_block(&self, l: &Scope, attn: Attention, mlp: ChannelMixer) -> Result<Block> {
        Ok(Block::pre_norm(
            self.rms(l, "input_layernorm")?,
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            self.rms(l, "post_attention_layernorm")?,
            mlp,
        ))
    }

    /// Builds each layer from its scope `model.layers.{i}`.
    pub fn blocks(&self, w: &Weights, layer: impl FnMut(usize, &Scope) -> Result<Block>) -> Result<Vec<Block>> {
        self.blocks_at(w, Names::LLAMA.layers, layer)
    }

    /// Builds each layer from its scope `{layers}.{i}`.
    pub fn blocks_at(
        &self,
        w: &Weights,
        layers: &str,
        mut layer: impl FnMut(usize, &Scope) -> Result<Block>,
    ) -> Result<Vec<Block>> {
        (0..self.layers).map(|i| layer(i, &w.at(format!("{layers}.{i}")))).collect()
    }

    /// The decoder around `blocks` with Llama's names.
    pub fn finish(
        &self,
        raw: &RawConfig,
        w: &Weights,
        blocks: Vec<Block>,
        final_norm: Norm,
        ropes: Vec<Rope>,
    ) -> Result<Decoder> {
        self.finish_at(raw, w, Names::LLAMA, blocks, Some(final_norm), ropes)
    }

    /// The decoder around `blocks`: the token embedding `[vocab, embed_dim]`, the final norm, and
    /// the LM head (or the tied embedding).
    pub fn finish_at(
        &self,
        raw: &RawConfig,
        w: &Weights,
        names: Names,
        blocks: Vec<Block>,
        final_norm: Option<Norm>,
        ropes: Vec<Rope>,
    ) -> Result<Decoder> {
        let width = names.embed_dim.unwrap_or(self.hidden);
        let embed = Embedding { table: w.matrix(&format!("{}.weight", names.embed), &[self.vocab, width])? };
        let lm_head = lm_head(w, names.lm_head, &embed, self.tie, names.lm_head_bias)?;
        let kv_scales = kv_cache_scales(w, names.layers, &blocks)?;
        Ok(Decoder::new(raw.architecture()?, self.max_positions, embed, blocks, final_norm, lm_head, ropes)
            .with_kv_scales(kv_scales))
    }
}

/// The FP8 KV-cache scales of each attention layer, where the checkpoint has them: a scalar
/// `self_attn.k_scale` and `v_scale` (compressed-tensors' `kv_cache_scheme`) or
/// `self_attn.k_proj.output_scale` and `v_proj.output_scale` (older FP8 exports), the names vLLM
/// maps to its attention layers' scales. Empty when no layer has them.
fn kv_cache_scales(w: &Weights, layers: &str, blocks: &[Block]) -> Result<Vec<Option<Fp8KvScales>>> {
    const NAMES: [[&str; 2]; 2] = [["k_scale", "v_scale"], ["k_proj.output_scale", "v_proj.output_scale"]];
    let scalar = |name: &str| -> Result<f32> {
        let t = w.get_f32_any_shape(name)?;
        match t.to_f32_vec()[..] {
            [value] => Ok(value),
            _ => Err(ModelError::TensorShape { name: name.into(), expected: vec![1], actual: t.shape().to_vec() }),
        }
    };
    let mut scales = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        if !matches!(block.mixer.cache(), LayerCache::Kv(_) | LayerCache::KvAndState(..)) {
            continue;
        }
        let attn = format!("{layers}.{i}.self_attn");
        let found = NAMES.iter().find(|[k, _]| w.contains(&format!("{attn}.{k}")));
        scales.push(match found {
            Some([k, v]) => {
                Some(Fp8KvScales { k: scalar(&format!("{attn}.{k}"))?, v: scalar(&format!("{attn}.{v}"))? })
            }
            None => None,
        });
    }
    Ok(if scales.iter().any(Option::is_some) { scales } else { Vec::new() })
}

/// Where a checkpoint keeps the tensors around its layers.
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    /// Layer `i` is under `{layers}.{i}`.
    pub layers: &'a str,
    pub embed: &'a str,
    /// The embedding width when it is not the hidden size (OPT's `word_embed_proj_dim`).
    pub embed_dim: Option<usize>,
    pub lm_head: &'a str,
    pub lm_head_bias: bool,
}

impl Names<'static> {
    pub const LLAMA: Names<'static> = Names {
        layers: "model.layers",
        embed: "model.embed_tokens",
        embed_dim: None,
        lm_head: "lm_head",
        lm_head_bias: false,
    };
}

/// A Hugging Face activation name, or an error naming the config key.
pub fn activation(raw: &RawConfig, key: &str, name: &str) -> Result<Activation> {
    Activation::from_hf(name).ok_or_else(|| raw.error(format!("unsupported `{key}` `{name}`")))
}

/// The largest size a config may give a dimension (or a product of two that sizes a weight):
/// far above any real model's, and far below what would overflow an index or ask the allocator
/// for more than a checkpoint could back.
pub const MAX_DIM: usize = 1 << 24;

/// Each `(key, value)` is positive and at most [`MAX_DIM`], else an error naming the key.
pub fn check_dims(raw: &RawConfig, dims: &[(&str, usize)]) -> Result<()> {
    match dims.iter().find(|(_, v)| *v == 0 || *v > MAX_DIM) {
        Some((key, v)) => Err(raw.error(format!("`{key}` is {v}: it must be between 1 and {MAX_DIM}"))),
        None => Ok(()),
    }
}

pub fn check_heads(raw: &RawConfig, heads: usize, kv_heads: usize) -> Result<()> {
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(
            raw.error(format!("num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"))
        );
    }
    Ok(())
}

/// `scale` is computed in f64 and rounded once, as a Python float reaches a torch f32 op.
pub fn attention_params(
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f64,
    sliding_window: Option<usize>,
    softcap: Option<f64>,
) -> AttentionParams {
    AttentionParams {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        v_head_dim: head_dim,
        scale: scale as f32,
        sliding_window,
        attention_chunk: None,
        softcap: softcap.map(|c| c as f32),
    }
}

/// The LM head: the input embedding when tied (or when the checkpoint has no head), else `name`.
pub fn lm_head(w: &Weights, name: &str, embed: &Embedding, tied: bool, bias: bool) -> Result<Linear> {
    let [vocab, hidden] = [embed.table.shape()[0], embed.table.shape()[1]];
    if tied || !w.contains(&format!("{name}.weight")) {
        let bias = if bias { Some(w.get_f32(&format!("{name}.bias"), &[vocab])?) } else { None };
        return Ok(Linear::new(embed.table.clone(), bias));
    }
    Linear::load_head(w, name, hidden, vocab, bias)
}

/// Whether layer `i` slides, from `layer_types` (`sliding_attention` / `full_attention`).
pub fn is_sliding(raw: &RawConfig, layer_types: &[String], i: usize) -> Result<bool> {
    match layer_types.get(i).map(String::as_str) {
        Some("sliding_attention") => Ok(true),
        Some("full_attention") => Ok(false),
        Some(other) => Err(raw.error(format!("unsupported layer type `{other}` in `layer_types`"))),
        None => Err(raw.error(format!("`layer_types` has no entry for layer {i}"))),
    }
}

/// Which earlier layer's keys and values each layer reads when the last `shared` layers share
/// them (Gemma 3n's and Gemma 4's `num_kv_shared_layers`): `None` for a layer that computes its
/// own, else the last layer before the shared ones of the same type (`sliding[i]`).
pub fn kv_sources(raw: &RawConfig, sliding: &[bool], shared: usize) -> Result<Vec<Option<usize>>> {
    let layers = sliding.len();
    if shared >= layers && shared > 0 {
        return Err(raw
            .error(format!("`num_kv_shared_layers` {shared} leaves no layer of {layers} to compute keys and values")));
    }
    let first_shared = layers - shared;
    (0..layers)
        .map(|i| {
            if i < first_shared {
                return Ok(None);
            }
            (0..first_shared).rev().find(|&j| sliding[j] == sliding[i]).map(Some).ok_or_else(|| {
                raw.error(format!("layer {i} shares keys and values, but no earlier layer of its type computes them"))
            })
        })
        .collect()
}

/// Gemma 3n's and Gemma 4's attention: per-head RMSNorms (`x * w`) on the queries and keys
/// (`q_norm`, `k_norm`) and a weightless one on the values, with the scale `params` gives (1).
#[derive(Debug, Clone)]
pub struct NormedAttention {
    pub params: AttentionParams,
    pub eps: f64,
    pub bias: bool,
    pub rope: usize,
    /// The earlier layer whose cache this one reads ([`kv_sources`]); it then projects queries only.
    pub source: Option<usize>,
    /// The values are `k_proj`'s output too (Gemma 4's `attention_k_eq_v` on full layers).
    pub values_from_keys: bool,
}

impl NormedAttention {
    /// The token mixer under `s` (a `self_attn` scope) for a stream of `hidden` channels.
    pub fn load(&self, s: &Scope, hidden: usize) -> Result<TokenMixer> {
        let p = &self.params;
        let q_rows = p.num_heads * p.head_dim;
        let q = s.linear("q_proj", hidden, q_rows, self.bias)?;
        let o = s.linear("o_proj", q_rows, hidden, self.bias)?;
        let q_norm = Some(s.rms("q_norm", p.head_dim, self.eps)?);
        if let Some(source) = self.source {
            let rope = Some(self.rope);
            return Ok(TokenMixer::SharedKv(SharedKvAttention { q, q_norm, o, params: p.clone(), rope, source }));
        }
        let kv_rows = p.num_kv_heads * p.head_dim;
        let k = s.linear("k_proj", hidden, kv_rows, self.bias)?;
        let v = if self.values_from_keys { k.clone() } else { s.linear("v_proj", hidden, kv_rows, self.bias)? };
        let k_norm = Some(s.rms("k_norm", p.head_dim, self.eps)?);
        let attn = Attention { q, k, v, o, q_norm, k_norm, query_scale: None, params: p.clone() };
        let ones = Tensor::from_f32(vec![1.0; p.head_dim], &[p.head_dim])?.to_device(s.weights().device())?;
        let v_norm = Some(Box::new(RmsNorm { weight: ones, eps: self.eps as f32, offset: 0.0 }));
        Ok(TokenMixer::Attention(SelfAttention { v_norm, ..SelfAttention::new(attn, Some(self.rope)) }))
    }
}

/// The multi-token-prediction layer DeepSeek-V3 and GLM-4.5 checkpoints ship after the last
/// (`model.layers.{layers}`: `enorm`, `hnorm`, `eh_proj`, a decoder layer of the model's kind built
/// by `block`, `shared_head.{norm, head}`), as vLLM's MTP predictors read it: the next token's
/// embedding zeroed at position 0, the stream before its norm fed back. `None` unless the weights
/// load MTP heads.
pub fn next_layer_mtp(
    raw: &RawConfig,
    w: &Weights,
    d: &Dims,
    block: impl FnOnce(usize, &Scope) -> Result<Block>,
) -> Result<Option<crate::decoder::Mtp>> {
    if !w.loads_mtp() {
        return Ok(None);
    }
    let l = w.at(format!("model.layers.{}", d.layers));
    if !w.contains(&l.name("eh_proj.weight")) {
        return Err(raw.error(format!(
            "the checkpoint has no MTP layer (`model.layers.{}.eh_proj`) for speculative decoding's `mtp`",
            d.layers
        )));
    }
    Ok(Some(crate::decoder::Mtp {
        norm_embedding: Norm::Rms(d.rms(&l, "enorm")?),
        norm_hidden: Norm::Rms(d.rms(&l, "hnorm")?),
        fc: l.linear("eh_proj", 2 * d.hidden, d.hidden, false)?,
        block: block(d.layers, &l)?,
        norm: Norm::Rms(d.rms(&l, "shared_head.norm")?),
        head: Some(l.linear("shared_head.head", d.hidden, d.vocab, false)?),
        zero_first_embedding: true,
        feeds_back_normed: false,
    }))
}
