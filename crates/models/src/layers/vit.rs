//! The plain ViT encoder of CLIP's and SigLIP's vision towers: square patches embedded by a
//! convolution (a matmul over patch rows here), learned positions, and pre-LayerNorm blocks of
//! full attention and a two-layer MLP. CLIP prepends a class token and normalizes the embeddings
//! (`pre_layrnorm`); SigLIP has neither, and its last hidden state passes `post_layernorm`.

use serde::{Deserialize, Serialize};

use ferrite_tensor::{ops, Activation, AttentionParams, DType, Device, Tensor};

use crate::decoder::load::{activation, attention_params, check_dims};
use crate::layers::{LayerNorm, Linear};
use crate::loading::config::RawConfig;
use crate::loading::weights::Scope;
use crate::model::pixel_input;
use crate::Result;

/// The fields `CLIPVisionConfig` and `SiglipVisionConfig` share, with CLIP's defaults (a SigLIP
/// config is read through [`VitConfig::siglip_defaults`]).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct VitConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_channels: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub hidden_act: String,
    pub layer_norm_eps: f64,
    pub model_type: Option<String>,
}

impl Default for VitConfig {
    fn default() -> VitConfig {
        VitConfig {
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            num_channels: 3,
            image_size: 224,
            patch_size: 32,
            hidden_act: "quick_gelu".into(),
            layer_norm_eps: 1e-5,
            model_type: None,
        }
    }
}

impl VitConfig {
    /// `vision_config` of `raw` over the CLIP defaults.
    pub fn clip(raw: &RawConfig) -> Result<VitConfig> {
        Self::parse(raw, VitConfig::default())
    }

    /// `vision_config` of `raw` over `SiglipVisionConfig`'s defaults.
    pub fn siglip(raw: &RawConfig) -> Result<VitConfig> {
        let defaults = VitConfig {
            patch_size: 16,
            hidden_act: "gelu_pytorch_tanh".into(),
            layer_norm_eps: 1e-6,
            ..VitConfig::default()
        };
        Self::parse(raw, defaults)
    }

    fn parse(raw: &RawConfig, defaults: VitConfig) -> Result<VitConfig> {
        // Null keys (as transformers writes unset ones) take the defaults too.
        let mut merged = serde_json::to_value(&defaults).expect("plain fields serialize");
        if let (Some(base), Some(serde_json::Value::Object(given))) =
            (merged.as_object_mut(), raw.value.get("vision_config"))
        {
            for (key, value) in given {
                if !value.is_null() {
                    base.insert(key.clone(), value.clone());
                }
            }
        }
        serde_json::from_value(merged).map_err(|e| raw.error(format!("vision_config: {e}")))
    }

    /// Patches along a side of the (square) image.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }
}

/// Which ViT a tower is: what surrounds its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VitKind {
    /// A class token first, LayerNorm before the blocks, no bias on the patch embedding.
    Clip,
    /// Patches only, a biased patch embedding, LayerNorm after the blocks.
    Siglip,
}

struct EncoderLayer {
    norm1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

pub struct VitTower {
    patch_embed: Linear,
    /// `[1, hidden]`: CLIP's class token, the first row of every image.
    class_embedding: Option<Tensor>,
    /// `[rows, hidden]`: one per patch (after the class token's own).
    position_embedding: Tensor,
    pre_norm: Option<LayerNorm>,
    /// The blocks that run: a tower read at an earlier layer leaves the rest unloaded.
    layers: Vec<EncoderLayer>,
    post_norm: Option<LayerNorm>,
    act: Activation,
    attention: AttentionParams,
    pub channels: usize,
    /// Pixels along a patch's side.
    pub patch: usize,
    /// Patches along the image's side.
    pub grid: usize,
}

impl VitTower {
    /// The tower under `v` (`embeddings.*`, `encoder.layers.*`, the norms), its first `depth`
    /// blocks loaded.
    pub fn load(raw: &RawConfig, cfg: &VitConfig, v: &Scope, kind: VitKind, depth: usize) -> Result<VitTower> {
        let (e, heads) = (cfg.hidden_size, cfg.num_attention_heads);
        check_dims(
            raw,
            &[
                ("vision_config.hidden_size", e),
                ("vision_config.intermediate_size", cfg.intermediate_size),
                ("vision_config.num_attention_heads", heads),
                ("vision_config.num_channels", cfg.num_channels),
                ("vision_config.patch_size", cfg.patch_size),
                ("vision_config.image_size", cfg.image_size),
            ],
        )?;
        if !e.is_multiple_of(heads) || !cfg.image_size.is_multiple_of(cfg.patch_size) {
            return Err(raw.error(format!(
                "vision_config: hidden_size {e} over {heads} heads, image_size {} in patches of {}: each must divide",
                cfg.image_size, cfg.patch_size
            )));
        }
        let grid = cfg.grid();
        let patch_dim = cfg.num_channels * cfg.patch_size * cfg.patch_size;
        let eps = cfg.layer_norm_eps;
        let emb = v.at("embeddings");
        let weights = v.weights();
        let patch_weight = weights
            .get(&emb.name("patch_embedding.weight"), &[e, cfg.num_channels, cfg.patch_size, cfg.patch_size])?
            .reshape(&[e, patch_dim])?;
        let patch_bias = match kind {
            VitKind::Clip => None,
            VitKind::Siglip => Some(emb.get_f32("patch_embedding.bias", &[e])?),
        };
        let layers = (0..depth)
            .map(|i| {
                let l = v.at(&format!("encoder.layers.{i}"));
                let a = l.at("self_attn");
                Ok(EncoderLayer {
                    norm1: l.layer_norm("layer_norm1", e, eps, true)?,
                    q: a.linear("q_proj", e, e, true)?,
                    k: a.linear("k_proj", e, e, true)?,
                    v: a.linear("v_proj", e, e, true)?,
                    out: a.linear("out_proj", e, e, true)?,
                    norm2: l.layer_norm("layer_norm2", e, eps, true)?,
                    fc1: l.linear("mlp.fc1", e, cfg.intermediate_size, true)?,
                    fc2: l.linear("mlp.fc2", cfg.intermediate_size, e, true)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let head_dim = e / heads;
        let (class_embedding, rows, pre_norm, post_norm) = match kind {
            VitKind::Clip => (
                Some(emb.get("class_embedding", &[e])?.reshape(&[1, e])?),
                grid * grid + 1,
                Some(v.layer_norm("pre_layrnorm", e, eps, true)?),
                None,
            ),
            VitKind::Siglip => (None, grid * grid, None, Some(v.layer_norm("post_layernorm", e, eps, true)?)),
        };
        Ok(VitTower {
            patch_embed: Linear::new(patch_weight, patch_bias),
            class_embedding,
            position_embedding: emb.get("position_embedding.weight", &[rows, e])?,
            pre_norm,
            layers,
            post_norm,
            act: activation(raw, "vision_config.hidden_act", &cfg.hidden_act)?,
            attention: attention_params(heads, heads, head_dim, (head_dim as f64).powf(-0.5), None, None),
            channels: cfg.num_channels,
            patch: cfg.patch_size,
            grid,
        })
    }

    /// The linear layers, for the model's weight bytes.
    pub fn linears(&self) -> impl Iterator<Item = &Linear> {
        let blocks = self.layers.iter().flat_map(|l| [&l.q, &l.k, &l.v, &l.out, &l.fc1, &l.fc2]);
        blocks.chain(std::iter::once(&self.patch_embed))
    }

    /// Rows of the tower's hidden states: the patches, and CLIP's class token before them.
    pub fn rows(&self) -> usize {
        self.position_embedding.shape()[0]
    }

    /// Pixels along the side of the image the tower takes.
    pub fn image_side(&self) -> usize {
        self.grid * self.patch
    }

    /// Channel-first pixels `[channels, H, W]` as patch rows `[patches, channels * p * p]`, each
    /// row ordered (channel, row, column) as the patch embedding's convolution reads it.
    fn patch_rows(&self, chw: &[f32]) -> Vec<f32> {
        let (p, g) = (self.patch, self.grid);
        let side = p * g;
        let mut rows = Vec::with_capacity(chw.len());
        for pr in 0..g {
            for pc in 0..g {
                for c in 0..self.channels {
                    for y in 0..p {
                        let start = (c * side + pr * p + y) * side + pc * p;
                        rows.extend_from_slice(&chw[start..start + p]);
                    }
                }
            }
        }
        rows
    }

    /// The tower's last hidden state of one image's channel-first pixels: the last block's output,
    /// through the closing norm where the tower has one (transformers' `last_hidden_state`).
    pub fn last_hidden_state(&self, chw: &[f32], device: Device, dtype: DType) -> Result<Tensor> {
        let x = self.hidden_states(chw, device, dtype, |_, _| Ok(()))?;
        match &self.post_norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
    }

    /// Runs the tower's blocks over one image's channel-first pixels: `visit(k, hidden)` sees the
    /// hidden states after `k` blocks (0: the embeddings, transformers' `hidden_states[k]`), and
    /// the result is the last block's output, without the closing norm.
    pub fn hidden_states(
        &self,
        chw: &[f32],
        device: Device,
        dtype: DType,
        mut visit: impl FnMut(usize, &Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        let patches = self.grid * self.grid;
        let pixels =
            pixel_input(self.patch_rows(chw), &[patches, self.channels * self.patch * self.patch], device, dtype)?;
        let embedded = self.patch_embed.forward(&pixels)?;
        // Tables kept in the weights' dtype join activations in theirs (f32 on the CPU).
        let x = match &self.class_embedding {
            Some(class) => ops::concat_rows(&[&class.to_dtype(embedded.dtype()), &embedded])?,
            None => embedded,
        };
        let x = ops::add(&x, &self.position_embedding.to_dtype(x.dtype()))?;
        let mut x = match &self.pre_norm {
            Some(norm) => norm.forward(&x)?,
            None => x,
        };
        visit(0, &x)?;
        let rows = self.rows();
        for (i, l) in self.layers.iter().enumerate() {
            let normed = l.norm1.forward(&x)?;
            let (q, k, v) = (l.q.forward(&normed)?, l.k.forward(&normed)?, l.v.forward(&normed)?);
            let attn = ops::attention_dense(&q, &k, &v, &self.attention, &[rows], false)?;
            x = ops::add(&x, &l.out.forward(&attn)?)?;
            let mlp = l.fc2.forward(&ops::activation(&l.fc1.forward(&l.norm2.forward(&x)?)?, self.act)?)?;
            x = ops::add(&x, &mlp)?;
            visit(i + 1, &x)?;
        }
        Ok(x)
    }
}
