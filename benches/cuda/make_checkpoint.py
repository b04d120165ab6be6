"""Writes a random-init bf16 checkpoint of a public architecture's shape, for speed measurements.

Speed does not depend on weight values, so a random checkpoint of the real shape stands in for
the real one. The configs below are the public Hugging Face ones (Llama-3.1-8B, Qwen3-30B-A3B)
with their depth optionally cut (--layers). Weights are initialised on the GPU when there is one.

The tokenizer is the 1000-token fixture tokenizer (fixtures/models/llama) with its vocabulary
extended to the model's: ids >= 1000 decode to " <id>". Prompts are random ids below 1000, as in
tools/bench/make_random_llama.py; the extension is there because `ferrite bench` times a token
when its stream chunk carries text, and with the bare fixture the ids a random model emits
(almost all >= 1000) would decode to nothing.

    python3 benches/cuda/make_checkpoint.py --shape llama-3.1-8b --out /tmp/llama-3.1-8b
    python3 benches/cuda/make_checkpoint.py --shape qwen3-30b-a3b --layers 8 --out /tmp/qwen3-30b-a3b-l8
    python3 benches/cuda/make_checkpoint.py --shape qwen3.5-9b --out /tmp/qwen3.5-9b
    python3 benches/cuda/make_checkpoint.py --shape llama-3.1-8b --w4a16 128 --out /tmp/llama-3.1-8b-w4a16
    python3 benches/cuda/make_checkpoint.py --shape llama-3.1-8b --fp8-dynamic --out /tmp/llama-3.1-8b-fp8
    python3 benches/cuda/make_checkpoint.py --shape qwen2.5-vl-7b --out /tmp/qwen2.5-vl-7b

A vision-language shape (qwen2.5-vl-7b: Qwen/Qwen2.5-VL-7B-Instruct's config) is saved as
transformers 5 saves Qwen2_5_VLForConditionalGeneration, with what serving images needs besides:
the vision special tokens at the real checkpoint's ids (<|vision_start|> 151652 ... <|video_pad|>
151656), Qwen2-VL's chat template, and the image processor with the real checkpoint's pixel
budget (min_pixels 3136, max_pixels 12845056: a 1024x1024 image stays 1036x1036, 1369 tokens).

--w4a16 GROUP writes the decoder layers' linear weights as compressed-tensors `pack-quantized`
W4A16 (symmetric 4-bit, one bf16 scale per GROUP inputs, the layout llm-compressor saves): random
nibbles and scales of the init's magnitude instead of quantized bf16 weights, as the values do not
matter for speed. Embeddings, norms and the LM head stay bf16 (llm-compressor's default `ignore`).

--fp8-dynamic writes the decoder layers' linear weights as compressed-tensors FP8_DYNAMIC, the
layout llm-compressor saves (`float-quantized`): the random bf16 weights rounded to e4m3 with one
f32 scale per output channel (`weight_scale` [n, 1]), inputs quantized per token at run time.
Embeddings, norms and the LM head stay bf16.

Prints one JSON line: shape, layers, parameters, weight bytes. Reruns on a complete checkpoint
of the same shape only print it.
"""

import argparse
import json
import shutil
import struct
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "fixtures" / "models" / "llama"
FIXTURE_VOCAB = 1000
# The fixture tokenizer's special ids: <|endoftext|> (bos, pad) and <|im_end|> (eos).
BOS, EOS, PAD = 0, 2, 0

SHAPES: dict[str, tuple[str, dict]] = {
    # meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": ("llama", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
        max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=False,
    )),
    # Qwen/Qwen3-30B-A3B config.json
    "qwen3-30b-a3b": ("qwen3_moe", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, hidden_act="silu",
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, attention_bias=False,
        use_sliding_window=False, sliding_window=None, tie_word_embeddings=False,
    )),
    # The Qwen3.5 dense text shape of transformers' Qwen3_5TextConfig defaults (hidden 4096, 32 layers:
    # 24 Gated DeltaNet + 8 gated attention, full_attention_interval 4), as a plain text model.
    "qwen3.5-9b": ("qwen3_5_text", dict(
        vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
        num_attention_heads=16, num_key_value_heads=4, head_dim=256, hidden_act="silu",
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
        linear_num_value_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        attention_bias=False, tie_word_embeddings=False,
    )),
}

# Qwen/Qwen2.5-VL-7B-Instruct config.json: the text model and the vision tower.
VL_SHAPES: dict[str, tuple[str, dict, dict]] = {
    "qwen2.5-vl-7b": ("qwen2_5_vl", dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, hidden_act="silu", max_position_embeddings=128000,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                            "mrope_section": [16, 24, 24]},
        use_sliding_window=False, tie_word_embeddings=False,
    ), dict(
        depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
        tokens_per_second=2, hidden_act="silu",
    )),
}
VISION_TOKENS = {151652: "<|vision_start|>", 151653: "<|vision_end|>", 151654: "<|vision_pad|>",
                 151655: "<|image_pad|>", 151656: "<|video_pad|>"}
# Qwen2-VL-Instruct's chat template, as the Qwen2-VL oracle fixture carries it.
VL_CHAT_TEMPLATE_FILE = REPO / "fixtures" / "models" / "qwen2-vl" / "chat_template.jinja"
VL_MIN_PIXELS, VL_MAX_PIXELS = 3136, 12845056

# --tiny keeps the architecture, depth and vocabulary but shrinks every width, so the scripts
# can be smoke-tested on a CPU in seconds.
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)

# The HF default, stated because it matters: with std 0.02 the residual stream and the logits of a
# random model stay well inside bf16 range at full depth.
INIT_STD = 0.02


def build_config(shape: str, layers: int | None, tiny: bool):
    model_type, values, *vision = SHAPES.get(shape) or VL_SHAPES[shape]
    values = dict(values, initializer_range=INIT_STD, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    if tiny:
        values.update({k: v for k, v in TINY.items() if k in values})
    if layers is not None:
        if not 0 < layers <= values["num_hidden_layers"]:
            sys.exit(f"--layers must be in 1..{values['num_hidden_layers']}")
        values["num_hidden_layers"] = layers
    if not vision:
        return AutoConfig.for_model(model_type, **values)
    (vision,) = vision
    vision = dict(vision, initializer_range=INIT_STD)
    if tiny:
        vision.update(hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=values["hidden_size"])
        # MRoPE's sections split the text heads' 8 frequencies.
        values["rope_parameters"] = dict(values["rope_parameters"], mrope_section=[2, 3, 3])
    ids = {name: i for i, name in VISION_TOKENS.items()}
    return AutoConfig.for_model(
        model_type, text_config=values, vision_config=vision, initializer_range=INIT_STD,
        tie_word_embeddings=values["tie_word_embeddings"], image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"])


def text_of(config):
    """The text model's config (the config itself for a text-only shape)."""
    return getattr(config, "text_config", None) or config


def safetensors_size(out: Path) -> tuple[int, int]:
    """(parameters, bytes) read from the safetensors headers, so a rerun needs no weights in memory."""
    params = nbytes = 0
    for path in sorted(out.glob("*.safetensors")):
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in entry["shape"]:
                numel *= d
            params += numel
            nbytes += entry["data_offsets"][1] - entry["data_offsets"][0]
    return params, nbytes


def quantization_of(w4a16: int | None, fp8_dynamic: bool) -> str | None:
    return f"w4a16-g{w4a16}" if w4a16 else "fp8-dynamic" if fp8_dynamic else None


def saved_quantization(saved: dict) -> str | None:
    group = (saved.get("quantization_config") or {}).get("config_groups", {}).get("group_0", {})
    weights = group.get("weights") or {}
    if weights.get("type") == "float":
        return "fp8-dynamic"
    return f"w4a16-g{weights['group_size']}" if weights.get("group_size") else None


def is_complete(out: Path, config, quantization: str | None) -> bool:
    # tokenizer.json is written after the weights (and a VL checkpoint's processor_config.json
    # after it), so its presence means the weights were all saved.
    last = "processor_config.json" if hasattr(config, "vision_config") else "tokenizer.json"
    if not (out / last).exists() or not (out / "config.json").exists():
        return False
    saved = json.loads((out / "config.json").read_text())
    keys = ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
    same_quantization = saved_quantization(saved) == quantization
    saved_text, text = saved.get("text_config", saved), text_of(config)
    return (same_quantization and saved.get("model_type") == config.model_type
            and all(saved_text.get(k) == getattr(text, k, None) for k in keys))


def write_tokenizer(out: Path, vocab_size: int, special: dict[int, str] | None = None) -> None:
    """The fixture tokenizer extended to `vocab_size`; `special` puts added special tokens at
    those ids instead."""
    special = special or {}
    tokenizer = json.loads((FIXTURE / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert len(vocab) == FIXTURE_VOCAB and max(vocab.values()) == FIXTURE_VOCAB - 1
    # "\u0120" is byte-level BPE's space, so these decode to " <1000>", " <1001>", ...
    extra = {special.get(i, f"\u0120<{i}>"): i for i in range(FIXTURE_VOCAB, vocab_size)}
    assert not extra.keys() & vocab.keys()
    vocab.update(extra)
    for i, content in sorted(special.items()):
        tokenizer["added_tokens"].append({"id": i, "content": content, "single_word": False, "lstrip": False,
                                          "rstrip": False, "normalized": False, "special": True})
    shutil.copy(FIXTURE / "tokenizer_config.json", out / "tokenizer_config.json")
    tmp = out / "tokenizer.json.tmp"
    tmp.write_text(json.dumps(tokenizer, ensure_ascii=False))
    tmp.rename(out / "tokenizer.json")


def write_processor(out: Path) -> None:
    """Qwen2.5-VL's processor files (image processor, chat template) beside the tokenizer."""
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    tok = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), bos_token="<|endoftext|>",
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    image_processor = Qwen2VLImageProcessor(size={"shortest_edge": VL_MIN_PIXELS, "longest_edge": VL_MAX_PIXELS})
    processor = Qwen2_5_VLProcessor(image_processor=image_processor, tokenizer=tok,
                                    video_processor=Qwen2VLVideoProcessor(),
                                    chat_template=VL_CHAT_TEMPLATE_FILE.read_text())
    processor.save_pretrained(str(out))


def w4a16_tensors(model, group: int) -> tuple[dict, dict]:
    """The state dict with every decoder linear weight replaced by random packed 4-bit words and
    bf16 scales (`weight_packed` int32 [n, k/8], `weight_scale` [n, k/group], `weight_shape`), and
    the `quantization_config` that describes them."""
    gen = torch.Generator(device=model.device).manual_seed(1)
    tensors = {}
    for name, t in model.state_dict().items():
        module = name.removesuffix(".weight")
        if ".layers." in name and name.endswith("_proj.weight") and t.dim() == 2:
            n, k = t.shape
            assert k % group == 0 and k % 8 == 0, f"{name}: {k} inputs in groups of {group}"
            words = torch.randint(-(2**31), 2**31, (n, k // 8), generator=gen, device=t.device, dtype=torch.int64)
            tensors[f"{module}.weight_packed"] = words.to(torch.int32)
            # Uniform nibbles (q in -8..7, std 4.6) times this scale have the init's std.
            scale = torch.full((n, k // group), INIT_STD / 4.6, dtype=torch.bfloat16, device=t.device)
            tensors[f"{module}.weight_scale"] = scale
            tensors[f"{module}.weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
        else:
            tensors[name] = t
    config = {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "ignore": ["lm_head"], "kv_cache_scheme": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group,
                        "dynamic": False, "actorder": None, "observer": "minmax"},
        }},
    }
    return tensors, config


def fp8_dynamic_tensors(model) -> tuple[dict, dict]:
    """The state dict with every decoder linear weight rounded to e4m3 per output channel
    (`weight` float8_e4m3fn, `weight_scale` f32 [n, 1]), and the `quantization_config` of
    llm-compressor's FP8_DYNAMIC scheme."""
    tensors = {}
    for name, t in model.state_dict().items():
        if ".layers." in name and name.endswith("_proj.weight") and t.dim() == 2:
            w = t.float()
            scale = (w.abs().amax(dim=1, keepdim=True) / 448.0).clamp(min=torch.finfo(torch.float32).eps)
            tensors[name] = (w / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            tensors[f"{name.removesuffix('.weight')}.weight_scale"] = scale
        else:
            tensors[name] = t
    scheme = {"dynamic": False, "group_size": None, "num_bits": 8, "observer": "memoryless_minmax",
              "strategy": "channel", "symmetric": True, "type": "float"}
    inputs = {"dynamic": True, "group_size": None, "num_bits": 8, "strategy": "token", "symmetric": True,
              "type": "float"}
    config = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "ignore": ["lm_head"], "kv_cache_scheme": None,
        "config_groups": {"group_0": {"format": "float-quantized", "targets": ["Linear"], "weights": scheme,
                                      "input_activations": inputs, "output_activations": None}},
    }
    return tensors, config


def save_sharded(tensors: dict, out: Path, shard_bytes: int = 5 << 30) -> None:
    from safetensors.torch import save_file

    shards, current, size = [], {}, 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = t.contiguous().cpu()
        size += nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES) + sorted(VL_SHAPES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, help="cut the depth to this many layers (default: the full depth)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="shrink every width (CPU smoke tests only)")
    ap.add_argument("--w4a16", type=int, metavar="GROUP", help="decoder linear weights as W4A16 in groups of GROUP")
    ap.add_argument("--fp8-dynamic", action="store_true", help="decoder linear weights as FP8_DYNAMIC")
    args = ap.parse_args()

    config = build_config(args.shape, args.layers, args.tiny)
    full_depth = (SHAPES.get(args.shape) or VL_SHAPES[args.shape])[1]["num_hidden_layers"]
    vl = args.shape in VL_SHAPES
    if vl and (args.w4a16 or args.fp8_dynamic):
        sys.exit("--w4a16 and --fp8-dynamic are for text shapes")
    if args.w4a16 and args.fp8_dynamic:
        sys.exit("--w4a16 and --fp8-dynamic exclude each other")
    quantization = quantization_of(args.w4a16, args.fp8_dynamic)
    if is_complete(args.out, config, quantization):
        print(f"{args.out} already holds this checkpoint", file=sys.stderr)
    else:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        start = time.perf_counter()
        torch.manual_seed(args.seed)
        auto = AutoModelForImageTextToText if vl else AutoModelForCausalLM
        with torch.device(device):
            model = auto.from_config(config, dtype=torch.bfloat16).eval()
        model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
        init_s = time.perf_counter() - start
        if (args.out / "config.json").exists():
            shutil.rmtree(args.out)  # a partial or different checkpoint
        elif args.out.exists() and any(args.out.iterdir()):
            sys.exit(f"{args.out} is not empty and holds no checkpoint; not overwriting it")
        args.out.mkdir(parents=True, exist_ok=True)
        if quantization:
            tensors, scheme = w4a16_tensors(model, args.w4a16) if args.w4a16 else fp8_dynamic_tensors(model)
            model.config.quantization_config = scheme
            model.config.architectures = [type(model).__name__]
            model.config.save_pretrained(args.out)
            model.generation_config.save_pretrained(args.out)
            save_sharded(tensors, args.out)
            del tensors
        else:
            model.save_pretrained(args.out, max_shard_size="5GB")
        del model
        if vl:
            write_tokenizer(args.out, text_of(config).vocab_size, VISION_TOKENS)
            write_processor(args.out)
        else:
            write_tokenizer(args.out, config.vocab_size)
        print(f"wrote {args.out} (init on {device} {init_s:.1f} s, total {time.perf_counter() - start:.1f} s)",
              file=sys.stderr)
    params, nbytes = safetensors_size(args.out)
    print(json.dumps({
        "shape": args.shape, "dir": str(args.out), "model_type": config.model_type,
        "layers": text_of(config).num_hidden_layers, "full_depth_layers": full_depth,
        "truncated": text_of(config).num_hidden_layers < full_depth, "tiny": args.tiny,
        "parameters": params, "weight_bytes": nbytes, "dtype": "bfloat16", "init_std": INIT_STD, "seed": args.seed,
        "w4a16_group": args.w4a16, "quantization": quantization,
    }))


if __name__ == "__main__":
    main()
