"""Merges run_startup.sh's healthy times and the phases each server logged into one JSON."""
import json
import re
import sys
from pathlib import Path

out, gpu = Path(sys.argv[1]), sys.argv[2]
healthy = dict(line.split() for line in (out / "healthy.txt").read_text().splitlines() if line.strip())
PHASES = {
    "weights_s": r"model loaded .*?seconds=([\d.]+)",
    "weights_gib_per_s": r"model loaded .*?gib_per_s=([\d.]+)",
    "profiling_step_s": r"profiling step .*?seconds=([\d.]+)",
    "startup_s": r"listening on .*?startup_s=([\d.]+)",
}
runs = {}
for tag, seconds in healthy.items():
    log = re.sub(r"\x1b\[[0-9;]*m", "", (out / f"{tag}.log").read_text(errors="replace"))
    run = {"healthy_s": float(seconds)}
    for name, pattern in PHASES.items():
        m = re.search(pattern, log)
        if m:
            run[name] = round(float(m.group(1)), 3)
    runs[tag] = run
checkpoint = json.loads((out / "checkpoint.json").read_text().splitlines()[-1])
print(json.dumps({
    "benchmark": "start-up of `ferrite serve --device cuda` to a healthy /health, weights in the page cache",
    "machine": gpu,
    "checkpoint": {k: checkpoint[k] for k in ("shape", "layers", "parameters", "weight_bytes", "dtype")},
    "flags": "--dtype bf16 --max-num-seqs 256 --max-model-len 4096 --gpu-memory-utilization 0.9",
    "baseline": "base: the previous binary (weights through a host Vec and pageable copies, kernels compiled by NVRTC on first use)",
    "cold": "no kernel cache and no driver JIT cache (~/.nv/ComputeCache) before the run",
    "warm": "restarts after the cold run: both caches filled",
    "runs": runs,
}, indent=2))
