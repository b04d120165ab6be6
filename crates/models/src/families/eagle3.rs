//! EAGLE-3 draft heads (`LlamaForCausalLMEagle3` / `Eagle3LlamaForCausalLM`, and the
//! speculators format's `Eagle3Speculator`), as vLLM's `llama_eagle3.py` runs them: one Llama
//! layer whose attention reads the normed token embedding and the normed hidden state side by
//! side (twice the hidden size), fed on its first pass the target's residual stream at three
//! layers joined by `fc`, and on further drafts its own output before the final norm. Its LM head
//! covers a smaller draft vocabulary, mapped into the target's by `d2t` (draft id `i` is target
//! id `i + d2t[i]`), the other target tokens at `-inf`.

use serde_json::Value;

use ferrite_tensor::{ops, AttnMetadata, DType, PagedKvLayer, Tensor};

use crate::decoder::block::{LayerCaches, Residual};
use crate::decoder::load::{check_dims, CommonConfig, Defaults, Dims};
use crate::decoder::{Block, ChannelMixer, SelfAttention, TokenMixer, Wiring};
use crate::layers::rope::Rope;
use crate::layers::{Attention, Embedding, Linear, Norm, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::model::{CausalLM, DraftHead, HiddenTap, KvLayerSpec};
use crate::Result;

pub struct Eagle3Head {
    embed: Embedding,
    hidden: usize,
    /// Joins the target's layer inputs (`None`: the head reads the target's final hidden state).
    fc: Option<Linear>,
    tap: HiddenTap,
    embed_norm: RmsNorm,
    hidden_norm: RmsNorm,
    /// The residual is the normed hidden state rather than the hidden state (speculators' default).
    norm_before_residual: bool,
    /// Past its input norms: attention over both halves, then the MLP.
    block: Block,
    norm: Norm,
    lm_head: Linear,
    /// For each target token, the draft token it is (f32 whole numbers, `-1` for none); `None`
    /// when the vocabularies are the same.
    target_columns: Option<Tensor>,
    rope: Rope,
}

/// A checkpoint's `config.json` as vLLM reads it: the speculators format's
/// `transformer_layer_config` with its EAGLE-3 keys lifted beside it (`norm_before_residual`
/// then defaults to true), else the file itself.
pub fn normalize_config(raw: &RawConfig) -> Result<RawConfig> {
    let Some(kind) = raw.value.get("speculators_model_type") else { return Ok(raw.clone()) };
    if kind.as_str() != Some("eagle3") {
        return Err(raw.error(format!("`speculators_model_type` {kind}: ferrite runs `eagle3` speculators")));
    }
    let mut layer = match raw.value.get("transformer_layer_config") {
        Some(Value::Object(layer)) => layer.clone(),
        _ => return Err(raw.error("a speculators checkpoint needs a `transformer_layer_config` object")),
    };
    for key in ["draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids"] {
        if let Some(v) = raw.value.get(key).filter(|v| !v.is_null()) {
            layer.insert(key.into(), v.clone());
        }
    }
    let before = raw.value.get("norm_before_residual").cloned().unwrap_or(Value::Bool(true));
    layer.insert("norm_before_residual".into(), before);
    layer.insert("architectures".into(), Value::from(vec!["Eagle3LlamaForCausalLM"]));
    Ok(RawConfig { path: raw.path.clone(), value: Value::Object(layer) })
}

/// The head in `w` (its config `raw`, normalized), drafting for `target`.
pub fn load(raw: &RawConfig, w: &Weights, target: &dyn CausalLM) -> Result<Eagle3Head> {
    let common: CommonConfig = raw.parse()?;
    let d = common.resolve(raw, Defaults::LLAMA)?;
    if d.layers != 1 {
        return Err(raw.error(format!("`num_hidden_layers` {}: ferrite runs EAGLE-3 heads of one layer", d.layers)));
    }
    let info = target.info();
    let usize_key = |key: &str| -> Result<Option<usize>> {
        match raw.value.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| raw.error(format!("`{key}` must be a count")))
            }
        }
    };
    let draft_vocab = usize_key("draft_vocab_size")?.unwrap_or(d.vocab);
    let target_hidden = usize_key("target_hidden_size")?.unwrap_or(d.hidden);
    check_dims(raw, &[("draft_vocab_size", draft_vocab), ("target_hidden_size", target_hidden)])?;
    if d.vocab != info.vocab_size {
        return Err(raw.error(format!(
            "`vocab_size` {} is not the target's ({}): the head must share the target's tokenizer",
            d.vocab, info.vocab_size
        )));
    }
    let eagle = raw.value.get("eagle_config");
    let uses_aux = eagle.and_then(|e| e.get("use_aux_hidden_state")).and_then(Value::as_bool).unwrap_or(true);
    let tap =
        if uses_aux { HiddenTap::LayerInputs(aux_layers(raw, eagle, info.num_layers)?) } else { HiddenTap::Final };
    let fc = match &tap {
        HiddenTap::LayerInputs(layers) => Some(w.at("").linear("fc", layers.len() * target_hidden, d.hidden, false)?),
        HiddenTap::Final => None,
    };
    let embed = match w.contains("embed_tokens.weight") {
        true => Embedding { table: w.matrix("embed_tokens.weight", &[d.vocab, d.hidden])? },
        false => super::eagle::check_shared(
            raw,
            target.token_embedding(),
            |e| &e.table,
            "embed_tokens",
            info,
            [d.vocab, d.hidden],
        )?
        .clone(),
    };
    let layer = w.at(if w.contains("midlayer.hidden_norm.weight") { "midlayer" } else { "layers.0" });
    let attn = joined_attention(&d, &layer.at("self_attn"))?;
    let block = Block {
        attn_norm: None,
        mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
        attn_out_norm: None,
        mlp_norm: Some(Norm::Rms(d.rms(&layer, "post_attention_layernorm")?)),
        mlp: ChannelMixer::Gated(layer.gated_mlp("mlp", d.hidden, d.intermediate(raw)?, d.act, d.mlp_bias)?),
        mlp_out_norm: None,
        wiring: Wiring::Sequential { residual_scale: None },
    };
    let lm_head = Linear::load_head(w, "lm_head", d.hidden, draft_vocab, false)?;
    let target_columns = target_columns(raw, w, draft_vocab, info.vocab_size)?;
    Ok(Eagle3Head {
        embed,
        hidden: d.hidden,
        fc,
        tap,
        embed_norm: d.rms(&layer, "input_layernorm")?,
        hidden_norm: d.rms(&layer, "hidden_norm")?,
        norm_before_residual: raw.value.get("norm_before_residual").and_then(Value::as_bool).unwrap_or(false),
        block,
        norm: Norm::Rms(d.rms(&w.at(""), "norm")?),
        lm_head,
        target_columns: target_columns.map(|c| c.to_device(w.device())).transpose()?,
        rope: d.rope(raw, 10000.0)?,
    })
}

/// Llama's attention with q/k/v reading twice the hidden size.
fn joined_attention(d: &Dims, s: &crate::loading::weights::Scope) -> Result<Attention> {
    let (h2, q_rows, kv_rows) = (2 * d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim);
    Ok(Attention {
        q: s.linear("q_proj", h2, q_rows, d.attention_bias)?,
        k: s.linear("k_proj", h2, kv_rows, d.attention_bias)?,
        v: s.linear("v_proj", h2, kv_rows, d.attention_bias)?,
        o: s.linear("o_proj", q_rows, d.hidden, d.attention_bias)?,
        q_norm: None,
        k_norm: None,
        query_scale: None,
        params: d.attention_params((d.head_dim as f64).powf(-0.5)),
    })
}

/// The target layers whose inputs the head reads, in layer order: `eagle_aux_hidden_state_layer_ids`
/// (top level or in `eagle_config`), else vLLM's default `(2, L / 2, L - 3)` for an `L`-layer target.
fn aux_layers(raw: &RawConfig, eagle: Option<&Value>, target_layers: usize) -> Result<Vec<usize>> {
    const KEY: &str = "eagle_aux_hidden_state_layer_ids";
    let given = raw.value.get(KEY).or_else(|| eagle.and_then(|e| e.get(KEY))).filter(|v| !v.is_null());
    let mut layers: Vec<usize> = match given {
        Some(v) => v
            .as_array()
            .and_then(|ids| ids.iter().map(|i| i.as_u64().map(|i| i as usize)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| raw.error(format!("`{KEY}` must be a list of layer numbers, got {v}")))?,
        None => vec![2, target_layers / 2, target_layers.saturating_sub(3)],
    };
    layers.sort_unstable();
    let distinct = layers.windows(2).all(|p| p[0] < p[1]);
    match layers.last() {
        Some(&last) if distinct && last < target_layers => Ok(layers),
        _ => Err(raw.error(format!(
            "`{KEY}` {layers:?}: the target has {target_layers} layers, and the ids must be distinct layers of it{}",
            if given.is_none() { " (these are vLLM's default; give the ids for a target this small)" } else { "" }
        ))),
    }
}

/// For each target token, its draft token (`d2t`), or `None` when the vocabularies are the same.
fn target_columns(raw: &RawConfig, w: &Weights, draft_vocab: usize, vocab: usize) -> Result<Option<Tensor>> {
    let Some((shape, offsets)) = w.ints_opt("d2t")? else {
        if draft_vocab != vocab {
            return Err(raw.error(format!(
                "`draft_vocab_size` {draft_vocab} differs from `vocab_size` {vocab} and the checkpoint has no `d2t`"
            )));
        }
        return Ok(None);
    };
    if shape != [draft_vocab] {
        return Err(raw.error(format!("`d2t` is {shape:?}, not [{draft_vocab}] (`draft_vocab_size`)")));
    }
    let mut columns = vec![-1.0f32; vocab];
    for (draft, offset) in offsets.into_iter().enumerate() {
        let id = usize::try_from(draft as i64 + offset).ok().filter(|&id| id < vocab);
        match id.map(|id| &mut columns[id]) {
            Some(slot) if *slot < 0.0 => *slot = draft as f32,
            _ => {
                return Err(raw.error(format!(
                    "`d2t` maps draft token {draft} to {} , outside the target's {vocab} tokens or onto another draft token",
                    draft as i64 + offset
                )))
            }
        }
    }
    Ok(Some(Tensor::from_f32(columns, &[vocab])?))
}

impl DraftHead for Eagle3Head {
    fn kv_layer(&self) -> KvLayerSpec {
        self.block.mixer.kv_spec().expect("the head's block is built as attention")
    }

    fn hidden_tap(&self) -> HiddenTap {
        self.tap.clone()
    }

    fn forward(
        &self,
        next_tokens: &[u32],
        hidden: &Tensor,
        meta: &AttnMetadata,
        logit_rows: &[usize],
        kv: &mut PagedKvLayer,
    ) -> Result<(Tensor, Tensor)> {
        let e = self.embed.forward(next_tokens)?;
        let hidden = hidden.to_dtype(e.dtype());
        // The target's layer inputs, joined; a further draft's own output is already the width.
        let h = match &self.fc {
            Some(fc) if hidden.last_dim() != self.hidden => fc.forward(&hidden)?,
            _ => hidden,
        };
        let normed = self.hidden_norm.forward(&h)?;
        let residual = if self.norm_before_residual { normed.clone() } else { h };
        let joined = ops::concat_cols(&[&self.embed_norm.forward(&e)?, &normed])?;
        let (cos, sin) = self.rope.cos_sin(meta, e.device())?;
        let tables = [(&self.rope, cos, sin)];
        let stream = self.block.sequential_from(&joined, residual, None, None, &tables, meta, LayerCaches::kv(kv))?;
        let (normed, prenorm) = Residual::settle_norm(stream, Some(&self.norm))?;
        let logits = self.lm_head.forward(&ops::gather_rows(&normed, logit_rows)?)?.to_dtype(DType::F32);
        let logits = match &self.target_columns {
            Some(columns) => ops::gather_cols(&logits, columns, f32::NEG_INFINITY)?,
            None => logits,
        };
        Ok((logits, prenorm))
    }
}
