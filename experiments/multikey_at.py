"""The three-key probe of ``real_model_report.py`` on SmolLM2-135M-Instruct (or ``--model``) at any prompt length,
for one rope type with the parameters given: a check of one explanation at a time, not a table cell.

    OMP_NUM_THREADS=1 .venv/bin/python experiments/multikey_at.py --length 8160 --prompts 7 \\
        --rope-type string --rope-param window=8192 --rope-param local_window=128

``--length`` is the prompt's own length: the question (about 15 tokens) and the answer (6) come after it, so at
``--length 8192`` they sit past L0, and at 8160 within it. One JSON line per run is appended to ``--out`` (default
``docs/results/real-model/probes.jsonl``, committed), with the command that made it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from hf_rope_ext.eval import loading
from hf_rope_ext.eval.multikey import multikey_accuracy
from hf_rope_ext.store import smollm2

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "real-model" / "probes.jsonl"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model folder (default: SmolLM2 from `hf-rope-ext get-smollm2`)")
    parser.add_argument("--length", type=int, required=True, help="prompt tokens (the question comes after)")
    parser.add_argument("--prompts", type=int, default=7, help="prompts of three keys (default: 7, 21 probes)")
    parser.add_argument("--rope-type", default=None, help="a rope type (default: the model as saved)")
    parser.add_argument("--rope-param", action="append", default=[], help="KEY=VALUE (JSON), repeatable")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    folder = args.model or smollm2.ensure()
    config, tokenizer = loading.load_config(folder), loading.load_tokenizer(folder)
    chosen = loading.parse_rope_params(args.rope_param)
    params = loading.requested_parameters(config, args.rope_type, None, chosen or None)
    model = loading.load_model(folder, params, dtype=getattr(torch, args.dtype))
    start = time.perf_counter()
    found = multikey_accuracy(model, tokenizer, args.length, args.prompts)
    record = {"rope_parameters": params, "length": args.length, "dtype": args.dtype, **found}
    words = ["python", "experiments/multikey_at.py", *(sys.argv[1:] if argv is None else argv)]
    record |= {"seconds": round(time.perf_counter() - start), "command": shlex.join(words)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as stream:
        stream.write(json.dumps(record) + "\n")
    hits = round(found["multikey_accuracy"] * found["multikey_probes"])
    print(f"{args.rope_type or 'none'} at {args.length}: {hits}/{found['multikey_probes']}")


if __name__ == "__main__":
    main()
