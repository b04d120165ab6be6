"""Vision-language oracle fixtures: tiny random-init Qwen2-VL, Qwen2.5-VL and LLaVA models,
synthetic images and videos, and transformers' greedy output for prompts that mix text, images and
(Qwen) videos.

    .venv-oracle/bin/python tools/oracle/generate_vl_fixtures.py            # every family (~40 s)
    .venv-oracle/bin/python tools/oracle/generate_vl_fixtures.py qwen2.5-vl # one of them

Families and what their fixture exercises:
- qwen2-vl (fixtures/models/qwen2-vl): LayerNorm + quick-GELU tower, full attention per image or
  video frame pair; videos' temporal positions one per time step.
- qwen2.5-vl (fixtures/models/qwen2.5-vl): RMSNorm + SwiGLU tower with window attention (windows of
  2x2 merged tokens, so that every image but the smallest spans several, some partial) and one
  full-attention block; tied word embeddings, as the 3B checkpoint has them; `tokens_per_second` 25,
  so that a video's time steps (1/12 s each at the 24 fps transformers assumes for frame lists)
  sit 2.08 positions apart.
- qwen3-vl (fixtures/models/qwen3-vl): 16-pixel patches, learned positions on a 4x4 grid resampled
  to every image (up and down), LayerNorm + GELU(tanh) tower, DeepStack features from blocks 0 and
  1 added after the first two of three decoder layers, QK-norm, interleaved MRoPE. Videos through
  Qwen3-VL's processor: frames sampled at 2 of an assumed 24 fps (at least 4), each temporal patch
  written as `<t seconds>` + vision start + its placeholders + vision end, so one video spans
  several placeholder runs; a third video ("long", 16 frames sampled to 4) has two timestamps.
- qwen3-vl-moe (fixtures/models/qwen3-vl-moe): qwen3-vl's tower before a Qwen3-MoE text model (4
  experts, top 2, always renormalised; layer 1 dense through `mlp_only_layers`), experts saved fused
  as the Hub's checkpoints have them. Videos as qwen3-vl (without "long").
- qwen3.5-vl (fixtures/models/qwen3.5-vl): Qwen3-VL's tower without DeepStack before Qwen3.5's
  hybrid text model (three Gated DeltaNet layers, then one gated full-attention layer with half its
  head dims rotary, MRoPE interleaved over them). Videos as qwen3-vl-moe.
- gemma3-vl (fixtures/models/gemma3-vl): a SigLIP tower (no class token, biased patch embedding,
  post-LayerNorm, GELU(tanh)) over 112x112 images (8x8 patches of 14, every test image resized
  bilinearly, up or down), average-pooled 2x2 into 16 tokens, Gemma's RMSNorm and projection into
  a Gemma 3 text model of two sliding layers (window 24, so that it cuts into the images'
  bidirectional token runs) and one full layer. Gemma 3's processor writes each image as
  `\n\n<start_of_image>` + 16 `<image_soft_token>` + `<end_of_image>\n\n` and marks the soft
  tokens in `token_type_ids`, which make them attend to one another both ways; Gemma 3's chat
  template (`<start_of_turn>`, images as `<start_of_image>`). One case ("pan-and-scan") asks for
  pan-and-scan (`mm_processor_kwargs` in the case): the wide image and its 2 crops, written as
  "Here is the original image ... and here are some crops to help you see better ...".
- llava (fixtures/models/llava): a CLIP tower (class token, learned positions, pre-LayerNorm,
  quick-GELU) read at its second-to-last layer, the class row dropped, a GELU projector, a Llama
  text model; CLIP's processor (shortest edge 56, centre crop 56x56: 16 image tokens); llava-1.5's
  chat template (images first, `USER:` / `ASSISTANT:`).
- llava-siglip (fixtures/models/llava-siglip): LLaVA-interleave's shape: a SigLIP tower read at its
  last layer with every row kept (`vision_feature_select_strategy: full`, no class row), SigLIP's
  processor (bicubic resize to 56x56, mean and std 0.5: 16 image tokens) and a Qwen2 text model.
- llava-next (fixtures/models/llava-next): LLaVA-NeXT's anyres over llava's CLIP tower shape (28x28
  tiles of 4-pixel patches: 49 embeddings a tile, class row dropped), grid pinpoints 28x56, 56x28
  and 56x56; every image becomes the whole image squashed to a tile, then its best pinpoint's tiles
  (the image fitted and padded into it), packed with the tiles' padding rows or columns cut away
  and `image_newline` after each row. The images' aspect ratios differ (a tall one is added), so
  rows are cut from some and columns from others; llava-1.5's chat template.
- mistral3 (fixtures/models/mistral3): Mistral-Small-3.1's shape: a Pixtral tower (4-pixel
  patches, RMSNorm, 2-D axial rotary embedding, SiLU-gated MLP, three layers read at the last)
  before Mistral3's projector (RMSNorm, 2x2 patch merger, GELU MLP) into a Mistral text model.
  Pixtral's processor resizes each image to fit a 48-pixel longest edge, rounded up to whole 8-pixel
  merged patches (a tiny image is enlarged to them), and writes it as rows of `[IMG]`, each closed
  by `[IMG_BREAK]`, the last by `[IMG_END]`; the images' grids are not square. A Mistral-style chat
  template (`[INST]` ... `[/INST]`, images as `[IMG]`).

Pinned as the other oracle scripts (tools/oracle/requirements.txt: torch 2.15.0, transformers 5.24.0)
plus Pillow 13.0.0 and torchvision 0.29.2, which transformers' image processors need. Deterministic:
rerunning it with the same versions rewrites the same files.

What it writes (fixtures/models/<family>/):
- the checkpoint as transformers 5 saves it (config.json with text_config / vision_config,
  model.safetensors), the processor's files (preprocessor_config.json, tokenizer.json with the
  vision special tokens added, tokenizer_config.json, chat_template.jinja: Qwen2-VL's template);
- images/*.png: the synthetic images; videos/<video>/<frame>.png: the synthetic videos' frames;
- oracle.json: per case the messages, the prompt ids the processor made (placeholders expanded),
  each image's and video's files, grid and processed pixels (pixels/<name>.bin, f32 little-endian
  [patches, patch_dim], one file per image or video; a video's entry also has
  `video_seconds_per_grid`; a LLaVA-NeXT image's grid is its `image_sizes`, `[1, height, width]`
  in pixels, and its `patches` the whole image and its tiles; a Gemma 3 pan-and-scan image is an
  entry for the whole image and one per crop, `crop` 1, 2, ..., pixels/<name>-crop<k>.bin), in
  prompt order under `images`, a case's processor kwargs under `mm_processor_kwargs`, and
  transformers' 16 greedy tokens with top-5 logprobs per step.

The oracle is transformers on CPU in float32 with eager attention, batch 1, HF generate.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_common import ROOT, greedy_generate_inputs, versions, write_json  # noqa: E402
from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches  # noqa: E402

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import (  # noqa: E402
    CLIPImageProcessor,
    SiglipImageProcessor,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessor,
    Gemma3Processor,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessor,
    LlavaNextProcessor,
    LlavaProcessor,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    PixtralImageProcessor,
    PixtralProcessor,
    PreTrainedTokenizerFast,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
    Qwen3VLVideoProcessor,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
)

TOKENIZER_DIR = ROOT / "fixtures" / "tokenizer"
SEED = 1234
MAX_NEW_TOKENS = 16
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen2-VL-Instruct's chat template.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Small pixel budgets keep the fixture small: 4 to 16 merged tokens per image.
MIN_PIXELS = 28 * 28 * 4
MAX_PIXELS = 28 * 28 * 16


def synthetic_image(name: str, width: int, height: int, seed: int) -> Image.Image:
    """Smooth gradients plus noise, so that resizing and every patch matter."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = np.stack(
        [
            127 + 120 * np.sin(x / (3 + seed % 5) + y / 11),
            127 + 120 * np.cos(y / (4 + seed % 3) - x / 13),
            (x * 255 / max(width - 1, 1) + y * 97 / max(height - 1, 1)) % 256,
        ],
        axis=-1,
    )
    pixels = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


IMAGES = {
    "square": (56, 56, 1),  # exactly 4x4 patches: no resize
    "wide": (112, 56, 2),  # 8x4 patches
    "odd": (75, 61, 3),  # resized to 84x56
    "large": (200, 150, 4),  # shrunk under MAX_PIXELS
}

# name -> (frames, width, height, seed): 5 frames are padded to 6 (3 time steps); 61x75 is resized.
VIDEOS = {
    "clip": (5, 84, 56, 11),
    "short": (2, 61, 75, 12),
}

VIDEO_CASES = [
    ("video", [{"type": "video", "video": "clip"}, {"type": "text", "text": "What happens?"}]),
    ("image-and-video", [{"type": "image", "image": "square"}, {"type": "text", "text": "then"},
                         {"type": "video", "video": "short"}, {"type": "text", "text": "Same scene?"}]),
]
# Qwen3-VL's sampling keeps frames 0, 5, 10 and 15 of "long": temporal patches at 0.1 s and 0.5 s.
LONG_VIDEO = {"long": (16, 48, 40, 13)}
LONG_VIDEO_CASES = [
    ("long-video", [{"type": "text", "text": "Watch"}, {"type": "video", "video": "long"},
                    {"type": "text", "text": "When does it change?"}]),
]
# Qwen3-VL's video budget counts the pixels of all sampled frames, in 32x32 units.
QWEN3_VIDEO_SIZE = {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 16}

CASES = [
    ("one-image", [{"type": "image", "image": "square"}, {"type": "text", "text": "Describe the image."}]),
    ("text-image-text", [{"type": "text", "text": "Look at"}, {"type": "image", "image": "wide"},
                         {"type": "text", "text": "and say what you see."}]),
    ("two-images", [{"type": "image", "image": "odd"}, {"type": "image", "image": "large"},
                    {"type": "text", "text": "Compare them."}]),
    ("resized", [{"type": "text", "text": "What is in"}, {"type": "image", "image": "large"}]),
    ("image-last", [{"type": "text", "text": "def main():\n    return"}, {"type": "image", "image": "odd"}]),
    ("text-only", [{"type": "text", "text": "import os\nimport sys\n"}]),
    ("same-image-twice", [{"type": "image", "image": "wide"}, {"type": "text", "text": "and again"},
                          {"type": "image", "image": "wide"}]),
    ("code-after-image", [{"type": "image", "image": "square"},
                          {"type": "text", "text": "class Parser:\n    def __init__(self, text):\n"}]),
]


def build_tokenizer(special: list[str], extra: dict[str, str] | None = None) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_DIR / "tokenizer.json"),
                                  bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  **({"extra_special_tokens": extra} if extra else {}))
    tok.add_special_tokens({"additional_special_tokens": special})
    return tok


# llava-hf/llava-1.5-7b-hf's chat template, without its `{% generation %}` markers (a
# transformers-only tag for training masks; they render nothing).
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
    "{% endif %}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
LLAVA_IMAGE = 56
# LLaVA-NeXT: 28-pixel tiles of 7x7 4-pixel patches, pinpoints (height, width) of 2 or 4 tiles.
LLAVA_NEXT_TILE = 28
LLAVA_NEXT_PATCH = 4
LLAVA_NEXT_PINPOINTS = [[28, 56], [56, 28], [56, 56]]
# A tall image (30x90: best pinpoint 56x28, its columns cut from 7 to 5) beside the wide one.
LLAVA_NEXT_IMAGES = {"tall": (30, 90, 5)}
LLAVA_NEXT_CASES = [
    ("tall-and-wide", [{"type": "image", "image": "tall"}, {"type": "image", "image": "wide"},
                       {"type": "text", "text": "Which one is taller?"}]),
]

# A Mistral-style chat template (mistralai's, without the system prompt and tool handling).
MISTRAL3_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}[INST]{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}[IMG]{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}[/INST]{% else %}{{ message['content'][0]['text'] }}{% endif %}{% endfor %}"
)
MISTRAL3_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
# Pixtral's processor: 4-pixel patches merged 2x2, so images are resized to whole 8-pixel units
# within a 48-pixel longest edge (56x56 -> 48x48, 112x56 -> 48x24, 75x61 -> 48x40).
MISTRAL3_PATCH = 4
MISTRAL3_MERGE = 2
MISTRAL3_LONGEST_EDGE = 48
# A tiny image (21x13) fits as it is and is enlarged to 24x16: 3x2 merged tokens.
MISTRAL3_IMAGES = {"tiny": (21, 13, 6)}
MISTRAL3_CASES = [
    ("tiny-and-wide", [{"type": "image", "image": "tiny"}, {"type": "text", "text": "beside"},
                       {"type": "image", "image": "wide"}, {"type": "text", "text": "Which one is larger?"}]),
]

# google/gemma-3-4b-it's chat template.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}{%- else -%}{{ raise_exception(\"Invalid content type\") }}"
    "{%- endif -%}{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}"
    "{{'<start_of_turn>model\n'}}{%- endif -%}"
)
GEMMA3_IMAGE = 112
GEMMA3_TOKENS_PER_IMAGE = 16
# Pan-and-scan on the wide image (112x56, aspect ratio 2): with crops of at least 32 pixels, the
# processor makes 2 crops of 56x56 and writes the image as the whole image and its crops, three
# images of 16 tokens each; the kwargs are the request's `mm_processor_kwargs`.
GEMMA3_CASES = [
    ("pan-and-scan", [{"type": "text", "text": "Look closely at"}, {"type": "image", "image": "wide"},
                      {"type": "text", "text": "What is on the right?"}],
     {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 32}),
]
GEMMA3_EXTRA_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                       "image_token": "<image_soft_token>"}


TEXT_CONFIG = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.3,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
)

FAMILIES = {
    "qwen2-vl": dict(
        tokens=VISION_TOKENS, config=Qwen2VLConfig, model=Qwen2VLForConditionalGeneration, processor=Qwen2VLProcessor,
        vision=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=14,
                    temporal_patch_size=2, spatial_merge_size=2, initializer_range=0.3),
        extra={},
    ),
    "qwen2.5-vl": dict(
        tokens=VISION_TOKENS, config=Qwen2_5_VLConfig, model=Qwen2_5_VLForConditionalGeneration, processor=Qwen2_5_VLProcessor,
        vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, patch_size=14,
                    temporal_patch_size=2, spatial_merge_size=2, window_size=56, fullatt_block_indexes=[1],
                    hidden_act="silu", initializer_range=0.3),
        extra={"tie_word_embeddings": True},
        vision_extra={"tokens_per_second": 25},
    ),
    "qwen3-vl": dict(
        tokens=VISION_TOKENS, config=Qwen3VLConfig, model=Qwen3VLForConditionalGeneration, processor=Qwen3VLProcessor,
        vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, patch_size=16,
                    temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                    deepstack_visual_indexes=[0, 1], hidden_act="gelu_pytorch_tanh", initializer_range=0.3),
        extra={},
        text_extra={"num_hidden_layers": 3, "head_dim": 16,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                        "mrope_interleaved": True}},
        long_video=True,
    ),
    "qwen3-vl-moe": dict(
        tokens=VISION_TOKENS, config=Qwen3VLMoeConfig, model=Qwen3VLMoeForConditionalGeneration,
        processor=Qwen3VLProcessor,
        vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, patch_size=16,
                    temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                    deepstack_visual_indexes=[0, 1], hidden_act="gelu_pytorch_tanh", initializer_range=0.3),
        extra={},
        text_extra={"num_hidden_layers": 3, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 48, "mlp_only_layers": [1], "decoder_sparse_step": 1,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                        "mrope_interleaved": True}},
    ),
    "qwen3.5-vl": dict(
        tokens=VISION_TOKENS, config=Qwen3_5Config, model=Qwen3_5ForConditionalGeneration, processor=Qwen3VLProcessor,
        vision=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, patch_size=16,
                    temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                    hidden_act="gelu_pytorch_tanh", initializer_range=0.3),
        extra={},
        text_extra={"num_hidden_layers": 4, "head_dim": 16, "full_attention_interval": 4,
                    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_num_key_heads": 2,
                    "linear_num_value_heads": 4, "linear_value_head_dim": 8,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                        "mrope_interleaved": True, "partial_rotary_factor": 0.5}},
    ),
    "gemma3-vl": dict(
        tokens=["<start_of_turn>", "<end_of_turn>"], extra_tokens=GEMMA3_EXTRA_TOKENS, config=Gemma3Config,
        model=Gemma3ForConditionalGeneration, processor=Gemma3Processor,
        vision=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, image_size=GEMMA3_IMAGE, patch_size=14, vision_use_head=False),
        extra={}, cases=GEMMA3_CASES,
    ),
    "llava": dict(
        tokens=["<image>"], config=LlavaConfig, model=LlavaForConditionalGeneration, processor=LlavaProcessor,
        vision=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, image_size=LLAVA_IMAGE, patch_size=14, hidden_act="quick_gelu",
                    initializer_range=0.3),
        extra={},
    ),
    "llava-next": dict(
        tokens=["<image>"], config=LlavaNextConfig, model=LlavaNextForConditionalGeneration,
        processor=LlavaNextProcessor,
        vision=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, image_size=LLAVA_NEXT_TILE, patch_size=LLAVA_NEXT_PATCH,
                    hidden_act="quick_gelu", initializer_range=0.3),
        extra={}, images=LLAVA_NEXT_IMAGES, cases=LLAVA_NEXT_CASES,
    ),
    "mistral3": dict(
        tokens=MISTRAL3_TOKENS, config=Mistral3Config, model=Mistral3ForConditionalGeneration,
        processor=PixtralProcessor,
        vision=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, image_size=MISTRAL3_LONGEST_EDGE, patch_size=MISTRAL3_PATCH,
                    hidden_act="silu", rope_parameters={"rope_type": "axial", "rope_theta": 10000.0},
                    initializer_range=0.3),
        extra={}, images=MISTRAL3_IMAGES, cases=MISTRAL3_CASES,
    ),
    "llava-siglip": dict(
        tokens=["<image>"], config=LlavaConfig, model=LlavaForConditionalGeneration, processor=LlavaProcessor,
        siglip=True,
        vision=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, image_size=LLAVA_IMAGE, patch_size=14, vision_use_head=False),
        extra={},
    ),
}


def family_config(family: dict, vocab: int, ids: dict[str, int]):
    if family.get("siglip"):
        text = dict(TEXT_CONFIG, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        return LlavaConfig(text_config=dict(model_type="qwen2", vocab_size=vocab, **text),
                           vision_config=family["vision"], image_token_id=ids["<image>"],
                           vision_feature_layer=-1, vision_feature_select_strategy="full",
                           image_seq_length=(LLAVA_IMAGE // 14) ** 2, initializer_range=0.3)
    if family["config"] is Gemma3Config:
        text = dict(model_type="gemma3_text", vocab_size=vocab, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    query_pre_attn_scalar=16, max_position_embeddings=512, rms_norm_eps=1e-6, sliding_window=24,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                    initializer_range=0.3)
        return Gemma3Config(text_config=text, vision_config=family["vision"],
                            mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE, boi_token_id=ids["<start_of_image>"],
                            eoi_token_id=ids["<end_of_image>"], image_token_id=ids["<image_soft_token>"],
                            initializer_range=0.3, tie_word_embeddings=False)
    if family["config"] is Mistral3Config:
        text = dict(TEXT_CONFIG, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        return Mistral3Config(text_config=dict(model_type="mistral", vocab_size=vocab, sliding_window=None, **text),
                              vision_config=family["vision"], image_token_index=ids["[IMG]"],
                              spatial_merge_size=MISTRAL3_MERGE, vision_feature_layer=-1,
                              multimodal_projector_bias=False, projector_hidden_act="gelu",
                              tie_word_embeddings=False, initializer_range=0.3)
    if family["config"] is LlavaNextConfig:
        text = dict(TEXT_CONFIG, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        return LlavaNextConfig(text_config=dict(model_type="llama", vocab_size=vocab, **text),
                               vision_config=family["vision"], image_token_id=ids["<image>"],
                               vision_feature_layer=-2, vision_feature_select_strategy="default",
                               image_grid_pinpoints=LLAVA_NEXT_PINPOINTS, initializer_range=0.3)
    if family["config"] is LlavaConfig:
        text = dict(TEXT_CONFIG, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        return LlavaConfig(text_config=dict(model_type="llama", vocab_size=vocab, **text),
                           vision_config=family["vision"], image_token_id=ids["<image>"],
                           vision_feature_layer=-2, vision_feature_select_strategy="default",
                           image_seq_length=(LLAVA_IMAGE // 14) ** 2, initializer_range=0.3)
    return family["config"](
        text_config=dict(TEXT_CONFIG, vocab_size=vocab, **family["extra"]) | family.get("text_extra", {}),
        vision_config=family["vision"] | family.get("vision_extra", {}),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        initializer_range=0.3, **family["extra"],
    )


def family_processor(family: dict, tok):
    if family.get("siglip"):
        image_processor = SiglipImageProcessor(size={"height": LLAVA_IMAGE, "width": LLAVA_IMAGE})
        return LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=14,
                              vision_feature_select_strategy="full", num_additional_image_tokens=0,
                              chat_template=LLAVA_CHAT_TEMPLATE)
    if family["processor"] is Gemma3Processor:
        image_processor = Gemma3ImageProcessor(size={"height": GEMMA3_IMAGE, "width": GEMMA3_IMAGE})
        return Gemma3Processor(image_processor=image_processor, tokenizer=tok,
                               image_seq_length=GEMMA3_TOKENS_PER_IMAGE, chat_template=GEMMA3_CHAT_TEMPLATE)
    if family["processor"] is PixtralProcessor:
        image_processor = PixtralImageProcessor(size={"longest_edge": MISTRAL3_LONGEST_EDGE},
                                                patch_size={"height": MISTRAL3_PATCH, "width": MISTRAL3_PATCH})
        return PixtralProcessor(image_processor=image_processor, tokenizer=tok, patch_size=MISTRAL3_PATCH,
                                spatial_merge_size=MISTRAL3_MERGE, chat_template=MISTRAL3_CHAT_TEMPLATE)
    if family["processor"] is LlavaNextProcessor:
        image_processor = LlavaNextImageProcessor(
            size={"shortest_edge": LLAVA_NEXT_TILE}, crop_size={"height": LLAVA_NEXT_TILE, "width": LLAVA_NEXT_TILE},
            image_grid_pinpoints=LLAVA_NEXT_PINPOINTS)
        return LlavaNextProcessor(image_processor=image_processor, tokenizer=tok, patch_size=LLAVA_NEXT_PATCH,
                                  vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                  chat_template=LLAVA_CHAT_TEMPLATE)
    if family["processor"] is LlavaProcessor:
        image_processor = CLIPImageProcessor(size={"shortest_edge": LLAVA_IMAGE},
                                             crop_size={"height": LLAVA_IMAGE, "width": LLAVA_IMAGE})
        return LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=14,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=LLAVA_CHAT_TEMPLATE)
    if family["processor"] is Qwen3VLProcessor:
        # Qwen3-VL's processor: 16-pixel patches, mean = std = 0.5, the same pixel budget in 32x32 units.
        budget = {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 16}
        image_processor = Qwen2VLImageProcessor(size=budget, patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3)
        video_processor = Qwen3VLVideoProcessor(size=QWEN3_VIDEO_SIZE, cap_pixels_per_frame=False)
        return family["processor"](image_processor=image_processor, tokenizer=tok,
                                   video_processor=video_processor, chat_template=CHAT_TEMPLATE)
    image_processor = Qwen2VLImageProcessor(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})
    video_processor = Qwen2VLVideoProcessor(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
                                            cap_pixels_per_frame=False)
    return family["processor"](image_processor=image_processor, tokenizer=tok,
                               video_processor=video_processor, chat_template=CHAT_TEMPLATE)


def video_records(inputs):
    """Per video: its grid, processed pixels and seconds per temporal patch (transformers'
    `second_per_grid_ts` where the processor makes it, else what it would be: Qwen2-VL's processor
    leaves it out because its model does not read it)."""
    out, offset = [], 0
    seconds = inputs.get("second_per_grid_ts")
    for k, grid in enumerate(inputs["video_grid_thw"].tolist()):
        patches = grid[0] * grid[1] * grid[2]
        rows = inputs["pixel_values_videos"][offset:offset + patches].numpy().astype("<f4")
        offset += patches
        per_grid = float(seconds[k]) if seconds is not None else 2 / 24
        out.append((grid, rows.reshape(-1), int(rows.shape[1]), per_grid))
    return out


def image_records(inputs, count: int, patch: int):
    """Per image: its grid in `patch`-pixel patches and its processed pixels (as the model takes
    them: Qwen's patch rows, or CLIP's channel-first image), flattened; for LLaVA-NeXT the grid is
    the image's size in pixels (`image_sizes`), the pixels its tiles without the batch padding; for
    Pixtral the grid is in patches and the pixels the image without the batch padding."""
    if "image_sizes" in inputs and inputs["pixel_values"].dim() == 4:
        out = []
        for k, (height, width) in enumerate(inputs["image_sizes"].tolist()):
            chw = inputs["pixel_values"][k][:, :height, :width].numpy().astype("<f4")
            out.append(([1, height // patch, width // patch], chw.reshape(-1), 3 * patch * patch, None))
        return out
    if "image_sizes" in inputs:
        out = []
        for k, (height, width) in enumerate(inputs["image_sizes"].tolist()):
            tiles = image_size_to_num_patches((height, width), LLAVA_NEXT_PINPOINTS, LLAVA_NEXT_TILE)
            chw = inputs["pixel_values"][k][:tiles].numpy().astype("<f4")
            out.append(([1, height, width], chw.reshape(-1), int(chw[0].size), tiles))
        return out
    if "image_grid_thw" in inputs:
        out, offset = [], 0
        for grid in inputs["image_grid_thw"].tolist():
            patches = grid[0] * grid[1] * grid[2]
            rows = inputs["pixel_values"][offset:offset + patches].numpy().astype("<f4")
            offset += patches
            out.append((grid, rows.reshape(-1), int(rows.shape[1]), None))
        return out
    out = []
    for k in range(count):
        chw = inputs["pixel_values"][k].numpy().astype("<f4")
        out.append(([1, chw.shape[1] // patch, chw.shape[2] // patch], chw.reshape(-1), 3 * patch * patch, None))
    return out


def build_model(family: dict, vocab: int, ids: dict[str, int]):
    cfg = family_config(family, vocab, ids)
    torch.manual_seed(SEED)
    model = family["model"]._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            if flat.numel() > 0 and bool(torch.all(flat == flat[0])):
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    model.eval()
    return model


def generate(family_name: str) -> None:
    family = FAMILIES[family_name]
    out = ROOT / "fixtures" / "models" / family_name
    if out.exists():
        shutil.rmtree(out)
    (out / "images").mkdir(parents=True)
    (out / "pixels").mkdir()
    tok = build_tokenizer(family["tokens"], family.get("extra_tokens"))
    tokens = family["tokens"] + list(family.get("extra_tokens", {}).values())
    ids = {t: tok.convert_tokens_to_ids(t) for t in tokens}
    processor = family_processor(family, tok)
    images = {}
    for name, (w, h, seed) in (IMAGES | family.get("images", {})).items():
        synthetic_image(name, w, h, seed).save(out / "images" / f"{name}.png")
        images[name] = Image.open(out / "images" / f"{name}.png").convert("RGB")
    takes_video = "<|video_pad|>" in family["tokens"]
    family_videos = VIDEOS | (LONG_VIDEO if family.get("long_video") else {})
    videos = {}
    for name, (count, w, h, seed) in family_videos.items() if takes_video else ():
        (out / "videos" / name).mkdir(parents=True)
        frames = []
        for k in range(count):
            file = out / "videos" / name / f"{k}.png"
            synthetic_image(name, w, h, seed * 10 + k).save(file)
            frames.append(np.asarray(Image.open(file).convert("RGB")))
        videos[name] = frames

    model = build_model(family, len(tok), ids)
    model.save_pretrained(str(out), safe_serialization=True)
    processor.save_pretrained(str(out))
    model = family["model"].from_pretrained(str(out), dtype=torch.float32,
                                                            attn_implementation="eager").eval()

    cases = []
    video_cases = VIDEO_CASES + (LONG_VIDEO_CASES if family.get("long_video") else [])
    for name, content, *kwargs in CASES + family.get("cases", []) + (video_cases if takes_video else []):
        kwargs = kwargs[0] if kwargs else {}
        messages = [{"role": "user", "content": [
            {"type": part["type"]} if part["type"] in ("image", "video") else part for part in content]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        used = [images[p["image"]] for p in content if p["type"] == "image"]
        used_videos = [videos[p["video"]] for p in content if p["type"] == "video"]
        inputs = processor(text=[text], images=used or None, videos=used_videos or None, return_tensors="pt",
                           **kwargs)
        prompt_ids = inputs["input_ids"][0].tolist()

        def keep(file, pixels):
            if (out / file).exists():
                assert np.array_equal(np.fromfile(out / file, dtype="<f4"), pixels), file
            else:
                pixels.tofile(out / file)

        # Gemma 3's pan-and-scan: per image, its crops (each one more image after it in `pixel_values`),
        # from its image processor with the processor's defaults under the case's kwargs.
        crops = [0] * len(used)
        if kwargs.get("do_pan_and_scan"):
            crop_kwargs = {k: v for k, v in (Gemma3Processor.images_kwargs | kwargs).items() if k.startswith("pan_")}
            crops = [int(processor.image_processor(image, do_pan_and_scan=True, **crop_kwargs)["num_crops"][0])
                     for image in used]
        image_rows = iter(image_records(inputs, len(used) + sum(crops), family["vision"]["patch_size"])
                          if used else [])
        image_crops = iter(crops)
        video_rows = iter(video_records(inputs) if used_videos else [])
        record_images = []
        for part in content:
            if part["type"] == "image":
                # The image, then its pan-and-scan crops: one entry each, as the model takes them.
                for crop in range(1 + next(image_crops)):
                    grid, pixels, patch_dim, patches = next(image_rows)
                    file = f"pixels/{part['image']}{f'-crop{crop}' if crop else ''}.bin"
                    keep(file, pixels)
                    record_images.append({"file": f"images/{part['image']}.png", "grid_thw": grid, "pixels": file,
                                          "patch_dim": patch_dim} | ({"patches": patches} if patches else {})
                                         | ({"crop": crop} if crop else {}))
            elif part["type"] == "video":
                grid, pixels, patch_dim, per_grid = next(video_rows)
                file = f"pixels/video-{part['video']}.bin"
                keep(file, pixels)
                frames = [f"videos/{part['video']}/{k}.png" for k in range(len(videos[part["video"]]))]
                record = {"frames": frames, "grid_thw": grid, "pixels": file, "patch_dim": patch_dim,
                          "video_seconds_per_grid": per_grid}
                if isinstance(processor, Qwen3VLProcessor):
                    # The seconds of each temporal patch, which the processor wrote into the prompt.
                    video_processor = processor.video_processor
                    meta = video_processor(videos=[videos[part["video"]]], return_metadata=True)["video_metadata"][0]
                    record["video_timestamps"] = processor._calculate_timestamps(
                        meta.frames_indices, 24, video_processor.temporal_patch_size)
                record_images.append(record)
        extra = {k: inputs[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                                        "second_per_grid_ts", "mm_token_type_ids", "token_type_ids", "image_sizes") if k in inputs}
        result = greedy_generate_inputs(model, inputs["input_ids"], MAX_NEW_TOKENS, **extra)
        cases.append({"name": name, "messages": [{"role": "user", "content": content}], "prompt": text,
                      "prompt_ids": prompt_ids, "images": record_images,
                      **({"mm_processor_kwargs": kwargs} if kwargs else {}), **result})
        print(f"{name}: {len(prompt_ids)} prompt tokens, {len(record_images)} images and videos, "
              f"min gap {min(result['gaps']):.3f}, out {result['output_ids']}")

    write_json(out / "oracle.json", {
        "generator": "tools/oracle/generate_vl_fixtures.py",
        **versions(),
        "architecture": family["model"].__name__,
        "dtype": "float32",
        "attn_implementation": "eager",
        "decoding": "greedy (do_sample=False), batch 1, KV cache (HF generate), EOS disabled",
        "max_new_tokens": MAX_NEW_TOKENS,
        "seed": SEED,
        "image_processor": (
            {"size": LLAVA_IMAGE, "resample": "bicubic"} if family.get("siglip")
            else {"shortest_edge": LLAVA_IMAGE, "crop_size": LLAVA_IMAGE} if family["processor"] is LlavaProcessor
            else {"tile": LLAVA_NEXT_TILE, "image_grid_pinpoints": LLAVA_NEXT_PINPOINTS}
            if family["processor"] is LlavaNextProcessor
            else {"size": GEMMA3_IMAGE, "resample": "bilinear"} if family["processor"] is Gemma3Processor
            else {"longest_edge": MISTRAL3_LONGEST_EDGE, "patch_size": MISTRAL3_PATCH * MISTRAL3_MERGE}
            if family["processor"] is PixtralProcessor
            else {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}) | {"backend": type(processor.image_processor).__name__},
        **({"video_processor": {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "frames_fps": 24}
                               if family["processor"] is not Qwen3VLProcessor else
                               {"size": QWEN3_VIDEO_SIZE, "frames_fps": 24, "sample_fps": 2, "min_frames": 4}}
           if takes_video else {}),
        "cases": [{k: v for k, v in c.items() if k != "gaps"} | {"min_top2_gap": min(c["gaps"])} for c in cases],
    })


def main() -> int:
    for family_name in sys.argv[1:] or FAMILIES:
        generate(family_name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
