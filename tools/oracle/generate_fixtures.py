#!/usr/bin/env python3
"""Build the tiny random-init model fixtures and record the transformers oracle for each.

For every entry of SPECS below:
  1. build the model from its config class with torch.manual_seed(seed), eager attention;
     every parameter that init leaves constant (RMSNorm weights = 1, biases = 0, ...) is perturbed
     so that an engine which ignores it cannot pass;
  2. save_pretrained (safetensors, in the spec's save dtype) to fixtures/models/<name>/ together with
     copies of fixtures/tokenizer/tokenizer.json and tokenizer_config.json;
  3. reload it FROM DISK in float32 and run the battery (greedy, 16 new tokens, EOS disabled, batch 1),
     recording per step the top-5 log-probabilities of the raw f32 logits;
  4. if the smallest top1-top2 log-prob gap over the battery is below --min-gap, or some output is one
     token repeated, try the next seed (the seed used is recorded);
  5. check that the fixture's distinctive feature matters (an ablated copy gives different outputs),
     reload once more, and check that generate() and a hand-written KV-cache loop reproduce the outputs.

Writes fixtures/models/<name>/{config.json, generation_config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, oracle.json}.

Usage:
    .venv-oracle/bin/python tools/oracle/generate_fixtures.py              # all fixtures
    .venv-oracle/bin/python tools/oracle/generate_fixtures.py --only llama mistral
    .venv-oracle/bin/python tools/oracle/generate_fixtures.py --list
    .venv-oracle/bin/python tools/oracle/generate_fixtures.py --online-fp8 llama   # fixtures/models/llama/oracle-online-fp8.json

Adding a model family = one Spec entry in SPECS (config class name, kwargs over BASE, optional ablation).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_common import (  # noqa: E402
    ROOT, case_record, corpus_from, greedy_generate, manual_greedy, take_tokens, versions, write_json,
)
from moe_probe import init_correction_bias, routing_probe, zero_shared_expert_gate  # noqa: E402
from dsa_probe import indexer_probe  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

TOKENIZER_DIR = ROOT / "fixtures" / "tokenizer"
MODELS_DIR = ROOT / "fixtures" / "models"
GENERATOR = "tools/oracle/generate_fixtures.py"

MAX_NEW_TOKENS = 16
DEFAULT_MIN_GAP = 5e-3  # smallest acceptable top1-top2 log-prob gap over the battery
MAX_SEED_TRIES = 60
CONST_PERTURB_STD = 0.2  # std of the noise added to parameters that init leaves constant


# --------------------------------------------------------------------------------------------
# Fixture specs
# --------------------------------------------------------------------------------------------

# Shared by every fixture; a spec's kwargs override these. Token ids match fixtures/tokenizer:
# <|endoftext|> = 0 (bos/pad), <|im_end|> = 2 (eos). pad_token_id stays out of the model config on purpose:
# nn.Embedding(padding_idx=...) would zero that embedding row.
BASE: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    initializer_range=0.3,  # HF default 0.02 gives near-flat logits (tiny top-2 gaps, repetitive output)
    bos_token_id=0,
    eos_token_id=2,
    tie_word_embeddings=False,
)

Ablation = Callable[[torch.nn.Module], None]


@dataclass
class Spec:
    name: str
    config_class: str  # a transformers config class, e.g. "LlamaConfig"
    kwargs: dict[str, Any]
    architecture: str  # the *ForCausalLM class the config maps to (checked)
    feature: str  # what this fixture exercises, for humans and the Rust tests
    save_dtype: str = "float32"  # dtype of model.safetensors; the oracle always runs in float32
    seed: int = 0  # first seed tried
    # Ablation proving the feature matters: config overrides (rebuilt with the same weights) and/or a
    # function mutating the loaded model. The battery's greedy outputs must change.
    ablate_config: dict[str, Any] | None = None
    ablate_fn: Ablation | None = None
    ablation_desc: str = ""
    notes: list[str] = field(default_factory=list)
    # Run after the constant-parameter perturbation (e.g. to randomise buffers init leaves at zero).
    init_fn: Callable[[torch.nn.Module, torch.Generator], None] | None = None
    # Checks on the saved fixture whose result goes into oracle.json (e.g. a routing probe).
    probe: Callable[[torch.nn.Module, list], dict] | None = None
    # Further features of the same fixture, each checked like the main ablation.
    extra_ablations: list["Ablate"] = field(default_factory=list)
    # Keys deleted from the saved config.json, so that the oracle (which runs on what is on disk) and
    # ferrite both fall back to the config class's defaults for them.
    strip_config_keys: list[str] = field(default_factory=list)
    # Cases of this fixture only, after the shared battery: (name, at most this many prompt tokens
    # of the corpus's software history).
    extra_prompt_tokens: list[tuple[str, int]] = field(default_factory=list)
    # Rewrites the saved config.json the way real checkpoints of the family spell it (older key
    # names, the Hub's `architectures`); the oracle then loads that spelling from disk.
    edit_saved_config: Callable[[dict[str, Any]], None] | None = None
    # Rewrites the saved model.safetensors (e.g. into a quantized checkpoint layout).
    edit_saved_weights: Callable[[Path], None] | None = None
    # For architectures whose Hugging Face class needs trust_remote_code: the fixture is built and the
    # oracle run on a transformers-native model computing the same function, then its saved tensors and
    # config are re-packed into the remote-code checkpoint layout (names, fused tensors, config keys).
    # Called as repack(tensors, config) -> (tensors, config) after every check on the native model.
    repack: Callable[[dict[str, torch.Tensor], dict[str, Any]], tuple[dict[str, torch.Tensor], dict[str, Any]]] | None = None
    # Seed filter for numerically fragile oracles (FP8 W8A8: a last-bit difference can move an activation
    # across an e4m3 rounding boundary): besides the top-2 gap, the seed's greedy tokens must be the same in
    # a float64 run and in ROBUST_PERTURBED_RUNS f32 runs whose float32 weights are moved by up to
    # ROBUST_ULPS ulps at random.
    robust: bool = False
    # Check on the saved fixture as transformers loads it (e.g. dequantized weights against the checkpoint);
    # asserts, and its result goes into oracle.json as `load_check`.
    load_check: Callable[[Path], dict] | None = None


@dataclass
class Ablate:
    desc: str
    config: dict[str, Any] | None = None
    fn: Ablation | None = None


def _tie_lm_head(model: torch.nn.Module) -> None:
    model.lm_head.weight = model.model.embed_tokens.weight


def _zero_qkv_bias(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
            p.data.zero_()


def _drop_qk_norm(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()


def _opt_position_offset_0(model: torch.nn.Module) -> None:
    model.model.decoder.embed_positions.offset = 0


def _opt_pre_norm(model: torch.nn.Module) -> None:
    for layer in model.model.decoder.layers:
        layer.do_layer_norm_before = True


def _zero_wpe(model: torch.nn.Module) -> None:
    model.transformer.wpe.weight.data.zero_()


def _zero_lm_head_bias(model: torch.nn.Module) -> None:
    model.lm_head.bias.data.zero_()


def _no_stablelm_qk_layernorm(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.self_attn.qk_layernorm = False


def _no_cohere_qk_norm(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.self_attn.use_qk_norm = False


def _unit_embed_scale(model: torch.nn.Module) -> None:
    model.model.embed_tokens.embed_scale.fill_(1.0)


def _zero_o_bias(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        if name.endswith("o_proj.bias"):
            p.data.zero_()


def _no_llama4_query_scaling(model: torch.nn.Module) -> None:
    model.config.rope_parameters["llama_4_scaling_beta"] = 0.0


def _xielu_to_relu2(model: torch.nn.Module) -> None:
    from transformers.activations import ACT2FN
    for layer in model.model.layers:
        layer.mlp.act_fn = ACT2FN["relu2"]


def _internlm3_hub_spelling(cfg: dict[str, Any]) -> None:
    cfg["architectures"] = ["InternLM3ForCausalLM"]
    cfg["qkv_bias"] = cfg.pop("attention_bias")
    cfg["bias"] = cfg.pop("mlp_bias")


def _hybrid_interval_spelling(cfg: dict[str, Any]) -> None:
    """Real Qwen3-Next / Qwen3.5 config.json files spell the layer pattern as full_attention_interval."""
    types = cfg.pop("layer_types")
    interval = types.index("full_attention") + 1
    assert types == ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(len(types))]
    cfg["full_attention_interval"] = interval


def _drop_attn_output_gate(model: torch.nn.Module) -> None:
    """Zeroes the gate half of every full-attention q_proj (sigmoid(0) = 0.5 scales instead of gating)."""
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "self_attn"):
                a = layer.self_attn
                w = a.q_proj.weight.view(-1, 2 * a.head_dim, a.q_proj.weight.shape[-1])
                w[:, a.head_dim:, :] = 0.0


def _zero_afmoe_attn_gate(model: torch.nn.Module) -> None:
    """Zeroes every attention gate_proj (sigmoid(0) = 0.5 scales instead of gating)."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.gate_proj.weight.zero_()


def _randn_params(suffix: str, std: float):
    """An init_fn drawing N(0, std) for the parameters named `...suffix`, which init leaves at zero."""

    def init(model: torch.nn.Module, gen: torch.Generator) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(suffix):
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    return init


def _drop_swa_sinks(model: torch.nn.Module) -> None:
    """Sinks far below every logit: sigmoid(lse - sink) = 1, no sink."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("self_attn.sinks"):
                p.fill_(-1e4)


def _zero_lfm3_gate(model: torch.nn.Module) -> None:
    """Zeroes every attention g_proj: sigmoid(0) = 0.5 scales each head instead of gating it."""
    with torch.no_grad():
        for layer in model.model.layers:
            if getattr(layer, "is_attention_layer", False):
                layer.self_attn.g_proj.weight.zero_()


def _drop_lfm3_sandwich(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.post_operator_norm = torch.nn.Identity()
        layer.post_ffn_norm = torch.nn.Identity()


def _drop_hyperclovax_post_norms(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.post_norm1 = torch.nn.Identity()
        layer.post_norm2 = torch.nn.Identity()


def _drop_gdn_conv(model: torch.nn.Module) -> None:
    """Makes every GatedDeltaNet's causal conv the identity (last tap 1, others 0)."""
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                w = layer.linear_attn.conv1d.weight
                w.zero_()
                w[:, :, -1] = 1.0


GDN_DIMS = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                linear_conv_kernel_dim=4)


def _repack_qwen3_5_conditional(tensors, cfg):
    """Qwen3_5ForCausalLM -> the layout real Qwen3.5 checkpoints ship: Qwen3_5ForConditionalGeneration
    with the text config nested in `text_config` (plus a vision config), the text weights under
    `model.language_model.`, and the tensors transformers ignores when loading the text model
    (a whole random vision tower `model.visual.*` and a random MTP head `mtp.*`) present."""
    text = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "dtype")}
    text["model_type"] = "qwen3_5_text"
    out = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
           for k, v in tensors.items()}
    hidden = cfg["hidden_size"]
    vision = {"model_type": "qwen3_5", "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
              "out_hidden_size": hidden, "patch_size": 4, "temporal_patch_size": 2, "num_position_embeddings": 16}
    # A whole (random) tower, as real checkpoints carry one: ferrite loads it with the text model.
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel
    torch.manual_seed(7)
    tower = Qwen3_5VisionModel._from_config(Qwen3_5VisionConfig(**vision), dtype=torch.float32)
    out.update({"model.visual." + k: v.detach().clone().contiguous() for k, v in tower.state_dict().items()})
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    out.update(_random_mtp_head(Qwen3_5TextConfig(**{k: v for k, v in text.items() if k != "model_type"})))
    new_cfg = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": cfg.get("tie_word_embeddings", False),
        "text_config": text,
        "vision_config": vision,
        "image_token_id": 990, "video_token_id": 991, "vision_start_token_id": 992, "vision_end_token_id": 993,
        "transformers_version": cfg.get("transformers_version"),
    }
    return out, new_cfg


def _random_mtp_head(cfg) -> dict[str, torch.Tensor]:
    """A random multi-token-prediction head in the layout Qwen3.5 checkpoints ship (`mtp.fc`,
    `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*` a gated full-attention
    layer, `mtp.norm`) for a Qwen3.5 text config. transformers ignores `mtp.*`; ferrite loads it for
    speculative decoding's `mtp`."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    layer = Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention"))
    gen = torch.Generator().manual_seed(11)
    # Norm weights are stored centred on zero ((1 + w) norms): small, so that they matter but do not dominate.
    rand = lambda shape, std: (torch.randn(shape, generator=gen) * std).contiguous()  # noqa: E731
    out = {f"mtp.layers.0.{k}": rand(v.shape, 0.1 if "norm" in k else cfg.initializer_range)
           for k, v in layer.state_dict().items()}
    h = cfg.hidden_size
    out["mtp.fc.weight"] = rand((h, 2 * h), cfg.initializer_range / 2**0.5)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = rand((h,), 0.1)
    return out


def _add_mtp_head(out_dir: Path) -> None:
    """edit_saved_weights hook: adds `_random_mtp_head` to the saved model.safetensors."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    path = out_dir / "model.safetensors"
    tensors = load_file(str(path))
    tensors.update(_random_mtp_head(AutoConfig.from_pretrained(out_dir)))
    save_file(tensors, str(path), metadata={"format": "pt"})




MTP_REFERENCE_SEQUENCES = [list(range(3, 40)), [5, 9, 5, 9, 5, 9, 17, 250, 3, 99] * 4, list(range(900, 860, -2))]


def _decoder_layer_class(cfg):
    """The decoder layer class of a DeepSeek-V3 or GLM-4.5 config: their MTP layers are one more of it."""
    if cfg.model_type == "glm4_moe":
        from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer, Glm4MoeRMSNorm
        return Glm4MoeDecoderLayer, Glm4MoeRMSNorm
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm
    return DeepseekV3DecoderLayer, DeepseekV3RMSNorm


def _add_deepseek_mtp_layer(out_dir: Path) -> None:
    """edit_saved_weights hook: adds a random MTP layer in DeepSeek-V3 checkpoints' layout (GLM-4.5's too):
    layer `num_hidden_layers` (real V3: 61) holding `embed_tokens` (the model's), `enorm`, `hnorm`, `eh_proj`,
    a whole decoder layer (MoE past first_k_dense_replace) and `shared_head.{norm, head}`. transformers
    ignores it; ferrite loads it for speculative decoding's `mtp`."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    path = out_dir / "model.safetensors"
    tensors = load_file(str(path))
    dtype = tensors["model.embed_tokens.weight"].dtype
    cfg = AutoConfig.from_pretrained(out_dir)
    n, h = cfg.num_hidden_layers, cfg.hidden_size
    layer = _decoder_layer_class(cfg)[0](cfg, n)
    gen = torch.Generator().manual_seed(13)
    rand = lambda shape, std: (torch.randn(shape, generator=gen) * std)  # noqa: E731
    new = {}
    for k, v in layer.state_dict().items():
        if "norm" in k:
            new[k] = 1 + rand(v.shape, 0.1)
        elif "e_score_correction_bias" in k or k.endswith(".bias"):
            new[k] = rand(v.shape, 0.1)
        else:
            new[k] = rand(v.shape, cfg.initializer_range)
    new["embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    new["eh_proj.weight"] = rand((h, 2 * h), cfg.initializer_range)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        new[f"{norm}.weight"] = 1 + rand((h,), 0.1)
    new["shared_head.head.weight"] = rand((cfg.vocab_size, h), cfg.initializer_range)
    tensors.update({f"model.layers.{n}.{k}": v.to(dtype).contiguous() for k, v in new.items()})
    save_file(tensors, str(path), metadata={"format": "pt"})


def _deepseek_mtp_reference(out_dir: Path) -> dict[str, Any]:
    """load_check hook: the DeepSeek (or GLM-4.5) MTP layer's predictions, as vLLM's
    DeepSeekMultiTokenPredictorLayer (Glm4MoeMultiTokenPredictorLayer) computes them with transformers'
    modules: the next token's embedding (zeroed at position 0) and the model's final hidden state, each normed (enorm, hnorm), joined by eh_proj, through the decoder layer
    (causal, rotary at the same positions), then shared_head's norm and head. Per sequence: the argmax and
    its logit at every position."""
    from safetensors.torch import load_file
    from transformers.masking_utils import create_causal_mask

    model = load_fixture(out_dir)
    cfg = model.config
    DecoderLayer, RMSNorm = _decoder_layer_class(cfg)
    n, h = cfg.num_hidden_layers, cfg.hidden_size
    prefix = f"model.layers.{n}."
    mtp = {k[len(prefix):]: v.float() for k, v in load_file(str(out_dir / "model.safetensors")).items()
           if k.startswith(prefix)}
    layer = DecoderLayer(cfg, n).float()
    layer.load_state_dict({k: v for k, v in mtp.items() if k.split(".")[0] in ("self_attn", "mlp", "input_layernorm",
                                                                               "post_attention_layernorm")})
    norms = {}
    for name in ("enorm", "hnorm", "shared_head.norm"):
        norms[name] = RMSNorm(h, eps=cfg.rms_norm_eps)
        norms[name].load_state_dict({"weight": mtp[f"{name}.weight"]})
    eh_proj = torch.nn.Linear(2 * h, h, bias=False)
    eh_proj.load_state_dict({"weight": mtp["eh_proj.weight"]})
    head = torch.nn.Linear(h, cfg.vocab_size, bias=False)
    head.load_state_dict({"weight": mtp["shared_head.head.weight"]})
    out = []
    with torch.no_grad():
        for seq in MTP_REFERENCE_SEQUENCES:
            ids = torch.tensor([seq])
            hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
            embeds = torch.nn.functional.embedding(ids[:, 1:], mtp["embed_tokens.weight"])
            embeds[:, 0] = 0
            x = eh_proj(torch.cat([norms["enorm"](embeds), norms["hnorm"](hidden)], -1))
            positions = torch.arange(x.shape[1])[None]
            rotary = model.model.rotary_emb(x, positions)
            mask = create_causal_mask(config=cfg, inputs_embeds=x, attention_mask=None, cache=None,
                                      position_ids=positions)
            y = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
            logits = head(norms["shared_head.norm"](y))[0]
            top = logits.max(-1)
            out.append({"tokens": seq, "argmax": top.indices.tolist(), "max_logit": top.values.tolist()})
    return {"mtp_reference": out}


def _mtp_reference(out_dir: Path) -> dict[str, Any]:
    """load_check hook: what the MTP head predicts, computed as vLLM's Qwen3NextMultiTokenPredictor does
    with transformers' own modules. At each position i of a sequence the head reads the model's final
    hidden state at i (after the last norm) and the embedding of token i + 1, joined by `fc` after their
    norms, runs its decoder layer over positions 0..i (causal, rotary at the same positions), and its
    norm and the model's LM head give the logits of token i + 2. Per sequence: the argmax and its logit
    at every position."""
    from safetensors.torch import load_file
    from transformers.masking_utils import create_causal_mask
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

    model = load_fixture(out_dir)
    cfg = model.config
    mtp = {k[len("mtp."):]: v for k, v in load_file(str(out_dir / "model.safetensors")).items() if k.startswith("mtp.")}
    layer = Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention"))
    layer.load_state_dict({k[len("layers.0."):]: v for k, v in mtp.items() if k.startswith("layers.0.")})
    norms = {}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        norms[n] = Qwen3_5RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        norms[n].load_state_dict({"weight": mtp[f"{n}.weight"]})
    fc = torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
    fc.load_state_dict({"weight": mtp["fc.weight"]})
    out = []
    with torch.no_grad():
        for seq in MTP_REFERENCE_SEQUENCES:
            ids = torch.tensor([seq])
            hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
            embeds = model.model.embed_tokens(ids[:, 1:])
            x = fc(torch.cat([norms["pre_fc_norm_embedding"](embeds), norms["pre_fc_norm_hidden"](hidden)], -1))
            positions = torch.arange(x.shape[1])[None]
            rotary = model.model.rotary_emb(x, positions[None].expand(3, 1, -1))
            mask = create_causal_mask(config=cfg, inputs_embeds=x, attention_mask=None, cache=None,
                                      position_ids=positions)
            y = norms["norm"](layer(x, position_embeddings=rotary, attention_mask=mask, position_ids=positions))
            logits = model.lm_head(y)[0]
            top = logits.max(-1)
            out.append({"tokens": seq, "argmax": top.indices.tolist(), "max_logit": top.values.tolist()})
    return {"mtp_reference": out}


# Two EAGLE-3 heads for the llama-eagle3 target, in subdirectories of its fixture: `eagle3/` in the
# Hugging Face layout (LlamaForCausalLMEagle3, `midlayer.*`, the target's embeddings shared, vLLM's
# default aux layers) and `eagle3-speculators/` in the speculators format (`transformer_layer_config`,
# `layers.0.*`, its own embeddings, aux layers given, norm_before_residual by the format's default).
EAGLE3_HEADS = {
    "eagle3": dict(speculators=False, seed=17, aux=None),
    "eagle3-speculators": dict(speculators=True, seed=19, aux=[1, 3, 6]),
}
EAGLE3_DRAFT_VOCAB = 400


def _eagle3_layer_config(target_cfg) -> dict[str, Any]:
    return dict(
        model_type="llama", hidden_size=target_cfg.hidden_size, intermediate_size=96, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        rms_norm_eps=1e-6, vocab_size=target_cfg.vocab_size, hidden_act="silu", tie_word_embeddings=False,
        rope_theta=5000.0,
    )


def _add_eagle3_heads(out_dir: Path) -> None:
    """edit_saved_weights hook: writes the random EAGLE-3 heads of EAGLE3_HEADS beside the target. The
    draft vocabulary is EAGLE3_DRAFT_VOCAB target tokens (a random subset, in id order, as `d2t`
    offsets), the other target tokens unreachable."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(out_dir)
    embed = load_file(str(out_dir / "model.safetensors"))["model.embed_tokens.weight"]
    h, layer_cfg = target.hidden_size, _eagle3_layer_config(target)
    heads, kv, hd, inter = 4, 2, 16, layer_cfg["intermediate_size"]
    for name, spec in EAGLE3_HEADS.items():
        gen = torch.Generator().manual_seed(spec["seed"])
        rand = lambda shape, std: (torch.randn(shape, generator=gen) * std).contiguous()  # noqa: E731
        layer = "layers.0" if spec["speculators"] else "midlayer"
        t = {
            f"{layer}.self_attn.q_proj.weight": rand((heads * hd, 2 * h), 0.15),
            f"{layer}.self_attn.k_proj.weight": rand((kv * hd, 2 * h), 0.15),
            f"{layer}.self_attn.v_proj.weight": rand((kv * hd, 2 * h), 0.15),
            f"{layer}.self_attn.o_proj.weight": rand((h, heads * hd), 0.15),
            f"{layer}.mlp.gate_proj.weight": rand((inter, h), 0.15),
            f"{layer}.mlp.up_proj.weight": rand((inter, h), 0.15),
            f"{layer}.mlp.down_proj.weight": rand((h, inter), 0.15),
            "fc.weight": rand((h, 3 * h), 0.1),
            "lm_head.weight": rand((EAGLE3_DRAFT_VOCAB, h), 0.3),
        }
        for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            t[f"{layer}.{norm}.weight"] = 1 + rand((h,), 0.1)
        t["norm.weight"] = 1 + rand((h,), 0.1)
        chosen = torch.randperm(target.vocab_size, generator=gen)[:EAGLE3_DRAFT_VOCAB].sort().values
        t["d2t"] = (chosen - torch.arange(EAGLE3_DRAFT_VOCAB)).to(torch.int64)
        t["t2d"] = torch.zeros(target.vocab_size, dtype=torch.bool).index_fill_(0, chosen, True)
        if spec["speculators"]:
            t["embed_tokens.weight"] = (embed + rand(embed.shape, 0.2)).contiguous()
            cfg = {
                "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                "transformer_layer_config": layer_cfg, "draft_vocab_size": EAGLE3_DRAFT_VOCAB,
                "eagle_aux_hidden_state_layer_ids": spec["aux"],
                "speculators_config": {"algorithm": "eagle3",
                                       "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                       "verifier": {"name_or_path": "llama-eagle3"}},
            }
        else:
            cfg = dict(layer_cfg, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=EAGLE3_DRAFT_VOCAB)
        head_dir = out_dir / name
        head_dir.mkdir(exist_ok=True)
        save_file(t, str(head_dir / "model.safetensors"), metadata={"format": "pt"})
        (head_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


EAGLE3_REFERENCE_SEQUENCES = [list(range(3, 40)), [5, 9, 5, 9, 5, 9, 17, 250, 3, 99] * 4]


def _eagle3_reference(out_dir: Path) -> dict[str, Any]:
    """load_check hook: each head's drafts, computed as vLLM's llama_eagle3 runs it with torch and
    transformers' modules. At position i the head reads the embedding of token i + 1 and `fc` of the
    target's residual stream entering its aux layers at i (vLLM's default (2, L // 2, L - 3) unless the
    config gives ids); its layer attends over the normed embedding and normed hidden state side by side
    (residual: the hidden state, or its norm with norm_before_residual), and the final norm and LM head
    give draft-vocabulary logits, mapped to target ids by d2t. Per sequence: the target-vocabulary argmax
    at every position, and the chain of 3 drafts after the sequence (each further draft feeds the
    previous one at the next position with the head's output before its final norm)."""
    from safetensors.torch import load_file
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    model = load_fixture(out_dir)
    n_layers = model.config.num_hidden_layers
    captured: dict[int, torch.Tensor] = {}
    for j, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(
            lambda mod, args, kwargs, j=j: captured.__setitem__(j, (args[0] if args else kwargs["hidden_states"])),
            with_kwargs=True)
    out = {}
    for name, spec in EAGLE3_HEADS.items():
        head_dir = out_dir / name
        raw = json.loads((head_dir / "config.json").read_text())
        layer_cfg = raw.get("transformer_layer_config", raw)
        nbr = raw.get("norm_before_residual", spec["speculators"])
        aux = sorted(raw.get("eagle_aux_hidden_state_layer_ids") or [2, n_layers // 2, n_layers - 3])
        cfg = LlamaConfig(**{k: v for k, v in layer_cfg.items() if k not in ("model_type", "architectures")})
        cfg._attn_implementation = "eager"
        w = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(head_dir / "model.safetensors")).items()}
        prefix = "layers.0." if spec["speculators"] else "midlayer."
        layer = LlamaDecoderLayer(cfg, 0)
        h, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            setattr(layer.self_attn, proj, torch.nn.Linear(2 * h, rows, bias=False))
        layer.load_state_dict({k[len(prefix):]: v for k, v in w.items()
                               if k.startswith(prefix) and "hidden_norm" not in k})
        layer.eval()
        hidden_norm, norm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps), LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        hidden_norm.load_state_dict({"weight": w[prefix + "hidden_norm.weight"]})
        norm.load_state_dict({"weight": w["norm.weight"]})
        fc = torch.nn.Linear(3 * h, h, bias=False)
        fc.load_state_dict({"weight": w["fc.weight"]})
        lm_head = torch.nn.Linear(h, w["lm_head.weight"].shape[0], bias=False)
        lm_head.load_state_dict({"weight": w["lm_head.weight"]})
        embed = w.get("embed_tokens.weight", model.model.embed_tokens.weight.detach())
        to_target = torch.arange(w["d2t"].shape[0]) + w["d2t"]
        rotary = LlamaRotaryEmbedding(cfg)

        def run(tokens: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """The head over rows (token after each position, hidden state); positions 0.. in order."""
            e = layer.input_layernorm(torch.nn.functional.embedding(tokens, embed))
            hn = hidden_norm(x)
            residual = hn if nbr else x
            positions = torch.arange(x.shape[1])[None]
            mask = create_causal_mask(config=cfg, inputs_embeds=x, attention_mask=None, cache=None,
                                      position_ids=positions)
            a, _ = layer.self_attn(torch.cat([e, hn], -1), position_embeddings=rotary(x, positions),
                                   attention_mask=mask)
            y = residual + a
            prenorm = y + layer.mlp(layer.post_attention_layernorm(y))
            logits = lm_head(norm(prenorm))[0]
            top = logits.max(-1)
            return to_target[top.indices], top.values, prenorm

        seqs = []
        with torch.no_grad():
            for seq in EAGLE3_REFERENCE_SEQUENCES:
                ids = torch.tensor([seq])
                model(input_ids=ids)
                joined = torch.cat([captured[j] for j in aux], -1)[:, :-1]
                x = fc(joined)
                argmax, max_logit, prenorm = run(ids[:, 1:], x)
                chain, tokens = [int(argmax[-1])], ids[:, 1:]
                for _ in range(2):
                    tokens = torch.cat([tokens, torch.tensor([[chain[-1]]])], -1)
                    x = torch.cat([x, prenorm[:, -1:]], 1)
                    step, _, prenorm = run(tokens, x)
                    chain.append(int(step[-1]))
                seqs.append({"tokens": seq, "argmax": argmax.tolist(), "max_logit": max_logit.tolist(),
                             "chain": chain})
        out[name] = {"aux_layers": aux, "norm_before_residual": nbr, "sequences": seqs}
    return {"eagle3_reference": out}


# Two EAGLE-1 heads for the llama-eagle3 target beside its EAGLE-3 ones, in the EAGLE repository's
# layout (config `LlamaForCausalLM`, `layers.0.*` without an input norm, `fc` over [embedding,
# hidden]): `eagle/` with `fc.bias` and the target's embeddings and LM head, `eagle-hass/` with
# HASS's two input norms (`add_para_norm`), no fc bias, its own embeddings and LM head.
EAGLE_HEADS = {
    "eagle": dict(seed=23, hass=False),
    "eagle-hass": dict(seed=29, hass=True),
}


def _add_eagle_heads(out_dir: Path) -> None:
    """edit_saved_weights hook: the EAGLE-3 heads of EAGLE3_HEADS and the EAGLE-1 heads of EAGLE_HEADS."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    _add_eagle3_heads(out_dir)
    target = AutoConfig.from_pretrained(out_dir)
    saved = load_file(str(out_dir / "model.safetensors"))
    h, layer_cfg = target.hidden_size, _eagle3_layer_config(target)
    heads, kv, hd, inter = 4, 2, 16, layer_cfg["intermediate_size"]
    for name, spec in EAGLE_HEADS.items():
        gen = torch.Generator().manual_seed(spec["seed"])
        rand = lambda shape, std: (torch.randn(shape, generator=gen) * std).contiguous()  # noqa: E731
        t = {
            "layers.0.self_attn.q_proj.weight": rand((heads * hd, h), 0.15),
            "layers.0.self_attn.k_proj.weight": rand((kv * hd, h), 0.15),
            "layers.0.self_attn.v_proj.weight": rand((kv * hd, h), 0.15),
            "layers.0.self_attn.o_proj.weight": rand((h, heads * hd), 0.15),
            "layers.0.mlp.gate_proj.weight": rand((inter, h), 0.15),
            "layers.0.mlp.up_proj.weight": rand((inter, h), 0.15),
            "layers.0.mlp.down_proj.weight": rand((h, inter), 0.15),
            "layers.0.post_attention_layernorm.weight": 1 + rand((h,), 0.1),
            "fc.weight": rand((h, 2 * h), 0.1),
        }
        cfg = dict(layer_cfg, architectures=["LlamaForCausalLM"])
        if spec["hass"]:
            t["embedding_layernorm.weight"] = 1 + rand((h,), 0.1)
            t["hidden_states_layernorm.weight"] = 1 + rand((h,), 0.1)
            t["embed_tokens.weight"] = (saved["model.embed_tokens.weight"] + rand((target.vocab_size, h), 0.2)).contiguous()
            t["lm_head.weight"] = (saved["lm_head.weight"] + rand((target.vocab_size, h), 0.2)).contiguous()
            cfg.update(add_para_norm=True, bias=False)
        else:
            t["fc.bias"] = rand((h,), 0.1)
            cfg.update(bias=True)
        head_dir = out_dir / name
        head_dir.mkdir(exist_ok=True)
        save_file(t, str(head_dir / "model.safetensors"), metadata={"format": "pt"})
        (head_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def _eagle_reference(out_dir: Path) -> dict[str, Any]:
    """load_check hook: _eagle3_reference, and each EAGLE-1 head's drafts computed as vLLM's
    llama_eagle runs it with torch and transformers' modules. At position i the head reads the
    embedding of token i + 1 and the target's final-norm output at i (each through its HASS norm where
    the head has them), joined by `fc`; its one Llama layer has no input norm, and the LM head (its own,
    else the target's) reads the layer's output with no final norm. Per sequence: the argmax at every
    position and the chain of 3 drafts after the sequence (each further draft feeds the previous one at
    the next position with the head's own output as the hidden state)."""
    from safetensors.torch import load_file
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    out = _eagle3_reference(out_dir)
    model = load_fixture(out_dir)
    final: dict[str, torch.Tensor] = {}
    model.model.norm.register_forward_hook(lambda mod, args, output: final.__setitem__("h", output))
    heads = {}
    for name, spec in EAGLE_HEADS.items():
        head_dir = out_dir / name
        raw = json.loads((head_dir / "config.json").read_text())
        cfg = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures", "bias", "add_para_norm")})
        cfg._attn_implementation = "eager"
        w = load_file(str(head_dir / "model.safetensors"))
        layer = LlamaDecoderLayer(cfg, 0)
        layer.input_layernorm = torch.nn.Identity()
        layer.load_state_dict({k[len("layers.0."):]: v for k, v in w.items() if k.startswith("layers.0.")})
        layer.eval()
        h = cfg.hidden_size
        fc = torch.nn.Linear(2 * h, h, bias="fc.bias" in w)
        fc.load_state_dict({k[len("fc."):]: v for k, v in w.items() if k.startswith("fc.")})
        norms = None
        if spec["hass"]:
            norms = (LlamaRMSNorm(h, eps=cfg.rms_norm_eps), LlamaRMSNorm(h, eps=cfg.rms_norm_eps))
            norms[0].load_state_dict({"weight": w["embedding_layernorm.weight"]})
            norms[1].load_state_dict({"weight": w["hidden_states_layernorm.weight"]})
        embed = w.get("embed_tokens.weight", model.model.embed_tokens.weight.detach())
        lm_head = w.get("lm_head.weight", model.lm_head.weight.detach())
        rotary = LlamaRotaryEmbedding(cfg)

        def run(tokens: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """The head over rows (token after each position, hidden state); positions 0.. in order."""
            e = torch.nn.functional.embedding(tokens, embed)
            if norms:
                e, x = norms[0](e), norms[1](x)
            y0 = fc(torch.cat([e, x], -1))
            positions = torch.arange(x.shape[1])[None]
            mask = create_causal_mask(config=cfg, inputs_embeds=x, attention_mask=None, cache=None,
                                      position_ids=positions)
            a, _ = layer.self_attn(y0, position_embeddings=rotary(x, positions), attention_mask=mask)
            y = y0 + a
            y = y + layer.mlp(layer.post_attention_layernorm(y))
            top = (y @ lm_head.T)[0].max(-1)
            return top.indices, top.values, y

        seqs = []
        with torch.no_grad():
            for seq in EAGLE3_REFERENCE_SEQUENCES:
                ids = torch.tensor([seq])
                model(input_ids=ids)
                x = final["h"][:, :-1]
                argmax, max_logit, y = run(ids[:, 1:], x)
                chain, tokens = [int(argmax[-1])], ids[:, 1:]
                for _ in range(2):
                    tokens = torch.cat([tokens, torch.tensor([[chain[-1]]])], -1)
                    x = torch.cat([x, y[:, -1:]], 1)
                    step, _, y = run(tokens, x)
                    chain.append(int(step[-1]))
                seqs.append({"tokens": seq, "argmax": argmax.tolist(), "max_logit": max_logit.tolist(),
                             "chain": chain})
        heads[name] = {"sequences": seqs}
    return dict(out, eagle_reference=heads)


def _python_infinity_spelling(cfg: dict[str, Any]) -> None:
    """Real Mamba2 / Nemotron-H config.json files spell the open dt limit as Python's bare Infinity
    (transformers 5 writes {"__float__": "Infinity"} instead)."""
    cfg["time_step_limit"] = [0.0, float("inf")]


def _drop_mamba_skip(model: torch.nn.Module) -> None:
    """Zeroes every Mamba2 mixer's D (the skip connection around the scan)."""
    with torch.no_grad():
        for layer in model.backbone.layers:
            layer.mixer.D.zero_()


def _mamba_conv_identity(model: torch.nn.Module) -> None:
    """Makes every Mamba2 mixer's causal conv the identity (last tap 1, others and bias 0)."""
    with torch.no_grad():
        for layer in model.backbone.layers:
            w = layer.mixer.conv1d.weight
            w.zero_()
            w[:, :, -1] = 1.0
            if layer.mixer.conv1d.bias is not None:
                layer.mixer.conv1d.bias.zero_()


def _mamba_scalar_a(model: torch.nn.Module) -> None:
    """Gives every Mamba (1) channel one A for all its state entries (Mamba2's scalar-per-head form)."""
    with torch.no_grad():
        for name, a in model.named_parameters():
            if name.endswith("A_log"):
                a.copy_(a[:, :1].expand_as(a))


def _jamba_unit_ssm_norms(model: torch.nn.Module) -> None:
    """Sets the weights of Jamba's dt/B/C RMSNorms to one (Falcon-Mamba's weightless form)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("dt_layernorm.weight", "b_layernorm.weight", "c_layernorm.weight")):
                p.fill_(1.0)


def _exaone_hub_spelling(cfg: dict[str, Any]) -> None:
    """EXAONE 3.x config.json files: their own key names (transformers' attribute_map), the
    ExaoneForCausalLM architecture and a top-level rope_theta."""
    cfg["architectures"] = ["ExaoneForCausalLM"]
    for hf, exaone in [("num_hidden_layers", "num_layers"), ("rms_norm_eps", "layer_norm_epsilon"),
                       ("hidden_act", "activation_function")]:
        cfg[exaone] = cfg.pop(hf)
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]


def _phimoe_hub_spelling(cfg: dict[str, Any]) -> None:
    """Phi-3.5-MoE's config.json names the architecture PhiMoEForCausalLM (vLLM's registry name too)."""
    cfg["architectures"] = ["PhiMoEForCausalLM"]


def _nemotron_h_hub_spelling(cfg: dict[str, Any]) -> None:
    """Real Nemotron-H config.json files: the layer pattern as hybrid_override_pattern (M mamba, * attention,
    - MLP), and time_step_limit with Python's bare Infinity."""
    chars = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
    cfg["hybrid_override_pattern"] = "".join(chars[t] for t in cfg.pop("layers_block_type"))
    cfg["time_step_limit"] = [0.0, float("inf")]


def _nemotron_h_mixer_conv_identity(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.block_type == "linear_attention":
                w = layer.mixer.conv1d.weight
                w.zero_()
                w[:, :, -1] = 1.0


def _nemotron_hub_spelling(cfg: dict[str, Any]) -> None:
    """Real Nemotron config.json files: rope_theta at the top, no partial_rotary_factor (0.5 by default)."""
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]


def _lfm2_hub_spelling(cfg: dict[str, Any]) -> None:
    """Real LFM2 config.json files: the attention layers as full_attn_idxs, block_ff_dim, tie_embedding."""
    cfg["full_attn_idxs"] = [i for i, t in enumerate(cfg.pop("layer_types")) if t == "full_attention"]
    cfg["block_ff_dim"] = cfg.pop("intermediate_size")
    cfg["tie_embedding"] = cfg.pop("tie_word_embeddings")


def _lfm2_conv_identity(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for layer in model.model.layers:
            if not layer.is_attention_layer:
                w = layer.conv.conv.weight
                w.zero_()
                w[:, :, -1] = 1.0


def _init_lfm2_expert_bias(model: torch.nn.Module, gen: torch.Generator) -> None:
    """LFM2-MoE's expert_bias starts at zero: random, so that it steers the choice of experts."""
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("expert_bias"):
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)


def _lfm2_moe_drop_expert_bias(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("expert_bias"):
                buf.zero_()


def _granite_hybrid_hub_spelling(cfg: dict[str, Any]) -> None:
    """Real Granite 4.0-H config.json files spell layer kinds "mamba" / "attention" and time_step_limit with
    Python's bare Infinity."""
    names = {"linear_attention": "mamba", "full_attention": "attention"}
    cfg["layer_types"] = [names[t] for t in cfg["layer_types"]]
    cfg["time_step_limit"] = [0.0, float("inf")]


def _falcon_h1_hub_spelling(cfg: dict[str, Any]) -> None:
    """Real Falcon-H1 config.json files (written by transformers 4.x) keep rope_theta at the top level."""
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]


def _zamba2_hub_spelling(cfg: dict[str, Any]) -> None:
    """Real Zamba2 config.json files (written by transformers 4.x): Mamba layers as "mamba" in
    layers_block_type, rope_theta at the top level."""
    cfg["layers_block_type"] = ["mamba" if t == "linear_attention" else t for t in cfg["layers_block_type"]]
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]


def _zamba2_shared_blocks(model: torch.nn.Module, gen: torch.Generator) -> None:
    """The shared attention's q and k projections (and their adapters' up projections) scaled by 0.4: with
    its input twice the hidden size wide and its (head_dim / 2)^-0.5 scale, initializer_range 0.3 makes it
    near-argmax, so chaotic that transformers' own f32 and f64 runs differ by 3.5e-3 nats. Then every
    invocation of a block gets the first invocation's weights, as in real checkpoints: transformers 5.24 ties
    the copies only with tie_word_embeddings on; untied, each hybrid layer keeps (and saves) its own copy,
    which the constant-parameter perturbation would otherwise make differ."""
    layers = model.model.layers
    hybrid = [i for i, t in enumerate(model.config.layers_block_type) if t == "hybrid"]
    sources = [layers[i].shared_transformer for i in hybrid[: model.config.num_mem_blocks]]
    with torch.no_grad():
        for block in sources:
            for name, p in block.self_attn.named_parameters():
                if name.startswith(("q_proj", "k_proj", "linear_q_adapter_list", "linear_k_adapter_list")) and (
                    "proj" in name or name.endswith(".1.weight")
                ):
                    p.mul_(0.4)
        for n, i in enumerate(hybrid):
            src = sources[n % model.config.num_mem_blocks]
            if layers[i].shared_transformer is not src:
                layers[i].shared_transformer.load_state_dict(src.state_dict())


def _zamba2_zero_attention_adapters(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "_adapter_list." in name and "self_attn" in name:
                p.zero_()


def _zamba2_zero_mlp_adapters(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gate_up_proj_adapter_list." in name:
                p.zero_()


def _zamba2_drop_embeddings_half(model: torch.nn.Module) -> None:
    """The shared blocks' input norm weight zeroed over the original-embedding half of its input."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("shared_transformer.input_layernorm.weight"):
                p[model.config.hidden_size:] = 0.0


def _kimi_linear_hub_spelling(cfg: dict[str, Any]) -> None:
    """Real Kimi-Linear config.json files (remote code): the layer split and the KDA shape only in
    linear_attn_config (1-indexed full_attn_layers / kda_layers, head_dim, num_heads, short_conv_kernel_size),
    first_k_dense_replace in place of mlp_layer_types."""
    for k in ("layer_types", "mlp_layer_types", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim"):
        cfg.pop(k, None)


def _kimi_linear_head_decay(model: torch.nn.Module) -> None:
    """KDA's per-channel decay collapsed to one decay per head: f_b_proj's rows and dt_bias averaged over
    each head's channels."""
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.self_attn, "forget_gate", None)
            if gate is None:
                continue
            h, d = gate.num_heads, gate.head_dim
            w = gate.f_b_proj.weight.view(h, d, -1)
            w.copy_(w.mean(dim=1, keepdim=True).expand_as(w).clone())
            b = gate.dt_bias.view(h, d)
            b.copy_(b.mean(dim=1, keepdim=True).expand_as(b).clone())


def _drop_hunyuan_qk_norm(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.self_attn.query_layernorm = torch.nn.Identity()
        layer.self_attn.key_layernorm = torch.nn.Identity()


def _drop_glm4_sandwich_norms(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.post_self_attn_layernorm = torch.nn.Identity()
        layer.post_mlp_layernorm = torch.nn.Identity()


def _granite_router_full_softmax(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        router = layer.block_sparse_moe.router

        def forward(h, r=router):
            logits = torch.nn.functional.linear(h, r.weight).float()
            weights, index = logits.softmax(dim=-1).topk(r.top_k, dim=-1)
            return logits, weights.type_as(h), index

        router.forward = forward


def _zero_granite_shared_mlp(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.shared_mlp.output_linear.weight.data.zero_()


def _zero_correction_bias(model: torch.nn.Module) -> None:
    for name, t in list(model.named_buffers()) + list(model.named_parameters()):
        if name.endswith("e_score_correction_bias"):
            t.data.zero_()


def _init_param_correction_bias(std: float):
    """ERNIE's e_score_correction_bias is a parameter: replace the generic N(0, 0.2) by N(0, std)."""

    def init(model: torch.nn.Module, gen: torch.Generator) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("e_score_correction_bias"):
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    return init


def _drop_llama4_qk_norm(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        if hasattr(layer.self_attn, "qk_norm"):
            del layer.self_attn.qk_norm


def _llama4_weight_expert_outputs(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        moe = layer.feed_forward
        if not hasattr(moe, "router"):
            continue

        def forward(hidden_states, m=moe):
            hidden_states = hidden_states.reshape(-1, m.hidden_dim)
            scores, logits = m.router(hidden_states)
            routed = m.experts(hidden_states.repeat(scores.shape[1], 1))
            routed = routed * scores.transpose(0, 1).reshape(-1, 1)
            out = m.shared_expert(hidden_states)
            out.add_(routed.reshape(scores.shape[1], -1, routed.shape[-1]).sum(dim=0))
            return out, logits

        moe.forward = forward


# --------------------------------------------------------------------------------------------
# Re-packing native fixtures into remote-code layouts (see Spec.repack)
# --------------------------------------------------------------------------------------------

_REMOTE_KEEP = ("bos_token_id", "eos_token_id", "vocab_size", "hidden_size", "tie_word_embeddings",
                "initializer_range")


def _layers(cfg: dict[str, Any]) -> range:
    return range(cfg["num_hidden_layers"])


def _renamed(tensors: dict[str, torch.Tensor], names: dict[str, str]) -> dict[str, torch.Tensor]:
    """Every tensor under its new name; a name not in `names` is an error (nothing dropped silently)."""
    missing = sorted(set(tensors) - set(names))
    assert not missing, ("no remote name for", missing)
    return {names[k]: v for k, v in tensors.items()}


def _repack_internlm2(tensors, cfg):
    """Llama (attention_bias) -> InternLM2: `wqkv` fused per KV group as [q_0..q_{n-1}, k, v] heads,
    InternLM2's module names, and the remote InternLM2Config keys (`bias`, `rope_theta`)."""
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg["hidden_size"] // heads
    assert cfg.get("head_dim", d) == d and cfg["attention_bias"] and not cfg["mlp_bias"]
    out, names = {}, {}
    for i in _layers(cfg):
        a, b = f"model.layers.{i}.self_attn", f"model.layers.{i}.attention"
        for leaf in ("weight", "bias"):
            q, k, v = (tensors.pop(f"{a}.{p}_proj.{leaf}") for p in "qkv")
            rest = q.shape[1:]
            fused = torch.cat([q.reshape(kv, heads // kv, d, *rest), k.reshape(kv, 1, d, *rest),
                               v.reshape(kv, 1, d, *rest)], dim=1)
            out[f"{b}.wqkv.{leaf}"] = fused.reshape(-1, *rest).contiguous()
        m, f = f"model.layers.{i}.mlp", f"model.layers.{i}.feed_forward"
        names.update({f"{a}.o_proj.weight": f"{b}.wo.weight", f"{a}.o_proj.bias": f"{b}.wo.bias",
                      f"{m}.gate_proj.weight": f"{f}.w1.weight", f"{m}.up_proj.weight": f"{f}.w3.weight",
                      f"{m}.down_proj.weight": f"{f}.w2.weight",
                      f"model.layers.{i}.input_layernorm.weight": f"model.layers.{i}.attention_norm.weight",
                      f"model.layers.{i}.post_attention_layernorm.weight": f"model.layers.{i}.ffn_norm.weight"})
    names.update({"model.embed_tokens.weight": "model.tok_embeddings.weight", "model.norm.weight": "model.norm.weight",
                  "lm_head.weight": "output.weight"})
    out.update(_renamed(tensors, names))
    rope = cfg["rope_parameters"]
    assert rope["rope_type"] == "default", rope
    remote = {k: cfg[k] for k in _REMOTE_KEEP + ("intermediate_size", "num_hidden_layers", "num_attention_heads",
                                                  "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
                                                  "hidden_act")}
    remote.update(architectures=["InternLM2ForCausalLM"], model_type="internlm2", bias=True,
                  rope_theta=rope["rope_theta"], rope_scaling=None,
                  auto_map={"AutoConfig": "configuration_internlm2.InternLM2Config",
                            "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"})
    return out, remote


def _repack_minicpm(tensors, cfg):
    """Granite -> MiniCPM: the tensors keep their names; the multipliers become MiniCPM's keys
    (embedding_multiplier = scale_emb, residual_multiplier = scale_depth / sqrt(layers),
    logits_scaling = hidden_size / dim_model_base, attention_multiplier = head_dim^-0.5)."""
    layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    scale_depth = MINICPM_SCALE_DEPTH
    assert cfg["residual_multiplier"] == scale_depth / math.sqrt(layers), cfg["residual_multiplier"]
    assert cfg["attention_multiplier"] == (hidden // cfg["num_attention_heads"]) ** -0.5
    dim_model_base = hidden / cfg["logits_scaling"]
    rope = cfg["rope_parameters"]
    assert rope["rope_type"] == "default", rope
    remote = {k: cfg[k] for k in _REMOTE_KEEP + ("intermediate_size", "num_hidden_layers", "num_attention_heads",
                                                  "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
                                                  "hidden_act", "attention_bias")}
    remote.update(architectures=["MiniCPMForCausalLM"], model_type="minicpm", scale_emb=cfg["embedding_multiplier"],
                  scale_depth=scale_depth, dim_model_base=dim_model_base, rope_theta=rope["rope_theta"],
                  rope_scaling=None,
                  auto_map={"AutoConfig": "configuration_minicpm.MiniCPMConfig",
                            "AutoModelForCausalLM": "modeling_minicpm.MiniCPMForCausalLM"})
    return tensors, remote


def _repack_chatglm(tensors, cfg):
    """GLM -> ChatGLM (chatglm2/3, glm-4-9b-chat): `query_key_value` = [q; k; v] rows, the MLP's
    `gate_up_proj` as `dense_h_to_4h`, ChatGLM's `transformer.*` names and ChatGLMConfig keys
    (rope base = 10000 * rope_ratio, rotary on half of kv_channels, adjacent pairs: original_rope)."""
    heads, d = cfg["num_attention_heads"], cfg["head_dim"]
    rope = cfg["rope_parameters"]
    assert rope["rope_type"] == "default" and rope["partial_rotary_factor"] == 0.5, rope
    assert cfg["attention_bias"] and not cfg["tie_word_embeddings"]
    out, names = {}, {}
    for i in _layers(cfg):
        a, b = f"model.layers.{i}", f"transformer.encoder.layers.{i}"
        for leaf in ("weight", "bias"):
            out[f"{b}.self_attention.query_key_value.{leaf}"] = torch.cat(
                [tensors.pop(f"{a}.self_attn.{p}_proj.{leaf}") for p in "qkv"]).contiguous()
        names.update({f"{a}.self_attn.o_proj.weight": f"{b}.self_attention.dense.weight",
                      f"{a}.mlp.gate_up_proj.weight": f"{b}.mlp.dense_h_to_4h.weight",
                      f"{a}.mlp.down_proj.weight": f"{b}.mlp.dense_4h_to_h.weight",
                      f"{a}.input_layernorm.weight": f"{b}.input_layernorm.weight",
                      f"{a}.post_attention_layernorm.weight": f"{b}.post_attention_layernorm.weight"})
    names.update({"model.embed_tokens.weight": "transformer.embedding.word_embeddings.weight",
                  "model.norm.weight": "transformer.encoder.final_layernorm.weight",
                  "lm_head.weight": "transformer.output_layer.weight"})
    out.update(_renamed(tensors, names))
    # The remote checkpoints carry the rotary buffer too (readers must skip it).
    dim = d // 2
    out["transformer.rotary_pos_emb.inv_freq"] = 1.0 / (rope["rope_theta"] ** (
        torch.arange(0, dim, 2, dtype=torch.float) / dim))
    remote = {k: cfg[k] for k in _REMOTE_KEEP if k != "vocab_size"}  # padded_vocab_size instead
    remote.update(architectures=["ChatGLMModel"], model_type="chatglm", num_layers=cfg["num_hidden_layers"],
                  padded_vocab_size=cfg["vocab_size"], ffn_hidden_size=cfg["intermediate_size"], kv_channels=d,
                  num_attention_heads=heads, multi_query_attention=True,
                  multi_query_group_num=cfg["num_key_value_heads"], seq_length=cfg["max_position_embeddings"],
                  layernorm_epsilon=cfg["rms_norm_eps"], rmsnorm=True, apply_residual_connection_post_layernorm=False,
                  post_layer_norm=True, add_bias_linear=False, add_qkv_bias=True, original_rope=True,
                  rope_ratio=rope["rope_theta"] / 10000.0,
                  auto_map={"AutoConfig": "configuration_chatglm.ChatGLMConfig",
                            "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration",
                            "AutoModelForCausalLM": "modeling_chatglm.ChatGLMForConditionalGeneration"})
    return out, remote


def repack_fixture(spec: Spec, fixture_dir: Path) -> None:
    """Rewrites a saved native fixture in place into spec.repack's remote-code layout."""
    from safetensors.torch import load_file, save_file

    path = fixture_dir / "model.safetensors"
    cfg_path = fixture_dir / "config.json"
    tensors, cfg = spec.repack(load_file(str(path)), json.loads(cfg_path.read_text(encoding="utf-8")))
    save_file(tensors, str(path), metadata={"format": "pt"})
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


MINICPM_SCALE_DEPTH = 1.4

DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}

# The tiny DeepSeek-V3 shape of the `deepseek-v3` fixtures (rope added per fixture).
DEEPSEEK_V3_TINY = dict(hidden_size=32, num_key_value_heads=4, intermediate_size=64, moe_intermediate_size=16,
                        q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                        n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)
DEEPSEEK_V3_KV_HEADS_NOTE = ("num_key_value_heads is set to num_attention_heads: DeepseekV3Config defaults it to 128, "
                             "and MLA expands the latent to every query head.")


def _deepseek_v32_hub_spelling(cfg: dict[str, Any]) -> None:
    """DeepSeek-V3.2-Exp's config.json: YaRN as rope_scaling {type: yarn} beside a top-level rope_theta, no
    mlp_layer_types / layer_types / head_dim / qk_head_dim (derived), and the reference code's keys transformers
    does not read (topk_method, scoring_func, ep_size, moe_layer_freq, num_nextn_predict_layers)."""
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    cfg["rope_scaling"] = rope
    for k in ("mlp_layer_types", "layer_types", "head_dim", "qk_head_dim"):
        cfg.pop(k, None)
    cfg.update(topk_method="noaux_tc", scoring_func="sigmoid", ep_size=1, moe_layer_freq=1, num_nextn_predict_layers=1)

# The tiny dense Qwen3.5 shape of the `qwen3_5` fixtures.
QWEN3_5_TINY = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=64, **GDN_DIMS)


def qwen3_5_rope() -> dict[str, Any]:
    """Qwen3.5's partial rotary with an interleaved mrope_section that text-only positions reduce to plain RoPE."""
    return dict(DEFAULT_ROPE, partial_rotary_factor=0.25, mrope_section=[1, 1, 0], mrope_interleaved=True)

# HunYuan's checkpoints spell a fixed NTK stretch as a "dynamic" rope with `alpha`.
HUNYUAN_ALPHA_ROPE = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}

# Phi-3 with LongRoPE: short factors up to 256 positions, long factors beyond.
PHI3_LONGROPE: dict[str, Any] = dict(
    hidden_size=48, intermediate_size=96, pad_token_id=None, max_position_embeddings=2048,
    original_max_position_embeddings=256,
    rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                         short_factor=[1.0, 1.02, 1.1, 1.25, 1.5, 2.0],
                         long_factor=[1.0, 1.6, 3.0, 5.0, 8.0, 12.0]),
)


PHIMOE_TINY: dict[str, Any] = dict(
    hidden_size=48, intermediate_size=32, pad_token_id=None, num_local_experts=8, num_experts_per_tok=2,
    router_jitter_noise=0.25, attention_bias=True, lm_head_bias=True, rms_norm_eps=1e-5, max_position_embeddings=2048,
    rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=256,
                         short_factor=[1.0, 1.02, 1.1, 1.25, 1.5, 2.0], long_factor=[1.0, 1.6, 3.0, 5.0, 8.0, 12.0],
                         short_mscale=1.1, long_mscale=1.3),
)


def _scale_sinks(std: float):
    """gpt-oss sinks init to N(0, initializer_range); widen them so that every head's sink weighs."""

    def init(model: torch.nn.Module, gen: torch.Generator) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("self_attn.sinks"):
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    return init


def _drop_sinks(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("self_attn.sinks"):
                p.fill_(float("-inf"))


# MXFP4 (OCP microscaling): 32 FP4 (e2m1) values share one e8m0 exponent; transformers'
# integrations/mxfp4.py FP4_VALUES order (nibble = sign << 3 | magnitude index).
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`w [..., n]` (n a multiple of 32) -> blocks uint8 [..., n / 32, 16] and scales uint8 [..., n / 32]:
    per group of 32 the exponent e = ceil(log2(amax / 6)) (so |w| / 2^e <= 6), each value rounded to the
    nearest FP4 magnitude (ties to the lower index), low nibble first."""
    g = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32).to(torch.float64)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(2.0 ** -126)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    x = g / torch.exp2(e)
    mags = torch.tensor(FP4_VALUES[:8], dtype=torch.float64)
    idx = (x.abs().unsqueeze(-1) - mags).abs().argmin(-1)
    nib = (idx | ((x < 0).long() << 3)).to(torch.uint8)
    blocks = nib[..., 0::2] | (nib[..., 1::2] << 4)
    return blocks.contiguous(), (e.squeeze(-1) + 127).to(torch.uint8)


def _mxfp4_dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    lo, hi = lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], -1).reshape(*blocks.shape[:-1], 32)
    vals = torch.ldexp(vals, scales.to(torch.int32).unsqueeze(-1) - 127)
    return vals.reshape(*vals.shape[:-2], -1)


def _expert_checkpoint_views(model: torch.nn.Module):
    """(name, parameter) of each expert weight ([E, in, out]; the checkpoint keeps their transposes)."""
    for name, p in model.named_parameters():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            yield name, p


def _mxfp4_round_experts(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Puts every expert weight on the MXFP4 grid, so the f32 model is the dequantized checkpoint."""
    _scale_sinks(1.5)(model, gen)
    with torch.no_grad():
        for _, p in _expert_checkpoint_views(model):
            blocks, scales = _mxfp4_quantize(p.transpose(1, 2))
            p.copy_(_mxfp4_dequantize(blocks, scales).transpose(1, 2))


def _mxfp4_checkpoint(out_dir: Path) -> None:
    """Replaces the f32 expert weights of model.safetensors by `*_blocks` / `*_scales`, as gpt-oss ships."""
    from safetensors.torch import load_file, save_file

    path = out_dir / "model.safetensors"
    tensors = load_file(str(path))
    for name in [n for n in tensors if n.endswith("mlp.experts.gate_up_proj") or n.endswith("mlp.experts.down_proj")]:
        w = tensors.pop(name).transpose(1, 2).contiguous()
        blocks, scales = _mxfp4_quantize(w)
        assert torch.equal(_mxfp4_dequantize(blocks, scales), w), name
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, str(path), metadata={"format": "pt"})


def _mxfp4_config(cfg: dict[str, Any]) -> None:
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


# FP8 checkpoints. compressed-tensors ones are written by llmcompressor (tools/oracle/fp8_quantize.py,
# run in a subprocess); the `fp8` block layout of Qwen3-*-FP8 / DeepSeek-V3 is written here by hand.
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_QUANTIZE = Path(__file__).resolve().parent / "fp8_quantize.py"
CALIB_CASES = ("hello", "pangram", "code", "unicode", "paragraph_100", "code_300", "chat_capital", "chat_multi_turn")


def _calibration_sequences() -> list[list[int]]:
    """Static-FP8 calibration set: the token ids of eight battery prompts (CALIB_CASES), one a batch."""
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    by_name = {c["name"]: c["prompt_ids"] for c in build_battery(tok)}
    return [list(by_name[n]) for n in CALIB_CASES]


def _llmcompressor_checkpoint(scheme: str, ignore: list[str], calibrate: bool = False):
    """edit_saved_weights hook: quantizes the saved fixture in place with llmcompressor's oneshot
    (QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)), in a subprocess."""

    def edit(out_dir: Path) -> None:
        import subprocess

        cmd = [sys.executable, str(FP8_QUANTIZE), str(out_dir), scheme, json.dumps(ignore)]
        with tempfile.TemporaryDirectory() as td:
            if calibrate:
                calib = Path(td) / "calib.json"
                calib.write_text(json.dumps(_calibration_sequences()), encoding="utf-8")
                cmd.append(str(calib))
            r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"fp8_quantize.py failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}")

    return edit


def W4A16_GROUPS(group_size: int, symmetric: bool) -> dict[str, Any]:
    """compressed-tensors config_groups for int4 weight-only quantization with `group_size` inputs a scale."""
    return {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": group_size, "symmetric": symmetric,
        "dynamic": False}}}


W8A16_GROUPS = {"group_0": {"targets": ["Linear"], "weights": {
    "num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False}}}


def _ct_w8a16(model: torch.nn.Module) -> None:
    """Disables compressed-tensors' activation fake-quantization (weights stay FP8-dequantized)."""
    n = 0
    for m in model.modules():
        if getattr(m, "quantization_scheme", None) is not None:
            m.quantization_enabled = False
            n += 1
    assert n > 0, "no compressed-tensors module"


def _ct_mean_weight_scale(model: torch.nn.Module) -> None:
    """Replaces every per-channel / per-block weight_scale by its mean (before the first forward's
    decompression): the scale layout must matter."""
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".weight_scale") and p.numel() > 1:
                p.fill_(float(p.float().mean()))
                n += 1
    assert n > 0, "no per-channel / per-block weight_scale"


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _nvfp4_dequantize(stored: dict[str, torch.Tensor], module: str, high_first: bool = False,
                      scale=lambda s: s, global_divides: bool = True) -> torch.Tensor:
    """An NVFP4 linear's weight as compressed-tensors 0.20.0 decompresses it (NVFP4PackedCompressor.decompress:
    unpack_fp4_from_uint8 to bf16, the e4m3 weight_scale to bf16, then _dequantize: scale / global_scale in f32
    (bf16 / an f32 tensor of shape [1]), code times that in f32, rounded to bf16), from the stored tensors. The
    keywords read it wrong, for the ablations: nibbles high first, the scales edited, the global scale multiplied."""
    packed = stored[f"{module}.weight_packed"]
    assert packed.dtype == torch.uint8, (module, packed.dtype)
    nibbles = (packed >> 4, packed & 0x0F) if high_first else (packed & 0x0F, packed >> 4)
    codes = torch.stack(nibbles, dim=-1).flatten(-2).long()
    table = torch.tensor(E2M1 + tuple(-v for v in E2M1), dtype=torch.float32)
    group_scale = scale(stored[f"{module}.weight_scale"].float())
    global_scale = stored[f"{module}.weight_global_scale"]
    assert global_scale.dtype == torch.float32 and global_scale.shape == (1,), (module, global_scale)
    group_scale = group_scale / global_scale if global_divides else group_scale * global_scale
    return (table[codes] * group_scale.repeat_interleave(16, dim=-1)).to(torch.bfloat16)


def _nvfp4_rewrite(model: torch.nn.Module, **wrong) -> None:
    """Replaces every NVFP4 linear's dequantized weight by _nvfp4_dequantize(..., **wrong) of the checkpoint
    (dequantize=True leaves no quantization parameters on the model to edit)."""
    from safetensors.torch import load_file

    stored = load_file(str(Path(model.name_or_path) / "model.safetensors"))
    n = 0
    with torch.no_grad():
        for name, m in model.named_modules():
            if f"{name}.weight_packed" in stored:
                m.weight.copy_(_nvfp4_dequantize(stored, name, **wrong).float())
                n += 1
    assert n > 0, "no NVFP4 linear"


def nvfp4_load_check(fixture_dir: Path) -> dict[str, Any]:
    """load_check hook: each linear weight of the NVFP4A16 fixture as transformers loads it against
    _nvfp4_dequantize of the stored tensors (the formula ferrite dequantizes with), torch.equal."""
    from safetensors.torch import load_file

    stored = load_file(str(fixture_dir / "model.safetensors"))
    model = load_fixture(fixture_dir)
    checked = []
    for name, module in model.named_modules():
        if f"{name}.weight_packed" not in stored:
            continue
        assert stored[f"{name}.weight_scale"].dtype == torch.float8_e4m3fn, name
        got = module.weight
        assert got.dtype == torch.float32, (name, got.dtype)
        assert torch.equal(got, _nvfp4_dequantize(stored, name).float()), f"{name}: weight differs from the formula"
        checked.append(name)
    assert len(checked) == 14, checked
    return {"note": "every linear weight transformers loads equals bf16(e2m1(code, low nibble first) * "
                    "(f32(weight_scale) / weight_global_scale)), torch.equal", "modules": len(checked)}


# GPTQ and AWQ checkpoints, written here by hand. transformers 5.24 runs both formats through gptqmodel, which is
# not installed (it needs compiled extensions), so the oracle is transformers' Llama on the dequantized weights:
# _int_quant_round puts every decoder linear on its quantization grid, dequantized as gptqmodel 7.7.0's torch
# kernels do (_gptq_dequantize, _awq_dequantize), and _int_quant_repack (Spec.repack) writes the packed tensors
# those weights came from.
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # gptqmodel quantization/awq/utils/packing_utils.py
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
_INT_QUANT_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                      "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass(frozen=True)
class IntQuant:
    method: str  # "gptq" or "awq"
    bits: int
    group: int  # -1: one group over all inputs (GPTQ)
    sym: bool = True
    desc_act: bool = False
    not_converted: tuple[str, ...] = ()  # modules left unquantized (modules_to_not_convert)

    def config(self) -> dict[str, Any]:
        if self.method == "awq":
            return {"quant_method": "awq", "bits": self.bits, "group_size": self.group, "zero_point": True,
                    "version": "gemm", "modules_to_not_convert": list(self.not_converted) or None}
        return {"quant_method": "gptq", "bits": self.bits, "group_size": self.group, "desc_act": self.desc_act,
                "sym": self.sym, "checkpoint_format": "gptq", "pack_dtype": "int32", "lm_head": False}

    def quantized(self, module: str) -> bool:
        return (module.startswith("model.layers.") and module.endswith(_INT_QUANT_LINEARS)
                and not any(n in module for n in self.not_converted))


def _int32_words(fields: torch.Tensor, bits: int, dim: int, order: list[int] | None = None) -> torch.Tensor:
    """Packs `fields` (small non-negative ints) along `dim`, 32 / bits to an int32 word, field j at bit j * bits
    (field j taken from position order[j] of each run when given)."""
    per = 32 // bits
    f = fields.to(torch.int64).movedim(dim, -1)
    f = f.reshape(*f.shape[:-1], f.shape[-1] // per, per)
    if order is not None:
        f = f[..., order]
    words = sum(f[..., j] << (j * bits) for j in range(per))
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def _gptq_dequantize(qweight, qzeros, scales, g_idx, bits: int) -> torch.Tensor:
    """The [out, in] weight of a v1 (checkpoint_format gptq) checkpoint, as gptqmodel 7.7.0 computes it:
    utils/model.py convert_gptq_v1_to_v2_format_module adds 0b0001..0001 to every int32 qzeros word, then
    nn_modules/qlinear/torch.py TorchLinear._dequantize_weight_cached_248 shifts, casts to int8 (int16 for 8 bits),
    masks, and returns scales[g_idx] * (weight - zeros[g_idx]): a float16 product."""
    per, maxq = 32 // bits, (1 << bits) - 1
    dt = torch.int16 if bits == 8 else torch.int8
    qzeros = qzeros + {4: 0x11111111, 8: 0x01010101}[bits]
    wf = torch.arange(0, 32, bits, dtype=torch.int32)
    zeros = torch.bitwise_right_shift(qzeros.unsqueeze(2).expand(-1, -1, per), wf.unsqueeze(0)).to(dt)
    zeros = torch.bitwise_and(zeros, maxq).reshape(qzeros.shape[0], -1)[:, :scales.shape[1]]
    weight = torch.bitwise_and(
        torch.bitwise_right_shift(qweight.unsqueeze(1).expand(-1, per, -1), wf.unsqueeze(-1)).to(dt), maxq)
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
    g = g_idx.long()
    return (scales[g] * (weight - zeros[g])).T.contiguous()


def _awq_dequantize(qweight, qzeros, scales, group: int) -> torch.Tensor:
    """The [out, in] weight of an AWQ GEMM checkpoint, as gptqmodel 7.7.0's quantization/awq/utils/
    packing_utils.py dequantize_gemm computes it: unpack_awq (shift, & 15), reverse_awq_order, mask, and
    (iweight - izeros) * scales with both repeated over the group: a float16 product."""
    shifts = torch.arange(0, 32, 4)

    def unpack(q):
        return torch.bitwise_right_shift(q[:, :, None], shifts[None, None, :]).view(q.shape[0], -1) & 15

    order = torch.arange(scales.shape[-1], dtype=torch.int32).view(-1, 8)[:, AWQ_REVERSE_ORDER].view(-1)
    iweight, izeros = unpack(qweight)[:, order] & 15, unpack(qzeros)[:, order] & 15
    w = (iweight - izeros.repeat_interleave(group, dim=0)) * scales.repeat_interleave(group, dim=0)
    return w.T.contiguous()


def _int_quantize(w: torch.Tensor, q: IntQuant, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Round-to-nearest quantization of `w [out, in]` into the checkpoint's tensors: GPTQ symmetric (scale =
    2 amax / maxq, zero (maxq + 1) / 2) or asymmetric (scale = (max - min) / maxq, zero = round(-min / scale)),
    with desc_act a random input order grouped by g_idx; AWQ asymmetric with AutoAWQ's min/max rule."""
    out_f, in_f = w.shape
    group = in_f if q.group == -1 else q.group
    maxq = (1 << q.bits) - 1
    g_idx = torch.arange(in_f) // group
    if q.desc_act:
        g_idx = g_idx[torch.argsort(torch.randperm(in_f, generator=gen))]
        assert not torch.equal(g_idx, torch.arange(in_f) // group)
    groups = in_f // group
    scales = torch.empty(groups, out_f, dtype=torch.float16)
    zeros = torch.empty(groups, out_f, dtype=torch.int64)
    codes = torch.empty(in_f, out_f, dtype=torch.int64)
    for g in range(groups):
        cols = (g_idx == g).nonzero().squeeze(1)
        x = w[:, cols]
        if q.method == "awq":
            lo, hi = x.amin(1), x.amax(1)
            s = ((hi - lo).clamp(min=1e-5) / maxq).half()
            z = (-torch.round(lo / s.float())).clamp(0, maxq)
        elif q.sym:
            s = (2 * x.abs().amax(1) / maxq).half()
            z = torch.full((out_f,), (maxq + 1) // 2)
        else:
            lo, hi = x.amin(1).clamp(max=0), x.amax(1).clamp(min=0)
            s = ((hi - lo) / maxq).half()
            z = torch.round(-lo / s.float())
        # v1 stores zero - 1; a zero of 0 would borrow from the next field.
        assert q.method == "awq" or bool((z >= 1).all()), "a GPTQ zero point of 0"
        scales[g], zeros[g] = s, z.long()
        codes[cols] = (torch.round(x / s.float()[:, None]) + z[:, None]).clamp(0, maxq).long().T
    if q.method == "awq":
        return {"qweight": _int32_words(codes, 4, 1, AWQ_ORDER), "qzeros": _int32_words(zeros, 4, 1, AWQ_ORDER),
                "scales": scales}
    return {"qweight": _int32_words(codes, q.bits, 0), "qzeros": _int32_words(zeros - 1, q.bits, 1),
            "scales": scales, "g_idx": g_idx.to(torch.int32)}


def _int_dequantize(packed: dict[str, torch.Tensor], q: IntQuant) -> torch.Tensor:
    if q.method == "awq":
        return _awq_dequantize(packed["qweight"], packed["qzeros"], packed["scales"], q.group)
    return _gptq_dequantize(packed["qweight"], packed["qzeros"], packed["scales"], packed["g_idx"], q.bits)


# The packed tensors of each rounded weight, by the weight's float16 bytes: repack runs on the saved tensors of
# a model init_fn built in this process, and the rounding cannot be undone from the weights alone.
_INT_PACKED: dict[bytes, dict[str, torch.Tensor]] = {}


def _int_quant_round(q: IntQuant):
    """init_fn: every quantized decoder linear's weight replaced by its dequantized quantization."""

    def init(model: torch.nn.Module, gen: torch.Generator) -> None:
        with torch.no_grad():
            for name, m in model.named_modules():
                if isinstance(m, torch.nn.Linear) and q.quantized(name):
                    packed = _int_quantize(m.weight.float(), q, gen)
                    w = _int_dequantize(packed, q)
                    assert w.dtype == torch.float16, w.dtype
                    _INT_PACKED[w.numpy().tobytes()] = packed
                    m.weight.copy_(w.float())

    return init


def _int_quant_repack(q: IntQuant):
    """repack: each rounded weight replaced by its qweight / qzeros / scales (/ g_idx), plus quantization_config."""

    def repack(tensors, cfg):
        out = {}
        for name, t in tensors.items():
            module = name.removesuffix(".weight")
            if name.endswith(".weight") and q.quantized(module):
                packed = _INT_PACKED[t.to(torch.float16).numpy().tobytes()]
                assert torch.equal(_int_dequantize(packed, q), t.to(torch.float16)), name
                out.update({f"{module}.{k}": v for k, v in packed.items()})
            else:
                out[name] = t
        cfg = dict(cfg, quantization_config=q.config())
        return out, cfg

    return repack


def _int_quant_ablation(q: IntQuant, wrong: Callable[[dict[str, torch.Tensor], IntQuant], dict[str, torch.Tensor]]):
    """ablate_fn: every quantized linear's weight as a reader that gets the layout wrong (`wrong` edits the
    packed tensors) would dequantize it."""

    def ablate(model: torch.nn.Module) -> None:
        with torch.no_grad():
            for name, m in model.named_modules():
                if isinstance(m, torch.nn.Linear) and q.quantized(name):
                    packed = _INT_PACKED[m.weight.half().numpy().tobytes()]
                    m.weight.copy_(_int_dequantize(wrong(dict(packed), q), q).float())

    return ablate


def _zeros_minus_one_kept(p: dict[str, torch.Tensor], q: IntQuant) -> dict[str, torch.Tensor]:
    """v1 qzeros read as v2 (the stored zero - 1 taken as the zero): the +1 undone before dequantizing."""
    return dict(p, qzeros=p["qzeros"] - {4: 0x11111111, 8: 0x01010101}[q.bits])


def _g_idx_ignored(p: dict[str, torch.Tensor], q: IntQuant) -> dict[str, torch.Tensor]:
    n, groups = p["g_idx"].numel(), p["scales"].shape[0]
    return dict(p, g_idx=(torch.arange(n) // (n // groups)).to(torch.int32))


def _awq_natural_order(p: dict[str, torch.Tensor], q: IntQuant) -> dict[str, torch.Tensor]:
    """The fields of each AWQ word read in natural order (re-packed so that dequantize's reorder undoes nothing)."""
    def natural(words):
        fields = torch.bitwise_right_shift(words[:, :, None], torch.arange(0, 32, 4)[None, None, :]) & 15
        return _int32_words(fields.reshape(words.shape[0], -1), 4, 1, AWQ_ORDER)

    return dict(p, qweight=natural(p["qweight"]), qzeros=natural(p["qzeros"]))


GPTQ_4 = IntQuant("gptq", 4, 32)
GPTQ_ACT = IntQuant("gptq", 4, 32, sym=False, desc_act=True)
GPTQ_8 = IntQuant("gptq", 8, -1)
AWQ_4 = IntQuant("awq", 4, 32, sym=False, not_converted=("model.layers.1.mlp.down_proj",))


def _fp8_block_quantize(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """`w [out, in]` (multiples of `block`) -> float8_e4m3fn weight and f32 weight_scale_inv
    [out / block, in / block]: per block scale = amax / 448 (f32), w8 = (w / scale).to(e4m3fn)."""
    out_f, in_f = w.shape
    assert out_f % block == 0 and in_f % block == 0, w.shape
    wb = w.to(torch.float32).reshape(out_f // block, block, in_f // block, block)
    scale = wb.abs().amax(dim=(1, 3)) / FP8_MAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = (wb / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(out_f, in_f).contiguous(), scale.contiguous()


def _fp8_block_dequantize(q: torch.Tensor, scale: torch.Tensor, block: int = 128) -> torch.Tensor:
    out_f, in_f = q.shape
    qb = q.to(torch.float32).reshape(out_f // block, block, in_f // block, block)
    return (qb * scale[:, None, :, None]).reshape(out_f, in_f)


# Suffixes of the checkpoint weights quantized (under model.layers.): attention (incl. DeepSeek MLA's
# q_a / q_b / kv_a_proj_with_mqa / kv_b), dense MLPs and every routed / shared expert's gate / up / down
# (per-expert tensors `mlp.experts.{e}.*_proj.weight`, as the checkpoints ship them). The MoE router
# (`mlp.gate.weight`, DeepSeek's `e_score_correction_bias`) does not match and stays unquantized.
FP8_BLOCK_LINEARS = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                     "up_proj.weight", "down_proj.weight", "q_a_proj.weight", "q_b_proj.weight",
                     "kv_a_proj_with_mqa.weight", "kv_b_proj.weight")


def _fp8_block_checkpoint(out_dir: Path) -> None:
    """Rewrites every decoder linear weight of model.safetensors as Qwen3-*-FP8 / DeepSeek-V3 ship them:
    float8_e4m3fn `*.weight` + f32 `*.weight_scale_inv` (one per 128x128 block). Embeddings, norms and
    lm_head stay as saved."""
    from safetensors.torch import load_file, save_file

    path = out_dir / "model.safetensors"
    tensors = load_file(str(path))
    for name in [n for n in tensors if n.startswith("model.layers.") and n.endswith(FP8_BLOCK_LINEARS)]:
        q, s = _fp8_block_quantize(tensors[name])
        tensors[name], tensors[name[: -len("weight")] + "weight_scale_inv"] = q, s
    save_file(tensors, str(path), metadata={"format": "pt"})


def _fp8_block_config(cfg: dict[str, Any]) -> None:
    # As Qwen/Qwen3-*-FP8's config.json spells it.
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": [128, 128]}


def _fp8_block_expected(model: torch.nn.Module, tensors: dict[str, torch.Tensor], scale=None):
    """(name, what the loaded parameter must equal, quantized checkpoint names) for every parameter of `model`
    that comes from FP8 tensors of `tensors` (the fixture's model.safetensors): f32(w8) * weight_scale_inv per
    128x128 block, or `scale(q, s)` instead where given. transformers (on CPU, dequantize at load) fuses the
    per-expert tensors into `mlp.experts.gate_up_proj` [E, 2 * I, H] (gate rows then up rows per expert) and
    `mlp.experts.down_proj` [E, H, I]."""
    deq = scale or _fp8_block_dequantize

    def one(n: str) -> torch.Tensor:
        return deq(tensors[n], tensors[n + "_scale_inv"])

    for name, p in model.named_parameters():
        if name + "_scale_inv" in tensors:
            yield name, one(name), [name]
        elif name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            pre = name[: -len("gate_up_proj")] if name.endswith("gate_up_proj") else name[: -len("down_proj")]
            kinds = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
            names = [[f"{pre}{e}.{k}.weight" for k in kinds] for e in range(p.shape[0])]
            if all(n + "_scale_inv" in tensors for ns in names for n in ns):
                yield name, torch.stack([torch.cat([one(n) for n in ns], 0) for ns in names]), sum(names, [])


def _fp8_block_mean_scale_where(keep: Callable[[str], bool]):
    """Ablation: the dequantized-at-load weights whose parameter name passes `keep` are replaced by f32(w8) x
    the matrix's mean weight_scale_inv (read from the fixture on disk): the per-block scale layout must matter."""

    def ablate(model: torch.nn.Module) -> None:
        from safetensors.torch import load_file

        tensors = load_file(str(Path(model.config._name_or_path) / "model.safetensors"))
        params = dict(model.named_parameters())
        n = 0
        with torch.no_grad():
            for name, want, _ in _fp8_block_expected(model, tensors, scale=lambda q, s: q.to(torch.float32) * s.mean()):
                if keep(name):
                    params[name].copy_(want)
                    n += 1
        assert n > 0, "no FP8 block weight ablated"

    return ablate


_fp8_block_mean_scale = _fp8_block_mean_scale_where(lambda name: True)
_fp8_block_mean_scale_experts = _fp8_block_mean_scale_where(lambda name: ".mlp.experts." in name)


def fp8_block_load_check(fixture_dir: Path) -> dict[str, Any]:
    """transformers' load of the `fp8` block fixture (CPU, default settings) against the checkpoint: every
    parameter built from FP8 tensors must equal f32(w8) * weight_scale_inv per 128x128 block exactly
    (torch.equal), every other parameter the saved tensor upcast, and every checkpoint tensor must be used."""
    from safetensors.torch import load_file

    tensors = load_file(str(fixture_dir / "model.safetensors"))
    model = load_fixture(fixture_dir)
    quant, used, fused = 0, set(), {}
    for name, want, src in _fp8_block_expected(model, tensors):
        p = dict(model.named_parameters())[name]
        assert p.dtype == torch.float32 and torch.equal(p.detach(), want), f"{name}: loaded != f32(w8) * scale"
        quant += len(src)
        used.update(src + [n + "_scale_inv" for n in src])
        if len(src) > 1:
            fused[name] = list(p.shape)
    state = model.state_dict()
    for name, t in tensors.items():
        if name in used:
            continue
        assert t.dtype != torch.float8_e4m3fn and not name.endswith("_scale_inv"), f"{name}: FP8 tensor not checked"
        assert name in state and torch.equal(state[name], t.to(torch.float32)), f"{name}: unquantized tensor changed"
        used.add(name)
    qm = [n for n in tensors if tensors[n].dtype == torch.float8_e4m3fn]
    assert quant == len(qm) > 0, (quant, len(qm))
    assert not any(type(m).__name__.startswith("FP8") for m in model.modules()), "FP8 modules kept (not W8A16)"
    return {"note": "the fixture as transformers loads it on CPU (default settings: FineGrainedFP8 dequantize=True, "
                    "plain nn.Linear / experts modules, W8A16) against the checkpoint: each parameter from FP8 "
                    "tensors torch.equal to f32(w8) * weight_scale_inv per 128x128 block; each other tensor "
                    "equal to the saved one upcast",
            "quantized_matrices": quant, "fused_expert_params": fused, "all_equal": True}


def _gemma4_hub_spelling(cfg: dict[str, Any]) -> None:
    """Gemma 4 checkpoints on the Hub give the full-attention layers' head size and KV heads as
    `global_head_dim` / `num_global_key_value_heads`, not transformers' serialized `per_layer_config`."""
    per_layer = cfg.pop("per_layer_config")
    full = per_layer[str(cfg["layer_types"].index("full_attention"))]
    cfg["global_head_dim"] = full["head_dim"]
    if "num_key_value_heads" in full:
        cfg["num_global_key_value_heads"] = full["num_key_value_heads"]


def _gemma4_random_layer_scalars(model: torch.nn.Module, gen: torch.Generator) -> None:
    """`layer_scalar` is a buffer (init 1, so untouched by the parameter perturbation)."""
    for layer in model.model.layers:
        layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=gen))


def _gemma4_unit_layer_scalars(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.layer_scalar.fill_(1.0)


def _gemma4_drop_per_layer_inputs(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.per_layer_projection.weight.data.zero_()


def _gemma4_share_first_sliding_layer(model: torch.nn.Module) -> None:
    """The shared sliding layer reads layer 0's keys/values instead of layer 1's (the last of its type)."""
    layers = model.model.layers
    layers[0].self_attn.store_full_length_kv = True
    layers[1].self_attn.store_full_length_kv = False


def _gemma3n_zero_altup_correction(model: torch.nn.Module) -> None:
    """correction_coefs = 0: every copy takes the whole innovation (coefficients 0 + 1)."""
    for layer in model.model.layers:
        layer.altup.correction_coefs.weight.data.zero_()


def _gemma3n_zero_laurel(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.laurel.linear_right.weight.data.zero_()


def _gemma3n_drop_per_layer_inputs(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.per_layer_projection.weight.data.zero_()


def _gemma3n_share_first_sliding_layer(model: torch.nn.Module) -> None:
    """The shared sliding layer reads layer 0's keys/values instead of layer 2's (the last of its type)."""
    layers = model.model.layers
    layers[0].self_attn.store_full_length_kv = True
    layers[2].self_attn.store_full_length_kv = False


# The tiny LFM2 shape of lfm2 and lfm2-moe.
LFM2_TINY: dict[str, Any] = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3, norm_eps=1e-5,
    tie_word_embeddings=True, rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
)

# The tiny GLM-4.5 shape of glm4-moe and glm4-moe-mtp.
GRANITE_SWA_TINY: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, pad_token_id=None, embedding_multiplier=6.0,
    residual_multiplier=0.4, attention_multiplier=0.2, logits_scaling=2.0, sliding_window=24,
    layer_rope_theta=[0.0, 10000.0, 10000.0, 500000.0], rope_parameters=dict(DEFAULT_ROPE),
)
COHERE2_MOE_TINY: dict[str, Any] = dict(
    hidden_size=32, head_dim=16, num_hidden_layers=4, intermediate_size=32, prefix_dense_intermediate_size=64,
    num_experts=8, num_experts_per_tok=2, num_shared_experts=1, first_k_dense_replace=1, sliding_window=24,
    sliding_window_pattern=2, prefix_dense_sliding_window_pattern=1, logit_scale=0.25, tie_word_embeddings=True,
    rope_parameters=dict(DEFAULT_ROPE), rms_norm_eps=None,  # BASE's RMSNorm eps off: the bias-free LayerNorm
)
GLM4_MOE_TINY: dict[str, Any] = dict(
    hidden_size=32, head_dim=16, intermediate_size=64, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=1,
    num_experts_per_tok=2, first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
    norm_topk_prob=True, use_qk_norm=True, attention_bias=True, rope_parameters=dict(DEFAULT_ROPE),
)

SPECS: list[Spec] = [
    Spec(
        name="llama",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="Llama baseline: GQA (4 query heads / 2 KV heads), untied lm_head, default RoPE theta 10000",
        ablate_fn=_tie_lm_head,
        ablation_desc="lm_head replaced by the input embedding (as if tied)",
    ),
    Spec(
        name="llama-tied-llama3rope",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=256,
            ),
        ),
        feature="tied embeddings (no lm_head.weight in the file), MQA (1 KV head), llama3 RoPE scaling "
        "(factor 8, low 1, high 4, original_max 256)",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        notes=[
            "HF 5.24 llama3 RoPE is static (one inv_freq for all lengths). With head_dim 16, theta 1e4, original_max 256: "
            "wavelength 2*pi/inv_freq < 256/4 = 64 unchanged (pairs 0-2), > 256/1 = 256 divided by factor 8 (pairs 4-7), "
            "in between smoothed: inv_freq * ((1-s)/8 + s), s = (256/wavelen - 1)/(4-1) (pair 3: ratio 0.20912). "
            "Ratios to plain RoPE: [1, 1, 1, 0.20912479, 0.125, 0.125, 0.125, 0.125].",
            "Tied embeddings: model.safetensors has no lm_head.weight; logits = hidden @ embed_tokens.weight^T.",
        ],
    ),
    Spec(
        name="llama-linear-rope",
        save_dtype="bfloat16",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
        feature="linear RoPE scaling (position interpolation): inv_freq / 2",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        notes=["HF 5.24 linear RoPE: every inv_freq divided by factor (= positions divided by 2); static."],
    ),
    Spec(
        name="llama-dynamic-rope",
        save_dtype="bfloat16",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(
            max_position_embeddings=512,
            rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0),
        ),
        feature="dynamic NTK RoPE (factor 2, max_position_embeddings 512): inv_freq recomputed once the "
        "sequence passes 512 tokens",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        notes=[
            "HF 5.24 dynamic NTK (modeling_rope_utils.dynamic_rope_update + _compute_dynamic_ntk_parameters): before each "
            "forward, seq_len = max(position_ids)+1; if seq_len > max_seq_len_cached (starts at max_position_embeddings=512) "
            "inv_freq is recomputed with base' = base * (factor*seq_len/512 - (factor-1)) ** (dim/(dim-2)), dim = head_dim, "
            "and max_seq_len_cached = seq_len. Up to 512 tokens it is plain RoPE.",
            "So in generate(): a prefill of L > 512 tokens rotates all L positions with base'(L); each decode step at "
            "position p >= 512 rotates its q and its new k with base'(p+1). Keys already in the KV cache keep the rotation "
            "they were computed with (they are NOT re-rotated). A prompt shorter than 512 whose decode crosses 512 switches "
            "to base'(p+1) at the first step with p >= 512.",
            "The rotary module is stateful (cached length only grows unless a later call has seq_len < 512, which resets "
            "it). The oracle runs every case on a fresh copy of the model, i.e. a fresh engine state per request.",
        ],
    ),
    Spec(
        name="llama-yarn-rope",
        save_dtype="bfloat16",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(
            max_position_embeddings=1024,  # = factor * original_max, so HF's implicit-factor check is quiet
            rope_parameters=dict(
                rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256
            ),
        ),
        feature="YaRN RoPE (factor 4, original_max 256, beta_fast 32, beta_slow 1, truncate): blended inv_freq and "
        "attention_factor = 0.1*ln(4)+1 multiplying cos and sin",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        notes=[
            "HF 5.24 YaRN is static (same inv_freq for every length). cos and sin are both multiplied by "
            "attention_factor (here 0.1*ln(4)+1 = 1.138629436111989), so q.k scores scale by its square.",
            "Correction range from beta_fast=32 / beta_slow=1 over original_max 256, floored/ceiled (truncate=True); "
            "inv_freq ratios to plain RoPE for the 8 pairs: [1, 0.8125, 0.625, 0.4375, 0.25, 0.25, 0.25, 0.25].",
        ],
    ),
    Spec(
        name="mistral",
        save_dtype="bfloat16",
        config_class="MistralConfig",
        architecture="MistralForCausalLM",
        kwargs=dict(sliding_window=64, rope_parameters=dict(DEFAULT_ROPE)),
        feature="sliding-window attention, window 64 (each query sees itself and the 63 previous tokens)",
        ablate_config=dict(sliding_window=None),
        ablation_desc="sliding_window -> None (full causal attention)",
        notes=[
            "HF 5.24 Mistral (eager): mask = causal AND kv_idx > q_idx - sliding_window, i.e. a query at position q "
            "attends to positions q-63..q. generate() uses DynamicSlidingWindowLayer caches that keep the last 63 "
            "tokens, with the same result.",
        ],
    ),
    Spec(
        name="qwen2",
        config_class="Qwen2Config",
        architecture="Qwen2ForCausalLM",
        kwargs=dict(tie_word_embeddings=True, rope_parameters=dict(DEFAULT_ROPE)),
        feature="q/k/v projection biases (o_proj has none), tied embeddings",
        ablate_fn=_zero_qkv_bias,
        ablation_desc="q/k/v biases zeroed",
    ),
    Spec(
        name="qwen3",
        config_class="Qwen3Config",
        architecture="Qwen3ForCausalLM",
        kwargs=dict(head_dim=32, rope_parameters=dict(DEFAULT_ROPE)),
        feature="QK-norm (per-head RMSNorm on q and k before RoPE), head_dim 32 != hidden/heads (16)",
        ablate_fn=_drop_qk_norm,
        ablation_desc="q_norm/k_norm replaced by identity",
    ),
    # ---- model families wave 1 (bf16 weights, oracle on the f32 upcast; each fixture <= 450 KB) ----
    Spec(
        name="gemma",
        config_class="GemmaConfig",
        architecture="GemmaForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(head_dim=16, pad_token_id=None, tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh",
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="GeGLU (gelu_pytorch_tanh), embeddings scaled by sqrt(hidden)=8 in the weight dtype, (1+w) RMSNorm, "
        "tied embeddings",
        ablate_fn=_unit_embed_scale,
        ablation_desc="embedding normalizer sqrt(64) -> 1",
    ),
    Spec(
        name="gemma2",
        config_class="Gemma2Config",
        architecture="Gemma2ForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=48, head_dim=16, pad_token_id=None, query_pre_attn_scalar=24,
                    sliding_window=48, attn_logit_softcapping=5.0, final_logit_softcapping=15.0, rope_parameters=dict(DEFAULT_ROPE)),
        feature="sandwich norms (pre/post attention, pre/post feedforward), attention logits softcapped at 5, final "
        "logits at 15, query_pre_attn_scalar 24 (scale 24^-0.5, head_dim 16), layer_types [sliding 48, full], "
        "hidden 48 (embedding normalizer sqrt(48) is not a round number), untied lm_head",
        ablate_config=dict(attn_logit_softcapping=None, final_logit_softcapping=None),
        ablation_desc="attn_logit_softcapping and final_logit_softcapping -> None",
        extra_ablations=[
            Ablate("attn_logit_softcapping -> None", config=dict(attn_logit_softcapping=None)),
            Ablate("sliding_window 48 -> 4096 (layer 0 sees the whole prompt)", config=dict(sliding_window=4096)),
            Ablate("query_pre_attn_scalar 24 -> head_dim 16", config=dict(query_pre_attn_scalar=16)),
        ],
        notes=[
            "Untied and hidden 48: with tied embeddings the sqrt(hidden)-scaled input embedding dominates the sandwich-"
            "normed residual stream and every seed repeats its last token.",
            "HF 5.24 Gemma2 eager attention: scores = (q.k) * query_pre_attn_scalar**-0.5, then softcap "
            "(scores/cap -> tanh -> *cap), then the mask; logits = lm_head(h) -> /cap -> tanh -> *cap.",
            "Sliding layers (layer_types[i] == 'sliding_attention', default even i) see keys q-47..q.",
            "The final softcap is monotonic, so it cannot change greedy tokens (no ablation for it): it shows in the "
            "recorded log-probs, which the Rust gate compares within 2e-3 nats.",
        ],
    ),
    Spec(
        name="gemma3",
        config_class="Gemma3TextConfig",
        architecture="Gemma3ForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(
            hidden_size=48, head_dim=16, pad_token_id=None, intermediate_size=96, num_hidden_layers=3,
            query_pre_attn_scalar=24,
            sliding_window=48, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
        ),
        feature="QK-norm ((1+w) per head), local rope theta 1e4 on sliding layers vs global theta 1e6 with linear "
        "factor 8 on full layers, layer_types [sliding 48, sliding 48, full], sandwich norms, scale 24^-0.5, "
        "untied lm_head",
        ablate_fn=_drop_qk_norm,
        ablation_desc="q_norm/k_norm replaced by identity",
        extra_ablations=[
            Ablate("global rope -> the local one (theta 1e4, no scaling)", config=dict(rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
            Ablate("sliding_window 48 -> 4096", config=dict(sliding_window=4096)),
        ],
        notes=[
            "HF 5.24 Gemma3 passes no softcap to attention (attn_logit_softcapping is unused); final_logit_softcapping "
            "is None here. rope_parameters is nested per layer type.",
        ],
    ),
    Spec(
        name="phi3",
        config_class="Phi3Config",
        architecture="Phi3ForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=48, intermediate_size=96, pad_token_id=None, sliding_window=48,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="fused qkv_proj (q 48 | k 24 | v 24 rows) and gate_up_proj (gate | up), split at load; sliding window "
        "48 on every layer; untied lm_head",
        ablate_config=dict(sliding_window=None),
        ablation_desc="sliding_window -> None",
    ),
    Spec(
        name="phi3-longrope",
        config_class="Phi3Config",
        architecture="Phi3ForCausalLM",
        save_dtype="bfloat16",
        kwargs=PHI3_LONGROPE,
        feature="LongRoPE: short factors up to original_max_position_embeddings 256, long factors beyond (prompts of "
        "297+ tokens), cos/sin scaled by sqrt(1 + ln(2048/256)/ln(256)) = 1.1726",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        extra_ablations=[
            Ablate("long_factor -> short_factor", config=dict(rope_parameters=dict(
                rope_type="longrope", rope_theta=10000.0, short_factor=[1.0, 1.02, 1.1, 1.25, 1.5, 2.0],
                long_factor=[1.0, 1.02, 1.1, 1.25, 1.5, 2.0]))),
        ],
        notes=[
            "HF 5.24 longrope_frequency_update: each forward picks the long factors iff max(position_ids)+1 > "
            "original_max_position_embeddings (256; the top-level Phi-3 key wins over the rope section), else the short "
            "ones; cached keys keep the rotation they were written with. attention_factor is "
            "sqrt(1 + ln(max_position_embeddings/original) / ln(original)) when unset.",
        ],
    ),
    Spec(
        name="phi3-longrope-switch",
        config_class="Phi3Config",
        architecture="Phi3ForCausalLM",
        save_dtype="bfloat16",
        kwargs=PHI3_LONGROPE,
        # Prompt + output cross 256: generate() recomputes the whole sequence there.
        extra_prompt_tokens=[("cross_switch_250", 250)],
        feature="LongRoPE switch during decode: a 250-token prompt whose output crosses original_max 256, where "
        "Phi-3's generate drops its cache and recomputes the sequence with the long factors",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        notes=[
            "HF 5.24 Phi3ForCausalLM.prepare_inputs_for_generation: the first time the sequence reaches "
            "original_max_position_embeddings + 1 tokens with at most original_max cached, the cache is dropped and "
            "the whole sequence runs again (long factors for every key); cross_switch_250 crosses it while decoding.",
        ],
    ),
    Spec(
        name="phimoe",
        config_class="PhimoeConfig",
        architecture="PhimoeForCausalLM",
        kwargs=PHIMOE_TINY,
        edit_saved_config=_phimoe_hub_spelling,
        feature="PhiMoE (Phi-3.5-MoE): LayerNorms with bias, q/k/v/o and lm_head biases, sparsemixer top-2 routing "
        "(router_jitter_noise 0.25 so that several logits share each softmax), LongRoPE with the short factors at "
        "every length and cos/sin times short_mscale 1.1 up to original_max 256, long_mscale 1.3 past it",
        ablate_config=dict(router_jitter_noise=0.01),
        ablation_desc="router_jitter_noise 0.25 -> 0.01",
        extra_ablations=[
            Ablate("long_mscale -> short_mscale", config=dict(rope_parameters=dict(PHIMOE_TINY["rope_parameters"],
                                                                                    long_mscale=1.1))),
            Ablate("lm_head bias zeroed", fn=_zero_lm_head_bias),
        ],
        notes=[
            "HF 5.24 PhimoeRotaryEmbedding.forward calls rope_init_fn(config) without seq_len, so the inverse "
            "frequencies always use short_factor; only the cos/sin scale follows max(position_ids)+1 > original_max.",
        ],
    ),
    Spec(
        name="phimoe-switch",
        config_class="PhimoeConfig",
        architecture="PhimoeForCausalLM",
        kwargs=PHIMOE_TINY,
        edit_saved_config=_phimoe_hub_spelling,
        extra_prompt_tokens=[("cross_switch_250", 250)],
        feature="PhiMoE LongRoPE switch during decode: a 250-token prompt whose output crosses original_max 256, where "
        "PhiMoE's generate drops its cache and recomputes the sequence with long_mscale",
        ablate_config=dict(rope_parameters=dict(PHIMOE_TINY["rope_parameters"], long_mscale=1.1)),
        ablation_desc="long_mscale -> short_mscale",
    ),
    Spec(
        name="phi",
        config_class="PhiConfig",
        architecture="PhiForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=48, intermediate_size=128, num_key_value_heads=4, pad_token_id=None,
                    rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=0.5)),
        feature="parallel attention + MLP on one LayerNorm (h = (attn + mlp) + h), partial rotary 0.5 (6 of 12 dims), "
        "LayerNorm and dense biases, lm_head bias, gelu_new",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=1.0)),
        ablation_desc="partial_rotary_factor 0.5 -> 1.0",
        extra_ablations=[Ablate("lm_head bias zeroed", fn=_zero_lm_head_bias)],
    ),
    Spec(
        name="opt",
        config_class="OPTConfig",
        architecture="OPTForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=32, ffn_dim=64, max_position_embeddings=672, pad_token_id=None,
                    tie_word_embeddings=True),
        feature="learned positions at position + 2, queries scaled after q_proj, ReLU MLP, pre-LayerNorm "
        "(do_layer_norm_before), tied embeddings",
        ablate_fn=_opt_position_offset_0,
        ablation_desc="position offset 2 -> 0",
    ),
    Spec(
        name="opt-postnorm",
        config_class="OPTConfig",
        architecture="OPTForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=32, ffn_dim=64, max_position_embeddings=672, pad_token_id=None,
                    tie_word_embeddings=True, do_layer_norm_before=False, word_embed_proj_dim=24),
        feature="opt-350m layout: LayerNorm after each residual add (do_layer_norm_before false, no final norm), "
        "word_embed_proj_dim 24 with project_in / project_out",
        ablate_fn=_opt_pre_norm,
        ablation_desc="layers switched to pre-norm",
    ),
    Spec(
        name="gpt2",
        config_class="GPT2Config",
        architecture="GPT2LMHeadModel",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=48, n_inner=128, max_position_embeddings=672, tie_word_embeddings=True),
        feature="Conv1D weights [in, out] (transposed at load), fused c_attn, learned positions (wpe), gelu_new, "
        "tied embeddings",
        ablate_fn=_zero_wpe,
        ablation_desc="position embeddings zeroed",
        extra_ablations=[Ablate("scale_attn_weights -> False", config=dict(scale_attn_weights=False))],
    ),
    Spec(
        name="gpt-neox",
        config_class="GPTNeoXConfig",
        architecture="GPTNeoXForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=48, num_attention_heads=2, intermediate_size=96,
                    rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=0.25)),
        feature="fused query_key_value interleaved per head, partial rotary 0.25 (6 of 24 dims), parallel residual "
        "(h = (mlp(ln2 h) + attn(ln1 h)) + h), biases, untied lm_head (embed_out in older checkpoints)",
        ablate_config=dict(use_parallel_residual=False),
        ablation_desc="use_parallel_residual -> False",
        extra_ablations=[Ablate("partial_rotary_factor 0.25 -> 1.0",
                                config=dict(rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=1.0)))],
    ),
    Spec(
        name="gptj",
        config_class="GPTJConfig",
        architecture="GPTJForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(n_inner=128, rotary_dim=8),
        feature="attention and MLP in parallel from one LayerNorm (h = (attn + mlp) + h), rotary on the first 8 of "
        "16 head dims rotating adjacent pairs (rotate_every_two), unbiased q/k/v/out_proj, biased MLP, lm_head with "
        "a bias",
        ablate_config=dict(rotary_dim=16),
        ablation_desc="rotary_dim 8 -> 16",
        extra_ablations=[Ablate("lm_head bias zeroed", fn=_zero_lm_head_bias)],
    ),
    Spec(
        name="stablelm",
        config_class="StableLmConfig",
        architecture="StableLmForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=48, num_attention_heads=2, intermediate_size=96, use_qkv_bias=True,
                    rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=0.25)),
        feature="LayerNorm with bias, partial rotary 0.25 (6 of 24 dims), q/k/v biases (StableLM 2 1.6B), "
        "sequential residual, untied lm_head",
        ablate_fn=_zero_qkv_bias,
        ablation_desc="q/k/v biases zeroed",
        extra_ablations=[Ablate("partial_rotary_factor 0.25 -> 1.0",
                                config=dict(rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=1.0)))],
    ),
    Spec(
        name="stablelm-qknorm-parallel",
        config_class="StableLmConfig",
        architecture="StableLmForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=48, num_attention_heads=2, num_key_value_heads=1, intermediate_size=96,
                    qk_layernorm=True, use_parallel_residual=True, tie_word_embeddings=True,
                    rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=0.25)),
        feature="StableLM 2 12B layout: per-head LayerNorm QK-norm with one weight per head, parallel residual "
        "(h = (h + attn) + mlp(ln1 h)), MQA",
        ablate_fn=_no_stablelm_qk_layernorm,
        ablation_desc="qk_layernorm off",
    ),
    Spec(
        name="granite",
        config_class="GraniteConfig",
        architecture="GraniteForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=48, intermediate_size=96, pad_token_id=None, embedding_multiplier=12.0,
                    residual_multiplier=0.22, attention_multiplier=0.15, logits_scaling=2.0,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="embedding_multiplier 12, residual_multiplier 0.22, attention_multiplier 0.15 (not 12^-0.5), logits "
        "divided by logits_scaling 2",
        ablate_config=dict(embedding_multiplier=1.0, residual_multiplier=1.0, attention_multiplier=12 ** -0.5),
        ablation_desc="embedding/residual multipliers -> 1, attention_multiplier -> head_dim^-0.5",
        extra_ablations=[
            Ablate("embedding_multiplier -> 1", config=dict(embedding_multiplier=1.0)),
            Ablate("residual_multiplier -> 1", config=dict(residual_multiplier=1.0)),
            Ablate("attention_multiplier -> head_dim^-0.5", config=dict(attention_multiplier=12 ** -0.5)),
        ],
        notes=["logits_scaling only divides the logits (monotonic): it shows in the log-probs, not the tokens. It is 2 "
               "here rather than Granite 3's 8: dividing by 8 shrinks every top-2 log-prob gap 8x, and no seed of 60 "
               "reached the 5e-3 minimum (best 1.4e-3)."],
    ),
    Spec(
        name="olmo2",
        config_class="Olmo2Config",
        architecture="Olmo2ForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=48, intermediate_size=96, pad_token_id=None, rope_parameters=dict(DEFAULT_ROPE)),
        feature="post-norm (h = h + norm(attn(h)), h = h + norm(mlp(h))), QK-norm over all heads at once "
        "(q_norm [48], k_norm [24]) before RoPE",
        ablate_fn=_drop_qk_norm,
        ablation_desc="q_norm/k_norm replaced by identity",
    ),
    Spec(
        name="cohere",
        config_class="CohereConfig",
        architecture="CohereForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(pad_token_id=None, tie_word_embeddings=True, use_qk_norm=True, logit_scale=2.0,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="parallel block on one bias-free LayerNorm (h = (h + attn) + mlp), interleaved rope (adjacent "
        "pairs), per-head LayerNorm QK-norm (weights [heads, head_dim]), logit_scale 2, tied embeddings",
        ablate_fn=_no_cohere_qk_norm,
        ablation_desc="use_qk_norm off",
        notes=["logit_scale is 2 here (Command-R uses 0.0625): a scale below 1 shrinks every top-2 log-prob gap, and "
               "with 0.25 no seed of 60 reached the 5e-3 minimum (best 2.7e-3). It only rescales the logits, so it "
               "shows in the log-probs, not the tokens."],
    ),
    Spec(
        name="starcoder2",
        config_class="Starcoder2Config",
        architecture="Starcoder2ForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(sliding_window=48, tie_word_embeddings=True, rope_parameters=dict(DEFAULT_ROPE)),
        feature="LayerNorm with bias, biases on q/k/v/o and c_fc/c_proj, ungated gelu_pytorch_tanh MLP, sliding window "
        "48, tied embeddings",
        ablate_config=dict(sliding_window=None),
        ablation_desc="sliding_window -> None",
        extra_ablations=[Ablate("q/k/v biases zeroed", fn=_zero_qkv_bias)],
    ),
    Spec(
        name="falcon",
        config_class="FalconConfig",
        architecture="FalconForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(ffn_hidden_size=128, tie_word_embeddings=True, multi_query=True, parallel_attn=True, bias=False,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="Falcon-7B layout: multi-query fused query_key_value [q x4 | k | v], parallel attention + MLP on one "
        "LayerNorm (h = (mlp + attn) + h), erf GELU, tied embeddings",
        notes=["No ablation: the features are layouts (a wrong split or wiring fails every case)."],
    ),
    Spec(
        name="falcon-new-arch",
        config_class="FalconConfig",
        architecture="FalconForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(ffn_hidden_size=128, tie_word_embeddings=True, new_decoder_architecture=True, num_kv_heads=2,
                    bias=True,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="Falcon-40B layout (new_decoder_architecture): grouped fused query_key_value (per KV group 2 queries, "
        "1 key, 1 value), separate ln_attn / ln_mlp feeding the parallel branches, biases",
        notes=["No ablation: the features are layouts (a wrong split or wiring fails every case)."],
    ),
    # ---- mixture of experts (crates/models/src/layers/moe.rs, mla.rs) --------------------------------------
    Spec(
        name="mixtral",
        config_class="MixtralConfig",
        architecture="MixtralForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=32, head_dim=16, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=64, rope_parameters=dict(DEFAULT_ROPE)),
        feature="sparse MoE: softmax router, top-2 of 4 experts renormalised (w1/w3/w2 expert weights under "
        "block_sparse_moe), sliding window 64, head_dim 16 != hidden/heads",
        ablate_config=dict(num_experts_per_tok=1),
        ablation_desc="num_experts_per_tok 2 -> 1",
        probe=routing_probe,
    ),
    Spec(
        name="mixtral-default-theta",
        config_class="MixtralConfig",
        architecture="MixtralForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=32, head_dim=16, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
        strip_config_keys=["rope_parameters", "rope_theta"],
        feature="config.json without rope_theta / rope_parameters: MixtralConfig's default rope_theta 1e6 applies "
        "(not the 1e4 of most families)",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_theta 1e6 -> 1e4",
    ),
    Spec(
        name="qwen2-moe",
        config_class="Qwen2MoeConfig",
        architecture="Qwen2MoeForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=32, num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=32,
                    shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1],
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="Qwen2-MoE: softmax top-2 of 4 experts NOT renormalised (norm_topk_prob false), shared expert "
        "scaled by sigmoid(shared_expert_gate), q/k/v biases, mlp_only_layers [1] (layer 1 dense, 0 and 2 sparse)",
        ablate_fn=zero_shared_expert_gate,
        ablation_desc="shared_expert_gate weights zeroed (gate = sigmoid(0) = 0.5)",
        extra_ablations=[Ablate("norm_topk_prob false -> true", config=dict(norm_topk_prob=True))],
        probe=routing_probe,
    ),
    Spec(
        name="qwen3-moe",
        config_class="Qwen3MoeConfig",
        architecture="Qwen3MoeForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=32, head_dim=16, num_hidden_layers=4, intermediate_size=64, moe_intermediate_size=16,
                    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="Qwen3-MoE: per-head QK-norm, softmax top-2 of 8 experts renormalised (norm_topk_prob), "
        "decoder_sparse_step 2 (layers 1 and 3 sparse, 0 and 2 dense), head_dim 16",
        ablate_config=dict(norm_topk_prob=False),
        ablation_desc="norm_topk_prob true -> false",
        extra_ablations=[Ablate("q_norm/k_norm replaced by identity", fn=_drop_qk_norm)],
        probe=routing_probe,
    ),
    Spec(
        name="olmoe",
        config_class="OlmoeConfig",
        architecture="OlmoeForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=32, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                    rope_parameters=dict(DEFAULT_ROPE), pad_token_id=None),
        feature="OLMoE: QK-norm over the full q / k width (one RMSNorm across all heads), softmax top-2 of 8 "
        "experts not renormalised",
        ablate_fn=_drop_qk_norm,
        ablation_desc="q_norm/k_norm replaced by identity",
        probe=routing_probe,
    ),
    Spec(
        name="deepseek-v2",
        config_class="DeepseekV2Config",
        architecture="DeepseekV2ForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=32, num_key_value_heads=None, intermediate_size=64, moe_intermediate_size=16,
                    q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, first_k_dense_replace=1,
                    topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=2.0,
                    max_position_embeddings=1024,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                         original_max_position_embeddings=256, mscale=1.0, mscale_all_dim=0.8,
                                         beta_fast=32.0, beta_slow=1.0)),
        feature="DeepSeek-V2: MLA (q_proj, kv_lora_rank 32, nope 16 + rope 8, v 16, interleaved rope), YaRN "
        "(factor 4, mscale 1 / mscale_all_dim 0.8: cos/sin x attention_factor and softmax scale x mscale^2), "
        "group_limited_greedy top-3 of 8 experts in 4 groups (2 groups kept), routed_scaling_factor 2, 1 shared "
        "expert, first_k_dense_replace 1",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default (drops YaRN and its mscale)",
        extra_ablations=[Ablate("topk_method group_limited_greedy -> greedy", config=dict(topk_method="greedy"))],
        probe=routing_probe,
        notes=["num_key_value_heads is left at its default (= num_attention_heads): DeepseekV2Attention expands "
               "the latent to every head and fails with fewer KV heads."],
    ),
    Spec(
        name="deepseek-v3",
        config_class="DeepseekV3Config",
        architecture="DeepseekV3ForCausalLM",
        save_dtype="bfloat16",
        init_fn=init_correction_bias(0.1),
        kwargs=dict(DEEPSEEK_V3_TINY, rope_parameters=dict(DEFAULT_ROPE)),
        feature="DeepSeek-V3: MLA with q_lora_rank 24 (q_a_proj / q_a_layernorm / q_b_proj), interleaved rope; "
        "noaux_tc router: sigmoid scores + e_score_correction_bias (N(0, 0.1)) for the choice, top-2 of 4 groups "
        "by their two best scores, top-2 experts, unbiased weights renormalised (norm_topk_prob) x 2.5, 1 shared "
        "expert, first_k_dense_replace 1",
        ablate_config=dict(n_group=1, topk_group=1),
        ablation_desc="n_group 4 / topk_group 2 -> 1 / 1 (no group limit)",
        extra_ablations=[Ablate("routed_scaling_factor 2.5 -> 1.0", config=dict(routed_scaling_factor=1.0))],
        probe=routing_probe,
        notes=[DEEPSEEK_V3_KV_HEADS_NOTE],
    ),
    Spec(
        name="deepseek-v3-mtp",
        config_class="DeepseekV3Config",
        architecture="DeepseekV3ForCausalLM",
        save_dtype="bfloat16",
        init_fn=init_correction_bias(0.1),
        kwargs=dict(DEEPSEEK_V3_TINY, rope_parameters=dict(DEFAULT_ROPE)),
        seed=60,
        edit_saved_weights=_add_deepseek_mtp_layer,
        load_check=_deepseek_mtp_reference,
        feature="DeepSeek-V3 with the MTP layer real checkpoints ship after the last (layer num_hidden_layers: "
        "embed_tokens, enorm / hnorm, eh_proj, an MLA + MoE decoder layer, shared_head norm and head); the oracle is "
        "the model transformers loads (it ignores that layer), and load_check holds the layer's predictions computed "
        "with transformers' modules as vLLM's DeepSeekMultiTokenPredictorLayer runs it",
        ablate_config=dict(n_group=1, topk_group=1),
        ablation_desc="n_group 4 / topk_group 2 -> 1 / 1 (no group limit)",
        notes=[DEEPSEEK_V3_KV_HEADS_NOTE],
    ),
    Spec(
        name="deepseek-v32",
        config_class="DeepseekV32Config",
        architecture="DeepseekV32ForCausalLM",
        save_dtype="bfloat16",
        init_fn=init_correction_bias(0.1),
        kwargs=dict(DEEPSEEK_V3_TINY, index_n_heads=16, index_head_dim=16, index_topk=8,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                         original_max_position_embeddings=512, mscale=1.0, mscale_all_dim=1.0,
                                         beta_fast=32.0, beta_slow=1.0)),
        edit_saved_config=_deepseek_v32_hub_spelling,
        feature="DeepSeek-V3.2: DeepSeek Sparse Attention. Each layer's lightning indexer (16 heads of 16: "
        "wq_b on MLA's q LoRA latent, wk + LayerNorm k_norm on the hidden state, half-split rope on the first 8 dims, "
        "scores sum_h weights_proj(x)_h / 4 * relu(q_h . k / 4), causal) keeps the top 8 keys per query, and MLA "
        "(q_lora_rank 24, kv_lora_rank 32, nope 16 + interleaved rope 8, v 16) attends to those alone: every "
        "prompt but one is longer than 8 tokens; YaRN (factor 4, mscale = mscale_all_dim = 1: softmax scale x "
        "mscale^2); V3's noaux_tc routing (top-2 of 8 experts in 4 groups, 2 kept, x 2.5, 1 shared expert) from "
        "layer 1 (first_k_dense_replace 1); the released config's spelling (rope_scaling {type: yarn} + rope_theta, "
        "topk_method, scoring_func, no mlp_layer_types)",
        ablate_config=dict(index_topk=4096),
        ablation_desc="index_topk 8 -> 4096 (dense MLA attention)",
        extra_ablations=[Ablate("index_topk 8 -> 16", config=dict(index_topk=16))],
        probe=indexer_probe,
        notes=[DEEPSEEK_V3_KV_HEADS_NOTE,
               "16 indexer heads: with few heads whole rows of keys score exactly 0 (every head's relu 0) and "
               "top-k boundaries fall on ties that only torch.topk's order decides; the probe asserts none does."],
    ),
    Spec(
        name="llama-eagle3",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(num_hidden_layers=7, initializer_range=0.15, rope_parameters=dict(DEFAULT_ROPE)),
        edit_saved_weights=_add_eagle_heads,
        load_check=_eagle_reference,
        feature="a 7-layer Llama target with two random EAGLE-3 heads beside it (`eagle3/`: LlamaForCausalLMEagle3 "
        "layout, shared embeddings, vLLM's default aux layers 2/3/4; `eagle3-speculators/`: the speculators format, "
        "own embeddings, aux layers 1/3/6, norm_before_residual by default) and two EAGLE-1 heads (`eagle/`: fc bias, "
        "the target's embeddings and LM head; `eagle-hass/`: HASS input norms, its own embeddings and LM head); "
        "load_check holds each head's drafts computed as vLLM's llama_eagle3 / llama_eagle run it",
        ablate_config=dict(rope_parameters=dict(rope_type="default", rope_theta=100.0)),
        ablation_desc="rope_theta 10000 -> 100",
    ),
    # ---- wave 2: dense Llama relatives -------------------------------------------------------
    Spec(
        name="smollm3",
        config_class="SmolLM3Config",
        architecture="SmolLM3ForCausalLM",
        kwargs=dict(num_hidden_layers=4, pad_token_id=None, tie_word_embeddings=True,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="NoPE every 4th layer (no_rope_layers [1, 1, 1, 0] from no_rope_layer_interval 4), tied embeddings",
        ablate_config=dict(no_rope_layers=[1, 1, 1, 1]),
        ablation_desc="no_rope_layers [1, 1, 1, 0] -> [1, 1, 1, 1] (rope on every layer)",
    ),
    Spec(
        name="internlm3",
        config_class="InternLM3Config",
        architecture="LlamaForCausalLM",
        kwargs=dict(qkv_bias=True, bias=True, head_dim=16, rope_parameters=dict(DEFAULT_ROPE)),
        edit_saved_config=_internlm3_hub_spelling,
        feature="InternLM3 as its Hub checkpoints spell it: architectures InternLM3ForCausalLM, qkv_bias for the "
        "q/k/v biases and bias for o_proj and the MLP (transformers maps them onto Llama)",
        ablate_fn=_zero_qkv_bias,
        ablation_desc="q/k/v biases zeroed",
    ),
    Spec(
        name="seed-oss",
        config_class="SeedOssConfig",
        architecture="SeedOssForCausalLM",
        kwargs=dict(attention_bias=True, attention_out_bias=True, head_dim=16, pad_token_id=None,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="q/k/v biases from attention_bias, an o_proj bias from attention_out_bias",
        ablate_fn=_zero_o_bias,
        ablation_desc="o_proj bias zeroed",
    ),
    Spec(
        name="ernie4_5",
        config_class="Ernie4_5Config",
        architecture="Ernie4_5ForCausalLM",
        kwargs=dict(use_bias=True, head_dim=16, pad_token_id=None, tie_word_embeddings=True,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="rotary on adjacent pairs (GLM style), use_bias on every projection, tied embeddings",
        ablate_fn=_zero_qkv_bias,
        ablation_desc="q/k/v biases zeroed",
    ),
    Spec(
        name="ministral3",
        config_class="Ministral3Config",
        architecture="Ministral3ForCausalLM",
        kwargs=dict(head_dim=16, pad_token_id=None,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                         original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0,
                                         mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.5)),
        feature="Llama-4 query scaling after rope (1 + 0.5 ln(1 + floor(pos / 16))) with YaRN factor 4 over "
        "original_max_position_embeddings 16",
        ablate_fn=_no_llama4_query_scaling,
        ablation_desc="llama_4_scaling_beta 0.5 -> 0",
    ),
    Spec(
        name="arcee",
        config_class="ArceeConfig",
        architecture="ArceeForCausalLM",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="ungated MLP down(relu(up(x))^2) (hidden_act relu2, no gate_proj)",
        ablate_config=dict(hidden_act="relu"),
        ablation_desc="relu2 -> relu",
    ),
    Spec(
        name="apertus",
        config_class="ApertusConfig",
        architecture="ApertusForCausalLM",
        kwargs=dict(pad_token_id=None,
                    rope_parameters=dict(rope_type="llama3", rope_theta=12000000.0, factor=8.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=256)),
        feature="ungated MLP with xIELU (learned alpha_p / alpha_n per layer, beta 0.5, eps -1e-6), per-head "
        "QK-norm, attention_layernorm / feedforward_layernorm names, llama3 rope",
        ablate_fn=_xielu_to_relu2,
        ablation_desc="xielu -> relu2",
    ),
    Spec(
        name="cohere2",
        config_class="Cohere2Config",
        architecture="Cohere2ForCausalLM",
        kwargs=dict(num_hidden_layers=4, pad_token_id=None, tie_word_embeddings=True, logit_scale=2.0,
                    sliding_window=24, rope_parameters=dict(DEFAULT_ROPE)),
        feature="Command R7B: parallel block on a bias-free LayerNorm, layers [sliding 24, sliding, sliding, full]: "
        "only sliding layers rotate (interleaved pairs), the full layer has no positions; logit_scale 2",
        ablate_config=dict(sliding_window=4096),
        ablation_desc="sliding window 24 -> 4096",
    ),
    Spec(
        name="olmo3",
        config_class="Olmo3Config",
        architecture="Olmo3ForCausalLM",
        kwargs=dict(num_hidden_layers=4, hidden_size=48, intermediate_size=96, pad_token_id=None,
                    sliding_window=24,
                    rope_parameters=dict(sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                                         full_attention=dict(rope_type="linear", factor=4.0, rope_theta=500000.0))),
        feature="OLMo-2 block with layers [sliding 24, sliding, sliding, full], a rotary table per layer type "
        "(sliding theta 1e4, full theta 5e5 linear x4)",
        ablate_config=dict(sliding_window=4096),
        ablation_desc="sliding window 24 -> 4096",
    ),
    Spec(
        name="exaone4",
        config_class="Exaone4Config",
        architecture="Exaone4ForCausalLM",
        kwargs=dict(num_hidden_layers=4, pad_token_id=None, sliding_window=24,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="post-branch norms, per-head QK-norm, layers [sliding 24, sliding, sliding, full]: the full layer "
        "has no positions (global NoPE)",
        ablate_config=dict(sliding_window=4096),
        ablation_desc="sliding window 24 -> 4096",
    ),
    # ---- model families wave 2: GLM, HunYuan (float32 weights) ------------------------------------------------
    Spec(
        name="glm",
        config_class="GlmConfig",
        architecture="GlmForCausalLM",
        kwargs=dict(head_dim=16, pad_token_id=None, rope_parameters=dict(DEFAULT_ROPE)),
        feature="GLM-4 (glm-4-9b-chat-hf): q/k/v biases (attention_bias default true, o_proj none), fused "
        "gate_up_proj, partial rotary 0.5 by default (8 of 16 dims) rotating adjacent pairs, GQA 4/2",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=1.0)),
        ablation_desc="partial_rotary_factor 0.5 -> 1.0",
        extra_ablations=[Ablate("q/k/v biases zeroed", fn=_zero_qkv_bias)],
        notes=["GlmConfig defaults head_dim to 128 and pad_token_id to 151329, so both are set here. "
               "partial_rotary_factor comes from GlmConfig's default (0.5) and is saved inside rope_parameters.",
               "HF 5.24 GLM rope: cos/sin of the first rotary_dim/2 frequencies repeat_interleave'd, rotate_half "
               "on even/odd lanes: pairs (2i, 2i+1) rotate by frequency i, over the first rotary_dim dims."],
    ),
    Spec(
        name="glm4",
        config_class="Glm4Config",
        architecture="Glm4ForCausalLM",
        kwargs=dict(head_dim=16, pad_token_id=None, rope_parameters=dict(DEFAULT_ROPE)),
        feature="GLM-4-0414: GLM plus sandwich norms (post_self_attn_layernorm on the attention output, "
        "post_mlp_layernorm on the MLP output, before each residual add)",
        ablate_fn=_drop_glm4_sandwich_norms,
        ablation_desc="post_self_attn_layernorm / post_mlp_layernorm replaced by identity",
        extra_ablations=[Ablate("partial_rotary_factor 0.5 -> 1.0",
                                config=dict(rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=1.0)))],
    ),
    Spec(
        name="glm4-moe-mtp",
        config_class="Glm4MoeConfig",
        architecture="Glm4MoeForCausalLM",
        init_fn=init_correction_bias(0.1),
        kwargs=dict(GLM4_MOE_TINY, num_hidden_layers=2, num_nextn_predict_layers=1),
        seed=7,
        edit_saved_weights=_add_deepseek_mtp_layer,
        load_check=_deepseek_mtp_reference,
        feature="GLM-4.5 with the MTP layer its checkpoints ship after the last (layer num_hidden_layers: embed_tokens, "
        "enorm / hnorm, eh_proj, a GQA + MoE decoder layer, shared_head norm and head); the oracle is the model "
        "transformers loads (it ignores that layer), and load_check holds the layer's predictions computed with "
        "transformers' modules as vLLM's Glm4MoeMultiTokenPredictorLayer runs it",
        ablate_config=dict(n_group=1, topk_group=1),
        ablation_desc="n_group 4 / topk_group 2 -> 1 / 1 (no group limit)",
    ),
    Spec(
        name="afmoe",
        config_class="AfmoeConfig",
        architecture="AfmoeForCausalLM",
        init_fn=_randn_params("expert_bias", 0.1),  # a load-balancing statistic, zero at init
        kwargs=dict(hidden_size=32, head_dim=16, intermediate_size=64, moe_intermediate_size=16, num_experts=8,
                    num_experts_per_tok=2, num_shared_experts=1, num_dense_layers=1, route_scale=2.5,
                    global_attn_every_n_layers=2, sliding_window=24, mup_enabled=True, num_hidden_layers=4,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="Arcee AFMoE (Trinity): sandwich RMSNorms around attention and MLP, per-head QK-norm, attention output "
        "gated by sigmoid(gate_proj(x)), sliding-window layers (24) that rotate alternating with global NoPE layers "
        "(global_attn_every_n_layers 2), layer 0 dense then sigmoid routing with expert_bias (N(0, 0.1)) for the "
        "choice, top-2 of 8 renormalised x 2.5, one shared expert; muP embeddings x sqrt(hidden)",
        ablate_config=dict(mup_enabled=False),
        ablation_desc="mup_enabled -> False",
        extra_ablations=[
            Ablate("route_scale 2.5 -> 1.0", config=dict(route_scale=1.0)),
            Ablate("every layer slides and rotates", config=dict(layer_types=["sliding_attention"] * 4)),
            Ablate("attention gate_proj zeroed", fn=_zero_afmoe_attn_gate),
            Ablate("q_norm/k_norm replaced by identity", fn=_drop_qk_norm),
        ],
    ),
    Spec(
        name="cohere2-moe",
        config_class="Cohere2MoeConfig",
        architecture="Cohere2MoeForCausalLM",
        kwargs=dict(COHERE2_MOE_TINY),
        feature="Cohere 2 MoE: parallel block h = (h + attn) + mlp from one bias-free LayerNorm, adjacent-pair rotary on "
        "sliding (24) layers and on the dense prefix layer (prefix_dense_sliding_window_pattern 1), global layers NoPE; "
        "layer 0 dense (prefix_dense_intermediate_size 64), then top-2 of 8 router logits softmaxed, one shared expert "
        "averaged with the routed output; logit_scale 0.25, tied embeddings",
        ablate_config=dict(shared_expert_combination_strategy="sum"),
        ablation_desc="shared_expert_combination_strategy average -> sum",
        extra_ablations=[
            Ablate("expert_selection_fn softmax -> sigmoid", config=dict(expert_selection_fn="sigmoid")),
            Ablate("dense prefix layer without rotary", config=dict(prefix_dense_sliding_window_pattern=2)),
        ],
    ),
    Spec(
        name="cohere2-moe-rms-sigmoid",
        config_class="Cohere2MoeConfig",
        architecture="Cohere2MoeForCausalLM",
        kwargs=dict(COHERE2_MOE_TINY, rms_norm_eps=1e-5, expert_selection_fn="sigmoid", norm_topk_prob=True,
                    shared_expert_combination_strategy="sum"),
        feature="Cohere 2 MoE with RMSNorms (rms_norm_eps set), sigmoid of the top-2 router logits renormalised "
        "(norm_topk_prob), the shared expert summed with the routed output",
        ablate_config=dict(norm_topk_prob=False),
        ablation_desc="norm_topk_prob -> False",
        extra_ablations=[Ablate("shared_expert_combination_strategy sum -> average",
                                config=dict(shared_expert_combination_strategy="average"))],
    ),
    Spec(
        name="glm4-moe",
        config_class="Glm4MoeConfig",
        architecture="Glm4MoeForCausalLM",
        init_fn=init_correction_bias(0.1),
        kwargs=dict(GLM4_MOE_TINY, num_hidden_layers=3),
        feature="GLM-4.5: GQA with q/k/v biases, per-head QK-norm before RoPE (use_qk_norm), partial rotary 0.5 by "
        "default (8 of 16 dims, halves rotated); noaux_tc router: sigmoid + e_score_correction_bias (N(0, 0.1)) "
        "for the choice, top-2 of 4 groups, top-2 of 8 experts, renormalised x 2.5, 1 shared expert, "
        "first_k_dense_replace 1 (layer 0 dense)",
        ablate_config=dict(n_group=1, topk_group=1),
        ablation_desc="n_group 4 / topk_group 2 -> 1 / 1 (no group limit)",
        extra_ablations=[
            Ablate("routed_scaling_factor 2.5 -> 1.0", config=dict(routed_scaling_factor=1.0)),
            Ablate("partial_rotary_factor 0.5 -> 1.0",
                   config=dict(rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=1.0))),
            Ablate("q_norm/k_norm replaced by identity", fn=_drop_qk_norm),
        ],
        probe=routing_probe,
        notes=["head_dim is not a Glm4MoeConfig field; Glm4MoeAttention reads it with getattr (GLM-4.5's config.json "
               "has it: 96 heads of 128 over hidden 5120)."],
    ),
    Spec(
        name="glm4-moe-lite",
        config_class="Glm4MoeLiteConfig",
        architecture="Glm4MoeLiteForCausalLM",
        init_fn=init_correction_bias(0.1),
        kwargs=dict(hidden_size=32, num_hidden_layers=3, num_key_value_heads=4, intermediate_size=64,
                    moe_intermediate_size=16, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16,
                    qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
                    mlp_layer_types=["sparse", "dense", "sparse"], rope_parameters=dict(DEFAULT_ROPE)),
        feature="GLM-4.7-Flash: DeepSeek-V3 MLA (q_lora_rank 24, interleaved rope on 8 dims), noaux_tc router with "
        "e_score_correction_bias (N(0, 0.1)), one group, top-2 of 8 renormalised x routed_scaling_factor 1.8 (the "
        "config default), 1 shared expert (default), mlp_layer_types [sparse, dense, sparse]",
        ablate_config=dict(routed_scaling_factor=1.0),
        ablation_desc="routed_scaling_factor 1.8 -> 1.0",
        extra_ablations=[Ablate("rope_interleave -> False", config=dict(rope_interleave=False))],
        probe=routing_probe,
    ),
    Spec(
        name="hunyuan-dense",
        config_class="HunYuanDenseV1Config",
        architecture="HunYuanDenseV1ForCausalLM",
        kwargs=dict(head_dim=16, pad_token_id=None, rope_parameters=HUNYUAN_ALPHA_ROPE),
        feature="HunYuan dense: per-head RMSNorm on q and k AFTER RoPE (query_layernorm / key_layernorm), RoPE "
        "'dynamic' with alpha 1000: a fixed NTK base 1e4 * 1000^(16/14) at every length",
        ablate_fn=_drop_hunyuan_qk_norm,
        ablation_desc="query_layernorm / key_layernorm replaced by identity",
        extra_ablations=[Ablate("rope_parameters -> default (no alpha)", config=dict(rope_parameters=dict(DEFAULT_ROPE)))],
        notes=["HF 5.24 HunYuanDenseV1RotaryEmbedding: rope_type 'dynamic' with a truthy alpha becomes 'ntk_alpha': "
               "inv_freq = 1 / (base ** (arange(0, d, 2) / d)), base = rope_theta * alpha ** (d / (d - 2)) in Python "
               "floats, d = head_dim; dynamic_rope_update leaves it alone (static for every length)."],
    ),
    Spec(
        name="hunyuan-moe",
        config_class="HunYuanMoEV1Config",
        architecture="HunYuanMoEV1ForCausalLM",
        kwargs=dict(hidden_size=32, head_dim=16, intermediate_size=32, num_experts=8, moe_topk=[2, 1],
                    pad_token_id=None, rope_parameters=HUNYUAN_ALPHA_ROPE),
        feature="HunYuan MoE: every layer sparse, softmax router gate.wg (f32) top-k renormalised with moe_topk per "
        "layer [2, 1], shared_mlp added to the routed output, experts and shared MLP intermediate_size wide; "
        "post-RoPE QK-norm; alpha RoPE",
        ablate_fn=_drop_hunyuan_qk_norm,
        ablation_desc="query_layernorm / key_layernorm replaced by identity",
        extra_ablations=[Ablate("moe_topk [2, 1] -> 2", config=dict(moe_topk=2))],
    ),
    # ---- MoE families wave 2 (f32 on disk, hidden 32) ----------------------------------------------------------
    Spec(
        name="granite-moe",
        config_class="GraniteMoeConfig",
        architecture="GraniteMoeForCausalLM",
        kwargs=dict(hidden_size=32, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                    pad_token_id=None, embedding_multiplier=12.0, residual_multiplier=0.22,
                    attention_multiplier=0.25, logits_scaling=2.0, rope_parameters=dict(DEFAULT_ROPE)),
        feature="Granite MoE: top-2 of 4 experts by raw logit, weighted by the softmax over the two chosen logits; "
        "stacked input_linear / output_linear experts and router.layer; embedding_multiplier 12, "
        "residual_multiplier 0.22, attention_multiplier 0.25, logits divided by 2",
        ablate_fn=_granite_router_full_softmax,
        ablation_desc="router weights = softmax over all experts (not renormalised over the chosen two)",
        extra_ablations=[
            Ablate("residual_multiplier -> 1", config=dict(residual_multiplier=1.0)),
            Ablate("num_experts_per_tok 2 -> 1", config=dict(num_experts_per_tok=1)),
        ],
        probe=routing_probe,
    ),
    Spec(
        name="hyperclovax",
        config_class="HyperCLOVAXConfig",
        architecture="HyperCLOVAXForCausalLM",
        kwargs=dict(hidden_size=48, intermediate_size=96, pad_token_id=None, embedding_multiplier=3.0,
                    residual_multiplier=0.5, logits_scaling=0.7, use_post_norm=True, rope_parameters=dict(DEFAULT_ROPE)),
        feature="HyperCLOVAX: Granite's layer with an RMSNorm on each branch output before residual_multiplier 0.5 "
        "(Peri-LN post_norm1/post_norm2), embedding_multiplier 3, logits times logits_scaling 0.7, attention "
        "multiplier unset (head_dim^-0.5)",
        ablate_fn=_drop_hyperclovax_post_norms,
        ablation_desc="post_norm1/post_norm2 replaced by the identity",
    ),
    Spec(
        name="granite-swa",
        config_class="GraniteSWAConfig",
        architecture="GraniteSWAForCausalLM",
        init_fn=_randn_params("self_attn.sinks", 1.0),  # each head its own sink logit
        kwargs=dict(GRANITE_SWA_TINY),
        feature="GraniteSWA (granite-swash): Granite's multipliers, layer_types by default (layer 0 full, the rest "
        "sliding over 24), a learned sink logit per head (N(0, 1)), layer_rope_theta [0, 10000, 10000, 500000] (the "
        "full layer without positions, two rotary bases)",
        ablate_fn=_drop_swa_sinks,
        ablation_desc="sinks -> -1e4 (no sink)",
        extra_ablations=[
            Ablate("layer_rope_theta -> 10000 on every layer", config=dict(layer_rope_theta=[10000.0] * 4)),
            Ablate("every layer full", config=dict(layer_types=["full_attention"] * 4)),
        ],
    ),
    Spec(
        name="granite-moe-swa",
        config_class="GraniteMoeSWAConfig",
        architecture="GraniteMoeSWAForCausalLM",
        init_fn=_randn_params("self_attn.sinks", 1.0),  # each head its own sink logit
        kwargs=dict(GRANITE_SWA_TINY, hidden_size=32, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                    shared_intermediate_size=48),
        feature="GraniteMoeSWA: the granite-moe-shared layer with GraniteSWA's sliding layers, sinks and per-layer "
        "rotary bases",
        ablate_fn=_drop_swa_sinks,
        ablation_desc="sinks -> -1e4 (no sink)",
        extra_ablations=[
            Ablate("layer_rope_theta -> 10000 on every layer", config=dict(layer_rope_theta=[10000.0] * 4)),
        ],
        probe=routing_probe,
    ),
    Spec(
        name="granite-moe-shared",
        config_class="GraniteMoeSharedConfig",
        architecture="GraniteMoeSharedForCausalLM",
        kwargs=dict(hidden_size=32, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                    shared_intermediate_size=48, pad_token_id=None, embedding_multiplier=12.0,
                    residual_multiplier=0.22, attention_multiplier=0.25, logits_scaling=2.0,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="Granite MoE Shared: the granite-moe layer plus a dense shared_mlp (fused input_linear gate | up, "
        "width 48) added to the routed output before residual_multiplier",
        ablate_fn=_zero_granite_shared_mlp,
        ablation_desc="shared_mlp output_linear zeroed",
        probe=routing_probe,
    ),
    Spec(
        name="minimax-m2",
        config_class="MiniMaxM2Config",
        architecture="MiniMaxM2ForCausalLM",
        init_fn=init_correction_bias(0.1),
        kwargs=dict(hidden_size=32, head_dim=16, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                    rotary_dim=8, rope_parameters=dict(DEFAULT_ROPE)),
        feature="MiniMax-M2: sigmoid router, e_score_correction_bias (N(0, 0.1)) steers the top-2 of 8 but the "
        "weights are the chosen sigmoids renormalised; QK-norm over all heads at once (q_norm [64], k_norm [32]); "
        "partial rotary from the legacy rotary_dim 8 of head_dim 16",
        ablate_fn=_zero_correction_bias,
        ablation_desc="e_score_correction_bias zeroed",
        extra_ablations=[
            Ablate("q_norm/k_norm replaced by identity", fn=_drop_qk_norm),
            Ablate("partial_rotary_factor 0.5 -> 1.0",
                   config=dict(rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=1.0))),
        ],
        probe=routing_probe,
    ),
    Spec(
        name="ernie45-moe",
        config_class="Ernie4_5_MoeConfig",
        architecture="Ernie4_5_MoeForCausalLM",
        init_fn=_init_param_correction_bias(0.05),
        kwargs=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, moe_intermediate_size=16,
                    moe_num_experts=8, moe_k=2, moe_num_shared_experts=2, moe_layer_start_index=1,
                    moe_layer_end_index=2, use_bias=True, tie_word_embeddings=True, pad_token_id=None,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="ERNIE 4.5 MoE: softmax router, moe_statics.e_score_correction_bias (N(0, 0.05)) steers the top-2 "
        "of 8, weights renormalised; 2 shared experts (one MLP of 2 x 16); MoE on layers 1..=2 only "
        "(moe_layer_start_index 1, moe_layer_end_index 2; 0 and 3 dense); interleaved rope; use_bias on every "
        "projection and the tied lm_head",
        ablate_fn=_zero_correction_bias,
        ablation_desc="e_score_correction_bias zeroed",
        extra_ablations=[Ablate("lm_head bias zeroed", fn=_zero_lm_head_bias)],
        probe=routing_probe,
    ),
    Spec(
        name="minicpm3",
        config_class="MiniCPM3Config",
        architecture="MiniCPM3ForCausalLM",
        kwargs=dict(hidden_size=32, intermediate_size=64, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                    qk_nope_head_dim=8, qk_rope_head_dim=8, scale_emb=12, scale_depth=1.4, dim_model_base=16,
                    pad_token_id=None, max_position_embeddings=2048,
                    original_max_position_embeddings=256,
                    rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                         short_factor=[1.0, 1.1, 1.5, 2.0], long_factor=[1.0, 2.0, 5.0, 12.0])),
        feature="MiniCPM3: MLA (q_lora_rank 16, kv_lora_rank 16, nope 8 + rope 8, v 8) with rotate-half LongRoPE on "
        "the rope part (short factors up to 256 positions, long beyond, cos/sin x 1.1726), embeddings x scale_emb "
        "12, branches x scale_depth / sqrt(2 layers), hidden / (hidden / dim_model_base) = / 2 before the "
        "lm_head",
        ablate_config=dict(scale_depth=2 ** 0.5),
        ablation_desc="scale_depth 1.4 -> sqrt(2 layers) (branches x 1)",
        extra_ablations=[
            Ablate("long_factor -> short_factor", config=dict(rope_parameters=dict(
                rope_type="longrope", rope_theta=10000.0, short_factor=[1.0, 1.1, 1.5, 2.0],
                long_factor=[1.0, 1.1, 1.5, 2.0]))),
            Ablate("scale_emb 12 -> 1", fn=_unit_embed_scale),
        ],
    ),
    Spec(
        name="llama4",
        config_class="Llama4TextConfig",
        architecture="Llama4ForCausalLM",
        kwargs=dict(hidden_size=32, head_dim=16, num_hidden_layers=4, intermediate_size=32, intermediate_size_mlp=64,
                    num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                    no_rope_layer_interval=4, attention_chunk_size=32, attn_temperature_tuning=True,
                    floor_scale=16, attn_scale=0.5, use_qk_norm=True, pad_token_id=None,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="Llama 4 text: layers 0-2 rotary (adjacent pairs) + L2 QK-norm after rope + chunked attention (chunks "
        "of 32), layer 3 NoPE with full attention and temperature tuning (floor_scale 16, attn_scale 0.5); MoE on "
        "layers 1 and 3 (interleave_moe_layer_step 2): top-1 of 4 by raw logit, expert input x sigmoid(logit), "
        "plus a shared expert; dense MLP (intermediate_size_mlp 64) on 0 and 2",
        ablate_config=dict(attention_chunk_size=4096),
        ablation_desc="attention_chunk_size 32 -> 4096 (no chunk boundary in any prompt)",
        extra_ablations=[
            Ablate("attn_temperature_tuning -> False", config=dict(attn_temperature_tuning=False)),
            Ablate("L2 QK-norm dropped", fn=_drop_llama4_qk_norm),
            Ablate("expert output x score instead of input", fn=_llama4_weight_expert_outputs),
        ],
    ),
    Spec(
        name="gpt_oss",
        config_class="GptOssConfig",
        architecture="GptOssForCausalLM",
        init_fn=_scale_sinks(1.5),
        kwargs=dict(hidden_size=64, head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=3,
                    sliding_window=6, swiglu_limit=1.5, pad_token_id=None,
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=8.0, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False, original_max_position_embeddings=64)),
        feature="gpt-oss: attention sinks (a learned logit per head in each softmax denominator, N(0, 1.5)), "
        "layer 0 sliding (window 6) and layer 1 full (default layer_types), q/k/v/o biases, YaRN (factor 8 over "
        "64 positions, truncate false); MoE: router Linear with bias, top-3 of 4 logits softmaxed, experts with "
        "interleaved gate_up_proj + biases, clamped SwiGLU (limit 1.5, alpha 1.702, (up + 1) * glu), down + bias",
        ablate_fn=_drop_sinks,
        ablation_desc="sinks -> -inf (no sink)",
        extra_ablations=[
            Ablate("sliding_window 6 -> 4096", config=dict(sliding_window=4096)),
            Ablate("swiglu_limit 1.5 -> 7", config=dict(swiglu_limit=7.0)),
        ],
    ),
    Spec(
        name="gpt_oss_mxfp4",
        config_class="GptOssConfig",
        architecture="GptOssForCausalLM",
        init_fn=_mxfp4_round_experts,
        kwargs=dict(hidden_size=64, head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=6, pad_token_id=None),
        feature="gpt-oss as the Hub ships it: expert weights as MXFP4 `*_blocks` (uint8, two e2m1 values a byte, "
        "low nibble first, [E, out, in / 32, 16]) and `*_scales` (e8m0 exponents, one per 32 values) under "
        "quantization_config mxfp4, dequantized at load (transformers dequantizes on CPU); default YaRN rope "
        "(factor 32 over 4096), swiglu_limit 7",
        ablate_fn=_drop_sinks,
        ablation_desc="sinks -> -inf (no sink)",
        edit_saved_config=_mxfp4_config,
        edit_saved_weights=_mxfp4_checkpoint,
    ),
    Spec(
        name="gemma4",
        config_class="Gemma4TextConfig",
        architecture="Gemma4ForCausalLM",
        seed=1,
        kwargs=dict(intermediate_size=64, num_hidden_layers=5, head_dim=16, global_head_dim=32,
                    attention_k_eq_v=True, num_global_key_value_heads=1, pad_token_id=None,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                                 "full_attention"],
                    sliding_window=16, num_kv_shared_layers=2, use_double_wide_mlp=True,
                    hidden_size_per_layer_input=8, vocab_size_per_layer_input=1000,
                    final_logit_softcapping=30.0,
                    rope_parameters={
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0},
                    }),
        feature="Gemma 4 text: layer types [S, S, F, S, F] (sliding 16, head_dim 16, 2 KV heads; full head_dim 32, "
        "1 KV head with K = V projection), proportional rope on full layers (4 of 16 angles rotate, theta 1e6), "
        "layers 3-4 reuse the K/V of layers 1 and 2 (num_kv_shared_layers 2) with double-wide MLPs, per-layer "
        "inputs (8 per layer), random layer_scalar, q/k/v RMS norms, attention scale 1, final softcap 30, untied "
        "lm_head",
        init_fn=_gemma4_random_layer_scalars,
        edit_saved_config=_gemma4_hub_spelling,
        ablate_fn=_gemma4_drop_per_layer_inputs,
        ablation_desc="per-layer input branch zeroed (per_layer_projection = 0)",
        extra_ablations=[
            Ablate("shared sliding layer reads layer 0 instead of layer 1", fn=_gemma4_share_first_sliding_layer),
            Ablate("layer_scalar -> 1", fn=_gemma4_unit_layer_scalars),
            Ablate("proportional rope rotates every angle", config=dict(rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 1.0,
                                   "rope_theta": 1000000.0}})),
            Ablate("sliding_window 16 -> 4096", config=dict(sliding_window=4096)),
        ],
        notes=[
            "HF 5.24 Gemma4: RMSNorm is x * pow(mean(x^2) + eps, -0.5) * w (no 1 + w); v_norm has no weight; "
            "attention scaling 1.0, no attention softcap. Full layers with attention_k_eq_v take V from k_proj "
            "(before k_norm, then v_norm). Per-layer inputs: (norm(per_layer_model_projection(h0) * hidden^-0.5) + "
            "embed_tokens_per_layer(ids) * sqrt(8)) * 2^-0.5, layer i gets slice i; after the MLP residual "
            "h += post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(h)) * slice)); "
            "then h *= layer_scalar.",
            "Proportional rope: inv_freq = 1 / theta^(2j / head_dim) for j < int(0.25 * head_dim // 2), 0 beyond, "
            "rotated with rotate_half over the whole head (dims j and j + head_dim/2).",
            "config.json uses the Hub spelling global_head_dim / num_global_key_value_heads (no per_layer_config).",
            "lm_head is untied: with the tied embedding every seed tried repeats one token.",
        ],
    ),
    Spec(
        name="gemma3n",
        config_class="Gemma3nTextConfig",
        architecture="Gemma3nForCausalLM",
        kwargs=dict(intermediate_size=[64, 48, 96, 48, 64], num_hidden_layers=5, head_dim=16, pad_token_id=None,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                                 "full_attention"],
                    sliding_window=16, num_kv_shared_layers=2, activation_sparsity_pattern=[0.95, 0.0, 0.6, 0.3, 0.0],
                    altup_num_inputs=4, laurel_rank=8, hidden_size_per_layer_input=8, vocab_size_per_layer_input=600,
                    final_logit_softcapping=30.0, tie_word_embeddings=True,
                    rope_parameters={
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                    }),
        feature="Gemma 3n text: layer types [S, F, S, S, F] (sliding 16), head_dim 16, 2 KV heads; layers 3-4 reuse "
        "the K/V of layers 2 (sliding) and 1 (full) (num_kv_shared_layers 2); activation sparsity 0.95 / 0.6 / 0.3 "
        "on layers 0, 2, 3 (gaussian top-k through the normal icdf); AltUp with 4 copies, active copy 0, "
        "correct_output_scale; LAuReL rank 8; per-layer inputs (8 per layer, ids from 600 up read row 0); "
        "per-layer intermediate sizes; q/k/v RMS norms, attention scale 1, final softcap 30, tied embeddings",
        ablate_config=dict(activation_sparsity_pattern=[0.0] * 5),
        ablation_desc="activation sparsity off (every pattern entry 0)",
        extra_ablations=[
            Ablate("AltUp correction coefficients zeroed", fn=_gemma3n_zero_altup_correction),
            Ablate("LAuReL low-rank branch zeroed (linear_right = 0)", fn=_gemma3n_zero_laurel),
            Ablate("per-layer input branch zeroed (per_layer_projection = 0)", fn=_gemma3n_drop_per_layer_inputs),
            Ablate("shared sliding layer reads layer 0 instead of layer 2", fn=_gemma3n_share_first_sliding_layer),
            Ablate("altup_correct_scale false", config=dict(altup_correct_scale=False)),
            Ablate("sliding_window 16 -> 4096", config=dict(sliding_window=4096)),
        ],
        notes=[
            "HF 5.24 Gemma3n: RMSNorm is x * pow(mean(x^2) + eps, -0.5) * w (no 1 + w); v_norm has no weight; "
            "attention scaling 1.0. The stream is 4 copies: h0 = embed * sqrt(64), then altup_projections[k](h0) "
            "rescaled to h0's RMS (its own mean square clamped at 1e-5). Per layer: predictions = copies + "
            "sum_j coef[i*4+j] * copy_j with coef = prediction_coefs(tanh(modality_router(router_norm(copy_0) / 64))); "
            "the block runs on prediction 0 (input_layernorm; LAuReL x + post_laurel_norm(right(left(x))); "
            "attention; (pred0 + post_attention_layernorm(attn) + laurel) / sqrt(2); the MLP residual); then "
            "corrected_i = pred_i + (out - pred0) * (correction_coefs(tanh(router(out))) + 1)_i; the per-layer "
            "branch post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(corrected_0 * "
            "correct_output_scale)) * per_layer_input)) is added to copies 1-3. At the end copies 1-3 go through "
            "altup_unembed_projections, are rescaled to copy 0's RMS, and the 4 are averaged before the final norm.",
            "Activation sparsity p: gate = relu(gate - (mean + std * Normal(0, 1).icdf(p))) over each row "
            "(population std), before gelu_pytorch_tanh.",
            "Per-layer inputs: (norm(per_layer_model_projection(h0) * 64^-0.5) + embed_tokens_per_layer(ids) * "
            "sqrt(8)) * 2^-0.5, ids >= vocab_size_per_layer_input (600) read row 0.",
            "The shared layers' KV come from the last non-shared layer of each type (2 sliding, 1 full).",
        ],
    ),
    Spec(
        name="internlm2",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(attention_bias=True, rope_parameters=dict(DEFAULT_ROPE, rope_theta=50000.0)),
        feature="InternLM2 (remote code; oracle: Llama re-packed): wqkv fused per KV group ([q, q, k, v] x 2 groups "
        "for GQA 4/2), bias on wqkv and wo (`bias`), tok_embeddings / attention.wo / feed_forward.w1,w3,w2 / "
        "attention_norm / ffn_norm / output, rope_theta 50000",
        ablate_fn=_zero_qkv_bias,
        ablation_desc="q/k/v biases zeroed",
        extra_ablations=[Ablate("o_proj bias zeroed", fn=_zero_o_bias)],
        repack=_repack_internlm2,
        notes=["Method: InternLM2ForCausalLM needs trust_remote_code, so the oracle is a transformers LlamaForCausalLM "
               "with attention_bias (InternLM2 = Llama with a fused wqkv: vLLM internlm2.py views it as "
               "[kv_heads, q_per_kv + 2, head_dim]), whose saved tensors are then renamed and fused into the "
               "InternLM2 layout with the remote InternLM2Config keys (tools/oracle/generate_fixtures.py "
               "_repack_internlm2). oracle.json holds the Llama model's outputs."],
    ),
    Spec(
        name="minicpm",
        config_class="GraniteConfig",
        architecture="GraniteForCausalLM",
        kwargs=dict(tie_word_embeddings=True, pad_token_id=None, embedding_multiplier=12.0,
                    residual_multiplier=MINICPM_SCALE_DEPTH / math.sqrt(2), attention_multiplier=16 ** -0.5,
                    logits_scaling=2.0, rope_parameters=dict(DEFAULT_ROPE)),
        feature="MiniCPM (remote code; oracle: Granite re-packed): Llama names, tied lm_head, embeddings x scale_emb "
        "12, branches x scale_depth 1.4 / sqrt(2 layers), final hidden / (hidden 64 / dim_model_base 32)",
        ablate_config=dict(residual_multiplier=1.0),
        ablation_desc="scale_depth / sqrt(layers) -> 1",
        extra_ablations=[Ablate("scale_emb 12 -> 1", config=dict(embedding_multiplier=1.0))],
        repack=_repack_minicpm,
        notes=["Method: MiniCPMForCausalLM needs trust_remote_code, so the oracle is a transformers GraniteForCausalLM "
               "with embedding_multiplier = scale_emb, residual_multiplier = scale_depth / sqrt(num_hidden_layers), "
               "attention_multiplier = head_dim^-0.5 and logits_scaling = hidden_size / dim_model_base, re-packed "
               "into MiniCPM's config keys (the tensor names are the same; _repack_minicpm).",
               "MiniCPM divides the final hidden state before the lm_head, Granite the logits after it: the same "
               "function up to f32 rounding of a linear map (well inside the gate's log-prob tolerance).",
               "logits_scaling only shows in the log-probs (monotonic), as for the granite fixture."],
    ),
    Spec(
        name="chatglm",
        config_class="GlmConfig",
        architecture="GlmForCausalLM",
        kwargs=dict(head_dim=16, pad_token_id=None, rope_parameters=dict(DEFAULT_ROPE, rope_theta=50000.0)),
        feature="ChatGLM (chatglm2/3, glm-4-9b-chat; remote code; oracle: GLM re-packed): fused query_key_value "
        "[q; k; v] with bias (add_qkv_bias), multi_query_group_num 2 of 4 heads, dense_h_to_4h (gate; up), rotary on "
        "half of kv_channels 16 rotating adjacent pairs (original_rope) with base 10000 x rope_ratio 5, "
        "transformer.encoder.* names, untied output_layer",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE, rope_theta=10000.0)),
        ablation_desc="rope_ratio 5 -> 1 (base 10000)",
        extra_ablations=[Ablate("q/k/v biases zeroed", fn=_zero_qkv_bias)],
        repack=_repack_chatglm,
        notes=["Method: ChatGLMModel needs trust_remote_code, so the oracle is a transformers GlmForCausalLM (the "
               "glm-4-9b-chat-hf port: partial_rotary_factor 0.5 with adjacent-pair rotation, which is ChatGLM's "
               "original_rope over kv_channels / 2 as in vLLM chatglm.py), re-packed into ChatGLM's names and "
               "ChatGLMConfig keys (_repack_chatglm), with the transformer.rotary_pos_emb.inv_freq buffer the "
               "remote checkpoints carry.",
               "GlmConfig defaults head_dim to 128 and pad_token_id to 151329, so both are set here."],
    ),
    # ---- FP8 checkpoints (oracle: transformers on CPU loading the checkpoint with default settings) ----
    Spec(
        name="llama-fp8-dynamic",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="bfloat16",
        robust=True,
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="compressed-tensors FP8_DYNAMIC (llmcompressor oneshot, data-free, ignore lm_head): q/k/v/o/gate/"
        "up/down weights float8_e4m3fn with per-output-channel weight_scale [out, 1] (bf16); W8A8: every quantized "
        "linear's input fake-quantized per token (scale = amax / 448)",
        ablate_fn=_ct_w8a16,
        ablation_desc="activation fake-quantization off (W8A16: quantization_enabled = False)",
        extra_ablations=[Ablate("per-channel weight_scale -> its mean", fn=_ct_mean_weight_scale)],
        edit_saved_weights=_llmcompressor_checkpoint("FP8_DYNAMIC", ["lm_head"]),
        notes=["Quantized by tools/oracle/fp8_quantize.py: llmcompressor oneshot, QuantizationModifier(targets="
               "'Linear', scheme='FP8_DYNAMIC', ignore=['lm_head']), model loaded in float32 (the bf16-saved fixture upcast, so embed, norms, lm_head and the scales are stored F32) from the saved fixture, "
               "save_pretrained(save_compressed=True); config.json's quantization_config is as llmcompressor wrote it"],
    ),
    # ---- Integer weight-only checkpoints (compressed-tensors pack-quantized; oracle: transformers on CPU
    # decompressing them as it loads) ----
    Spec(
        name="llama-w4a16",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="compressed-tensors W4A16 pack-quantized (llmcompressor oneshot, data-free, ignore lm_head): "
        "q/k/v/o/gate/up/down weights int4 symmetric, one bf16 weight_scale per 32 inputs, eight to an int32 "
        "`weight_packed`, with `weight_shape`",
        ablate_fn=_ct_mean_weight_scale,
        ablation_desc="every per-group weight_scale -> its mean",
        edit_saved_weights=_llmcompressor_checkpoint(json.dumps(W4A16_GROUPS(32, True)), ["lm_head"]),
        notes=["Quantized by tools/oracle/fp8_quantize.py: llmcompressor oneshot, QuantizationModifier("
               "config_groups=" + json.dumps(W4A16_GROUPS(32, True)) + ", ignore=['lm_head']), model loaded in "
               "float32 from the saved fixture, save_pretrained(save_compressed=True)"],
    ),
    Spec(
        name="llama-w8a16",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="compressed-tensors W8A16 (llmcompressor oneshot, data-free, ignore lm_head): int8 symmetric "
        "weights with one bf16 weight_scale per output channel",
        ablate_fn=_ct_mean_weight_scale,
        ablation_desc="every per-channel weight_scale -> its mean",
        edit_saved_weights=_llmcompressor_checkpoint(json.dumps(W8A16_GROUPS), ["lm_head"]),
        notes=["Quantized by tools/oracle/fp8_quantize.py: llmcompressor oneshot, QuantizationModifier("
               "config_groups=" + json.dumps(W8A16_GROUPS) + ", ignore=['lm_head'])"],
    ),
    Spec(
        name="llama-nvfp4a16",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="compressed-tensors NVFP4A16 nvfp4-pack-quantized (llmcompressor oneshot, data-free, ignore lm_head): "
        "q/k/v/o/gate/up/down weights FP4 e2m1, two to a uint8 `weight_packed`, one float8_e4m3fn weight_scale "
        "per 16 inputs and an f32 per-tensor `weight_global_scale`; transformers (dequantize=True: see load_fixture) "
        "decompresses them at load as bf16(fp4 * (f32(scale) / global_scale))",
        ablate_fn=lambda m: _nvfp4_rewrite(m, scale=lambda s: s.mean().expand_as(s)),
        ablation_desc="every weight_scale -> its tensor's mean",
        extra_ablations=[
            Ablate("weight_global_scale multiplied where it divides", fn=lambda m: _nvfp4_rewrite(m, global_divides=False)),
            Ablate("each byte's high nibble read first", fn=lambda m: _nvfp4_rewrite(m, high_first=True)),
        ],
        edit_saved_weights=_llmcompressor_checkpoint("NVFP4A16", ["lm_head"]),
        load_check=nvfp4_load_check,
        notes=["Quantized by tools/oracle/fp8_quantize.py: llmcompressor oneshot, QuantizationModifier(targets="
               "'Linear', scheme='NVFP4A16', ignore=['lm_head']), model loaded in float32 from the saved fixture, "
               "save_pretrained(save_compressed=True)"],
    ),
    # ---- GPTQ / AWQ checkpoints (oracle: transformers' Llama on the dequantized weights; see _int_quant_round) ----
    Spec(
        name="llama-gptq",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="float16",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="GPTQ v1 (checkpoint_format gptq), 4 bits symmetric, group_size 32, desc_act false: q/k/v/o/gate/up/"
        "down as int32 qweight [in / 8, out] (packed along the inputs), qzeros [in / 32, out / 8] (zero - 1, packed "
        "along the outputs), f16 scales [in / 32, out], g_idx = i / 32; lm_head f16. Oracle: transformers' Llama on "
        "the weights dequantized as gptqmodel 7.7.0's torch kernel does (not installed: compiled extensions)",
        init_fn=_int_quant_round(GPTQ_4),
        repack=_int_quant_repack(GPTQ_4),
        ablate_fn=_int_quant_ablation(GPTQ_4, _zeros_minus_one_kept),
        ablation_desc="v1 zero points taken as stored (the +1 of gptqmodel's v1 -> v2 conversion dropped)",
        notes=["Written by _int_quantize (round to nearest: scale = f16(2 amax / 15), zero 8) and packed by "
               "_int_quant_repack; the oracle model's weights are _gptq_dequantize of those tensors, taken from "
               "gptqmodel 7.7.0 (convert_gptq_v1_to_v2_format_module, then TorchLinear's dequantize_weight: "
               "scales[g_idx] * (q - zeros[g_idx]) in float16)"],
    ),
    Spec(
        name="llama-gptq-act",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="float16",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="GPTQ v1, 4 bits asymmetric (sym false), group_size 32, desc_act true: each linear's g_idx a random "
        "permutation of the inputs grouped 32 at a time, zero points per group and output. Oracle: transformers' "
        "Llama on the weights dequantized as gptqmodel 7.7.0's torch kernel does (not installed)",
        init_fn=_int_quant_round(GPTQ_ACT),
        repack=_int_quant_repack(GPTQ_ACT),
        ablate_fn=_int_quant_ablation(GPTQ_ACT, _g_idx_ignored),
        ablation_desc="g_idx ignored (input i in group i / 32)",
        extra_ablations=[Ablate("v1 zero points taken as stored", fn=_int_quant_ablation(GPTQ_ACT,
                                                                                            _zeros_minus_one_kept))],
        notes=["Round to nearest with scale = f16((max(w, 0) - min(w, 0)) / 15), zero = round(-min / scale) over "
               "each group's inputs (those g_idx names); dequantized by _gptq_dequantize (gptqmodel 7.7.0's)"],
    ),
    Spec(
        name="llama-gptq-w8",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="float16",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="GPTQ v1, 8 bits symmetric, group_size -1 (one group over all inputs): qweight [in / 4, out], qzeros "
        "[1, out / 4], scales [1, out]. Oracle: transformers' Llama on the weights dequantized as gptqmodel 7.7.0's "
        "torch kernel does (not installed)",
        init_fn=_int_quant_round(GPTQ_8),
        repack=_int_quant_repack(GPTQ_8),
        ablate_fn=_int_quant_ablation(GPTQ_8, _zeros_minus_one_kept),
        ablation_desc="v1 zero points taken as stored (the +1 dropped)",
    ),
    Spec(
        name="llama-awq",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="float16",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="AWQ GEMM (version gemm), 4 bits with zero points, group_size 32: qweight [in, out / 8] and qzeros "
        "[in / 32, out / 8] packed along the outputs in AWQ's order [0, 2, 4, 6, 1, 3, 5, 7], f16 scales "
        "[in / 32, out]; modules_to_not_convert keeps layer 1's down_proj f16. Oracle: transformers' Llama on the "
        "weights dequantized as gptqmodel 7.7.0's dequantize_gemm does (not installed)",
        init_fn=_int_quant_round(AWQ_4),
        repack=_int_quant_repack(AWQ_4),
        ablate_fn=_int_quant_ablation(AWQ_4, _awq_natural_order),
        ablation_desc="the fields of each word read in natural order (AWQ's interleave ignored)",
        notes=["Round to nearest per group of 32 inputs with AutoAWQ's rule: scale = f16((max - min) / 15), zero = "
               "-round(min / scale) clamped to [0, 15]; dequantized by _awq_dequantize (gptqmodel 7.7.0's "
               "dequantize_gemm: (q - zero) * scale in float16)"],
    ),
    Spec(
        name="llama-fp8-static",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="bfloat16",
        robust=True,
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="compressed-tensors FP8 static (llmcompressor oneshot scheme FP8, calibrated, ignore lm_head): "
        "weights float8_e4m3fn with one per-tensor weight_scale [1] and one static per-tensor input_scale [1] "
        "(bf16) per linear; W8A8 with the stored input_scale",
        ablate_fn=_ct_w8a16,
        ablation_desc="activation fake-quantization off (W8A16: quantization_enabled = False)",
        edit_saved_weights=_llmcompressor_checkpoint("FP8", ["lm_head"], calibrate=True),
        notes=["Quantized by tools/oracle/fp8_quantize.py: llmcompressor oneshot, QuantizationModifier(targets="
               "'Linear', scheme='FP8', ignore=['lm_head']), model loaded in float32 (the bf16-saved fixture upcast, so embed, norms, lm_head and the scales are stored F32); calibration set = the token ids "
               "of the battery prompts " + ", ".join(CALIB_CASES) + " (one sequence a batch, no shuffling, "
               "llmcompressor's default observers)"],
    ),
    Spec(
        name="llama-fp8-block",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        save_dtype="bfloat16",
        robust=True,
        kwargs=dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, rope_parameters=dict(DEFAULT_ROPE)),
        feature="compressed-tensors FP8_BLOCK (llmcompressor oneshot, data-free, ignore lm_head): weights "
        "float8_e4m3fn with a weight_scale per 128x128 block [out / 128, in / 128] (bf16); W8A8 with the input "
        "fake-quantized per token per group of 128 along the hidden dim; every linear dim a multiple of 128 "
        "(hidden 128, 4 q heads x 64, 2 kv heads, intermediate 256)",
        ablate_fn=_ct_w8a16,
        ablation_desc="activation fake-quantization off (W8A16: quantization_enabled = False)",
        extra_ablations=[Ablate("per-block weight_scale -> its mean", fn=_ct_mean_weight_scale)],
        edit_saved_weights=_llmcompressor_checkpoint("FP8_BLOCK", ["lm_head"]),
        notes=["Quantized by tools/oracle/fp8_quantize.py: llmcompressor oneshot, QuantizationModifier(targets="
               "'Linear', scheme='FP8_BLOCK', ignore=['lm_head']), model loaded in float32 (the bf16-saved fixture upcast, so embed, norms, lm_head and the scales are stored F32), data-free"],
    ),
    Spec(
        name="qwen3-fp8",
        config_class="Qwen3Config",
        architecture="Qwen3ForCausalLM",
        save_dtype="bfloat16",
        robust=True,
        kwargs=dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, rope_parameters=dict(DEFAULT_ROPE)),
        feature="Qwen3-*-FP8 / DeepSeek-V3 `fp8` block layout: quantization_config {quant_method fp8, fmt e4m3, "
        "activation_scheme dynamic, weight_block_size [128, 128]}; decoder linears float8_e4m3fn + f32 "
        "weight_scale_inv [out / 128, in / 128] (weight = f32(w8) * scale per 128x128 block); transformers on CPU "
        "dequantizes at load (W8A16, no activation quantization); embed, norms, lm_head bf16",
        ablate_fn=_fp8_block_mean_scale,
        ablation_desc="per-block weight_scale_inv -> the matrix's mean scale",
        extra_ablations=[Ablate("q_norm/k_norm replaced by identity", fn=_drop_qk_norm)],
        edit_saved_config=_fp8_block_config,
        edit_saved_weights=_fp8_block_checkpoint,
        notes=["Written by _fp8_block_checkpoint: per 128x128 block scale = amax(|w|) / 448 in f32 (w the bf16 "
               "weight upcast), w8 = (w / scale).clamp(+-448).to(float8_e4m3fn) (round to nearest even), "
               "weight_scale_inv = scale (the name is DeepSeek's; it multiplies)"],
    ),
    Spec(
        name="qwen3-moe-fp8-dynamic",
        config_class="Qwen3MoeConfig",
        architecture="Qwen3MoeForCausalLM",
        save_dtype="bfloat16",
        robust=True,
        kwargs=dict(hidden_size=64, head_dim=16, num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32,
                    num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                    rope_parameters=dict(DEFAULT_ROPE)),
        feature="compressed-tensors FP8_DYNAMIC MoE (llmcompressor oneshot, data-free, ignore lm_head and the router "
        "mlp.gate): attention q/k/v/o and every expert's gate/up/down float8_e4m3fn with per-channel weight_scale; "
        "attention W8A8 (per-token activation fake-quant), experts dequantized at load (W8A16)",
        ablate_fn=_ct_w8a16,
        ablation_desc="activation fake-quantization off (W8A16: quantization_enabled = False)",
        extra_ablations=[Ablate("per-channel weight_scale -> its mean", fn=_ct_mean_weight_scale)],
        edit_saved_weights=_llmcompressor_checkpoint("FP8_DYNAMIC", ["lm_head", "re:.*mlp.gate$"]),
        probe=routing_probe,
        notes=["Quantized by tools/oracle/fp8_quantize.py in a subprocess: llmcompressor oneshot, "
               "QuantizationModifier(targets='Linear', scheme='FP8_DYNAMIC', ignore=['lm_head', 're:.*mlp.gate$']), "
               "model loaded in float32 (the bf16-saved fixture upcast, so embed, norms, lm_head and the scales are stored F32), data-free"],
    ),
    Spec(
        name="deepseek-v3-fp8",
        config_class="DeepseekV3Config",
        architecture="DeepseekV3ForCausalLM",
        save_dtype="bfloat16",
        init_fn=init_correction_bias(0.1),
        kwargs=dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, intermediate_size=384,
                    moe_intermediate_size=256, q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=64,
                    qk_rope_head_dim=128, v_head_dim=64, n_routed_experts=6, n_shared_experts=1,
                    num_experts_per_tok=2, first_k_dense_replace=1, n_group=3, topk_group=2,
                    routed_scaling_factor=2.5, norm_topk_prob=True, rope_parameters=dict(DEFAULT_ROPE)),
        feature="DeepSeek-V3 `fp8` block checkpoint (quantization_config {quant_method fp8, fmt e4m3, activation_scheme "
        "dynamic, weight_block_size [128, 128]}): MLA q_a_proj / q_b_proj / kv_a_proj_with_mqa / kv_b_proj / o_proj, "
        "the dense MLP (layer 0) and every routed and shared expert's gate / up / down float8_e4m3fn + f32 "
        "weight_scale_inv [out / 128, in / 128]; router mlp.gate (+ e_score_correction_bias), embed, norms, lm_head "
        "bf16. transformers on CPU dequantizes at load (W8A16). Model: MLA (q_lora_rank 128, kv_lora_rank 128, 2 "
        "heads, nope 64 + rope 128, v 64, interleaved rope), noaux_tc router (sigmoid + correction bias N(0, 0.1), "
        "top-2 of 3 groups by their two best scores, top-2 of 6 experts, renormalised x 2.5), 1 shared expert, first_k_dense_replace 1; "
        "every quantized dim a multiple of 128",
        ablate_fn=_fp8_block_mean_scale,
        ablation_desc="per-block weight_scale_inv -> the matrix's mean scale (every quantized matrix)",
        extra_ablations=[
            Ablate("expert weight_scale_inv -> each expert matrix's mean scale (routed experts only)",
                   fn=_fp8_block_mean_scale_experts),
            Ablate("n_group 3 / topk_group 2 -> 1 / 1 (no group limit)", config=dict(n_group=1, topk_group=1)),
            Ablate("routed_scaling_factor 2.5 -> 1.0", config=dict(routed_scaling_factor=1.0)),
        ],
        edit_saved_config=_fp8_block_config,
        edit_saved_weights=_fp8_block_checkpoint,
        probe=routing_probe,
        load_check=fp8_block_load_check,
        notes=["Written by _fp8_block_checkpoint: per 128x128 block scale = amax(|w|) / 448 in f32 (w the bf16 "
               "weight upcast), w8 = (w / scale).clamp(+-448).to(float8_e4m3fn) (round to nearest even), "
               "weight_scale_inv = scale (the name is DeepSeek's; it multiplies). Experts are per-expert tensors "
               "mlp.experts.{e}.{gate,up,down}_proj.weight (+ _scale_inv), as DeepSeek-V3 ships them.",
               "Dims chosen so every quantized matrix is a multiple of 128 both ways (transformers infers the block "
               "from the scale grid and cannot take a partial last block): kv_a_proj_with_mqa out = kv_lora_rank "
               "128 + qk_rope_head_dim 128 = 256 and kv_b_proj in = kv_lora_rank 128 force both to multiples of 128 "
               "(real DeepSeek-V3 has 512 + 64 = 576, a partial block); hidden 128 keeps the fixture under 2 MB.",
               "W8A16 (transformers dequantizes at load on CPU; no activation quantization), so no robustness "
               "filter: the seed only has to pass the top-2 gap filter.",
               "num_key_value_heads is set to num_attention_heads: MLA expands the latent to every query head."],
    ),
    Spec(
        name="qwen3-moe-fp8",
        config_class="Qwen3MoeConfig",
        architecture="Qwen3MoeForCausalLM",
        save_dtype="bfloat16",
        kwargs=dict(hidden_size=128, head_dim=128, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
                    intermediate_size=256, moe_intermediate_size=256, num_experts=4, num_experts_per_tok=2,
                    norm_topk_prob=True, decoder_sparse_step=1, rope_parameters=dict(DEFAULT_ROPE)),
        feature="Qwen3-30B-A3B-FP8 `fp8` block layout (quantization_config {quant_method fp8, fmt e4m3, "
        "activation_scheme dynamic, weight_block_size [128, 128]}): attention q/k/v/o and every expert's "
        "gate / up / down (per-expert tensors mlp.experts.{e}.*_proj.weight) float8_e4m3fn + f32 weight_scale_inv "
        "[out / 128, in / 128]; router mlp.gate, embed, norms, lm_head bf16. transformers on CPU dequantizes at load "
        "(W8A16). Model: 2 q heads x 128, 1 kv head, QK-norm, softmax top-2 of 4 experts renormalised, every layer "
        "sparse",
        ablate_fn=_fp8_block_mean_scale,
        ablation_desc="per-block weight_scale_inv -> the matrix's mean scale (every quantized matrix)",
        extra_ablations=[
            Ablate("expert weight_scale_inv -> each expert matrix's mean scale (experts only)",
                   fn=_fp8_block_mean_scale_experts),
            Ablate("norm_topk_prob true -> false", config=dict(norm_topk_prob=False)),
        ],
        edit_saved_config=_fp8_block_config,
        edit_saved_weights=_fp8_block_checkpoint,
        probe=routing_probe,
        load_check=fp8_block_load_check,
        notes=["Written by _fp8_block_checkpoint: per 128x128 block scale = amax(|w|) / 448 in f32 (w the bf16 "
               "weight upcast), w8 = (w / scale).clamp(+-448).to(float8_e4m3fn) (round to nearest even), "
               "weight_scale_inv = scale (it multiplies).",
               "Every quantized dim a multiple of 128 (hidden 128, head_dim 128, moe_intermediate 256): transformers "
               "infers the block from the scale grid and cannot take a partial last block.",
               "W8A16 (transformers dequantizes at load on CPU; no activation quantization), so no robustness "
               "filter: the seed only has to pass the top-2 gap filter."],
    ),
    Spec(
        name="qwen3-next",
        config_class="Qwen3NextConfig",
        architecture="Qwen3NextForCausalLM",
        kwargs=dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                    shared_expert_intermediate_size=16, decoder_sparse_step=1, mlp_only_layers=[1],
                    rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=0.25), **GDN_DIMS),
        edit_saved_config=_hybrid_interval_spelling,
        # Longer than the GDN chunk (64) and than a prefill chunk of the engine's chunked-prefill tests.
        extra_prompt_tokens=[("long_150", 150)],
        feature="Qwen3-Next: 3 Gated DeltaNet layers then 1 full-attention layer (full_attention_interval 4, the "
        "real config spelling); GDN with 2 key heads serving 4 value heads (interleaved in_proj_qkvz / in_proj_ba), "
        "causal conv1d kernel 4, L2-normed q/k, gated RMSNorm; attention with a sigmoid output gate from q_proj and "
        "(1 + w) QK-norm, partial rotary 0.25; MoE with a sigmoid-gated shared expert, layer 1 dense (mlp_only_layers)",
        ablate_fn=_drop_attn_output_gate,
        ablation_desc="attention output gate zeroed (sigmoid 0.5)",
        extra_ablations=[Ablate("GDN causal conv replaced by the identity", fn=_drop_gdn_conv)],
        notes=["The oracle runs transformers' torch fallbacks: chunked gated delta rule (chunk 64) for prompts, "
               "the recurrent rule for single-token decode."],
    ),
    Spec(
        name="qwen3_5",
        config_class="Qwen3_5TextConfig",
        architecture="Qwen3_5ForCausalLM",
        kwargs=dict(QWEN3_5_TINY, rope_parameters=qwen3_5_rope()),
        edit_saved_config=_hybrid_interval_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Qwen3.5 dense text: 3 Gated DeltaNet layers (separate in_proj_qkv / in_proj_z / in_proj_b / "
        "in_proj_a) then 1 gated full-attention layer, full_attention_interval 4, partial rotary 0.25 with an "
        "interleaved mrope_section that text-only positions reduce to plain RoPE",
        ablate_fn=_drop_attn_output_gate,
        ablation_desc="attention output gate zeroed (sigmoid 0.5)",
        extra_ablations=[Ablate("GDN causal conv replaced by the identity", fn=_drop_gdn_conv)],
    ),
    Spec(
        name="qwen3_5-mtp",
        config_class="Qwen3_5TextConfig",
        architecture="Qwen3_5ForCausalLM",
        kwargs=dict(QWEN3_5_TINY, rope_parameters=qwen3_5_rope()),
        seed=40,
        edit_saved_weights=_add_mtp_head,
        load_check=_mtp_reference,
        feature="Qwen3.5 dense text with the multi-token-prediction head real checkpoints ship (mtp.*: fc over "
        "[norm(embedding of the next token), norm(final hidden state)], one gated full-attention layer, a norm, "
        "the model's LM head); the oracle is the text model (transformers ignores mtp.*), and load_check holds the "
        "head's predictions computed with transformers' modules as vLLM's Qwen3NextMultiTokenPredictor runs it",
        ablate_fn=_drop_attn_output_gate,
        ablation_desc="attention output gate zeroed (sigmoid 0.5)",
    ),
    Spec(
        name="qwen3_5-moe",
        config_class="Qwen3_5MoeTextConfig",
        architecture="Qwen3_5MoeForCausalLM",
        kwargs=dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                    rope_parameters=qwen3_5_rope(), **GDN_DIMS),
        edit_saved_config=_hybrid_interval_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Qwen3.5-MoE text: Qwen3.5's Gated DeltaNet (separate in_proj_qkv / z / b / a) and gated attention, "
        "3:1 (full_attention_interval 4), every layer a sparse MoE (top-2 of 8, always renormalised) with a "
        "sigmoid-gated shared expert",
        ablate_fn=_drop_attn_output_gate,
        ablation_desc="attention output gate zeroed (sigmoid 0.5)",
        extra_ablations=[Ablate("GDN causal conv replaced by the identity", fn=_drop_gdn_conv)],
    ),
    Spec(
        name="qwen3_5-conditional",
        config_class="Qwen3_5TextConfig",
        architecture="Qwen3_5ForCausalLM",
        kwargs=dict(QWEN3_5_TINY, rope_parameters=qwen3_5_rope()),
        seed=100,
        repack=_repack_qwen3_5_conditional,
        feature="The layout of real Qwen3.5 checkpoints: Qwen3_5ForConditionalGeneration, the text config nested in "
        "text_config (layer_types spelled out), text weights under model.language_model., vision and MTP tensors "
        "present and ignored; the oracle is the text model transformers loads from it (Qwen3_5ForCausalLM)",
        ablate_fn=_drop_attn_output_gate,
        ablation_desc="attention output gate zeroed (sigmoid 0.5)",
    ),
    Spec(
        name="mamba2",
        config_class="Mamba2Config",
        architecture="Mamba2ForCausalLM",
        kwargs=dict(hidden_size=32, num_heads=4, head_dim=16, expand=2, state_size=8, n_groups=2,
                    num_hidden_layers=3, conv_kernel=4, chunk_size=64),
        edit_saved_config=_python_infinity_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Mamba2: every layer an SSD mixer (4 heads of 16 over 2 B/C groups of state 8), causal conv with "
        "bias, softplus(dt + dt_bias), the D skip, grouped gated RMSNorm (norm after gating); no attention, no "
        "position embeddings; time_step_limit (0, Infinity) written as Python's non-standard JSON; the oracle's "
        "prompts run the chunked scan (chunk 64), decode the selective state update",
        ablate_fn=_drop_mamba_skip,
        ablation_desc="D skip zeroed",
        extra_ablations=[Ablate("causal conv replaced by the identity", fn=_mamba_conv_identity)],
    ),
    Spec(
        name="mamba",
        config_class="MambaConfig",
        architecture="MambaForCausalLM",
        kwargs=dict(hidden_size=32, expand=2, state_size=8, num_hidden_layers=3, conv_kernel=4),
        extra_prompt_tokens=[("long_150", 150)],
        feature="Mamba (1): every layer a selective-SSM mixer (64 channels, state 8, time_step_rank auto = 2), "
        "causal conv with bias and SiLU, x_proj to (dt, B, C), dt_proj with its bias inside the softplus, A per "
        "channel and state entry, the D skip, gate silu(z); tied embeddings; prompts run the sequential scan, "
        "decode the selective state update",
        ablate_fn=_mamba_scalar_a,
        ablation_desc="A_log made one value per channel (the first state entry's)",
        extra_ablations=[
            Ablate("D skip zeroed", fn=_drop_mamba_skip),
            Ablate("causal conv replaced by the identity", fn=_mamba_conv_identity),
        ],
    ),
    Spec(
        name="falcon-mamba",
        config_class="FalconMambaConfig",
        architecture="FalconMambaForCausalLM",
        kwargs=dict(hidden_size=32, expand=2, state_size=8, num_hidden_layers=3, conv_kernel=4, time_step_rank=4,
                    mixer_rms_eps=1e-6, tie_word_embeddings=False),
        seed=3,
        feature="Falcon-Mamba: Mamba (1) mixers whose time step, B and C pass a weightless RMSNorm each "
        "(mixer_rms_eps) before dt_proj and the scan; time_step_rank 4; untied LM head",
        ablate_config=dict(mixer_rms_eps=10.0),
        ablation_desc="mixer_rms_eps 1e-6 -> 10 (the dt/B/C norms all but flatten their inputs)",
    ),
    Spec(
        name="jamba",
        config_class="JambaConfig",
        architecture="JambaForCausalLM",
        kwargs=dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                    num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                    expert_layer_offset=0, num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4,
                    mamba_expand=2, mamba_dt_rank="auto", use_mamba_kernels=False),
        extra_prompt_tokens=[("long_150", 150)],
        feature="Jamba: Mamba (1) mixers (64 channels, state 8, dt rank auto = 2) whose dt, B and C pass RMSNorms with "
        "weights, on layers 0 and 2; attention without position embeddings (GQA 4/2) on layers 1 and 3 "
        "(attn_layer_period 2, offset 1); a mixture of 4 experts, top 2 of the softmax not renormalised, on layers "
        "0 and 2 (expert_layer_period 2, offset 0), gated MLPs on 1 and 3; final_layernorm",
        ablate_fn=_mamba_scalar_a,
        ablation_desc="A_log made one value per channel (the first state entry's)",
        extra_ablations=[Ablate("dt/B/C RMSNorm weights set to one", fn=_jamba_unit_ssm_norms)],
    ),
    Spec(
        name="olmo-hybrid",
        config_class="OlmoHybridConfig",
        architecture="OlmoHybridForCausalLM",
        kwargs=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                    num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=32, linear_conv_kernel_dim=4, linear_allow_neg_eigval=True,
                    pad_token_id=None, eos_token_id=None),
        extra_prompt_tokens=[("long_150", 150)],
        feature="OLMo Hybrid: Gated DeltaNet layers (separate q/k/v/g/a/b projections, 2 key heads of 16, 4 value "
        "heads of 32, beta scaled to [0, 2] by linear_allow_neg_eigval, gated o_norm at eps 1e-5) in pre-norm layers "
        "0-2, an OLMo 3 attention layer (full-width QK-norm, norms after attention and MLP) at layer 3 by the default "
        "layer_types rule",
        ablate_config=dict(linear_allow_neg_eigval=False),
        ablation_desc="linear_allow_neg_eigval off (beta in [0, 1])",
    ),
    Spec(
        name="exaone",
        config_class="ExaoneConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                    num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                    pad_token_id=None, eos_token_id=None, bos_token_id=None),
        edit_saved_config=_exaone_hub_spelling,
        feature="EXAONE 3.x: Llama run under EXAONE's names (transformer.wte, transformer.h.N.attn.attention."
        "{q,k,v,out}_proj, mlp.c_fc_0/c_fc_1/c_proj, ln_1/ln_2/ln_f, as transformers saves it) and config keys "
        "(num_layers, layer_norm_epsilon, activation_function, top-level rope_theta 1e6)",
        ablate_config=dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        ablation_desc="rope_theta 1e6 -> 1e4",
    ),
    Spec(
        name="nemotron-h",
        config_class="NemotronHConfig",
        architecture="NemotronHForCausalLM",
        kwargs=dict(hidden_size=32, layers_block_type=["linear_attention", "mlp", "full_attention", "mlp",
                                                       "linear_attention", "mlp"],
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                    mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=2, conv_kernel=4,
                    chunk_size=64, time_step_min=0.05),
        edit_saved_config=_nemotron_h_hub_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Nemotron-H: one mixer per layer after an RMSNorm (hybrid_override_pattern M-*-M-, the real "
        "spelling): Mamba2 layers (4 heads over 2 groups, state 8, dt clamped to time_step_min 0.05 on prompts but "
        "not in single-token decode, as transformers does), NoPE GQA attention, relu2 MLPs (up/down, no gate); "
        "time_step_limit [0, Infinity]",
        ablate_config=dict(time_step_min=1e-4),
        ablation_desc="time_step_min 0.05 -> 1e-4 (the dt clamp on prompts all but off)",
        extra_ablations=[Ablate("Mamba causal conv replaced by the identity", fn=_nemotron_h_mixer_conv_identity)],
    ),
    Spec(
        name="nemotron",
        seed=2,
        config_class="NemotronConfig",
        architecture="NemotronForCausalLM",
        kwargs=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                    norm_eps=1e-5, hidden_act="relu2", attention_bias=True, mlp_bias=True),
        edit_saved_config=_nemotron_hub_spelling,
        feature="Nemotron-4 / Minitron: LayerNorm1P (weight + 1, with bias), GQA with q/k/v/o biases, rotary on "
        "the first half of each head (partial_rotary_factor 0.5 by the config's default), ungated relu2 MLP with biases",
        ablate_config=dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0)),
        ablation_desc="partial_rotary_factor 0.5 -> 1.0",
    ),
    Spec(
        name="lfm2",
        config_class="Lfm2Config",
        architecture="Lfm2ForCausalLM",
        kwargs=dict(LFM2_TINY, layer_types=["conv", "conv", "full_attention", "conv"], intermediate_size=192,
                    block_multiple_of=48, block_ffn_dim_multiplier=1.3, conv_bias=True),
        edit_saved_config=_lfm2_hub_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="LFM2: gated short convolutions (in_proj -> B, C, x; conv of B*x over 3 taps with bias; C gate; "
        "out_proj) and GQA attention with per-head QK RMSNorm (full_attn_idxs [2], the real spelling), SwiGLU "
        "w1/w3/w2 of width 2/3 x block_ff_dim 192 x 1.3 rounded up to a multiple of 48 (192), final "
        "embedding_norm, tied embeddings (tie_embedding)",
        ablate_fn=_lfm2_conv_identity,
        ablation_desc="short conv taps replaced by the identity",
    ),
    Spec(
        name="lfm2-moe",
        config_class="Lfm2MoeConfig",
        architecture="Lfm2MoeForCausalLM",
        kwargs=dict(LFM2_TINY, layer_types=["conv", "full_attention", "conv", "conv"], intermediate_size=96,
                    moe_intermediate_size=32, num_dense_layers=1, num_experts=8, num_experts_per_tok=2,
                    use_expert_bias=True, routed_scaling_factor=2.0, norm_topk_prob=True),
        init_fn=_init_lfm2_expert_bias,
        probe=routing_probe,
        extra_prompt_tokens=[("long_150", 150)],
        feature="LFM2-MoE: LFM2's short convs and QK-normed attention; layer 0's MLP dense (intermediate_size 96, "
        "unadjusted), the rest 8 experts top-2 by sigmoid scores plus expert_bias (N(0, 0.1), the choice only), "
        "renormalised (+1e-6) x 2.0",
        ablate_fn=_lfm2_moe_drop_expert_bias,
        ablation_desc="expert_bias zeroed",
    ),
    Spec(
        name="lfm3",
        config_class="Lfm3Config",
        architecture="Lfm3ForCausalLM",
        kwargs=dict(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=96, conv_L_cache=3, sliding_window=24, tie_word_embeddings=True, pad_token_id=None),
        extra_prompt_tokens=[("long_150", 150)],
        feature="LFM3: the default layer_types (conv, conv, full, conv, sliding 24, conv), per-type rotary (sliding "
        "default 1e4, full proportional over half the head at 1e6), Qwen3-named attention with QK-norm and a "
        "sigmoid gate per head (g_proj), sandwich norms around every operator and MLP, SwiGLU w1/w3/w2, tied "
        "embeddings, embedding_norm",
        ablate_fn=_zero_lfm3_gate,
        ablation_desc="g_proj zeroed (every head scaled by 0.5)",
        extra_ablations=[
            Ablate("sandwich norms replaced by the identity", fn=_drop_lfm3_sandwich),
            Ablate("full layers on the sliding layers' rope", config=dict(rope_parameters=dict(
                sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                full_attention=dict(rope_type="default", rope_theta=10000.0)))),
        ],
    ),
    Spec(
        name="granite-moe-hybrid",
        config_class="GraniteMoeHybridConfig",
        architecture="GraniteMoeHybridForCausalLM",
        kwargs=dict(hidden_size=32, num_hidden_layers=4, layer_types=["linear_attention", "linear_attention",
                                                                      "full_attention", "linear_attention"],
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=16, shared_intermediate_size=48,
                    num_local_experts=8, num_experts_per_tok=2, mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8,
                    mamba_d_conv=4, mamba_chunk_size=64, position_embedding_type=None, embedding_multiplier=12.0,
                    logits_scaling=2.0, residual_multiplier=0.22, attention_multiplier=0.0078125),
        edit_saved_config=_granite_hybrid_hub_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Granite 4.0-H: Mamba2 mixers and NoPE attention (layer_types mamba/attention), each layer followed by "
        "8 experts top-2 plus a shared gated MLP, Granite's four multipliers",
        ablate_config=dict(residual_multiplier=1.0),
        ablation_desc="residual_multiplier 0.22 -> 1",
    ),
    Spec(
        name="falcon-h1",
        config_class="FalconH1Config",
        architecture="FalconH1ForCausalLM",
        kwargs=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, rope_theta=100000.0, pad_token_id=None,
                    mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head="auto", mamba_n_groups=2, mamba_d_state=8,
                    mamba_d_conv=4, mamba_chunk_size=64, mamba_rms_norm=True, mamba_norm_before_gate=True,
                    mamba_conv_bias=True, mamba_proj_bias=True, projectors_bias=True, attention_bias=True,
                    mlp_bias=True, tie_word_embeddings=False, embedding_multiplier=1.7, lm_head_multiplier=0.6,
                    key_multiplier=0.39, attention_in_multiplier=1.3, attention_out_multiplier=0.9375,
                    ssm_in_multiplier=1.25, ssm_out_multiplier=0.7, ssm_multipliers=[0.35, 0.8, 1.4, 0.5, 1.6],
                    mlp_multipliers=[0.88, 0.59]),
        edit_saved_config=_falcon_h1_hub_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Falcon-H1: every layer runs GQA attention (head_dim 16, not hidden/heads; keys times key_multiplier "
        "before RoPE; input times attention_in_multiplier, output times attention_out_multiplier) and a Mamba2 mixer "
        "(mamba_d_ssm 48 = 6 heads of 8, not expand x hidden; 2 B/C groups of state 8; input times ssm_in_multiplier; "
        "in_proj output times the muP vector of ssm_multipliers per z/x/B/C/dt section; grouped gated RMSNorm with "
        "the norm before the gate; output times ssm_out_multiplier) in parallel on the same normed input, then a "
        "SwiGLU MLP with mlp_multipliers on the gate and down projections; biases on attention, MLP, in_proj, "
        "out_proj (projectors_bias) and conv; embedding_multiplier, lm_head_multiplier, untied head; rope_theta at "
        "the top level as real checkpoints spell it",
        ablate_config=dict(ssm_multipliers=[1.0, 1.0, 1.0, 1.0, 1.0]),
        ablation_desc="ssm_multipliers all 1 (no muP vector on in_proj's output)",
        extra_ablations=[
            Ablate("key_multiplier 0.39 -> 1", config=dict(key_multiplier=1.0)),
            Ablate("mamba_norm_before_gate off (norm after the gate)", config=dict(mamba_norm_before_gate=False)),
            Ablate("mlp_multipliers [0.88, 0.59] -> [1, 1]", config=dict(mlp_multipliers=[1.0, 1.0])),
        ],
    ),
    Spec(
        name="falcon-h1-tiny",
        config_class="FalconH1Config",
        architecture="FalconH1ForCausalLM",
        kwargs=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, rope_theta=100000000000.0, pad_token_id=None,
                    mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8,
                    mamba_d_conv=4, mamba_chunk_size=64, mamba_rms_norm=False, mamba_norm_before_gate=False,
                    tie_word_embeddings=True, embedding_multiplier=0.5, lm_head_multiplier=1.5),
        edit_saved_config=_falcon_h1_hub_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Falcon-H1 as the Tiny-90M checkpoints have it: no RMSNorm in the Mamba2 mixer (mamba_rms_norm off: "
        "y * silu(z) straight into out_proj), one B/C group, tied embeddings, no biases, unit attention/SSM "
        "multipliers, embedding_multiplier 0.5 and lm_head_multiplier 1.5, rope_theta 1e11 at the top level",
        ablate_config=dict(embedding_multiplier=1.0),
        ablation_desc="embedding_multiplier 0.5 -> 1",
        extra_ablations=[Ablate("SSM branch dropped (ssm_out_multiplier 0)", config=dict(ssm_out_multiplier=0.0))],
    ),
    Spec(
        name="zamba2",
        config_class="Zamba2Config",
        architecture="Zamba2ForCausalLM",
        kwargs=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=4, pad_token_id=None,
                    layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"], num_mem_blocks=2,
                    use_shared_attention_adapter=True, adapter_rank=4, use_mem_rope=True,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0), add_bias_linear=True,
                    mamba_expand=2, n_mamba_heads=8, mamba_ngroups=2, mamba_d_state=8, mamba_d_conv=4,
                    chunk_size=64, rms_norm_eps=1e-5, tie_word_embeddings=False),
        init_fn=_zamba2_shared_blocks,
        edit_saved_config=_zamba2_hub_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Zamba2: Mamba2 layers (64 channels = 8 heads of 8, 2 B/C groups of state 8, grouped gated RMSNorm "
        "after the gate at eps 1e-5, dt clamped to time_step_min on prompts) and hybrid layers 1, 3, 4 that first "
        "run a shared transformer block on RMSNorm([hidden, original embeddings]) (2 x hidden wide: attention "
        "head_dim 16 = 2 * 32 / 4, scaled by (head_dim / 2)^-0.5, RoPE by use_mem_rope; no residuals; a GeLU "
        "gate_up MLP), its per-layer linear, and add that to the Mamba2 input; num_mem_blocks 2 used round-robin "
        "(layers 1 and 4 share block 0), each invocation with its own LoRA adapters (rank 4) on q, k, v "
        "(use_shared_attention_adapter) and gate_up, and its own KV cache; add_bias_linear biases on in_proj, "
        "out_proj, gate_up and down; untied head; layers_block_type 'mamba' and rope_theta at the top level as "
        "real checkpoints spell them",
        ablate_config=dict(use_mem_rope=False),
        ablation_desc="use_mem_rope on -> off (no RoPE in the shared attention)",
        extra_ablations=[
            Ablate("q/k/v LoRA adapters zeroed", fn=_zamba2_zero_attention_adapters),
            Ablate("original-embedding half of the shared blocks' input dropped", fn=_zamba2_drop_embeddings_half),
        ],
    ),
    Spec(
        name="zamba2-tied",
        config_class="Zamba2Config",
        architecture="Zamba2ForCausalLM",
        kwargs=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=5, num_attention_heads=4,
                    num_key_value_heads=2, pad_token_id=None,
                    layers_block_type=["mamba", "hybrid", "mamba", "mamba", "hybrid"], num_mem_blocks=1,
                    use_shared_attention_adapter=False, adapter_rank=8, use_mem_rope=False, add_bias_linear=False,
                    mamba_expand=2, n_mamba_heads=4, mamba_ngroups=1, mamba_d_state=16, mamba_d_conv=4,
                    chunk_size=64, rms_norm_eps=1e-5, tie_word_embeddings=True),
        init_fn=_zamba2_shared_blocks,
        edit_saved_config=_zamba2_hub_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Zamba2 as the 2.7B / 7B checkpoints lay it out: one shared block (num_mem_blocks 1) invoked at "
        "layers 1 and 4, stored once (tied, as transformers saves it with tied embeddings), no q/k/v adapters, "
        "gate_up LoRA adapters (rank 8) per invocation, no RoPE (use_mem_rope off), GQA 4 query / 2 KV heads, "
        "no biases, one B/C group of state 16, tied embeddings",
        ablate_fn=_zamba2_zero_mlp_adapters,
        ablation_desc="gate_up LoRA adapters zeroed",
    ),
    Spec(
        name="kimi-linear",
        config_class="KimiLinearConfig",
        architecture="KimiLinearForCausalLM",
        kwargs=dict(hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=4, pad_token_id=None, q_lora_rank=None, kv_lora_rank=32,
                    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, moe_intermediate_size=16,
                    num_experts=8, num_experts_per_token=2, num_shared_experts=2, num_expert_group=2, topk_group=1,
                    moe_renormalize=True, routed_scaling_factor=2.446, first_k_dense_replace=1,
                    linear_attn_config=dict(full_attn_layers=[2, 4], kda_layers=[1, 3], head_dim=16, num_heads=2,
                                            short_conv_kernel_size=3),
                    rms_norm_eps=1e-5),
        init_fn=init_correction_bias(0.1),
        edit_saved_config=_kimi_linear_hub_spelling,
        extra_prompt_tokens=[("long_150", 150)],
        feature="Kimi Linear: Kimi Delta Attention at layers 1 and 3 (2 heads of 16; q/k/v through a short conv of "
        "3 taps and SiLU; per-channel decay -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias); beta = sigmoid(b_proj); "
        "q/k L2-normalised; chunked (64) on prompts, recurrent on decode; per-head RMSNorm gated by "
        "sigmoid(g_b(g_a(x))) at rms_norm_eps) and NoPE MLA at layers 2 and 4 (no q LoRA, kv_lora_rank 32, "
        "nope 16 + unrotated rope part 8, v 12); a dense MLP at layer 1 (first_k_dense_replace 1), then MoE: "
        "sigmoid router + e_score_correction_bias (N(0, 0.1)) for the choice, top-1 of 2 groups by their two best, "
        "top-2 of 8 renormalised x 2.446, 2 shared experts; the remote code's config spellings (linear_attn_config "
        "with 1-indexed layers, num_experts, num_experts_per_token, num_shared_experts, moe_renormalize, "
        "num_expert_group, model_max_length)",
        ablate_config=dict(routed_scaling_factor=1.0),
        ablation_desc="routed_scaling_factor 2.446 -> 1",
        extra_ablations=[
            Ablate("per-channel decay collapsed to one per head (f_b_proj rows, dt_bias averaged per head)",
                   fn=_kimi_linear_head_decay),
            Ablate("e_score_correction_bias zeroed", fn=_zero_correction_bias),
        ],
    ),
]

SPEC_BY_NAME = {s.name: s for s in SPECS}


# --------------------------------------------------------------------------------------------
# Prompt battery (shared by every fixture)
# --------------------------------------------------------------------------------------------


def build_battery(tok) -> list[dict[str, Any]]:
    """Cases: name, prompt text, chat flag (+ messages). prompt_ids are what the HF tokenizer gives."""
    history = corpus_from("A. HISTORY OF THE SOFTWARE")
    textwrap_src = corpus_from('"""Text wrapping and filling.')
    raw = [
        ("single_token", "def"),
        ("hello", "Hello, world!"),
        ("pangram", "The quick brown fox jumps over the lazy dog."),
        ("code", "def fibonacci(n):\n    if n < 2:\n        return n\n    return"),
        ("unicode", "Déjà vu: naïve café, 敏捷的棕色狐狸 🙂 — π ≈ 3.14159"),
        ("paragraph_100", take_tokens(tok, history, 100)),
        ("code_300", take_tokens(tok, textwrap_src, 300)),
        # decode crosses position 512 (dynamic-RoPE threshold) part-way through the 16 new tokens
        ("near_512", take_tokens(tok, history[700:], 505)),
        ("long_650", take_tokens(tok, history, 650)),
    ]
    cases = [{"name": n, "prompt": p, "chat": False} for n, p in raw]
    chats = [
        (
            "chat_capital",
            [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
        ),
        (
            "chat_multi_turn",
            [
                {"role": "user", "content": "Hi! Can you add two numbers for me?"},
                {"role": "assistant", "content": "Sure, which numbers?"},
                {"role": "user", "content": "2 and 40, please."},
            ],
        ),
    ]
    for n, msgs in chats:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        cases.append({"name": n, "prompt": text, "chat": True, "messages": msgs})
    for c in cases:
        ids = tok(c["prompt"])["input_ids"]
        if c["chat"]:
            via_template = tok.apply_chat_template(
                c["messages"], tokenize=True, add_generation_prompt=True, return_dict=True
            )["input_ids"]
            assert list(via_template) == ids, (c["name"], via_template, ids)
        assert tok.decode(ids) == c["prompt"], c["name"]
        c["prompt_ids"] = ids
    assert len(cases[0]["prompt_ids"]) == 1
    return cases


# --------------------------------------------------------------------------------------------
# Model building / oracle
# --------------------------------------------------------------------------------------------


def make_config(spec: Spec, vocab_size: int, overrides: dict[str, Any] | None = None):
    cls = getattr(transformers, spec.config_class)
    kw = dict(BASE)
    kw.update(copy.deepcopy(spec.kwargs))
    if overrides:
        kw.update(copy.deepcopy(overrides))
    kw["vocab_size"] = vocab_size
    return cls(**kw)


def build_model(spec: Spec, vocab_size: int, seed: int) -> torch.nn.Module:
    cfg = make_config(spec, vocab_size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    assert type(model).__name__ == spec.architecture, (type(model).__name__, spec.architecture)
    # Perturb every parameter that init left constant (norm weights = 1, biases = 0, ...).
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    with torch.no_grad():
        for _, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            if flat.numel() > 0 and bool(torch.all(flat == flat[0])):
                p.add_(torch.randn(p.shape, generator=gen) * CONST_PERTURB_STD)
        if spec.init_fn is not None:
            spec.init_fn(model, gen)
    model.generation_config.bos_token_id = 0
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.eval()
    return model


def save_fixture(model: torch.nn.Module, spec: Spec, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    to_save = model.to(getattr(torch, spec.save_dtype))
    to_save.save_pretrained(str(out_dir), safe_serialization=True)
    model.to(torch.float32)
    if spec.strip_config_keys or spec.edit_saved_config:
        cfg_path = out_dir / "config.json"
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        for k in spec.strip_config_keys:
            cfg.pop(k, None)
        if spec.edit_saved_config:
            spec.edit_saved_config(cfg)
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if spec.edit_saved_weights:
        spec.edit_saved_weights(out_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / f, out_dir / f)
    present = sorted(p.name for p in out_dir.iterdir())
    assert "model.safetensors" in present, present


def load_fixture(path: Path) -> torch.nn.Module:
    kw = {}
    qcfg = json.loads((path / "config.json").read_text(encoding="utf-8")).get("quantization_config") or {}
    if qcfg.get("format") == "nvfp4-pack-quantized":
        # compressed-tensors decompresses NVFP4 weights to bf16 (unpack_fp4_from_uint8's dtype); on the default
        # route (decompress on the first forward) an f32 model then fails multiplying f32 inputs by bf16 weights.
        # dequantize=True runs the same decompression at load and casts the result to the model's f32.
        from transformers import CompressedTensorsConfig

        kw["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager", **kw)
    m.eval()
    return m


def run_battery(model: torch.nn.Module, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results = []
    for c in cases:
        fresh = copy.deepcopy(model)  # fresh rotary state (dynamic RoPE is stateful) per request
        r = greedy_generate(fresh, c["prompt_ids"], MAX_NEW_TOKENS, stop_at_eos=False)
        results.append(r)
    return results


def assess(results: list[dict[str, Any]]) -> tuple[float, bool, int]:
    min_gap = min(min(r["gaps"]) for r in results)
    degenerate = any(len(set(r["output_ids"])) <= 2 for r in results)
    distinct = len({t for r in results for t in r["output_ids"]})
    return min_gap, degenerate, distinct


def ablation_changes(spec: Spec, fixture_dir: Path, cases, results) -> int | None:
    if spec.ablate_config is None and spec.ablate_fn is None:
        return None
    return run_ablation(spec.ablate_config, spec.ablate_fn, fixture_dir, cases, results)


def run_ablation(ablate_config, ablate_fn, fixture_dir: Path, cases, results) -> int:
    base = load_fixture(fixture_dir)
    if ablate_config is not None:
        cfg = copy.deepcopy(base.config)
        for k, v in ablate_config.items():
            setattr(cfg, k, copy.deepcopy(v))
        if "rope_parameters" in ablate_config:
            cfg.standardize_rope_params()
        abl = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
        missing, unexpected = abl.load_state_dict(base.state_dict(), strict=False)
        assert not unexpected and all("rotary" in m or "lm_head" in m for m in missing), (missing, unexpected)
        if getattr(cfg, "tie_word_embeddings", False):
            abl.tie_weights()
        abl.eval()
    else:
        abl = base
    if ablate_fn is not None:
        ablate_fn(abl)
    abl_results = run_battery(abl, cases)
    return sum(a["output_ids"] != r["output_ids"] for a, r in zip(abl_results, results))


ROBUST_PERTURBED_RUNS = 3
ROBUST_ULPS = 2
ROBUST_SEEDS = 5  # gap-passing seeds checked for robustness before taking the one with most stable tokens


def _rebuilt(spec: Spec, vocab: int, seed: int, d: Path) -> Path:
    save_fixture(build_model(spec, vocab, seed), spec, d)
    return d


def _perturb_ulps(model: torch.nn.Module, gen: torch.Generator, ulps: int) -> None:
    """Moves every float32 parameter (not the `*_scale` quantization parameters) by a random number of
    ulps in [-ulps, ulps], element-wise."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype != torch.float32 or name.endswith("_scale"):
                continue
            r = torch.randint(-ulps, ulps + 1, p.shape, generator=gen)
            toward = torch.where(r < 0, float("-inf"), float("inf")).to(torch.float32)
            for step in range(ulps):
                p.copy_(torch.where(r.abs() > step, torch.nextafter(p, toward), p))


def robustness(fixture_dir: Path, cases, results, seed: int) -> dict[str, Any]:
    """Greedy tokens of a float64 run and of ROBUST_PERTURBED_RUNS ulp-perturbed f32 runs of the fixture as
    loaded (after its first forward, i.e. compressed-tensors' decompression), against `results`."""
    base = load_fixture(fixture_dir)
    with torch.no_grad():
        base(torch.tensor([[0]]))  # compressed-tensors decompresses the weights on the first forward
    want = [r["output_ids"] for r in results]
    runs = []
    m64 = copy.deepcopy(base).to(torch.float64)
    if hasattr(m64, "set_experts_implementation"):
        m64.set_experts_implementation("eager")  # torch's grouped_mm has no float64 kernel
    runs.append(("float64", run_battery(m64, cases)))
    gen = torch.Generator().manual_seed(seed + 7_000_001)
    for i in range(ROBUST_PERTURBED_RUNS):
        mp = copy.deepcopy(base)
        _perturb_ulps(mp, gen, ROBUST_ULPS)
        runs.append((f"f32 +-{ROBUST_ULPS} ulp #{i}", run_battery(mp, cases)))
    prefix = {}
    for c, w, *rs in zip(cases, want, *[r for _, r in runs]):
        n = len(w)
        for r in rs:
            n = min(n, next((i for i, (a, b) in enumerate(zip(r["output_ids"], w)) if a != b), len(w)))
        prefix[c["name"]] = n
    return {"runs": [n for n, _ in runs], "stable_prefix": prefix,
            "stable_tokens": sum(prefix.values()), "stable": all(v == MAX_NEW_TOKENS for v in prefix.values())}


def verify_reload(fixture_dir: Path, cases, results) -> None:
    m = load_fixture(fixture_dir)
    again = run_battery(m, cases)
    for c, a, r in zip(cases, again, results):
        assert a["output_ids"] == r["output_ids"], (fixture_dir.name, c["name"], a["output_ids"], r["output_ids"])
        for sa, sr in zip(a["top_logprobs"], r["top_logprobs"]):
            assert [t for t, _ in sa] == [t for t, _ in sr], (c["name"], sa, sr)
            assert max(abs(x - y) for (_, x), (_, y) in zip(sa, sr)) == 0.0, (c["name"], sa, sr)
        toks, logits = manual_greedy(copy.deepcopy(m), c["prompt_ids"], MAX_NEW_TOKENS)
        assert toks == r["output_ids"], (fixture_dir.name, c["name"], "manual loop", toks, r["output_ids"])
        for lg, sr in zip(logits, r["top_logprobs"]):
            lp = torch.log_softmax(lg, -1)
            assert max(abs(float(lp[t]) - v) for t, v in sr) < 1e-4


def verify_recorded(name: str, tok) -> tuple[int, int, float]:
    """Re-run a fixture from disk against its committed oracle.json; exact token and logprob equality."""
    import json

    d = MODELS_DIR / name
    oracle = json.loads((d / "oracle.json").read_text(encoding="utf-8"))
    spec = SPEC_BY_NAME[name]
    if spec.repack is None:
        m = load_fixture(d)
    else:
        m = rebuild_native(spec, oracle["seed"], len(tok), d)
    steps, max_diff = 0, 0.0
    for c in oracle["cases"]:
        assert tok(c["prompt"])["input_ids"] == c["prompt_ids"], (name, c["name"], "tokenizer drift")
        r = greedy_generate(copy.deepcopy(m), c["prompt_ids"], len(c["output_ids"]), stop_at_eos=False)
        assert r["output_ids"] == c["output_ids"], (name, c["name"], r["output_ids"], c["output_ids"])
        for sa, sr in zip(r["top_logprobs"], c["top_logprobs"]):
            assert [t for t, _ in sa] == [t for t, _ in sr], (name, c["name"], "top-5 ids differ", sa, sr)
            max_diff = max(max_diff, max(abs(x - y) for (_, x), (_, y) in zip(sa, sr)))
        steps += len(r["output_ids"])
    # Bit-identical on the machine that generated them; other CPUs / thread counts may differ in the last bits.
    assert max_diff < 1e-4, (name, max_diff)
    return len(oracle["cases"]), steps, max_diff


def rebuild_native(spec: Spec, seed: int, vocab: int, fixture_dir: Path) -> torch.nn.Module:
    """The native model a re-packed fixture came from (rebuilt from its seed), after checking that
    re-packing it again gives the committed tensors and config exactly."""
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td) / spec.name
        save_fixture(build_model(spec, vocab, seed), spec, tmp)
        native = load_fixture(tmp)
        repack_fixture(spec, tmp)
        for f in ("config.json",):
            assert (tmp / f).read_text(encoding="utf-8") == (fixture_dir / f).read_text(encoding="utf-8"), f
        ours, committed = load_file(str(tmp / "model.safetensors")), load_file(str(fixture_dir / "model.safetensors"))
        assert ours.keys() == committed.keys(), sorted(set(ours) ^ set(committed))
        assert all(torch.equal(ours[k], committed[k]) for k in ours), "re-packed tensors differ"
    return native


def saved_architecture(fixture_dir: Path) -> str:
    cfg = json.loads((fixture_dir / "config.json").read_text(encoding="utf-8"))
    return cfg["architectures"][0]


def dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def fixture_cases(spec: Spec, tok, cases) -> list[dict[str, Any]]:
    history = corpus_from("A. HISTORY OF THE SOFTWARE")
    extra = []
    for name, n in spec.extra_prompt_tokens:
        prompt = take_tokens(tok, history, n)
        extra.append({"name": name, "prompt": prompt, "chat": False, "prompt_ids": tok(prompt)["input_ids"]})
    return cases + extra


def generate_one(spec: Spec, tok, cases, min_gap_req: float) -> dict[str, Any]:
    t0 = time.time()
    cases = fixture_cases(spec, tok, cases)
    vocab = len(tok)
    out_dir = MODELS_DIR / spec.name
    best = None
    tried_robust: list[dict[str, Any]] = []
    seeds_tried = 0
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td) / spec.name
        for seed in range(spec.seed, spec.seed + MAX_SEED_TRIES):
            model = build_model(spec, vocab, seed)
            save_fixture(model, spec, tmp)
            loaded = load_fixture(tmp)  # the oracle always runs on what is on disk
            results = run_battery(loaded, cases)
            min_gap, degenerate, distinct = assess(results)
            ok = min_gap >= min_gap_req and not degenerate
            robust = None
            if ok and spec.robust:
                robust = robustness(tmp, cases, results, seed)
                tried_robust.append({"seed": seed, "min_gap": min_gap, **robust})
                ok = robust["stable"]
            print(f"  {spec.name}: seed {seed}: min_gap {min_gap:.2e} distinct {distinct} degenerate {degenerate}"
                  + ("" if robust is None else f" robust: {robust['stable_tokens']} stable tokens"))
            if spec.robust and not ok and len(tried_robust) >= ROBUST_SEEDS:
                # No seed fully stable: take the gap-passing seed with the most stable tokens.
                pick = max(tried_robust, key=lambda t: (t["stable_tokens"], t["min_gap"]))
                best = (True, pick["min_gap"], pick["seed"], None)
                break
            seeds_tried += 1
            if best is None or (ok, min_gap) > (best[0], best[1]):
                best = (ok, min_gap, seed, results)
            if ok:
                break
        ok, min_gap, seed, results = best
        if results is None:  # a robust pick: rebuild it below and take its battery then
            results = run_battery(load_fixture(_rebuilt(spec, vocab, seed, tmp)), cases)
        if not ok:
            print(f"  WARNING {spec.name}: no seed reached min_gap {min_gap_req}; using seed {seed} ({min_gap:.2e})")
        # Rebuild the chosen seed into the real fixture dir (deterministic).
        model = build_model(spec, vocab, seed)
        save_fixture(model, spec, out_dir)
    final = run_battery(load_fixture(out_dir), cases)
    assert [r["output_ids"] for r in final] == [r["output_ids"] for r in results]
    results = final
    min_gap, degenerate, distinct = assess(results)
    changed = ablation_changes(spec, out_dir, cases, results)
    if changed is not None:
        assert changed > 0, f"{spec.name}: ablation ({spec.ablation_desc}) changed no output: feature not exercised"
    extra = []
    for a in spec.extra_ablations:
        n = run_ablation(a.config, a.fn, out_dir, cases, results)
        assert n > 0, f"{spec.name}: ablation ({a.desc}) changed no output: feature not exercised"
        extra.append({"change": a.desc, "cases_changed": n, "cases": len(cases)})
    verify_reload(out_dir, cases, results)
    probe = spec.probe(load_fixture(out_dir), cases) if spec.probe is not None else None
    load_check = spec.load_check(out_dir) if spec.load_check is not None else None

    cfg = load_fixture(out_dir).config
    native = saved_architecture(out_dir)
    if spec.repack is not None:
        repack_fixture(spec, out_dir)
    oracle = {
        "generator": GENERATOR,
        **versions(),
        "architecture": saved_architecture(out_dir),
        "model_type": json.loads((out_dir / "config.json").read_text(encoding="utf-8"))["model_type"],
        **({"oracle_model": f"{native} ({cfg.model_type}), re-packed into this layout"}
           if spec.repack is not None else {}),
        "feature": spec.feature,
        "dtype": "float32",
        "save_dtype": spec.save_dtype,
        "attn_implementation": "eager",
        "decoding": "greedy (do_sample=False), batch 1, KV cache (HF generate)",
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_disabled": True,
        "eos_note": "generation_config.eos_token_id=None for the run, no min_new_tokens: exactly 16 tokens, each the "
        "argmax of the raw f32 logits (EOS may be emitted and generation continues)",
        "top_logprobs_note": "per step, top-5 [token_id, logprob] of log_softmax(f32 logits), best first",
        "seed": seed,
        "initializer_range": cfg.initializer_range,
        "const_param_perturb_std": CONST_PERTURB_STD,
        "min_top2_gap": min_gap,
        "distinct_output_tokens": distinct,
        "ablation": None if changed is None else {"change": spec.ablation_desc, "cases_changed": changed,
                                                  "cases": len(cases)},
        **({"extra_ablations": extra} if extra else {}),
        **({"routing_probe": probe} if probe is not None else {}),
        **({"load_check": load_check} if load_check is not None else {}),
        **({"robustness": {"note": f"W8A8 is fragile: a last-bit difference can move an activation across an e4m3 "
                                   f"rounding boundary. Per case, stable_prefix = how many leading greedy tokens "
                                   f"are the same in a float64 run and in {ROBUST_PERTURBED_RUNS} f32 runs with every "
                                   f"float32 parameter moved by up to {ROBUST_ULPS} ulps (random per element). Among "
                                   f"the first {ROBUST_SEEDS} seeds passing the gap filter, the first fully stable "
                                   f"one, else the one with the most stable tokens, was taken; an engine should be "
                                   f"held to exact tokens only within stable_prefix",
                           "seeds_tried": seeds_tried,
                           **next(({"stable_prefix": t["stable_prefix"], "stable_tokens": t["stable_tokens"]}
                                   for t in tried_robust if t["seed"] == seed), {}),
                           "checked": [{k: v for k, v in t.items() if k != "stable_prefix"} for t in tried_robust]}}
           if spec.robust else {}),
        "notes": spec.notes,
        "cases": [case_record(tok, c, r) for c, r in zip(cases, results)],
    }
    write_json(out_dir / "oracle.json", oracle)
    return {
        "name": spec.name,
        "size": dir_size(out_dir),
        "weights": (out_dir / "model.safetensors").stat().st_size,
        "min_gap": min_gap,
        "distinct": distinct,
        "seed": seed,
        "ablation": "-" if changed is None else "+".join([f"{changed}"] + [str(e["cases_changed"]) for e in extra])
        + f"/{len(cases)}",
        "secs": time.time() - t0,
    }


# --------------------------------------------------------------------------------------------
# Online FP8 oracle (ferrite's --quantization fp8 on an unquantized fixture)
# --------------------------------------------------------------------------------------------

ONLINE_FP8_FILE = "oracle-online-fp8.json"


def online_fp8_weight_check(orig_dir: Path, quant_dir: Path) -> dict[str, Any]:
    """For every quantized linear of the llmcompressor copy: its F8_E4M3 codes and f32(w8) * weight_scale
    against ferrite's online rule computed from the fixture's own f32 weights (s = amax_row / 448 in f32,
    f32 epsilon where 0; w8 = e4m3(clamp(w / s, +-448))). Also the other tensors must be untouched."""
    from safetensors.torch import load_file

    orig, quant = load_file(str(orig_dir / "model.safetensors")), load_file(str(quant_dir / "model.safetensors"))
    layers, max_diff, codes_equal = [], 0.0, True
    for name in sorted(quant):
        if not name.endswith(".weight_scale"):
            continue
        wname = name[: -len("_scale")]
        w = orig[wname].float()
        scale_q, w8_q = quant[name].float(), quant[wname]
        assert w8_q.dtype == torch.float8_e4m3fn and scale_q.shape == (w.shape[0], 1), (wname, w8_q.dtype, scale_q.shape)
        s = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
        s = torch.where(s == 0, torch.finfo(torch.float32).eps, s)
        w8 = (w / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        ours, theirs = w8.float() * s, w8_q.float() * scale_q
        d = float((ours - theirs).abs().max())
        same_codes = bool(torch.equal(w8.view(torch.uint8), w8_q.view(torch.uint8))) and bool(torch.equal(s, scale_q))
        codes_equal &= same_codes
        max_diff = max(max_diff, d)
        layers.append(wname)
    assert layers, "no quantized linear in the llmcompressor copy"
    untouched = [k for k in orig if k not in {n for l in layers for n in (l, l + "_scale")}]
    for k in untouched:
        assert k in quant and torch.equal(orig[k], quant[k]), f"{k} changed by quantization"
    extra = sorted(set(quant) - set(orig) - {l + "_scale" for l in layers})
    assert not extra, extra
    return {"quantized_linears": len(layers), "unquantized_tensors": sorted(untouched),
            "max_abs_diff_dequantized": max_diff, "codes_and_scales_bit_identical": codes_equal}


def generate_online_fp8(name: str, tok) -> dict[str, Any]:
    """fixtures/models/<name>/oracle-online-fp8.json: the oracle for ferrite loading the (unquantized) fixture
    with --quantization fp8. The fixture's own weights are quantized in a temporary copy by llmcompressor
    FP8_DYNAMIC (ignore lm_head), which computes exactly ferrite's online FP8; transformers runs that copy
    (W8A8, per-token activation fake-quant) on the same battery. The fixture's files are not touched."""
    t0 = time.time()
    spec = SPEC_BY_NAME[name]
    src = MODELS_DIR / name
    base_oracle = json.loads((src / "oracle.json").read_text(encoding="utf-8"))
    src_cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    assert "quantization_config" not in src_cfg and spec.repack is None, f"{name}: not a plain unquantized fixture"
    assert not any(k in src_cfg for k in ("num_local_experts", "num_experts", "n_routed_experts")), \
        f"{name}: MoE (ferrite leaves experts unquantized, llmcompressor targets every Linear)"
    cases = fixture_cases(spec, tok, build_battery(tok))
    assert [c["prompt_ids"] for c in cases] == [c["prompt_ids"] for c in base_oracle["cases"]], "battery drift"
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td) / name
        shutil.copytree(src, tmp)
        (tmp / "oracle.json").unlink()
        _llmcompressor_checkpoint("FP8_DYNAMIC", ["lm_head"])(tmp)
        weight_check = online_fp8_weight_check(src, tmp)
        qcfg = json.loads((tmp / "config.json").read_text(encoding="utf-8"))["quantization_config"]
        results = run_battery(load_fixture(tmp), cases)
        min_gap, degenerate, distinct = assess(results)
        robust = robustness(tmp, cases, results, base_oracle["seed"])
        verify_reload(tmp, cases, results)
        w8a16_changed = run_ablation(None, _ct_w8a16, tmp, cases, results)
        assert w8a16_changed > 0, "activation fake-quantization changed no output"
    changed_vs_f32 = sum(r["output_ids"] != c["output_ids"] for r, c in zip(results, base_oracle["cases"]))
    oracle = {
        "generator": GENERATOR + f" --online-fp8 {name}",
        **versions(),
        "architecture": base_oracle["architecture"],
        "model_type": base_oracle["model_type"],
        "feature": "online FP8 (ferrite --quantization fp8) of fixtures/models/" + name + ": every decoder linear's weight "
        "rounded to float8_e4m3fn with one f32 scale per output row (amax_row / 448); lm_head, embeddings and norms "
        "unquantized; W8A8: each quantized linear's input fake-quantized per token (scale = amax / 448)",
        "dtype": "float32",
        "save_dtype": base_oracle["save_dtype"],
        "attn_implementation": "eager",
        "decoding": base_oracle["decoding"],
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_disabled": True,
        "eos_note": base_oracle["eos_note"],
        "top_logprobs_note": base_oracle["top_logprobs_note"],
        "seed": base_oracle["seed"],
        "initializer_range": base_oracle["initializer_range"],
        "const_param_perturb_std": base_oracle["const_param_perturb_std"],
        "min_top2_gap": min_gap,
        "distinct_output_tokens": distinct,
        "ablation": {"change": "activation fake-quantization off (W8A16: quantization_enabled = False)",
                     "cases_changed": w8a16_changed, "cases": len(cases)},
        "cases_changed_vs_unquantized_oracle": changed_vs_f32,
        "quantization_config": qcfg,
        "weight_check": {"note": "llmcompressor's F8_E4M3 codes and weight_scale against ferrite's rule from the f32 "
                                 "weights (s = amax_row / 448, f32 eps where 0; e4m3(clamp(w / s, +-448)) * s)",
                         **weight_check},
        "robustness": {"note": f"W8A8 is fragile: a last-bit difference can move an activation across an e4m3 rounding "
                               f"boundary. Per case, stable_prefix = how many leading greedy tokens are the same in a "
                               f"float64 run and in {ROBUST_PERTURBED_RUNS} f32 runs with every float32 parameter "
                               f"moved by up to {ROBUST_ULPS} ulps (random per element, generator seed "
                               f"{base_oracle['seed']} + 7000001) of the quantized copy as transformers loads it; "
                               f"the weights are the fixture's own (no seed search), so hold an engine to exact "
                               f"tokens only within stable_prefix",
                       "runs": robust["runs"], "stable_prefix": robust["stable_prefix"],
                       "stable_tokens": robust["stable_tokens"], "stable": robust["stable"]},
        "notes": [f"Made by `generate_fixtures.py --online-fp8 {name}`: fixtures/models/{name} (config.json, "
                  f"model.safetensors, float32, unchanged) copied to a temporary directory and quantized there by "
                  f"tools/oracle/fp8_quantize.py in a subprocess: llmcompressor oneshot, QuantizationModifier("
                  f"targets='Linear', scheme='FP8_DYNAMIC', ignore=['lm_head']), data-free, save_compressed=True. "
                  f"transformers {transformers.__version__} loads that copy (compressed-tensors, float32, eager, CPU) "
                  f"and runs the fixture's battery: greedy, 16 tokens, EOS disabled, as oracle.json.",
                  f"ferrite is judged against this file when it loads fixtures/models/{name} with --quantization fp8 "
                  f"(online FP8 from the f32 weights); oracle.json stays the unquantized reference.",
                  "weight_check shows llmcompressor's quantized weights equal ferrite's rule bit for bit, so the only "
                  "oracle-side approximation left is the activation fake-quant, whose fragility stable_prefix measures."],
        "cases": [case_record(tok, c, r) for c, r in zip(cases, results)],
    }
    write_json(src / ONLINE_FP8_FILE, oracle)
    print(f"{name}: wrote {src / ONLINE_FP8_FILE}: {len(cases)} cases, min_gap {min_gap:.3e}, "
          f"stable {robust['stable_prefix']}, weight check {weight_check['max_abs_diff_dequantized']:.1e} "
          f"(bit-identical {weight_check['codes_and_scales_bit_identical']}), {time.time() - t0:.0f} s")
    return oracle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="regenerate only these fixtures")
    ap.add_argument("--list", action="store_true", help="list fixture names and exit")
    ap.add_argument("--min-gap", type=float, default=DEFAULT_MIN_GAP)
    ap.add_argument("--verify-only", action="store_true",
                    help="do not regenerate: reload the fixtures from disk and check them against oracle.json")
    ap.add_argument("--online-fp8", nargs="+", metavar="NAME",
                    help=f"write fixtures/models/NAME/{ONLINE_FP8_FILE}, the oracle for ferrite's --quantization fp8 "
                    "on that (unquantized) fixture; nothing else is regenerated")
    args = ap.parse_args()
    if args.list:
        for s in SPECS:
            print(f"{s.name:24s} {s.architecture:22s} {s.feature}")
        return 0
    names = args.only or [s.name for s in SPECS]
    unknown = [n for n in names if n not in SPEC_BY_NAME]
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; known: {list(SPEC_BY_NAME)}")
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        ap.error("fixtures/tokenizer/tokenizer.json missing: run tools/oracle/train_tokenizer.py first")

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    if args.online_fp8:
        for n in args.online_fp8:
            if n not in SPEC_BY_NAME:
                ap.error(f"unknown fixture {n}")
            generate_online_fp8(n, tok)
        return 0
    if args.verify_only:
        for n in names:
            ncases, steps, diff = verify_recorded(n, tok)
            print(f"{n:24s} ok: {ncases} cases, {steps} steps: tokens + top-5 ids exact, "
                  f"max logprob diff {diff:.1e}")
        return 0
    cases = build_battery(tok)
    print("battery:", ", ".join(f"{c['name']}({len(c['prompt_ids'])})" for c in cases))
    rows = [generate_one(SPEC_BY_NAME[n], tok, cases, args.min_gap) for n in names]

    print()
    print(f"{'fixture':24s} {'size':>9s} {'weights':>9s} {'min_top2_gap':>12s} {'distinct':>8s} {'seed':>4s} "
          f"{'ablation':>8s} {'secs':>5s}")
    for r in rows:
        print(f"{r['name']:24s} {r['size']:9d} {r['weights']:9d} {r['min_gap']:12.3e} {r['distinct']:8d} "
              f"{r['seed']:4d} {r['ablation']:>8s} {r['secs']:5.1f}")
    total = dir_size(ROOT / "fixtures")
    print(f"fixtures/ total: {total} bytes ({total / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
