"""Multi-key pass-key retrieval on a real model (SmolLM2-135M-Instruct by default) at lengths past its training
length, for the model as saved and each training-free method; one Markdown table and a JSON file.

    PYTHONPATH=. .venv/bin/python scripts/real_model_passkey.py --lengths 16384 --out runs/real-passkey

Each (method, length) cell: ``--prompts`` prompts of ``--keys`` needles each, every needle asked after one shared
prefill (``hf_rope_ext.eval.multikey``), scored by greedy generation. Peak resident memory and time per cell.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from hf_rope_ext import smollm2
from hf_rope_ext.eval.loading import load_model, rope_parameters_for
from hf_rope_ext.eval.multikey import multikey_accuracy

# (label, rope_type, factor per x of the training length or None, extra parameters)
METHODS = {
    "none": (None, None, {}),
    "yarn": ("yarn", "x", {}),
    "dynamic_yarn": ("dynamic_yarn", None, {}),
    "ntk_by_parts": ("ntk_by_parts", "x", {}),
    "self_extend": ("self_extend", None, {"window": 1024, "group_size": 4}),
    "rerope": ("rerope", None, {"window": 1024}),
    "leaky_rerope": ("leaky_rerope", "x", {"window": 1024}),
}


def cell(folder, tokenizer, label: str, length: int, args) -> dict:
    rope_type, factor, extra = METHODS[label]
    config_length = json.loads((Path(folder) / "config.json").read_text())["max_position_embeddings"]
    scale = length / config_length
    params = (
        rope_parameters_for(load_config(folder), rope_type, scale if factor == "x" else None, extra)
        if rope_type
        else None
    )
    model = load_model(folder, params)
    start = time.perf_counter()
    result = multikey_accuracy(model, tokenizer, length, prompts=args.prompts, keys=args.keys, progress=True)
    result.update(
        method=label,
        length=length,
        rope_parameters=params,
        seconds=round(time.perf_counter() - start, 1),
        peak_rss_gib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    )
    return result


def load_config(folder):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: SmolLM2 from hf-rope-ext get-smollm2)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--keys", type=int, default=5)
    parser.add_argument("--out", default="runs/real-passkey")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    folder = Path(args.model) if args.model else smollm2.ensure()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for length in args.lengths:
        for label in args.methods:
            rows.append(cell(folder, tokenizer, label, length, args))
            r = rows[-1]
            print(f"{label} @{length}: {r['multikey_accuracy']:.2f} of {r['multikey_probes']} ({r['seconds']} s)")
            (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| method | tokens | accuracy | probes | seconds | peak RSS GiB |", "|---|---:|---:|---:|---:|---:|"]
    lines += [
        f"| {r['method']} | {r['length']} | {r['multikey_accuracy']:.2f} | {r['multikey_probes']} | {r['seconds']} | "
        f"{r['peak_rss_gib']} |"
        for r in rows
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
