//! What a Hugging Face checkpoint of the same model would hold: its `config.json` and its tensors,
//! under transformers' names and in transformers' layout.
//!
//! Mirrors transformers' legacy GGUF loader (`load_gguf_checkpoint` with `GGUF_CONFIG_MAPPING` and
//! the `TensorProcessor`s), which is what transformers 5.24 uses for `llama`, `qwen2` and `gemma3`
//! files.

use serde_json::{json, Map, Value};

use ferrite_tensor::ggml::GgmlBlocks;

use super::{GgufError, GgufErrorKind, GgufFile};

/// The architectures this module can describe, by `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    Llama,
    Qwen2,
    Gemma3,
}

/// llama.cpp hardcodes Gemma 3's layer pattern (five sliding-window layers, then a global one)
/// instead of writing it to the file; transformers' `Gemma3TextConfig` has the same default.
const GEMMA3_SLIDING_WINDOW_PATTERN: usize = 6;
/// Gemma 3's local (sliding-window) RoPE base. Also absent from GGUF files: llama.cpp hardcodes
/// it, and transformers falls back to the same default.
const GEMMA3_ROPE_LOCAL_BASE_FREQ: f64 = 10_000.0;
/// transformers' `Gemma3TextConfig` default; the GGUF metadata has no key for it.
const GEMMA3_QUERY_PRE_ATTN_SCALAR: u64 = 256;

/// Per-layer GGUF tensor names and their transformers counterparts (after `model.layers.N.`).
const LLAMA_LAYER_TENSORS: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// Gemma 3 has four norms per layer; note that GGUF's `ffn_norm` is transformers'
/// `pre_feedforward_layernorm`, not `post_attention_layernorm` as in llama.
const GEMMA3_LAYER_TENSORS: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

const GLOBAL_TENSORS: &[(&str, &str)] =
    &[("token_embd", "model.embed_tokens"), ("output_norm", "model.norm"), ("output", "lm_head")];

/// The hyperparameters both the config and the tensor fix-ups need.
struct Dims {
    heads: u64,
    kv_heads: u64,
    hidden: u64,
}

impl GgufFile {
    fn arch(&self) -> Result<Arch, GgufError> {
        match self.architecture()? {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "gemma3" => Ok(Arch::Gemma3),
            other => Err(self.error(GgufErrorKind::Unsupported(format!(
                "architecture `{other}` is not supported (ferrite maps `llama`, `qwen2` and `gemma3` GGUF files)"
            )))),
        }
    }

    fn arch_key(&self, key: &str) -> Result<String, GgufError> {
        Ok(format!("{}.{key}", self.architecture()?))
    }

    fn dims(&self) -> Result<Dims, GgufError> {
        let heads = self.require_u64(&self.arch_key("attention.head_count")?)?;
        // llama.cpp's default when the key is absent: no grouped-query attention.
        let kv_heads = self.get_u64(&self.arch_key("attention.head_count_kv")?)?.unwrap_or(heads);
        let hidden = self.require_u64(&self.arch_key("embedding_length")?)?;
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(self.error(GgufErrorKind::Malformed(format!(
                "{heads} attention heads cannot be shared by {kv_heads} key/value heads"
            ))));
        }
        Ok(Dims { heads, kv_heads, hidden })
    }

    fn token_count(&self) -> Option<usize> {
        self.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).map(<[_]>::len)
    }

    /// A transformers-style `config.json` for this file, as transformers builds it from the same
    /// metadata, plus `architectures` (which transformers only adds when saving a model).
    pub fn hf_config(&self) -> Result<Value, GgufError> {
        let arch = self.arch()?;
        let dims = self.dims()?;
        let key = |k: &str| self.arch_key(k);
        let num_layers = self.require_u64(&key("block_count")?)?;
        let intermediate = self.require_u64(&key("feed_forward_length")?)?;
        // Defaults are those of the transformers config classes, which is what a missing key
        // leaves in place there.
        let context = self.get_u64(&key("context_length")?)?;
        let eps = self.get_f64(&key("attention.layer_norm_rms_epsilon")?)?;
        let rope_theta = self.get_f64(&key("rope.freq_base")?)?;
        // transformers takes the vocabulary size from the tokenizer when the arch key is absent
        // (transformers#32526), which llama.cpp's converter always leaves out for gemma3.
        let vocab_size = match self.get_u64(&key("vocab_size")?)? {
            Some(v) => Some(v),
            None => self.token_count().map(|n| n as u64),
        };
        let head_dim = match self.get_u64(&key("attention.key_length")?)? {
            Some(d) => d,
            // transformers maps llama's `rope.dimension_count` to `head_dim`; right for every
            // llama-architecture file, whose rotary width is the whole head.
            None if arch == Arch::Llama => match self.get_u64(&key("rope.dimension_count")?)? {
                Some(d) => d,
                None => dims.hidden / dims.heads,
            },
            None => dims.hidden / dims.heads,
        };
        // llama.cpp writes `output.weight` only when the head is not the embedding matrix.
        let tied = self.tensor_info("output.weight").is_none();
        let rope_scaling = self.rope_scaling()?;

        let mut c = Map::new();
        c.insert("hidden_size".into(), json!(dims.hidden));
        c.insert("intermediate_size".into(), json!(intermediate));
        c.insert("num_hidden_layers".into(), json!(num_layers));
        c.insert("num_attention_heads".into(), json!(dims.heads));
        c.insert("num_key_value_heads".into(), json!(dims.kv_heads));
        c.insert("head_dim".into(), json!(head_dim));
        c.insert("vocab_size".into(), json!(vocab_size));
        c.insert("tie_word_embeddings".into(), json!(tied));
        c.insert("attention_bias".into(), json!(false));
        c.insert("attention_dropout".into(), json!(0.0));
        for (name, key) in [
            ("bos_token_id", "tokenizer.ggml.bos_token_id"),
            ("eos_token_id", "tokenizer.ggml.eos_token_id"),
            ("pad_token_id", "tokenizer.ggml.padding_token_id"),
            ("unk_token_id", "tokenizer.ggml.unknown_token_id"),
        ] {
            c.insert(name.into(), json!(self.get_u64(key)?));
        }
        match arch {
            Arch::Llama => {
                let theta = rope_theta.unwrap_or(10_000.0);
                c.insert("architectures".into(), json!(["LlamaForCausalLM"]));
                c.insert("model_type".into(), json!("llama"));
                c.insert("hidden_act".into(), json!("silu"));
                c.insert("mlp_bias".into(), json!(false));
                c.insert("max_position_embeddings".into(), json!(context.unwrap_or(2048)));
                c.insert("rms_norm_eps".into(), json!(eps.unwrap_or(1e-6)));
                insert_rope(&mut c, theta, &rope_scaling);
            }
            Arch::Qwen2 => {
                // Qwen2Config's defaults; its q/k/v projections always carry biases, whatever
                // `attention_bias` says, and no GGUF key turns its sliding window on.
                let theta = rope_theta.unwrap_or(10_000.0);
                c.insert("architectures".into(), json!(["Qwen2ForCausalLM"]));
                c.insert("model_type".into(), json!("qwen2"));
                c.insert("hidden_act".into(), json!("silu"));
                c.insert("max_position_embeddings".into(), json!(context.unwrap_or(32_768)));
                c.insert("rms_norm_eps".into(), json!(eps.unwrap_or(1e-6)));
                insert_rope(&mut c, theta, &rope_scaling);
                c.insert("use_sliding_window".into(), json!(false));
            }
            Arch::Gemma3 => {
                let theta = rope_theta.unwrap_or(1_000_000.0);
                let window = self.get_u64(&key("attention.sliding_window")?)?.unwrap_or(4096);
                let layer_types: Vec<&str> = (0..num_layers as usize)
                    .map(|i| {
                        if (i + 1) % GEMMA3_SLIDING_WINDOW_PATTERN == 0 {
                            "full_attention"
                        } else {
                            "sliding_attention"
                        }
                    })
                    .collect();
                c.insert("architectures".into(), json!(["Gemma3ForCausalLM"]));
                c.insert("model_type".into(), json!("gemma3_text"));
                c.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
                c.insert("max_position_embeddings".into(), json!(context.unwrap_or(131_072)));
                c.insert("rms_norm_eps".into(), json!(eps.unwrap_or(1e-6)));
                c.insert("rope_theta".into(), json!(theta));
                c.insert("rope_local_base_freq".into(), json!(GEMMA3_ROPE_LOCAL_BASE_FREQ));
                // Scaling, where a file has it, applies to the global layers only, as in the
                // original checkpoints' configs.
                c.insert(
                    "rope_parameters".into(),
                    json!({
                        "full_attention": rope_parameters(theta, &rope_scaling),
                        "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_ROPE_LOCAL_BASE_FREQ},
                    }),
                );
                c.insert("rope_scaling".into(), json!(rope_scaling));
                c.insert("sliding_window".into(), json!(window));
                c.insert("_sliding_window_pattern".into(), json!(GEMMA3_SLIDING_WINDOW_PATTERN));
                c.insert("layer_types".into(), json!(layer_types));
                c.insert("query_pre_attn_scalar".into(), json!(GEMMA3_QUERY_PRE_ATTN_SCALAR));
                c.insert("final_logit_softcapping".into(), Value::Null);
                c.insert("attn_logit_softcapping".into(), Value::Null);
                c.insert("use_bidirectional_attention".into(), json!(false));
            }
        }
        Ok(Value::Object(c))
    }

    /// `{arch}.rope.scaling.*` as a transformers `rope_scaling` dict. transformers' GGUF loader
    /// drops these keys for llama, qwen2 and gemma3; they are kept here because without them a
    /// long-context model would silently run with the wrong positions.
    fn rope_scaling(&self) -> Result<Option<Value>, GgufError> {
        let key = |k: &str| self.arch_key(k);
        let Some(kind) = self.get_str(&key("rope.scaling.type")?)? else {
            return Ok(None);
        };
        if kind == "none" {
            return Ok(None);
        }
        let mut s = json!({"rope_type": kind});
        if let Some(f) = self.get_f64(&key("rope.scaling.factor")?)? {
            s["factor"] = json!(f);
        }
        if let Some(n) = self.get_u64(&key("rope.scaling.original_context_length")?)? {
            s["original_max_position_embeddings"] = json!(n);
        }
        if let Some(f) = self.get_f64(&key("rope.scaling.attn_factor")?)? {
            s["attention_factor"] = json!(f);
        }
        Ok(Some(s))
    }

    /// `(transformers name, GGUF name)` for every tensor of the file that transformers loads, in
    /// file order; empty for an architecture `hf_config` rejects. A tied model has no
    /// `lm_head.weight` here (see `tie_word_embeddings`): use `model.embed_tokens.weight`.
    pub fn hf_tensors(&self) -> Vec<(String, String)> {
        let Ok(arch) = self.arch() else {
            return Vec::new();
        };
        self.tensor_names().filter_map(|gguf| hf_name(arch, gguf).map(|hf| (hf, gguf.to_string()))).collect()
    }

    /// A tensor under its transformers name, dequantized to f32 and put in transformers' layout:
    /// row-major shape, q/k rows un-permuted for llama, the `+1` taken off Gemma's norms.
    pub fn load_hf_tensor(&self, hf_name: &str) -> Result<(Vec<usize>, Vec<f32>), GgufError> {
        let (arch, gguf_name) = self.gguf_name_of(hf_name)?;
        let (shape, data) = self.dequantize(&gguf_name)?;
        let cols = shape.iter().skip(1).product();
        let mut data = self.to_hf_rows(arch, &gguf_name, &shape, data, cols)?;
        if arch == Arch::Gemma3 && gguf_name.ends_with("norm.weight") {
            // Gemma normalizes with `(1 + w)`; llama.cpp's converter stores `w + 1` so its
            // RMSNorm can multiply directly, and transformers subtracts the 1 again (in f32).
            data.iter_mut().for_each(|w| *w -= 1.0);
        }
        Ok((shape, data))
    }

    /// A matrix under its transformers name kept in its ggml blocks, rows in transformers'
    /// order: `Some` for a 2-D tensor of a type the CPU multiplies in blocks
    /// ([`GgmlType::has_cpu_kernel`]) whose rows are whole blocks; `None` for anything else, which
    /// [`GgufFile::load_hf_tensor`] dequantizes.
    pub fn load_hf_blocks(&self, hf_name: &str) -> Result<Option<(Vec<usize>, GgmlBlocks)>, GgufError> {
        let (arch, gguf_name) = self.gguf_name_of(hf_name)?;
        let info = self.tensor_info(&gguf_name).expect("named by the tensor table");
        let shape = info.shape();
        let ty = info.ggml_type;
        if shape.len() != 2 || !ty.has_cpu_kernel() || !shape[1].is_multiple_of(ty.block_size()) {
            return Ok(None);
        }
        let bytes = self.tensor_data(&gguf_name)?.to_vec();
        let bytes = self.to_hf_rows(arch, &gguf_name, &shape, bytes, ty.bytes_for(shape[1]))?;
        let blocks = GgmlBlocks::new(ty, bytes, shape[0] * shape[1])
            .map_err(|e| self.error(GgufErrorKind::Malformed(format!("tensor `{gguf_name}`: {e}"))))?;
        Ok(Some((shape, blocks)))
    }

    fn gguf_name_of(&self, hf_name: &str) -> Result<(Arch, String), GgufError> {
        let arch = self.arch()?;
        let gguf_name = self
            .tensor_names()
            .find(|g| hf_name_is(arch, g, hf_name))
            .ok_or_else(|| self.error(GgufErrorKind::MissingTensor(hf_name.to_string())))?
            .to_string();
        Ok((arch, gguf_name))
    }

    /// Rows (of `row_len` values each: f32s or block bytes) in transformers' order. llama.cpp's
    /// converter interleaves each llama head's rotary halves (`permute` in convert_hf_to_gguf.py)
    /// so that its RoPE can rotate adjacent pairs; transformers rotates halves, so it undoes that
    /// (`_reverse_permute_weights`).
    fn to_hf_rows<T: Copy + Default>(
        &self,
        arch: Arch,
        gguf_name: &str,
        shape: &[usize],
        data: Vec<T>,
        row_len: usize,
    ) -> Result<Vec<T>, GgufError> {
        let is_q = gguf_name.contains(".attn_q.");
        if arch != Arch::Llama || !(is_q || gguf_name.contains(".attn_k.")) {
            return Ok(data);
        }
        let dims = self.dims()?;
        let heads = if is_q { dims.heads } else { dims.kv_heads } as usize;
        self.reverse_permute(gguf_name, shape, data, row_len, heads)
    }

    /// transformers' `_reverse_permute_weights`: rows grouped `[head, dim/2, 2]` become
    /// `[head, 2, dim/2]`. Also right for a bias (no columns).
    fn reverse_permute<T: Copy + Default>(
        &self,
        name: &str,
        shape: &[usize],
        data: Vec<T>,
        row_len: usize,
        heads: usize,
    ) -> Result<Vec<T>, GgufError> {
        let rows = shape.first().copied().unwrap_or(0);
        if heads == 0 || rows % (2 * heads) != 0 {
            return Err(self.error(GgufErrorKind::Malformed(format!(
                "tensor `{name}` has {rows} rows, which {heads} heads of rotary pairs cannot split"
            ))));
        }
        let half = rows / heads / 2;
        let mut out = vec![T::default(); data.len()];
        for h in 0..heads {
            for i in 0..half {
                for t in 0..2 {
                    let src = (h * half * 2 + i * 2 + t) * row_len;
                    let dst = (h * half * 2 + t * half + i) * row_len;
                    out[dst..dst + row_len].copy_from_slice(&data[src..src + row_len]);
                }
            }
        }
        Ok(out)
    }
}

/// Overlays the keys of `extra` on `base` (both JSON objects).
/// transformers' `rope_parameters` of a layer type: default rope at `theta`, under the file's
/// scaling where it has one.
fn rope_parameters(theta: f64, scaling: &Option<Value>) -> Value {
    let mut params = json!({"rope_type": "default", "rope_theta": theta});
    if let Some(scaling) = scaling {
        merge(&mut params, scaling);
    }
    params
}

/// A config's rope keys when every layer shares one rope: `rope_theta`, `rope_parameters` and
/// the legacy `rope_scaling`.
fn insert_rope(c: &mut Map<String, Value>, theta: f64, scaling: &Option<Value>) {
    c.insert("rope_theta".into(), json!(theta));
    c.insert("rope_parameters".into(), rope_parameters(theta, scaling));
    c.insert("rope_scaling".into(), json!(scaling));
}

fn merge(base: &mut Value, extra: &Value) {
    if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
    }
}

/// The transformers name of a GGUF tensor, or None for one transformers does not load (llama's
/// `rope_freqs.weight`, for instance, which transformers ignores too).
fn hf_name(arch: Arch, gguf: &str) -> Option<String> {
    let (stem, suffix) = gguf.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    if let Some(rest) = stem.strip_prefix("blk.") {
        let (layer, part) = rest.split_once('.')?;
        if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let table = match arch {
            // llama.cpp's qwen2 names are llama's, biases included.
            Arch::Llama | Arch::Qwen2 => LLAMA_LAYER_TENSORS,
            Arch::Gemma3 => GEMMA3_LAYER_TENSORS,
        };
        let (_, hf) = table.iter().find(|(g, _)| *g == part)?;
        return Some(format!("model.layers.{layer}.{hf}.{suffix}"));
    }
    let (_, hf) = GLOBAL_TENSORS.iter().find(|(g, _)| *g == stem)?;
    Some(format!("{hf}.{suffix}"))
}

fn hf_name_is(arch: Arch, gguf: &str, wanted: &str) -> bool {
    hf_name(arch, gguf).is_some_and(|hf| hf == wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let cases = [
            (Arch::Llama, "token_embd.weight", Some("model.embed_tokens.weight")),
            (Arch::Llama, "output_norm.weight", Some("model.norm.weight")),
            (Arch::Llama, "output.weight", Some("lm_head.weight")),
            (Arch::Llama, "blk.12.attn_q.weight", Some("model.layers.12.self_attn.q_proj.weight")),
            (Arch::Llama, "blk.0.attn_q.bias", Some("model.layers.0.self_attn.q_proj.bias")),
            (Arch::Llama, "blk.3.ffn_norm.weight", Some("model.layers.3.post_attention_layernorm.weight")),
            (Arch::Llama, "blk.3.ffn_down.weight", Some("model.layers.3.mlp.down_proj.weight")),
            (Arch::Llama, "rope_freqs.weight", None),
            (Arch::Llama, "blk.x.attn_q.weight", None),
            (Arch::Llama, "blk.1.post_ffw_norm.weight", None),
            (Arch::Qwen2, "blk.5.attn_k.bias", Some("model.layers.5.self_attn.k_proj.bias")),
            (Arch::Qwen2, "blk.5.ffn_norm.weight", Some("model.layers.5.post_attention_layernorm.weight")),
            (Arch::Gemma3, "blk.1.ffn_norm.weight", Some("model.layers.1.pre_feedforward_layernorm.weight")),
            (Arch::Gemma3, "blk.1.post_ffw_norm.weight", Some("model.layers.1.post_feedforward_layernorm.weight")),
            (Arch::Gemma3, "blk.1.attn_k_norm.weight", Some("model.layers.1.self_attn.k_norm.weight")),
            (Arch::Gemma3, "blk.1.post_attention_norm.weight", Some("model.layers.1.post_attention_layernorm.weight")),
        ];
        for (arch, gguf, want) in cases {
            assert_eq!(hf_name(arch, gguf).as_deref(), want, "{gguf}");
        }
    }
}
