#!/usr/bin/env python3
"""Reference data for ferrite's GGUF reader (crates/models/src/loading/gguf.rs), from transformers + gguf-py.

    gguf_probe.py blocks OUT.json
        Random blocks of every quant type ferrite dequantizes, with gguf-py's dequantization.
    gguf_probe.py model GGUF OUT.json
        For a real file: tensor checksums as gguf-py dequantizes them, the tensors, config and
        tokenizer transformers builds from it, and token ids for a set of texts.
    gguf_probe.py compare GGUF DUMP_DIR
        Diffs what ferrite wrote to DUMP_DIR (the ignored Rust test `gguf::tests::dump_for_probe`)
        against transformers: config.json, tokenizer.json, tokenizer_config.json, and the ids the
        tokenizer.json gives on the texts below.

Checksums are `sum(word[i] * (2*i + 1)) mod 2**64` over the little-endian u32 words of the f32
values (or over the bytes, for text): exact, cheap in numpy, and computed identically in Rust.

Run with the oracle venv: .venv-oracle/bin/python tools/oracle/gguf_probe.py ...
"""

import json
import os
import sys
import tempfile

import numpy as np

# Types ferrite dequantizes, by gguf-py name.
BLOCK_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and   internal   runs   ",
    "tabs\tand\nnewlines\n\n\nmany\r\nwindows",
    "Numbers: 1234567890, 3.14159, -42, 1e10, 2024-06-01, 1 2 3 10 100 1000 10000",
    "unicode: café, naïve, 日本語のテキスト, 한국어, emoji 🤖🚀👍🏽",
    "Mixed CASE and camelCaseIdentifiers_with_snake_case",
    "def f(x):\n    return x ** 2  # square\n\n\tpass\n",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><unk><mask><|endoftext|>",
    "    ",
    "",
    "a",
    "don't won't I'm they're you've we'll he'd",
    "http://example.com/path?query=1&b=2#frag",
    "ÀÉÎÕÜ ñ ß ø Ω ∑ ∞ ≠",
    "Русский текст и العربية والعبرית",
    "\u00a0non-breaking\u2003em-space\u3000ideographic",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "<think>reasoning</think> [multimodal] <start_of_image>",
    "\n\n\n\n          \t\t\t",
]

# Real tensors whose gguf-py dequantization is checked, per file, by GGUF name.
RAW_TENSORS = {
    "llama": ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight", "blk.29.ffn_down.weight"],
    "qwen2": [
        "token_embd.weight",
        "output.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_q.bias",
        "blk.0.ffn_down.weight",
        "blk.23.ffn_down.weight",
    ],
    "gemma3": [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_v.weight",
        "blk.0.attn_output.weight",
        "blk.0.ffn_down.weight",
        "blk.0.attn_k_norm.weight",
    ],
}


def checksum_words(words):
    words = np.ascontiguousarray(words).view(np.uint32).astype(np.uint64).ravel()
    weights = np.arange(words.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int(np.sum(words * weights, dtype=np.uint64))


def checksum_f32(values):
    return checksum_words(np.ascontiguousarray(values, dtype=np.float32))


def checksum_text(text):
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint64)
    weights = np.arange(data.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int(np.sum(data * weights, dtype=np.uint64))


def f32_hex(values):
    return np.ascontiguousarray(values, dtype="<f4").tobytes().hex()


def random_blocks(out_path):
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(20240601)
    cases = []
    for name in BLOCK_TYPES:
        qtype = GGMLQuantizationType[name]
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        n_blocks = max(2, 64 // block_elems)
        raw = rng.integers(0, 256, size=n_blocks * block_bytes, dtype=np.uint8)
        blocks = raw.reshape(n_blocks, block_bytes)
        # Random bits in the scale fields would give inf/NaN; write finite f16 scales there instead.
        # The offsets are each block struct's f16 fields.
        f16_fields = {
            "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
            "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
        }.get(name, [])
        if name == "F16":
            vals = rng.normal(0, 2, size=n_blocks * block_elems).astype(np.float16)
            blocks = vals.view(np.uint8).reshape(n_blocks, block_bytes)
        elif name == "F32":
            vals = rng.normal(0, 2, size=n_blocks * block_elems).astype(np.float32)
            blocks = vals.view(np.uint8).reshape(n_blocks, block_bytes)
        elif name == "BF16":
            vals = rng.normal(0, 2, size=n_blocks * block_elems).astype(np.float32)
            blocks = (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, block_bytes)
        else:
            for off in f16_fields:
                scale = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
                blocks[:, off : off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
        data = np.ascontiguousarray(blocks).reshape(-1)
        values = dequantize(data, qtype).astype(np.float32).ravel()
        assert values.size == n_blocks * block_elems, name
        cases.append({"type": name, "bytes": data.tobytes().hex(), "f32": f32_hex(values)})
    write_json(out_path, {"generator": "tools/oracle/gguf_probe.py blocks", "cases": cases})


def load_transformers(gguf_path):
    """Config, tokenizer and model as transformers builds them from the file (f32, CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, file_name = os.path.split(os.path.abspath(gguf_path))
    config = AutoConfig.from_pretrained(directory, gguf_file=file_name)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=file_name)
    return directory, file_name, config, tokenizer, AutoModelForCausalLM


def tokenizer_texts(tokenizer):
    texts = list(TEXTS)
    if tokenizer.chat_template:
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2? Answer with digits only."},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3 × 7 = ?"},
        ]
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return texts


def model_probe(gguf_path, out_path):
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(gguf_path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    by_name = {t.name: t for t in reader.tensors}
    raw = {}
    for name in RAW_TENSORS[arch]:
        t = by_name[name]
        values = dequantize(t.data, t.tensor_type).astype(np.float32)
        raw[name] = {
            "type": t.tensor_type.name,
            "shape": [int(d) for d in values.shape],
            "first": f32_hex(values.ravel()[:64]),
            "checksum": str(checksum_f32(values)),
        }

    directory, file_name, config, tokenizer, model_cls = load_transformers(gguf_path)
    model = model_cls.from_pretrained(directory, gguf_file=file_name, dtype=torch.float32)
    state = model.state_dict()
    # What transformers actually filled from the file (tied heads are views of the embedding).
    loaded = sorted(k for k in state if not (config.tie_word_embeddings and k == "lm_head.weight"))
    hf = {}
    for name in loaded:
        tensor = state[name].detach().to(torch.float32).contiguous().numpy()
        hf[name] = {"shape": list(tensor.shape), "checksum": str(checksum_f32(tensor))}

    texts = tokenizer_texts(tokenizer)
    backend_json = tokenizer.backend_tokenizer.to_str()
    data = {
        "generator": "tools/oracle/gguf_probe.py model",
        "file": file_name,
        "architecture": arch,
        "raw_tensors": raw,
        "hf_tensors": hf,
        "config": json.loads(config.to_json_string(use_diff=True)),
        "tokenizer": {
            "json_checksum": str(checksum_text(backend_json)),
            "json_len": len(backend_json.encode("utf-8")),
            "texts": texts,
            "ids": [tokenizer(t)["input_ids"] for t in texts],
        },
        "chat_template": tokenizer.chat_template,
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "add_bos_token": tokenizer.add_bos_token,
    }
    write_json(out_path, data)


def compare(gguf_path, dump_dir):
    from tokenizers import Tokenizer

    _, _, config, tokenizer, _ = load_transformers(gguf_path)
    ok = True

    theirs = json.loads(tokenizer.backend_tokenizer.to_str())
    mine_text = open(os.path.join(dump_dir, "tokenizer.json"), encoding="utf-8").read()
    mine = json.loads(mine_text)
    if mine == theirs:
        same_bytes = mine_text == tokenizer.backend_tokenizer.to_str()
        print(f"tokenizer.json: identical ({'byte for byte' if same_bytes else 'as JSON, not byte for byte'})")
    else:
        ok = False
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                print(f"tokenizer.json differs at {key!r}")
                a, b = mine.get(key), theirs.get(key)
                if isinstance(a, dict) and isinstance(b, dict):
                    for k in sorted(set(a) | set(b)):
                        if a.get(k) != b.get(k):
                            sa, sb = json.dumps(a.get(k))[:300], json.dumps(b.get(k))[:300]
                            print(f"  .{k}: ferrite {sa}\n  {' ' * len(k)}  transformers {sb}")
                elif isinstance(a, list) and isinstance(b, list):
                    print(f"  lengths {len(a)} vs {len(b)}")
                    for i, (x, y) in enumerate(zip(a, b)):
                        if x != y:
                            print(f"  first difference at [{i}]: ferrite {x} transformers {y}")
                            break
                else:
                    print(f"  ferrite {json.dumps(a)[:300]}\n  transformers {json.dumps(b)[:300]}")

    backend = Tokenizer.from_str(mine_text)
    texts = tokenizer_texts(tokenizer)
    bad = 0
    for text in texts:
        want = tokenizer(text)["input_ids"]
        got = backend.encode(text).ids
        if want != got:
            bad += 1
            print(f"ids differ for {text!r}:\n  ferrite      {got}\n  transformers {want}")
    print(f"ids: {len(texts) - bad}/{len(texts)} texts identical")
    ok &= bad == 0

    mine_config = json.load(open(os.path.join(dump_dir, "config.json")))
    theirs_config = json.loads(config.to_json_string(use_diff=False))
    for key, value in sorted(mine_config.items()):
        if key == "architectures":
            continue
        if key not in theirs_config:
            print(f"config: {key} = {value!r} (transformers has no such key)")
        elif theirs_config[key] != value:
            print(f"config: {key}: ferrite {value!r}, transformers {theirs_config[key]!r}")
            ok = False
    print("config compared")

    mine_tc = json.load(open(os.path.join(dump_dir, "tokenizer_config.json")))
    for key in ["bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token", "add_eos_token", "chat_template"]:
        theirs_v = getattr(tokenizer, key, None)
        if mine_tc.get(key) != theirs_v:
            print(f"tokenizer_config: {key}: ferrite {mine_tc.get(key)!r}, transformers {theirs_v!r}")
            ok = False
    print("tokenizer_config compared")
    print("OK" if ok else "DIFFERENCES FOUND")
    return 0 if ok else 1


def write_json(path, data):
    text = json.dumps(data, ensure_ascii=False, indent=1, sort_keys=True) + "\n"
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, delete=False) as f:
        f.write(text)
    os.replace(f.name, path)
    print(f"wrote {path} ({len(text.encode('utf-8'))} bytes)")


def main(argv):
    if len(argv) == 3 and argv[1] == "blocks":
        random_blocks(argv[2])
    elif len(argv) == 4 and argv[1] == "model":
        model_probe(argv[2], argv[3])
    elif len(argv) == 4 and argv[1] == "compare":
        return compare(argv[2], argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
