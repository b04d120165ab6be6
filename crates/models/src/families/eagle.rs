//! EAGLE-1 draft heads (`"method": "eagle"`; the EAGLE repository's checkpoints, whose config
//! says `LlamaForCausalLM`, run as vLLM's `EagleLlamaForCausalLM`): `fc` joins the token
//! embedding and a hidden state side by side (the target's final-norm output on a head's first
//! pass over a position, its own output on further drafts), then Llama layers, the first without
//! an input norm, and no final norm before the LM head. HASS heads (`add_para_norm`) normalise
//! both halves first. The embedding and LM head are the target's unless the checkpoint has its
//! own.

use ferrite_tensor::{ops, AttnMetadata, DType, PagedKvLayer, Tensor};

use crate::decoder::block::{LayerCaches, Residual};
use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, SelfAttention, TokenMixer, Wiring};
use crate::layers::rope::Rope;
use crate::layers::{Embedding, Linear, Norm, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::model::{CausalLM, DraftHead, HiddenTap, KvLayerSpec, ModelInfo};
use crate::Result;

pub struct EagleHead {
    embed: Embedding,
    /// HASS's norms of the embedding and of the hidden state, applied before `fc`.
    input_norms: Option<(RmsNorm, RmsNorm)>,
    fc: Linear,
    block: Block,
    lm_head: Linear,
    rope: Rope,
}

/// The head in `w` (its config `raw`), drafting for `target`.
pub fn load(raw: &RawConfig, w: &Weights, target: &dyn CausalLM) -> Result<EagleHead> {
    let common: CommonConfig = raw.parse()?;
    let d = common.resolve(raw, Defaults::LLAMA)?;
    if d.layers != 1 {
        return Err(raw.error(format!("`num_hidden_layers` {}: ferrite runs EAGLE heads of one layer", d.layers)));
    }
    let info = target.info();
    if d.vocab != info.vocab_size {
        return Err(raw.error(format!(
            "`vocab_size` {} is not the target's ({}): the head must share the target's tokenizer",
            d.vocab, info.vocab_size
        )));
    }
    let shape = [d.vocab, d.hidden];
    let embed = match w.contains("embed_tokens.weight") {
        true => Embedding { table: w.matrix("embed_tokens.weight", &shape)? },
        false => check_shared(raw, target.token_embedding(), |e| &e.table, "embed_tokens", info, shape)?.clone(),
    };
    let lm_head = match w.contains("lm_head.weight") {
        true => Linear::load_head(w, "lm_head", d.hidden, d.vocab, false)?,
        false => check_shared(raw, target.lm_head(), |h| &h.weight, "lm_head", info, shape)?.clone(),
    };
    let root = w.at("");
    let add_para_norm = raw.value.get("add_para_norm").and_then(serde_json::Value::as_bool).unwrap_or(false);
    let input_norms = match add_para_norm {
        true => Some((d.rms(&root, "embedding_layernorm")?, d.rms(&root, "hidden_states_layernorm")?)),
        false => None,
    };
    // The EAGLE repository's heads train `fc` with a bias unless their config turns it off; vLLM
    // reads the config's `bias` the same way.
    let fc_bias = raw.value.get("bias").and_then(serde_json::Value::as_bool).unwrap_or(w.contains("fc.bias"));
    let fc = root.linear("fc", 2 * d.hidden, d.hidden, fc_bias)?;
    let layer = w.at("layers.0");
    let attn = d.attention(&layer.at("self_attn"), d.attention_bias, d.attention_bias)?;
    let mlp = ChannelMixer::Gated(layer.gated_mlp("mlp", d.hidden, d.intermediate(raw)?, d.act, d.mlp_bias)?);
    let block = Block {
        attn_norm: None,
        mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
        attn_out_norm: None,
        mlp_norm: Some(Norm::Rms(d.rms(&layer, "post_attention_layernorm")?)),
        mlp,
        mlp_out_norm: None,
        wiring: Wiring::Sequential { residual_scale: None },
    };
    Ok(EagleHead { embed, input_norms, fc, block, lm_head, rope: d.rope(raw, 10000.0)? })
}

/// The target's `what` (`part`, whose weight `table` gives) for a head without its own, checked to
/// be `shape`.
pub(crate) fn check_shared<'t, T>(
    raw: &RawConfig,
    part: Option<&'t T>,
    table: impl Fn(&T) -> &Tensor,
    what: &str,
    info: &ModelInfo,
    shape: [usize; 2],
) -> Result<&'t T> {
    let part =
        part.ok_or_else(|| raw.error(format!("the head has no `{what}` and {} shares none", info.architecture)))?;
    if table(part).shape() != shape {
        return Err(
            raw.error(format!("the head has no `{what}` and the target's is {:?}, not {shape:?}", table(part).shape()))
        );
    }
    Ok(part)
}

impl DraftHead for EagleHead {
    fn kv_layer(&self) -> KvLayerSpec {
        self.block.mixer.kv_spec().expect("the head's block is built as attention")
    }

    fn hidden_tap(&self) -> HiddenTap {
        HiddenTap::Final
    }

    fn forward(
        &self,
        next_tokens: &[u32],
        hidden: &Tensor,
        meta: &AttnMetadata,
        logit_rows: &[usize],
        kv: &mut PagedKvLayer,
    ) -> Result<(Tensor, Tensor)> {
        let mut e = self.embed.forward(next_tokens)?;
        let mut hidden = hidden.to_dtype(e.dtype());
        if let Some((embed_norm, hidden_norm)) = &self.input_norms {
            e = embed_norm.forward(&e)?;
            hidden = hidden_norm.forward(&hidden)?;
        }
        let h = self.fc.forward(&ops::concat_cols(&[&e, &hidden])?)?;
        let (cos, sin) = self.rope.cos_sin(meta, e.device())?;
        let tables = [(&self.rope, cos, sin)];
        let out =
            self.block.forward(Residual { h, pending: None }, None, &tables, meta, LayerCaches::kv(kv))?.settle()?;
        let logits = self.lm_head.forward(&ops::gather_rows(&out, logit_rows)?)?.to_dtype(DType::F32);
        Ok((logits, out))
    }
}
