"""Merges the parts of a CUDA serving run into one JSON report (see run_serving.sh).

Inputs: the checkpoint line of make_checkpoint.py, one `ferrite bench` report per concurrency
level, and the torch_baseline.py report; any of the last two may be missing (a part that was
skipped or failed), and the report then says so. Ratios are oriented so that > 1 means ferrite
is better: output tok/s ferrite / baseline, TTFT and TPOT baseline / ferrite.

    python3 benches/cuda/merge.py --checkpoint ck.json --ferrite c1.json c8.json --baseline base.json \
        --command serve="ferrite serve ..." --out cuda-serving.json
"""

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

# The goals for the Llama-3.1-8B shape on one H200 (512-token prompts).
TARGETS = [
    ("single-stream decode", "tok/s", ">=", 225.0),
    ("output throughput at concurrency 32", "tok/s", ">=", 3500.0),
    ("TTFT at concurrency 1 (512-token prompt)", "ms", "<=", 25.0),
]


def read_json(path: Path | None) -> dict | None:
    return json.loads(path.read_text()) if path and path.exists() and path.stat().st_size else None


def nvidia_smi() -> list[dict] | None:
    query = "name,driver_version,memory.total"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [dict(zip(query.split(","), (v.strip() for v in line.split(",")), strict=True)) for line in out.splitlines()]


def ferrite_levels(reports: list[dict]) -> list[dict]:
    levels = []
    for report in reports:
        for r in report["results"]:
            run = r["median_run"]
            tpot = run["median_tpot_ms"]
            levels.append({
                "concurrency": r["concurrency"], "requests": run["requests"],
                "output_tok_s": run["output_tok_per_s"], "median_ttft_ms": run["median_ttft_ms"],
                "median_tpot_ms": tpot, "median_itl_ms": run["median_itl_ms"],
                "decode_tok_s_per_seq": 1e3 / tpot if tpot else None,
                "prefix_cache_hit_rate": r["prefix_cache_hit_rate"],
            })
    return sorted(levels, key=lambda level: level["concurrency"])


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def compare(level: dict, row: dict | None) -> dict | None:
    if not row or "output_tok_s" not in row:
        return None
    return {
        "output_tok_s_ratio": ratio(level["output_tok_s"], row["output_tok_s"]),
        "ttft_speedup": ratio(row["ttft_ms"], level["median_ttft_ms"]),
        "tpot_speedup": ratio(row["decode_ms_per_token"], level["median_tpot_ms"]),
    }


def by_batch(baseline: dict | None, variant: str) -> dict[int, dict]:
    rows = ((baseline or {}).get(variant) or {}).get("batches", [])
    return {row["batch"]: row for row in rows}


def check(value: float | None, op: str, goal: float) -> bool | None:
    if value is None:
        return None
    return value >= goal if op == ">=" else value <= goal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--ferrite", type=Path, nargs="*", default=[])
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--command", action="append", default=[], metavar="NAME=TEXT")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--bench", default="cuda-serving")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    checkpoint = read_json(args.checkpoint)
    reports = [r for r in map(read_json, args.ferrite) if r]
    baseline = read_json(args.baseline)
    levels = ferrite_levels(reports)
    eager, compiled = by_batch(baseline, "eager"), by_batch(baseline, "compiled")

    first = reports[0] if reports else baseline or {}
    report = {
        "bench": args.bench,
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "device": {"nvidia_smi": nvidia_smi(), "torch_name": (baseline or {}).get("device")},
        "checkpoint": checkpoint,
        "workload": {
            "input_len": first.get("input_len"), "output_len": first.get("output_len"),
            "prompts": "random token ids below 1000, a fresh set per level (see each level's prefix_cache_hit_rate)",
            "sampling": "greedy; ferrite ignore_eos, transformers min_new_tokens = max_new_tokens",
        },
        "commands": dict(c.split("=", 1) for c in args.command),
        "notes": args.note,
        "ferrite": {"levels": levels, "reports": reports} if reports else None,
        "baseline": baseline,
        "comparison": [
            {"concurrency": lv["concurrency"],
             "vs_eager": compare(lv, eager.get(lv["concurrency"])),
             "vs_compiled": compare(lv, compiled.get(lv["concurrency"]))}
            for lv in levels
        ],
    }
    if checkpoint and checkpoint.get("truncated"):
        report["notes"].append(f"depth cut to {checkpoint['layers']} of {checkpoint['full_depth_layers']} layers")

    c1 = next((lv for lv in levels if lv["concurrency"] == 1), None)
    c32 = next((lv for lv in levels if lv["concurrency"] == 32), None)
    single = c1["decode_tok_s_per_seq"] if c1 else None
    roofline = (baseline or {}).get("roofline_single_stream_tok_s")
    report["single_stream"] = {
        "ferrite_decode_tok_s": single,
        "baseline_eager_decode_tok_s": eager.get(1, {}).get("decode_tok_s_per_seq"),
        "baseline_compiled_decode_tok_s": compiled.get(1, {}).get("decode_tok_s_per_seq"),
        "roofline_tok_s": roofline,
        "ferrite_fraction_of_roofline": ratio(single, roofline),
        "roofline": "copy bandwidth (read + write) / weight bytes one decode step reads",
    }
    # The goals are stated for the full 8B model; on another shape they would mean nothing.
    if checkpoint and checkpoint["shape"] == "llama-3.1-8b" and not checkpoint["truncated"] and not checkpoint["tiny"]:
        values = [single, c32["output_tok_s"] if c32 else None, c1["median_ttft_ms"] if c1 else None]
        report["targets"] = [
            {"name": name, "goal": f"{op} {goal:g} {unit}", "value": value, "pass": check(value, op, goal)}
            for (name, unit, op, goal), value in zip(TARGETS, values, strict=True)
        ]
    else:
        report["targets"] = None

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(summary(report), file=sys.stderr)


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def summary(report: dict) -> str:
    lines = [f"{report['bench']}: {report['checkpoint'] and report['checkpoint']['shape']}"]
    eager, compiled = by_batch(report["baseline"], "eager"), by_batch(report["baseline"], "compiled")
    lines.append("  c      ferrite tok/s  TTFT ms  TPOT ms |  eager tok/s  compiled tok/s")
    for lv in (report["ferrite"] or {}).get("levels", []):
        c = lv["concurrency"]
        lines.append(f"  {c:<6} {fmt(lv['output_tok_s']):>13} {fmt(lv['median_ttft_ms']):>8} "
                     f"{fmt(lv['median_tpot_ms'], '.2f'):>8} | {fmt(eager.get(c, {}).get('output_tok_s')):>12} "
                     f"{fmt(compiled.get(c, {}).get('output_tok_s')):>15}")
    s = report["single_stream"]
    lines.append(f"  single stream {fmt(s['ferrite_decode_tok_s'])} tok/s, roofline {fmt(s['roofline_tok_s'])}, "
                 f"fraction {fmt(s['ferrite_fraction_of_roofline'], '.2f')}")
    for t in report["targets"] or []:
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
        lines.append(f"  {verdict:4} {t['name']}: {fmt(t['value'])} (goal {t['goal']})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
