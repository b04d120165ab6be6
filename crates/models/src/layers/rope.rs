//! Rotary position embeddings and the scaling variants configs declare (`rope_type`: default,
//! linear, dynamic, yarn, longrope, llama3, proportional). Frequencies are computed in f32 in the same order of
//! operations as transformers' `modeling_rope_utils.py`, so cos/sin tables match the oracle's.

use std::sync::Arc;

use ferrite_tensor::cuda::HostFill;
use ferrite_tensor::{ops, AttnMetadata, Device, PagedKvLayer, RopeStyle, Tensor};
use serde::Deserialize;
use serde_json::Value;

use crate::loading::config::RawConfig;
use crate::Result;

/// The union of the keys transformers reads from `rope_parameters` / `rope_scaling`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RopeParameters {
    #[serde(alias = "type")]
    pub rope_type: Option<String>,
    pub rope_theta: Option<f64>,
    pub factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    pub attention_factor: Option<f64>,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub short_factor: Option<Vec<f64>>,
    pub long_factor: Option<Vec<f64>>,
    pub truncate: Option<bool>,
    pub partial_rotary_factor: Option<f64>,
    /// HunYuan's fixed NTK `alpha` (see `families::hunyuan`); other families ignore it, as
    /// transformers does.
    pub alpha: Option<f64>,
    /// MRoPE's split of the rotary frequencies over (temporal, height, width) (Qwen2-VL).
    pub mrope_section: Option<Vec<usize>>,
}

impl RopeParameters {
    /// Reads `rope_parameters` (transformers 5) or the older `rope_scaling` + `rope_theta` pair.
    pub fn from_config(raw: &RawConfig, default_theta: f64) -> Result<RopeParameters> {
        let obj = &raw.value;
        let section = obj
            .get("rope_parameters")
            .filter(|v| v.is_object())
            .or_else(|| obj.get("rope_scaling").filter(|v| v.is_object()));
        let mut params: RopeParameters = match section {
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| raw.error(format!("rope parameters: {e}")))?,
            None => RopeParameters::default(),
        };
        if params.rope_theta.is_none() {
            params.rope_theta = obj.get("rope_theta").and_then(Value::as_f64).or(Some(default_theta));
        }
        if params.partial_rotary_factor.is_none() {
            params.partial_rotary_factor = obj.get("partial_rotary_factor").and_then(Value::as_f64);
        }
        // transformers' `standardize_rope_params`: a top-level `original_max_position_embeddings`
        // (Phi-3 saves it there) wins over the one inside the rope section for the scaled types.
        if matches!(params.kind(), "llama3" | "yarn" | "longrope") {
            if let Some(v) = obj.get("original_max_position_embeddings").and_then(Value::as_u64) {
                params.original_max_position_embeddings = Some(v as usize);
            }
        }
        Ok(params)
    }

    /// One rope section given as a JSON object (e.g. one layer type's entry of a nested
    /// `rope_parameters`, as Gemma 3 writes them), with `default_theta` where it has no `rope_theta`.
    pub fn from_section(raw: &RawConfig, section: &Value, default_theta: f64) -> Result<RopeParameters> {
        let mut params: RopeParameters =
            serde_json::from_value(section.clone()).map_err(|e| raw.error(format!("rope parameters: {e}")))?;
        params.rope_theta = params.rope_theta.or(Some(default_theta));
        Ok(params)
    }

    /// The sections `[sliding_attention, full_attention]` of a model whose layer types rotate
    /// differently (Gemma 3): transformers 5's nested `rope_parameters.{sliding_attention,
    /// full_attention}`, else the legacy keys, `rope_local_base_freq` for sliding layers and
    /// `rope_theta` + `rope_scaling` for full ones (the scaling applies to full layers only).
    pub fn sliding_and_full(raw: &RawConfig, local_theta: f64, global_theta: f64) -> Result<[RopeParameters; 2]> {
        let obj = &raw.value;
        let nested = obj
            .get("rope_parameters")
            .filter(|v| v.get("sliding_attention").is_some() || v.get("full_attention").is_some());
        let local_theta = obj.get("rope_local_base_freq").and_then(Value::as_f64).unwrap_or(local_theta);
        let global_theta = obj.get("rope_theta").and_then(Value::as_f64).unwrap_or(global_theta);
        let empty = Value::Object(Default::default());
        let (local, global) = match nested {
            Some(n) => (n.get("sliding_attention").unwrap_or(&empty), n.get("full_attention").unwrap_or(&empty)),
            None => (&empty, obj.get("rope_scaling").filter(|v| v.is_object()).unwrap_or(&empty)),
        };
        Ok([Self::from_section(raw, local, local_theta)?, Self::from_section(raw, global, global_theta)?])
    }

    pub fn kind(&self) -> &str {
        self.rope_type.as_deref().unwrap_or("default")
    }
}

#[derive(Debug, Clone)]
enum Schedule {
    Fixed(Vec<f32>),
    /// Dynamic NTK: frequencies are recomputed from the longest position in the step once it
    /// passes the trained length (transformers' `dynamic_rope_update`).
    DynamicNtk {
        base: f32,
        factor: f32,
        max_position: usize,
        original: Vec<f32>,
    },
    /// LongRoPE: short factors up to the original length, long factors beyond it.
    LongRope {
        short: Vec<f32>,
        long: Vec<f32>,
        original_max: usize,
        /// Whether transformers recomputes the cache when a sequence crosses `original_max`
        /// (Phi-3's generate); elsewhere cached keys keep the short-factor rotation.
        recompute: bool,
        /// cos/sin scales up to and past `original_max`, where they switch with the length
        /// (PhiMoE's `short_mscale` / `long_mscale`); else the one attention scaling.
        mscales: Option<[f32; 2]>,
    },
}

#[derive(Debug, Clone)]
pub struct Rope {
    schedule: Schedule,
    rotary_dim: usize,
    head_dim: usize,
    attention_scaling: f32,
    pub style: RopeStyle,
    /// MRoPE: for each rotary frequency, which of a token's (temporal, height, width) positions
    /// turns it (Qwen2-VL's `mrope_section` split of the frequencies); `None`: one position.
    mrope_axes: Option<Vec<usize>>,
}

/// `1 / base^(2i/dim)` exactly as torch evaluates it in f32.
fn default_inv_freq(base: f32, dim: usize) -> Vec<f32> {
    (0..dim).step_by(2).map(|i| 1.0f32 / base.powf(i as f32 / dim as f32)).collect()
}

impl Rope {
    /// Builds the rotary embedding for heads of `head_dim` (the rotary span is `head_dim *
    /// partial_rotary_factor`), trained for `max_position_embeddings` positions.
    pub fn new(
        params: &RopeParameters,
        head_dim: usize,
        max_position_embeddings: usize,
        raw: &RawConfig,
    ) -> Result<Rope> {
        let base = params.rope_theta.unwrap_or(10000.0) as f32;
        let partial = params.partial_rotary_factor.unwrap_or(1.0);
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(raw.error(format!("`partial_rotary_factor` {partial} is not in (0, 1]")));
        }
        crate::decoder::load::check_dims(raw, &[("head_dim (rotary)", head_dim)])?;
        // Proportional rope rotates over the whole head and zeroes the frequencies past its share.
        let rotary_dim = if params.kind() == "proportional" { head_dim } else { (head_dim as f64 * partial) as usize };
        let dim = rotary_dim;
        let need = |v: Option<f64>, key: &str| -> Result<f64> {
            v.ok_or_else(|| raw.error(format!("rope type `{}` needs `{key}`", params.kind())))
        };
        let mut attention_scaling = 1.0f32;
        let schedule = match params.kind() {
            "default" => Schedule::Fixed(default_inv_freq(base, dim)),
            "linear" => {
                let factor = need(params.factor, "factor")? as f32;
                Schedule::Fixed(default_inv_freq(base, dim).into_iter().map(|f| f / factor).collect())
            }
            "dynamic" => Schedule::DynamicNtk {
                base,
                factor: need(params.factor, "factor")? as f32,
                max_position: max_position_embeddings,
                original: default_inv_freq(base, dim),
            },
            "llama3" => {
                let factor = need(params.factor, "factor")? as f32;
                let low = need(params.low_freq_factor, "low_freq_factor")? as f32;
                let high = need(params.high_freq_factor, "high_freq_factor")? as f32;
                let old = need(
                    params.original_max_position_embeddings.map(|v| v as f64),
                    "original_max_position_embeddings",
                )? as f32;
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                let freqs = default_inv_freq(base, dim)
                    .into_iter()
                    .map(|f| {
                        let wavelen = (2.0 * std::f64::consts::PI) as f32 / f;
                        let scaled = if wavelen > low_wavelen { f / factor } else { f };
                        let smooth = (old / wavelen - low) / (high - low);
                        let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                        // transformers' `~(wavelen < high) & ~(wavelen > low)`, NaN handling included.
                        #[allow(clippy::neg_cmp_op_on_partial_ord)]
                        let medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
                        if medium {
                            smoothed
                        } else {
                            scaled
                        }
                    })
                    .collect();
                Schedule::Fixed(freqs)
            }
            "yarn" => {
                let original_max = params.original_max_position_embeddings.unwrap_or(max_position_embeddings);
                let factor = params.factor.unwrap_or(max_position_embeddings as f64 / original_max as f64);
                let mscale = |scale: f64, m: f64| {
                    if scale <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * scale.ln() + 1.0
                    }
                };
                attention_scaling = match (params.attention_factor, params.mscale, params.mscale_all_dim) {
                    (Some(a), _, _) => a as f32,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        (mscale(factor, m) / mscale(factor, all)) as f32
                    }
                    _ => mscale(factor, 1.0) as f32,
                };
                let beta_fast = params.beta_fast.filter(|&b| b != 0.0).unwrap_or(32.0);
                let beta_slow = params.beta_slow.filter(|&b| b != 0.0).unwrap_or(1.0);
                let correction_dim = |rotations: f64| {
                    (dim as f64 * (original_max as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln())
                        / (2.0 * (base as f64).ln())
                };
                let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
                if params.truncate.unwrap_or(true) {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(dim as f64 - 1.0);
                if low == high {
                    high += 0.001;
                }
                let factor = factor as f32;
                let freqs = (0..dim / 2)
                    .map(|i| {
                        let pos_freq = base.powf((2 * i) as f32 / dim as f32);
                        let extrapolation = 1.0 / pos_freq;
                        let interpolation = 1.0 / (factor * pos_freq);
                        let ramp = ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                        let extrapolation_factor = 1.0 - ramp;
                        interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
                    })
                    .collect();
                Schedule::Fixed(freqs)
            }
            "longrope" => {
                let original_max = params.original_max_position_embeddings.unwrap_or(max_position_embeddings);
                let factor = params.factor.unwrap_or(max_position_embeddings as f64 / original_max as f64);
                attention_scaling = match params.attention_factor {
                    Some(a) => a as f32,
                    None if factor <= 1.0 => 1.0,
                    None => (1.0 + factor.ln() / (original_max as f64).ln()).sqrt() as f32,
                };
                let scaled = |ext: &Option<Vec<f64>>, key: &str| -> Result<Vec<f32>> {
                    let ext = ext.as_ref().ok_or_else(|| raw.error(format!("rope type `longrope` needs `{key}`")))?;
                    if ext.len() != dim / 2 {
                        return Err(raw.error(format!(
                            "`{key}` has {} entries, rotary dim {dim} needs {}",
                            ext.len(),
                            dim / 2
                        )));
                    }
                    Ok((0..dim)
                        .step_by(2)
                        .zip(ext)
                        .map(|(i, &e)| 1.0 / (e as f32 * base.powf(i as f32 / dim as f32)))
                        .collect())
                };
                Schedule::LongRope {
                    short: scaled(&params.short_factor, "short_factor")?,
                    long: scaled(&params.long_factor, "long_factor")?,
                    original_max,
                    recompute: true,
                    mscales: None,
                }
            }
            "proportional" => {
                // transformers' `int(partial_rotary_factor * head_dim // 2)` rotating angles, the
                // exponents still over the whole head; the other angles have frequency 0 (cos 1, sin 0).
                let angles = ((partial * head_dim as f64) / 2.0).floor() as usize;
                let factor = params.factor.unwrap_or(1.0) as f32;
                let mut freqs: Vec<f32> = default_inv_freq(base, dim).into_iter().take(angles).collect();
                freqs.resize(dim / 2, 0.0);
                Schedule::Fixed(freqs.into_iter().map(|f| f / factor).collect())
            }
            other => return Err(raw.error(format!("unsupported rope type `{other}`"))),
        };
        Ok(Rope { schedule, rotary_dim, head_dim, attention_scaling, style: RopeStyle::Neox, mrope_axes: None })
    }

    pub fn with_style(mut self, style: RopeStyle) -> Rope {
        self.style = style;
        self
    }

    /// MRoPE as Qwen2-VL splits it: the first `sections[0]` frequencies turn with the temporal
    /// position, the next `sections[1]` with the height, the next with the width (and so on
    /// round the three axes), for tokens whose positions the step's metadata gives.
    pub fn with_mrope_sections(mut self, sections: &[usize], raw: &RawConfig) -> Result<Rope> {
        let half = self.rotary_dim / 2;
        if sections.iter().sum::<usize>() != half {
            return Err(raw.error(format!(
                "`mrope_section` {sections:?} adds up to {}, the rotary embedding has {half} frequencies",
                sections.iter().sum::<usize>()
            )));
        }
        let axes = sections.iter().enumerate().flat_map(|(i, &n)| std::iter::repeat_n(i % 3, n)).collect();
        self.mrope_axes = Some(axes);
        Ok(self)
    }

    /// MRoPE as Qwen3-VL interleaves it: frequency `j` turns with the height position when
    /// `j % 3 == 1` and `j < 3 * sections[1]`, with the width when `j % 3 == 2` and
    /// `j < 3 * sections[2]`, else with the temporal position.
    pub fn with_interleaved_mrope_sections(mut self, sections: &[usize], raw: &RawConfig) -> Result<Rope> {
        let half = self.rotary_dim / 2;
        let [_, height, width] = sections else {
            return Err(raw.error(format!("`mrope_section` {sections:?} must have three entries")));
        };
        if sections.iter().sum::<usize>() != half {
            return Err(raw.error(format!(
                "`mrope_section` {sections:?} adds up to {}, the rotary embedding has {half} frequencies",
                sections.iter().sum::<usize>()
            )));
        }
        let axes = (0..half)
            .map(|j| match j % 3 {
                1 if j < 3 * height => 1,
                2 if j < 3 * width => 2,
                _ => 0,
            })
            .collect();
        self.mrope_axes = Some(axes);
        Ok(self)
    }

    /// See [`crate::CausalLM::rotary_depends_on_length`].
    pub fn depends_on_length(&self) -> bool {
        !matches!(self.schedule, Schedule::Fixed(_))
    }

    /// LongRoPE's switch where the model recomputes the cache there: sequences longer than this
    /// use the long factors.
    pub fn long_factors_past(&self) -> Option<usize> {
        match &self.schedule {
            Schedule::LongRope { original_max, recompute: true, .. } => Some(*original_max),
            _ => None,
        }
    }

    /// LongRoPE without Phi-3's recompute: a sequence that grows past the original length rotates
    /// its new tokens with the long factors and keeps the keys it has cached (Llama's generate).
    pub fn without_recompute(mut self) -> Rope {
        if let Schedule::LongRope { recompute, .. } = &mut self.schedule {
            *recompute = false;
        }
        self
    }

    /// PhiMoE's LongRoPE as transformers 5.24 computes it: its frequencies come without the
    /// sequence length, so the short factors turn every position, while the cos/sin scale is
    /// `short_mscale` up to the original length and `long_mscale` past it.
    pub fn with_phimoe_mscales(mut self, short_mscale: f32, long_mscale: f32) -> Rope {
        if let Schedule::LongRope { short, long, mscales, .. } = &mut self.schedule {
            long.clone_from(short);
            *mscales = Some([short_mscale, long_mscale]);
        }
        self
    }

    /// The cos/sin scale for a step whose sequence reaches `seq_len` positions.
    fn scaling(&self, seq_len: usize) -> f32 {
        match &self.schedule {
            Schedule::LongRope { mscales: Some([short, long]), original_max, .. } => match seq_len > *original_max {
                true => *long,
                false => *short,
            },
            _ => self.attention_scaling,
        }
    }

    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// Inverse frequencies for a step whose longest sequence reaches `seq_len` positions.
    fn inv_freq(&self, seq_len: usize) -> std::borrow::Cow<'_, [f32]> {
        match &self.schedule {
            Schedule::Fixed(f) => f.into(),
            Schedule::DynamicNtk { base, factor, max_position, original } => {
                if seq_len <= *max_position {
                    return original.into();
                }
                let dim = self.rotary_dim as f32;
                let grown =
                    base * ((factor * seq_len as f32 / *max_position as f32) - (factor - 1.0)).powf(dim / (dim - 2.0));
                default_inv_freq(grown, self.rotary_dim).into()
            }
            Schedule::LongRope { short, long, original_max, .. } => {
                if seq_len > *original_max {
                    long.into()
                } else {
                    short.into()
                }
            }
        }
    }

    /// cos/sin tables `[tokens, rotary_dim / 2]` for every query token of the batch, on `device`.
    /// Schedules that depend on length use each sequence's own length (`schedule_len`), as
    /// transformers does at batch 1.
    pub fn cos_sin(&self, meta: &AttnMetadata, device: Device) -> Result<(Tensor, Tensor)> {
        let half = self.rotary_dim / 2;
        let table = |rope: Arc<Rope>, trig: fn(f32) -> f32| -> HostFill {
            Arc::new(move |meta: &AttnMetadata| rope.table(meta, trig))
        };
        let rope = Arc::new(self.clone());
        Ok((
            ops::step_tensor(meta, device, half, table(rope.clone(), f32::cos))?,
            ops::step_tensor(meta, device, half, table(rope, f32::sin))?,
        ))
    }

    /// `trig(angle) * attention_scaling` for every query token and rotary frequency.
    fn table(&self, meta: &AttnMetadata, trig: fn(f32) -> f32) -> Vec<f32> {
        let half = self.rotary_dim / 2;
        let mut out = vec![0.0f32; meta.num_tokens() * half];
        for (i, s) in meta.seqs.iter().enumerate() {
            let inv_freq = self.inv_freq(meta.schedule_len(i));
            let scaling = self.scaling(meta.schedule_len(i));
            for i in 0..s.q_len {
                let row = s.q_start + i;
                let pos = s.query_position(i);
                match (&self.mrope_axes, meta.mrope_positions.get(row)) {
                    (Some(axes), Some(thw)) => {
                        for ((j, &f), &axis) in inv_freq.iter().enumerate().zip(axes) {
                            out[row * half + j] = trig(f * thw[axis] as f32) * scaling;
                        }
                    }
                    _ => {
                        for (j, &f) in inv_freq.iter().enumerate() {
                            out[row * half + j] = trig(f * pos as f32) * scaling;
                        }
                    }
                }
            }
        }
        out
    }

    /// Rotates `x [tokens, heads * head_dim]` in place of its first `rotary_dim` dims per head.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        Ok(ferrite_tensor::ops::rope(x, cos, sin, self.head_dim, self.style)?)
    }

    /// Rotates the queries `q` (returned) and the keys `k` of a batch, and writes the rotated
    /// keys and the values `v` into `cache` at the batch's slots.
    #[allow(clippy::too_many_arguments)]
    pub fn apply_with_kv(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        cache: &mut PagedKvLayer,
        meta: &AttnMetadata,
    ) -> Result<Tensor> {
        Ok(ferrite_tensor::ops::rope_write_kv(q, k, v, cos, sin, self.head_dim, self.style, cache, meta)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: Value) -> RawConfig {
        RawConfig { path: "config.json".into(), value: v }
    }

    #[test]
    fn legacy_and_v5_rope_keys_agree() {
        let a =
            raw(serde_json::json!({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}));
        let b =
            raw(serde_json::json!({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}}));
        let (pa, pb) = (RopeParameters::from_config(&a, 1e4).unwrap(), RopeParameters::from_config(&b, 1e4).unwrap());
        assert_eq!(pa.rope_theta, pb.rope_theta);
        let ra = Rope::new(&pa, 64, 2048, &a).unwrap();
        let rb = Rope::new(&pb, 64, 2048, &b).unwrap();
        assert_eq!(ra.inv_freq(10), rb.inv_freq(10));
        assert_eq!(ra.inv_freq(10)[1], default_inv_freq(500000.0, 64)[1] / 2.0);
    }

    #[test]
    fn dynamic_ntk_only_changes_past_trained_length() {
        let r = raw(serde_json::json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}}));
        let rope = Rope::new(&RopeParameters::from_config(&r, 1e4).unwrap(), 32, 512, &r).unwrap();
        assert_eq!(rope.inv_freq(512).as_ref(), default_inv_freq(1e4, 32).as_slice());
        assert!(rope.inv_freq(600)[5] < rope.inv_freq(512)[5]);
    }

    #[test]
    fn unknown_rope_type_is_an_error_naming_it() {
        let r = raw(serde_json::json!({"rope_scaling": {"rope_type": "warp"}}));
        let err = Rope::new(&RopeParameters::from_config(&r, 1e4).unwrap(), 32, 512, &r).unwrap_err().to_string();
        assert!(err.contains("warp"), "{err}");
    }
}
