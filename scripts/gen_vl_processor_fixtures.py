"""Fixtures for crates/multimodal: synthetic image files, the RGB pixels Pillow decodes from them
(as transformers' `convert_to_rgb` hands them on) and what transformers' Qwen2-VL, CLIP, Gemma 3
LLaVA-NeXT and Pixtral image processors make of those pixels, for the bit-exact tests in crates/multimodal/tests/.

Pinned: torch 2.15.0, transformers 5.24.0, numpy 2.4.6 (tools/oracle/requirements.txt), plus
Pillow 13.0.0 and torchvision 0.29.2, the newest torchvision (it asks for torch >= 2.14; no release
is paired with torch 2.15 yet; its resize calls torch's own interpolate kernel, so the pairing does
not change the numbers):

    .venv-oracle/bin/pip install pillow==13.0.0 torchvision==0.29.2 --no-deps
    .venv-oracle/bin/python scripts/gen_vl_processor_fixtures.py      # ~15 s, rewrites the fixtures

Deterministic: the same versions rewrite the same bytes. Run it on an x86 CPU with AVX2 (or AVX-512)
or on aarch64: elsewhere torchvision's bilinear resize of uint8 images takes a float path instead of
torch's uint8 kernel (`_do_native_uint8_resize_on_cpu`), and the bilinear fixtures would change.

What it writes (crates/multimodal/tests/fixtures/):
- images/<name>.<ext>: the encoded images (PNG RGB / RGBA / LA / palette with partial alpha /
  16-bit, JPEG, lossless WebP, GIF, BMP) and images/<name>.rgb: the RGB8 pixels (row-major HWC)
  that `transformers.image_transforms.convert_to_rgb` returns for Pillow's decode of the file;
- processor/<case>.bin: `pixel_values` of `Qwen2VLImageProcessor` (the torchvision backend, the one
  vLLM runs) as f32 little-endian [patches, patch_dim], for the .rgb pixels of a case's image;
- clip/<case>.bin: `pixel_values` of `CLIPImageProcessor` (torchvision backend) as f32
  little-endian [3, height, width], for the .rgb pixels of a case's image; a case whose output is
  too big to keep (LLaVA-1.5's 336 x 336) has only the FNV-1a 64 digest of those bytes, which every
  case records;
- gemma3/<case>.bin: `pixel_values` of `Gemma3ImageProcessor` (torchvision backend, no
  pan-and-scan) as f32 little-endian [3, height, width], for the .rgb pixels of a case's image; the
  cases with Gemma 3's real config (896 x 896) have only the FNV-1a 64 digest, which every case
  records;
- gemma3/pas-<case>.bin: `pixel_values` of `Gemma3ImageProcessor` with `do_pan_and_scan` for one
  image, the whole image then its crops, as f32 little-endian [1 + num_crops, 3, height, width],
  with `num_crops`;
- llava_next/<case>.bin: `pixel_values` of `LlavaNextImageProcessor` (torchvision backend) for
  one image, its batch padding cut off, as f32 little-endian [1 + tiles, 3, tile, tile], with its
  `image_sizes`; the case with llava-v1.6's real config (336-pixel tiles) has only the FNV-1a 64
  digest, which every case records. `llava_next_tokens` lists, for many image sizes and two
  tilings, the image tokens `LlavaNextProcessor` expands `<image>` to;
- pixtral/<case>.bin: `pixel_values` of `PixtralImageProcessor` (torchvision backend) for one
  image, its batch padding cut off, as f32 little-endian [3, height, width], with its
  `image_sizes`; the case with Mistral-Small-3.1's real config has only the FNV-1a 64 digest,
  which every case records. `pixtral_sizes` lists, for many image sizes and three configs, the
  size `get_resize_output_image_size` resizes an image to (which sets its `[IMG]` rows);
- video/<case>.rgb: a video's RGB8 frames one after another, and video/<case>.bin:
  `pixel_values_videos` of `Qwen2VLVideoProcessor` (torchvision backend) for them, f32
  little-endian [patches, patch_dim];
- video/qwen3-<case>.{rgb,bin}: the same for `Qwen3VLVideoProcessor`, given the frames without
  metadata (so it samples them as at 24 fps); the manifest's `qwen3_video_cases` also record the
  sampled `frames_indices` and the timestamps `Qwen3VLProcessor` writes into the prompt;
- resize/{source,strip}.rgb and resize/{source,strip}-<w>x<h>.rgb: two noisy images and
  torchvision's uint8 bicubic antialiased resize of them to many sizes (up, down, one axis only,
  squeezes by 100 to 800 times);
- resize/small.rgb and resize/{source,strip,small}-bilinear-<w>x<h>.rgb: a third, tiny noisy image
  and torchvision's uint8 bilinear antialiased resize of the three (`bilinear_resizes` in the
  manifest), the same kinds of sizes plus whole-number upscales;
- manifest.json: everything the tests need to read those files (sizes, configs, grids) and, per
  processor case and resize size, how far the PIL backend (`Qwen2VLImageProcessorPil`,
  `CLIPImageProcessorPil`, `Gemma3ImageProcessorPil`, Pillow's ImagingResample) lands from the
  torchvision one.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image
from torchvision.transforms.v2 import functional as tvF
from transformers.image_transforms import convert_to_rgb
from transformers.models.clip.image_processing_clip import CLIPImageProcessor
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.gemma3.image_processing_gemma3 import Gemma3ImageProcessor
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.llava_next.image_processing_llava_next import LlavaNextImageProcessor
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor
from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil
from transformers.models.pixtral.image_processing_pixtral import PixtralImageProcessor, get_resize_output_image_size
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

OUT = Path(__file__).resolve().parents[1] / "crates" / "multimodal" / "tests" / "fixtures"


def smooth_noisy(width: int, height: int, seed: int, channels: int = 3, noise: float = 20.0) -> np.ndarray:
    """Gradients and a ripple (so resizing has structure to blur) plus noise (so rounding matters)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    planes = []
    for c in range(channels):
        fx, fy = rng.uniform(0.05, 0.4, 2)
        plane = (
            255 * (x / max(width - 1, 1)) * (c % 2)
            + 255 * (y / max(height - 1, 1)) * ((c + 1) % 2)
            + 60 * np.sin(fx * x + fy * y + c)
        )
        planes.append(plane / 1.3 + rng.normal(0, noise, plane.shape))
    return np.clip(np.stack(planes, -1), 0, 255).round().astype(np.uint8)


def png_by_hand(pixels: np.ndarray, color_type: int) -> bytes:
    """A 16-bit PNG (Pillow cannot write 16-bit RGB/RGBA): big-endian samples, no filtering."""
    height, width = pixels.shape[:2]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = pixels.astype(">u2").reshape(height, -1)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    header = struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def make_images() -> dict[str, bytes]:
    """name.ext -> encoded bytes."""
    files = {}

    def save(name: str, image: Image.Image, **kwargs) -> None:
        buffer = io.BytesIO()
        image.save(buffer, **kwargs)
        files[name] = buffer.getvalue()

    save("gradient.png", Image.fromarray(smooth_noisy(53, 37, 1)), format="PNG")
    rgba = smooth_noisy(100, 30, 2, channels=4)
    rgba[..., 3] = np.clip(np.linspace(0, 300, 100)[None, :] - 20 + rgba[..., 3] / 8, 0, 255).astype(np.uint8)
    save("alpha.png", Image.fromarray(rgba, "RGBA"), format="PNG")
    save("photo.jpg", Image.fromarray(smooth_noisy(160, 96, 3, noise=6)), format="JPEG", quality=90)
    save("tiny.webp", Image.fromarray(smooth_noisy(20, 12, 4)), format="WEBP", lossless=True)
    # Palette image whose tRNS chunk gives some entries partial alpha.
    palette_rgb = smooth_noisy(16, 16, 5, noise=0).reshape(-1, 3)
    indices = smooth_noisy(100, 80, 6, channels=1, noise=30)[..., 0]
    palette = Image.fromarray(indices, "P")
    palette.putpalette(palette_rgb.tobytes())
    alphas = bytes(int(a) for a in np.linspace(0, 255, 64).round()) + bytes([255]) * 192
    save("palette.png", palette, format="PNG", transparency=alphas)
    la = smooth_noisy(45, 30, 7, channels=2)
    save("gray_alpha.png", Image.fromarray(la, "LA"), format="PNG")
    save("exact.bmp", Image.fromarray(smooth_noisy(56, 40, 8)), format="BMP")
    gif = Image.fromarray((smooth_noisy(30, 20, 9, channels=1)[..., 0] // 4).astype(np.uint8), "P")
    gif.putpalette(smooth_noisy(8, 8, 10, noise=0).reshape(-1, 3).tobytes())
    save("indexed.gif", gif, format="GIF", transparency=0)
    wide16 = smooth_noisy(16, 12, 11).astype(np.uint16) * 257 + np.arange(16, dtype=np.uint16)[None, :, None]
    files["rgb16.png"] = png_by_hand(wide16, color_type=2)
    gray16 = np.linspace(0, 65535, 16 * 12).round().astype(np.uint16).reshape(12, 16, 1)
    files["gray16.png"] = png_by_hand(gray16, color_type=0)
    rgba16 = np.concatenate([wide16, (np.arange(16 * 12, dtype=np.uint16).reshape(12, 16, 1) * 341)], -1)
    files["rgba16.png"] = png_by_hand(rgba16, color_type=6)
    save("portrait.png", Image.fromarray(smooth_noisy(29, 43, 12)), format="PNG")
    return files


# A small pixel budget keeps outputs to 2-6 merged tokens (28x28-pixel units) per image.
SMALL = {"min_pixels": 28 * 28 * 2, "max_pixels": 28 * 28 * 6, "patch_size": 14, "temporal_patch_size": 2,
         "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
         "image_std": [0.26862954, 0.26130258, 0.27577711], "image_processor_type": "Qwen2VLImageProcessor"}
# Qwen2-VL-7B-Instruct's preprocessor_config.json.
QWEN2_VL = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
            "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711], "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": "Qwen2VLProcessor"}
# Qwen3-VL's layout (16-pixel patches, mean = std = 0.5, `size` instead of min/max_pixels), small budget.
QWEN3_VL_SMALL = {"size": {"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 6}, "patch_size": 16,
                  "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                  "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessorFast"}

# (case, image file, preprocessor config)
CASES = [
    ("gradient", "gradient.png", SMALL),                      # 53x37 -> 56x28: up in x, down in y
    ("alpha-qwen2vl", "alpha.png", QWEN2_VL),                 # 100x30 -> 112x28 with the real budget
    ("photo-max-pixels", "photo.jpg", SMALL),                 # 160x96 -> 84x28: over max_pixels, downscaled
    ("tiny-min-pixels", "tiny.webp", SMALL),                  # 20x12 -> 56x56: under min_pixels, upscaled
    ("palette-max-pixels", "palette.png", SMALL),             # 100x80 -> 56x56
    ("gray-alpha", "gray_alpha.png", SMALL),                  # 45x30 -> 56x28
    ("exact-vertical-only", "exact.bmp", SMALL),              # 56x40 -> 56x28: one pass only
    ("gif", "indexed.gif", SMALL),                            # 30x20 -> 56x56: under min_pixels
    ("gradient-qwen3vl", "gradient.png", QWEN3_VL_SMALL),     # 53x37 -> 64x32, 16-pixel patches
    ("exact-rescale-only", "exact.bmp", {**SMALL, "do_normalize": False}),
    ("exact-normalize-only", "exact.bmp", {**SMALL, "do_rescale": False}),
    ("exact-no-rescale-no-normalize", "exact.bmp", {**SMALL, "do_rescale": False, "do_normalize": False}),
]

# Video processor configs (Qwen2VLVideoProcessor kwargs), small budgets.
SMALL_VIDEO = {"size": {"shortest_edge": 28 * 28 * 2, "longest_edge": 28 * 28 * 6}, "cap_pixels_per_frame": False}
# (case, frames, width, height, config)
VIDEO_CASES = [
    ("three-frames-padded", 3, 53, 37, SMALL_VIDEO),            # 3 frames -> 4 (last repeated), 56x28
    ("four-frames-downscaled", 4, 160, 96, SMALL_VIDEO),        # over longest_edge: 84x28
    ("one-frame-legacy-keys", 1, 45, 30, {"min_pixels": 28 * 28 * 2, "max_pixels": 28 * 28 * 4,
                                          "cap_pixels_per_frame": False}),
    # A total budget of 6 merged tokens (4704 pixels over 0.9): six frames share it, so each frame
    # gets at most 2 * 4704 * 0.9 * 2 / 6 = 2822 pixels, floored at 1.05 * shortest_edge.
    ("capped-six-frames", 6, 90, 60, {"size": {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 16},
                                      "cap_pixels_per_frame": True, "max_video_tokens": 6}),
    ("qwen3-layout", 2, 70, 40, {"size": {"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 6},
                                 "patch_size": 16, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                                 "cap_pixels_per_frame": False}),
]

# Qwen3VLVideoProcessor kwargs: budgets count the pixels of all sampled frames (padded to whole
# temporal patches), in 32x32 units. Frames carry no metadata, so sampling assumes 24 fps.
QWEN3_VIDEO = {"size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 16}, "cap_pixels_per_frame": False}
# (case, frames, width, height, config)
QWEN3_VIDEO_CASES = [
    ("five-frames-sampled", 5, 70, 40, QWEN3_VIDEO),            # fps 2 of 24: min_frames 4 -> [0, 1, 3, 4]
    ("thirty-tiny-frames", 30, 24, 20, QWEN3_VIDEO),            # [0, 10, 19, 29]; sides under 32 scaled up
    ("three-frames-unsampled", 3, 53, 37, {**QWEN3_VIDEO, "do_sample_frames": False}),  # padded to 4
    ("num-frames-six-of-nine", 9, 40, 30, {**QWEN3_VIDEO, "fps": None, "num_frames": 6}),
    ("two-frames-under-min-frames", 2, 64, 64, QWEN3_VIDEO),    # min(4, 2 frames there) -> both
    ("fps-24-all-ten", 10, 33, 47, {**QWEN3_VIDEO, "fps": 24}),
    ("four-frames-downscaled", 4, 160, 96, QWEN3_VIDEO),        # over longest_edge
    # Per frame at most 2 merged tokens' pixels or longest_edge / 4, floored at 1.05 * shortest_edge.
    ("capped-four-frames", 4, 90, 60, {"size": {"shortest_edge": 32 * 32, "longest_edge": 32 * 32 * 64},
                                       "cap_pixels_per_frame": True, "max_video_tokens": 2}),
]

# llava-hf/llava-1.5-7b-hf's preprocessor_config.json.
LLAVA_1_5 = {"crop_size": {"height": 336, "width": 336}, "do_center_crop": True, "do_convert_rgb": True,
             "do_normalize": True, "do_rescale": True, "do_resize": True,
             "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
             "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaProcessor", "resample": 3,
             "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}}
SMALL_CLIP = {"size": {"shortest_edge": 16}, "crop_size": 16}

# (case, image file, preprocessor config). Sizes are width x height; the backend's crop starts at
# int((size - crop) / 2), where torchvision's own center_crop would round (both noted where they differ).
CLIP_CASES = [
    ("llava-1.5-photo", "photo.jpg", LLAVA_1_5),              # 160x96 -> 560x336, crop at x 112
    ("photo-56", "photo.jpg", {"size": {"shortest_edge": 56}, "crop_size": {"height": 56, "width": 56}}),
                                                              # 160x96 -> 93x56, crop at x 18
    ("palette-odd-offsets", "palette.png", {"size": {"shortest_edge": 40}, "crop_size": {"height": 33, "width": 47}}),
                                                              # 100x80 -> 50x40, crop at (1, 3), rounded (2, 4)
    ("portrait", "portrait.png", {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}}),
                                                              # 29x43 -> 32x47, crop at y 7, rounded 8
    ("gray-alpha-pad-rows", "gray_alpha.png", {"size": {"shortest_edge": 24}, "crop_size": {"height": 31, "width": 32}}),
                                                              # 45x30 -> 36x24: 3 zero rows above, 4 below
    ("tiny-no-resize-pad", "tiny.webp", {"do_resize": False, "crop_size": {"height": 17, "width": 27}}),
                                                              # 20x12 padded: 3 | 4 columns, 2 | 3 rows
    ("tiny-upscale", "tiny.webp", {"size": {"shortest_edge": 49}, "crop_size": {"height": 49, "width": 49}}),
                                                              # 20x12 -> 81x49 (81.67 truncated), crop at x 16
    ("gif-legacy-int-sizes", "indexed.gif", {"size": 40, "crop_size": 40}),
                                                              # openai/clip-vit-large-patch14-336's layout
    ("exact-fixed-size-no-crop", "exact.bmp", {"size": {"height": 30, "width": 44}, "do_center_crop": False}),
    ("alpha-rescale-only", "alpha.png", {**SMALL_CLIP, "do_normalize": False}),  # 100x30 -> 53x16
    ("alpha-normalize-only", "alpha.png", {**SMALL_CLIP, "do_rescale": False}),
    ("alpha-mean-std-half", "alpha.png", {**SMALL_CLIP, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}),
    # 1 / 0.003 is no f32, so the backend's fused f32(mean) * f32(1 / 0.003) differs from mean / 0.003.
    ("alpha-rescale-factor", "alpha.png", {**SMALL_CLIP, "rescale_factor": 0.003}),
]
# Outputs above this many bytes are kept as a digest only.
CLIP_MAX_FILE_BYTES = 64 * 1024

# google/gemma-3-4b-it's preprocessor_config.json.
GEMMA_3 = {"do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
           "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
           "image_seq_length": 256, "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None,
           "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
           "processor_class": "Gemma3Processor", "resample": 2, "rescale_factor": 0.00392156862745098,
           "size": {"height": 896, "width": 896}}
# Small sizes and no mean, std or resample, so the class defaults (0.5, bilinear) are what runs.
GEMMA3_SQUARE = {"size": {"height": 40, "width": 40}}
GEMMA3_WIDE = {"size": {"height": 32, "width": 48}}

# (case, image file, preprocessor config). Sizes are width x height.
GEMMA3_CASES = [
    ("gemma-3-photo", "photo.jpg", GEMMA_3),                 # 160x96 -> 896x896, digest only
    ("gemma-3-palette", "palette.png", GEMMA_3),             # 100x80 -> 896x896, digest only
    ("photo-down", "photo.jpg", GEMMA3_SQUARE),              # 160x96 -> 40x40: down in both
    ("tiny-up", "tiny.webp", GEMMA3_SQUARE),                 # 20x12 -> 40x40: up in both
    ("gradient-down-up", "gradient.png", GEMMA3_SQUARE),     # 53x37 -> 40x40: down in x, up in y
    ("portrait-up-down", "portrait.png", GEMMA3_WIDE),       # 29x43 -> 48x32: up in x, down in y
    ("alpha-wide", "alpha.png", GEMMA3_WIDE),                # 100x30 -> 48x32
    ("exact-horizontal-only", "exact.bmp", {"size": [40, 48]}),           # 56x40 -> 48x40: one pass only
    ("exact-no-resize", "exact.bmp", {"size": {"height": 40, "width": 56}}),  # its own size: no resize
    ("gif-int-size", "indexed.gif", {"size": 40}),           # 30x20 -> 40x40, a square by default_to_square
    ("palette-bicubic", "palette.png", {**GEMMA3_SQUARE, "resample": 3}),  # 100x80 -> 40x40
    ("gradient-rescale-only", "gradient.png", {**GEMMA3_SQUARE, "do_normalize": False}),
    ("tiny-clip-mean-std", "tiny.webp", {**GEMMA3_WIDE, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                                         "image_std": [0.26862954, 0.26130258, 0.27577711]}),
]

# Pan-and-scan (`do_pan_and_scan`): the whole image and its crops along the long edge, each resized
# to the size. (case, image file, preprocessor config); small sizes and crops keep the files small.
GEMMA3_PAS = {"size": {"height": 24, "width": 24}, "do_pan_and_scan": True, "pan_and_scan_max_num_crops": 4,
              "pan_and_scan_min_ratio_to_activate": 1.2}
GEMMA3_PAN_AND_SCAN_CASES = [
    ("pas-wide-3", "alpha.png", {**GEMMA3_PAS, "pan_and_scan_min_crop_size": 16}),   # 100x30: 3 crops, last 32 wide
    ("pas-photo-2", "photo.jpg", {**GEMMA3_PAS, "pan_and_scan_min_crop_size": 32}),  # 160x96: 2 crops of 80x96
    ("pas-portrait-2", "portrait.png", {**GEMMA3_PAS, "pan_and_scan_min_crop_size": 10}),  # 29x43: 2 rows, last 21
    ("pas-max-crops", "alpha.png", {**GEMMA3_PAS, "pan_and_scan_min_crop_size": 16,
                                    "pan_and_scan_max_num_crops": 2}),            # 100x30: capped at 2
    ("pas-crops-min-equal", "alpha.png", {**GEMMA3_PAS, "pan_and_scan_min_crop_size": 30}),  # crops 34x30: 30 is enough
    ("pas-crop-bicubic", "palette.png", {**GEMMA3_PAS, "pan_and_scan_min_crop_size": 8, "resample": 3,
                                         "pan_and_scan_min_ratio_to_activate": 1.1}),  # 100x80: 1.25 -> 2 crops
    ("pas-ratio-under", "gradient.png", {**GEMMA3_PAS, "pan_and_scan_min_crop_size": 8,
                                         "pan_and_scan_min_ratio_to_activate": 1.5}),  # 53x37 (1.43): no crops
    ("pas-crop-too-small", "photo.jpg", {**GEMMA3_PAS, "pan_and_scan_min_crop_size": 81}),  # 80 < 81: no crops
    ("pas-processor-defaults", "photo.jpg", {**GEMMA3_PAS, "pan_and_scan_min_crop_size": 256}),  # no crops
]

RESIZE_SOURCE = (61, 47)
RESIZE_TARGETS = [
    (1, 3), (2, 3), (5, 4), (30, 23), (31, 47), (61, 20), (100, 47), (61, 47), (60, 46), (62, 48),
    (122, 94), (90, 70), (7, 130), (130, 7), (45, 60), (17, 13), (59, 101),
]
# A long strip squeezed hard: weights so small that the int16 precision search stops at its cap of
# 22 bits (800 -> 4 is one where 21 bits would round one value differently).
STRIP_SOURCE = (800, 12)
STRIP_TARGETS = [(4, 12), (3, 12), (2, 2), (1, 12), (7, 9)]
# Bilinear: the bicubic sizes but the largest, and a tiny source for whole-number upscales (where a
# weight is exactly 1 and the int16 precision stops at 14 bits).
BILINEAR_SOURCE_TARGETS = [t for t in RESIZE_TARGETS if t not in ((122, 94), (90, 70), (61, 47))]
SMALL_SOURCE = (9, 7)
SMALL_TARGETS = [(27, 21), (18, 14), (27, 7), (9, 21), (13, 10), (4, 3), (5, 7), (2, 30)]

# llava-hf/llava-v1.6-mistral-7b-hf's preprocessor_config.json.
LLAVA_V1_6 = {"aspect_ratio_setting": "anyres", "crop_size": {"height": 336, "width": 336}, "do_center_crop": True,
              "do_convert_rgb": True, "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True,
              "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
              "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "LlavaNextImageProcessor",
              "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaNextProcessor",
              "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}}
# llava-v1.6's tiling at a twelfth of its size: 28-pixel tiles.
SMALL_NEXT = {"size": {"shortest_edge": 28}, "crop_size": {"height": 28, "width": 28},
              "image_grid_pinpoints": [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]}

# (case, image file, preprocessor config). Sizes are width x height; pinpoints height x width.
LLAVA_NEXT_CASES = [
    ("llava-v1.6-photo", "photo.jpg", LLAVA_V1_6),            # 160x96 -> 672x336 (2 tiles), digest only
    ("photo-wide", "photo.jpg", SMALL_NEXT),                  # 160x96: best 28x84, fitted 84x51
    ("portrait-tall", "portrait.png", SMALL_NEXT),            # 29x43: best 56x28, padded columns
    ("alpha-very-wide", "alpha.png", SMALL_NEXT),             # 100x30: best 28x84, 84x26, 1 black row each side
    ("tiny-upscale", "tiny.webp", SMALL_NEXT),                # 20x12: upscaled into 28x56
    ("palette-bilinear", "palette.png", {**SMALL_NEXT, "resample": 2}),  # 100x80 -> 56x56, 56x45
    ("gray-alpha-mean-std", "gray_alpha.png", {**SMALL_NEXT, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}),
    ("exact-fits-pinpoint", "exact.bmp", {"size": {"shortest_edge": 8}, "crop_size": 8,
                                          "image_grid_pinpoints": [[16, 16], [40, 56]]}),  # 56x40: no resize, no pad
    ("gradient-fixed-size-no-crop", "gradient.png", {"size": {"height": 28, "width": 28}, "crop_size": 28,
                                                     "do_center_crop": False,
                                                     "image_grid_pinpoints": [[28, 56], [56, 56]]}),
]

# mistralai/Mistral-Small-3.1-24B-Instruct-2503's image processor, with the patch its
# PixtralProcessor passes (patch_size 14 * spatial_merge_size 2).
MISTRAL_SMALL = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
                 "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "PixtralImageProcessor",
                 "image_std": [0.26862954, 0.26130258, 0.27577711], "patch_size": {"height": 28, "width": 28},
                 "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 1540}}
SMALL_PIXTRAL = {"size": {"longest_edge": 48}, "patch_size": {"height": 8, "width": 8}}

# (case, image file, preprocessor config). Sizes are width x height.
PIXTRAL_CASES = [
    ("mistral-small-photo", "photo.jpg", MISTRAL_SMALL),     # 160x96 -> 168x112 (rounded up), digest only
    ("photo-shrunk", "photo.jpg", SMALL_PIXTRAL),            # 160x96 -> 48x28 -> 48x32
    ("portrait-tall", "portrait.png", {**SMALL_PIXTRAL, "size": {"longest_edge": 64}}),  # 29x43 -> 32x48 (enlarged)
    ("alpha-very-wide", "alpha.png", {"size": {"longest_edge": 40}, "patch_size": 6}),  # 100x30 -> 40x12 -> 42x12
    ("tiny-defaults", "tiny.webp", {}),                      # 20x12 -> 32x16 (class defaults: 16-pixel patches)
    ("palette-bilinear", "palette.png", {**SMALL_PIXTRAL, "resample": 2}),  # 100x80 -> 48x38 -> 48x40
    ("gray-alpha-mean-std", "gray_alpha.png", {**SMALL_PIXTRAL, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}),
    ("exact-no-resize", "exact.bmp", {"size": {"longest_edge": 56}, "patch_size": 8}),  # 56x40 as it is
    ("gradient-height-width", "gradient.png", {"size": {"height": 20, "width": 30}, "patch_size": 5}),  # 53x37 -> 30x20
]
# (height, width) sizes whose processed size `pixtral_sizes` records under each config.
PIXTRAL_SIZES = [(1, 1), (96, 160), (43, 29), (1540, 1540), (1541, 1540), (1540, 3080), (3081, 1540), (500, 333),
                 (768, 1024), (10, 2000), (2000, 10), (123, 457), (37, 53), (1000, 999), (21, 13), (27, 28), (29, 28),
                 (49, 48), (47, 100), (95, 96), (7, 13)]
PIXTRAL_SIZE_CONFIGS = [("mistral-small", MISTRAL_SMALL), ("small", SMALL_PIXTRAL),
                        ("height-width", {"size": {"height": 20, "width": 30}, "patch_size": 5})]

# (tiling, tower patch, (height, width) sizes): image tokens LlavaNextProcessor counts.
LLAVA_NEXT_TOKEN_SIZES = [(1, 1), (96, 160), (43, 29), (336, 672), (337, 673), (335, 671), (500, 333), (333, 500),
                          (768, 1024), (1024, 768), (10, 2000), (2000, 10), (123, 457), (480, 640), (640, 480),
                          (1000, 1000), (21, 13), (700, 350), (351, 700), (1, 7), (30, 100), (100, 30)]
LLAVA_NEXT_TILINGS = [("llava-v1.6", LLAVA_V1_6, 14), ("small", SMALL_NEXT, 4)]


def llava_next_tokens(config: dict, patch: int, height: int, width: int) -> int:
    """`LlavaNextProcessor.replace_image_token`'s count for an image of `height` x `width` (CLIP
    tower, `default` strategy, one class token), the tile size being what the processor makes."""
    processor = LlavaNextProcessor.__new__(LlavaNextProcessor)
    processor.image_processor = LlavaNextImageProcessor(**config)
    processor.patch_size, processor.num_additional_image_tokens = patch, 1
    processor.vision_feature_select_strategy = "default"
    tile = config["crop_size"]["height"]
    return processor._get_number_of_features(height, width, tile, tile) - 1


def rgb_of(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    image.load()
    return convert_to_rgb(image, return_numpy=True)


def tv_resize(rgb: np.ndarray, width: int, height: int, bilinear: bool = False) -> np.ndarray:
    tensor = torch.from_numpy(rgb).permute(2, 0, 1).contiguous()
    mode = tvF.InterpolationMode.BILINEAR if bilinear else tvF.InterpolationMode.BICUBIC
    out = tvF.resize(tensor, [height, width], interpolation=mode, antialias=True)
    return out.permute(1, 2, 0).contiguous().numpy()


def pil_resize(rgb: np.ndarray, width: int, height: int, bilinear: bool = False) -> np.ndarray:
    mode = Image.Resampling.BILINEAR if bilinear else Image.Resampling.BICUBIC
    return np.array(Image.fromarray(rgb).resize((width, height), mode))


def fnv1a64(data: bytes) -> str:
    digest = 0xCBF29CE484222325
    for byte in data:
        digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{digest:016x}"


def diff_stats(a: np.ndarray, b: np.ndarray) -> dict:
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return {"max_abs_diff": float(diff.max()), "num_different": int((diff != 0).sum()), "num_values": int(diff.size)}


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    # Elsewhere torchvision resizes uint8 images bilinearly in f32 (see the docstring).
    assert torchvision.transforms.v2.functional._geometry._do_native_uint8_resize_on_cpu(
        tvF.InterpolationMode.BILINEAR), "torchvision would not take torch's uint8 bilinear kernel here"
    if OUT.exists():
        shutil.rmtree(OUT)
    for sub in ("images", "processor", "resize", "clip", "video", "gemma3", "llava_next", "pixtral"):
        (OUT / sub).mkdir(parents=True)

    images = []
    decoded = {}
    for name, data in make_images().items():
        (OUT / "images" / name).write_bytes(data)
        rgb = rgb_of(data)
        decoded[name] = rgb
        rgb_file = f"images/{Path(name).stem}.rgb"
        (OUT / rgb_file).write_bytes(rgb.tobytes())
        images.append({"file": f"images/{name}", "rgb": rgb_file, "width": rgb.shape[1], "height": rgb.shape[0],
                       "pil_mode": Image.open(io.BytesIO(data)).mode, "lossless": not name.endswith(".jpg")})

    cases = []
    for case, image_name, config in CASES:
        pil_image = Image.fromarray(decoded[image_name])
        tv = Qwen2VLImageProcessor(**config)(pil_image, return_tensors="np")
        pil = Qwen2VLImageProcessorPil(**config)(pil_image, return_tensors="np")
        grid = tv["image_grid_thw"][0].tolist()
        assert grid == pil["image_grid_thw"][0].tolist()
        pixel_values = tv["pixel_values"].astype("<f4")
        (OUT / "processor" / f"{case}.bin").write_bytes(pixel_values.tobytes())
        patch = config["patch_size"]
        height, width = grid[1] * patch, grid[2] * patch
        cases.append({
            "name": case, "image": f"images/{image_name}", "config": config, "image_grid_thw": grid,
            "pixel_values": f"processor/{case}.bin", "shape": list(pixel_values.shape),
            "pil_backend": {"pixel_values": diff_stats(pixel_values, pil["pixel_values"]),
                            "resized_rgb": diff_stats(tv_resize(decoded[image_name], width, height),
                                                      pil_resize(decoded[image_name], width, height))},
        })

    clip_cases = []
    for case, image_name, config in CLIP_CASES:
        pil_image = Image.fromarray(decoded[image_name])
        pixel_values = CLIPImageProcessor(**config)(pil_image, return_tensors="np")["pixel_values"][0].astype("<f4")
        pil = CLIPImageProcessorPil(**config)(pil_image, return_tensors="np")["pixel_values"][0]
        data = pixel_values.tobytes()
        file = None
        if len(data) <= CLIP_MAX_FILE_BYTES:
            file = f"clip/{case}.bin"
            (OUT / file).write_bytes(data)
        clip_cases.append({
            "name": case, "image": f"images/{image_name}", "config": config, "shape": list(pixel_values.shape),
            "pixel_values": file, "pixel_values_fnv1a64": fnv1a64(data),
            "pil_backend": {"pixel_values": diff_stats(pixel_values, pil)},
        })

    gemma3_cases = []
    for case, image_name, config in GEMMA3_CASES:
        pil_image = Image.fromarray(decoded[image_name])
        tv = Gemma3ImageProcessor(**config)(pil_image, return_tensors="np")
        assert tv["num_crops"].tolist() == [0]
        pixel_values = tv["pixel_values"][0].astype("<f4")
        pil = Gemma3ImageProcessorPil(**config)(pil_image, return_tensors="np")["pixel_values"][0]
        data = pixel_values.tobytes()
        file = None
        if len(data) <= CLIP_MAX_FILE_BYTES:
            file = f"gemma3/{case}.bin"
            (OUT / file).write_bytes(data)
        gemma3_cases.append({
            "name": case, "image": f"images/{image_name}", "config": config, "shape": list(pixel_values.shape),
            "pixel_values": file, "pixel_values_fnv1a64": fnv1a64(data),
            "pil_backend": {"pixel_values": diff_stats(pixel_values, pil)},
        })

    gemma3_pan_and_scan_cases = []
    for case, image_name, config in GEMMA3_PAN_AND_SCAN_CASES:
        pil_image = Image.fromarray(decoded[image_name])
        tv = Gemma3ImageProcessor(**config)(pil_image, return_tensors="np")
        pixel_values = tv["pixel_values"].astype("<f4")
        num_crops = tv["num_crops"].tolist()
        assert len(num_crops) == 1 and pixel_values.shape[0] == 1 + num_crops[0], case
        file = f"gemma3/{case}.bin"
        (OUT / file).write_bytes(pixel_values.tobytes())
        gemma3_pan_and_scan_cases.append({
            "name": case, "image": f"images/{image_name}", "config": config, "num_crops": num_crops[0],
            "shape": list(pixel_values.shape), "pixel_values": file,
        })

    llava_next_cases = []
    for case, image_name, config in LLAVA_NEXT_CASES:
        pil_image = Image.fromarray(decoded[image_name])
        tv = LlavaNextImageProcessor(**config)(pil_image, return_tensors="np")
        pixel_values = tv["pixel_values"][0].astype("<f4")
        image_size = tv["image_sizes"][0].tolist()
        assert image_size == [pil_image.height, pil_image.width]
        pil = LlavaNextImageProcessorPil(**config)(pil_image, return_tensors="np")["pixel_values"][0]
        data = pixel_values.tobytes()
        file = None
        if len(data) <= CLIP_MAX_FILE_BYTES:
            file = f"llava_next/{case}.bin"
            (OUT / file).write_bytes(data)
        llava_next_cases.append({
            "name": case, "image": f"images/{image_name}", "config": config, "shape": list(pixel_values.shape),
            "image_sizes": image_size, "pixel_values": file, "pixel_values_fnv1a64": fnv1a64(data),
            "pil_backend": {"pixel_values": diff_stats(pixel_values, pil)},
        })
    llava_next_token_counts = [
        {"tiling": name, "config": config, "patch_size": patch, "height": height, "width": width,
         "num_image_tokens": llava_next_tokens(config, patch, height, width)}
        for name, config, patch in LLAVA_NEXT_TILINGS for height, width in LLAVA_NEXT_TOKEN_SIZES]

    pixtral_cases = []
    for case, image_name, config in PIXTRAL_CASES:
        pil_image = Image.fromarray(decoded[image_name])
        tv = PixtralImageProcessor(**config)(pil_image, return_tensors="np")
        height, width = tv["image_sizes"][0].tolist()
        pixel_values = tv["pixel_values"][0][:, :height, :width].astype("<f4")
        pil = PixtralImageProcessorPil(**config)(pil_image, return_tensors="np")["pixel_values"][0]
        data = pixel_values.tobytes()
        file = None
        if len(data) <= CLIP_MAX_FILE_BYTES:
            file = f"pixtral/{case}.bin"
            (OUT / file).write_bytes(data)
        pixtral_cases.append({
            "name": case, "image": f"images/{image_name}", "config": config, "shape": list(pixel_values.shape),
            "image_sizes": [height, width], "pixel_values": file, "pixel_values_fnv1a64": fnv1a64(data),
            "pil_backend": {"pixel_values": diff_stats(pixel_values, pil[:, :height, :width])},
        })
    pixtral_sizes = []
    for name, config in PIXTRAL_SIZE_CONFIGS:
        size, patch = config["size"], config["patch_size"]
        max_size = (size["longest_edge"],) * 2 if "longest_edge" in size else (size["height"], size["width"])
        patch = (patch, patch) if isinstance(patch, int) else (patch["height"], patch["width"])
        for height, width in PIXTRAL_SIZES:
            resized = get_resize_output_image_size(np.zeros((height, width, 3)), size=max_size, patch_size=patch,
                                                   input_data_format="channels_last")
            pixtral_sizes.append({"config_name": name, "config": config, "height": height, "width": width,
                                  "resized": list(resized)})

    video_cases = []
    for seed, (case, count, width, height, config) in enumerate(VIDEO_CASES):
        frames = np.stack([smooth_noisy(width, height, 100 + 10 * seed + k) for k in range(count)])
        (OUT / "video" / f"{case}.rgb").write_bytes(frames.tobytes())
        out = Qwen2VLVideoProcessor(**config)(videos=[torch.from_numpy(frames)], return_tensors="np")
        pixel_values = out["pixel_values_videos"].astype("<f4")
        (OUT / "video" / f"{case}.bin").write_bytes(pixel_values.tobytes())
        video_cases.append({"name": case, "frames": f"video/{case}.rgb", "num_frames": count, "width": width,
                            "height": height, "config": config, "video_grid_thw": out["video_grid_thw"][0].tolist(),
                            "pixel_values": f"video/{case}.bin", "shape": list(pixel_values.shape)})

    qwen3_video_cases = []
    for seed, (case, count, width, height, config) in enumerate(QWEN3_VIDEO_CASES):
        frames = np.stack([smooth_noisy(width, height, 300 + 10 * seed + k) for k in range(count)])
        (OUT / "video" / f"qwen3-{case}.rgb").write_bytes(frames.tobytes())
        processor = Qwen3VLVideoProcessor(**config)
        out = processor(videos=[torch.from_numpy(frames)], return_tensors="np", return_metadata=True)
        pixel_values = out["pixel_values_videos"].astype("<f4")
        (OUT / "video" / f"qwen3-{case}.bin").write_bytes(pixel_values.tobytes())
        indices = [int(k) for k in out["video_metadata"][0].frames_indices]
        # Qwen3VLProcessor.replace_video_token's timestamps (24 fps: the metadata has none).
        timestamps = Qwen3VLProcessor._calculate_timestamps(None, list(indices), 24, processor.temporal_patch_size)
        qwen3_video_cases.append({
            "name": case, "frames": f"video/qwen3-{case}.rgb", "num_frames": count, "width": width, "height": height,
            "config": config, "video_grid_thw": out["video_grid_thw"][0].tolist(), "frames_indices": indices,
            "timestamps": timestamps, "timestamp_texts": [f"<{t:.1f} seconds>" for t in timestamps],
            "pixel_values": f"video/qwen3-{case}.bin", "shape": list(pixel_values.shape)})

    resizes = []
    bilinear_resizes = []
    sweeps = [("source", RESIZE_SOURCE, 20, RESIZE_TARGETS, BILINEAR_SOURCE_TARGETS),
              ("strip", STRIP_SOURCE, 21, STRIP_TARGETS, STRIP_TARGETS),
              ("small", SMALL_SOURCE, 22, [], SMALL_TARGETS)]
    for label, (source_w, source_h), seed, bicubic_targets, bilinear_targets in sweeps:
        source = smooth_noisy(source_w, source_h, seed, noise=40)
        (OUT / "resize" / f"{label}.rgb").write_bytes(source.tobytes())
        for bilinear, targets, entries in [(False, bicubic_targets, resizes), (True, bilinear_targets, bilinear_resizes)]:
            for width, height in targets:
                out = tv_resize(source, width, height, bilinear)
                file = f"resize/{label}{'-bilinear' if bilinear else ''}-{width}x{height}.rgb"
                (OUT / file).write_bytes(out.tobytes())
                entries.append({"source": f"resize/{label}.rgb", "source_width": source_w, "source_height": source_h,
                                "width": width, "height": height, "expected": file,
                                "pil_backend": diff_stats(out, pil_resize(source, width, height, bilinear))})

    manifest = {
        "generator": "scripts/gen_vl_processor_fixtures.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "torchvision": torchvision.__version__, "pillow": PIL.__version__, "numpy": np.__version__},
        "images": images, "cases": cases, "resizes": resizes, "clip_cases": clip_cases,
        "video_cases": video_cases, "qwen3_video_cases": qwen3_video_cases, "bilinear_resizes": bilinear_resizes, "gemma3_cases": gemma3_cases,
        "gemma3_pan_and_scan_cases": gemma3_pan_and_scan_cases,
        "llava_next_cases": llava_next_cases, "llava_next_tokens": llava_next_token_counts,
        "pixtral_cases": pixtral_cases, "pixtral_sizes": pixtral_sizes,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"wrote {OUT} ({total / 1024:.0f} KiB)")
    for case in cases:
        print(f"  {case['name']:32} grid {case['image_grid_thw']}  PIL backend: {case['pil_backend']}")
    for case in clip_cases:
        print(f"  clip {case['name']:27} shape {case['shape']}  PIL backend: {case['pil_backend']}")
    for case in gemma3_cases:
        print(f"  gemma3 {case['name']:25} shape {case['shape']}  PIL backend: {case['pil_backend']}")
    for case in gemma3_pan_and_scan_cases:
        print(f"  gemma3 pan-and-scan {case['name']:22} num_crops {case['num_crops']}  shape {case['shape']}")
    for case in llava_next_cases:
        print(f"  llava-next {case['name']:21} shape {case['shape']}  PIL backend: {case['pil_backend']}")
    for case in pixtral_cases:
        print(f"  pixtral {case['name']:24} shape {case['shape']}  PIL backend: {case['pil_backend']}")
    for case in video_cases:
        print(f"  video {case['name']:26} grid {case['video_grid_thw']}  shape {case['shape']}")
    for case in qwen3_video_cases:
        print(f"  qwen3 video {case['name']:20} grid {case['video_grid_thw']}  frames {case['frames_indices']}  "
              f"{''.join(case['timestamp_texts'])}")
    for label, entries in [("resize", resizes), ("bilinear resize", bilinear_resizes)]:
        worst = max(entries, key=lambda r: r["pil_backend"]["max_abs_diff"])
        print(f"  {label} sweep: PIL vs torchvision worst {worst['width']}x{worst['height']}: {worst['pil_backend']}")


if __name__ == "__main__":
    main()
