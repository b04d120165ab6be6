#!/usr/bin/env python3
"""Train the small byte-level BPE tokenizer used by every random-init test fixture.

Offline and deterministic: the training text is the committed file tools/oracle/corpus.txt
(see --rebuild-corpus for where it came from). Writes

    fixtures/tokenizer/tokenizer.json         (tokenizers library format)
    fixtures/tokenizer/tokenizer_config.json  (ChatML chat_template, bos/eos/pad)

Special tokens: <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2.

Usage:
    .venv-oracle/bin/python tools/oracle/train_tokenizer.py [--vocab-size 1000] [--rebuild-corpus]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tools" / "oracle" / "corpus.txt"
OUT_DIR = ROOT / "fixtures" / "tokenizer"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# ChatML, as used by Qwen2 / SmolLM2 (without SmolLM2's injected default system prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Sources used by --rebuild-corpus: files of the CPython 3.11 standard library (PSF licence),
# read from the interpreter's own lib directory, plus a little hand-written text below.
STDLIB_FILES = [
    "LICENSE.txt",
    "textwrap.py",
    "string.py",
    "heapq.py",
    "bisect.py",
    "fractions.py",
    "json/__init__.py",
    "functools.py",
    "contextlib.py",
]

EXTRA_TEXT = """\
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Hello, world! How are you today? I am fine, thank you. What is the capital of France?
The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.
Once upon a time, there was a little robot who wanted to learn how to paint the sky.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1000 3.14159 2.71828 1,000,000 -17 +5 50% $9.99
Dates: 2024-01-31, 12:30:45, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday.
Le renard brun rapide saute par-dessus le chien paresseux. Déjà vu, café, naïve, résumé.
Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München!
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la biblioteca?
敏捷的棕色狐狸跳过了懒狗。 こんにちは世界。 Привет, мир! Γειά σου Κόσμε! 🙂 ✓ → ∑ π
user: Can you help me write a function that adds two numbers?
assistant: Sure! Here is a simple function: def add(a, b): return a + b
system: You are a helpful assistant. Answer briefly and politely.
"""


def zen_of_python() -> str:
    import codecs
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        import this  # prints the Zen on import

    return codecs.decode(this.s, "rot13") + "\n"


def rebuild_corpus() -> None:
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [EXTRA_TEXT, zen_of_python()]
    for rel in STDLIB_FILES:
        parts.append((stdlib / rel).read_text(encoding="utf-8"))
    text = "\n".join(parts)
    CORPUS.write_text(text, encoding="utf-8")
    print(f"wrote {CORPUS} ({len(text.encode())} bytes) from {stdlib}")


def train(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Training on one in-memory list is deterministic (no file sharding / threading order effects).
    lines = CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return tok


def write_config(path: Path) -> None:
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


ROUNDTRIP_SAMPLES = [
    "Hello, world!",
    "  leading spaces and trailing  ",
    "def f(x):\n\treturn x ** 2  # tab + newline\n",
    "naïve café — ünïcödé ✓ 敏捷的棕色狐狸 🙂",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "",
]


def check(out_dir: Path) -> None:
    """Reload through transformers and through tokenizers; check ids agree and text round-trips."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out_dir))
    raw = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    for i, t in enumerate(SPECIAL_TOKENS):
        assert raw.token_to_id(t) == i, (t, raw.token_to_id(t))
    assert hf.eos_token == EOS_TOKEN and hf.bos_token == BOS_TOKEN
    for s in ROUNDTRIP_SAMPLES:
        ids_hf = hf(s, add_special_tokens=True)["input_ids"]
        ids_raw = raw.encode(s).ids
        assert ids_hf == ids_raw, (s, ids_hf, ids_raw)
        back = hf.decode(ids_hf, skip_special_tokens=False)
        assert back == s, (s, back)
    msgs = [{"role": "user", "content": "Hi"}]
    rendered = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", repr(rendered)
    chat_ids = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys"):
        chat_ids = chat_ids["input_ids"]
    assert list(chat_ids) == hf(rendered)["input_ids"], (chat_ids, hf(rendered)["input_ids"])
    assert chat_ids[0] == 1 and 2 in chat_ids
    print(f"ok: vocab {raw.get_vocab_size()}, specials {SPECIAL_TOKENS} -> 0..2, round-trip + chat template verified")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab-size", type=int, default=1000)
    ap.add_argument("--rebuild-corpus", action="store_true", help="regenerate corpus.txt from the stdlib first")
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    args = ap.parse_args()

    if args.rebuild_corpus or not CORPUS.exists():
        rebuild_corpus()
    tok = train(args.vocab_size)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"), pretty=True)
    write_config(args.out / "tokenizer_config.json")
    digest = hashlib.sha256((args.out / "tokenizer.json").read_bytes()).hexdigest()
    print(f"wrote {args.out}/tokenizer.json (vocab {tok.get_vocab_size()}, sha256 {digest[:16]}...)")
    check(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
