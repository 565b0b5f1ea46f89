"""lm-eval's RULER tasks on SmolLM2-135M-Instruct (trained at 8192 tokens) for the model as saved and every method
of README's real-model table, cell by cell, resumable:

    .venv/bin/python experiments/ruler_report.py --limit 5                       # every cell, 5 samples per task
    .venv/bin/python experiments/ruler_report.py --cells yarn:2:16384 none:1:8192 --tasks niah_single_1 --limit 10

A cell is ``method:factor:length``: the method with ``factor`` (and the parameters ``hf-rope-ext extend`` gives it at
that factor, ``compare.run_parameters``, with ``--rope-param KEY=VALUE`` over them) read at ``length`` tokens;
``lora:4:N`` is the adapter of ``--adapter`` (default ``examples/smollm2-self-extend-retrieval-lora``; its config:
Self-Extend at 4x) on its base, unmerged. Each cell runs the tasks through ``hf_rope_ext.eval.ruler`` (lm-eval's
builders, HFLM, scoring; the first ``--limit`` of the 500 samples lm-eval builds for that length) and is written to
``--out``/results.json at once (a rerun skips the cells there, and runs a cell again when asked for more samples than it
has). ``hf-rope-ext eval --model <smollm2> --ruler TASKS --rope-type M --factor s --lengths N --limit K --dtype D``
reproduces one method's cell; the cell's record has it.

Two jobs side by side on this 2-core machine: give each ``OMP_NUM_THREADS=1``. Two 2-thread jobs on two cores wait
on each other at every operation; a generated token at 8k then took 2.4 s instead of 0.18 s
(``benchmarks/bench_decode_threads.py``, 2026-11-26).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hf_rope_ext.eval import compare, loading, ruler, ruler_report
from hf_rope_ext.eval.adapters import adapter_label
from hf_rope_ext.eval.runner import label
from hf_rope_ext.store import smollm2

TASKS = ["niah_single_1", "niah_multikey_2"]
NEWER = ("dual_chunk", "string")
# 2x first (where the methods part ways), then L0, then 4x
CELLS = [
    *[f"{m}:2:16384" for m in ("none", "self_extend", "rerope", "yarn", *NEWER)],
    *[f"{m}:2:8192" for m in ("none", "self_extend", "rerope", "yarn", *NEWER)],
    "yarn:4:32768",
    "lora:4:32768",
    "self_extend:4:32768",
    "dual_chunk:4:32768",
    "yarn:4:8192",
    "lora:4:8192",
]
ROOT = Path(__file__).resolve().parent.parent
ADAPTER = ROOT / "examples" / "smollm2-self-extend-retrieval-lora"
RESULTS = ROOT / "docs" / "results" / "ruler"  # committed: the figures behind README's RULER table
DTYPES = ("float32", "bfloat16")  # float32: 0.6 of bf16's time on this CPU, which has no bf16 matrix units
SAVED_KEYS = ("rope_type", "factor", "rope_theta", "original_max_position_embeddings")  # from the type and config


def run_cell(folder, cell: str, tasks, limit: int, args) -> list[dict]:
    method, factor, length = cell.split(":")
    factor, length = float(factor), int(length)
    options = {"max_gen_toks": args.max_gen_toks}
    if method == "lora":
        found = ruler.evaluate_path(folder, None, None, {}, tasks, [length], limit, args.adapter, args.dtype, **options)
        return [{**r, "rope_type": adapter_label(args.adapter), "factor": 4.0} for r in found]
    config = loading.load_config(folder)
    pretrain = loading.pretraining_length(config)
    rope_type = None if method == "none" else method
    params = compare.run_parameters(config, rope_type, factor if rope_type else None, pretrain, args.chosen or None)
    import torch

    model = loading.load_model(folder, params, dtype=getattr(torch, args.dtype))
    tokenizer = loading.load_tokenizer(folder)
    ruler.check(tasks, tokenizer, [length])
    named = label(rope_type) + "".join(f" {k}={v}" for k, v in args.chosen.items())
    tag = {"rope_type": named, "factor": factor if rope_type else None}
    found = ruler.evaluate_ruler(model, tokenizer, folder, tasks, [length], limit, label=tag, **options)
    return [{**r, "rope_parameters": params} for r in found]


def command(cell: str, args, params: dict | None) -> str:
    """The ``hf-rope-ext eval`` command that reproduces one cell: ``--factor`` for a type that takes one, each other
    parameter the cell chose (``compare.run_parameters``) as ``--rope-param``."""
    method, factor, length = cell.split(":")
    line = f"hf-rope-ext eval --model <smollm2> --ruler {args.tasks}"
    if method == "lora":
        adapter = args.adapter.resolve()
        line += f" --adapter {adapter.relative_to(ROOT) if adapter.is_relative_to(ROOT) else adapter}"
    elif params:
        line += f" --rope-type {params['rope_type']}" + (
            f" --factor {params['factor']:g}" if "factor" in params else ""
        )
        line += loading.rope_param_flags({k: v for k, v in params.items() if k not in SAVED_KEYS})
    line += f" --lengths {length} --limit {args.limit} --dtype {args.dtype}"
    return line + (f" --max-gen-toks {args.max_gen_toks}" if args.max_gen_toks else "")


def cell_key(cell: str, args) -> str:
    """A cell's key in results.json: the cell and its tasks, then whatever differs from the first runs (parameters
    of --rope-param in brackets, bf16, each task's own generation length; a ``lora`` cell names its adapter), so that
    differently made cells sit side by side."""
    key = f"{cell}:{args.tasks}"
    if cell.startswith("lora:"):
        key = key.replace("lora:", f"lora@{args.adapter.name}:", 1)
    key += "[" + ",".join(f"{k}={v}" for k, v in args.chosen.items()) + "]" if args.chosen else ""
    key += "" if args.dtype == "bfloat16" else f" {args.dtype}"
    return key + (f" gen{args.max_gen_toks}" if args.max_gen_toks else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", default=CELLS, help="method:factor:length (default: all, in order)")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated RULER tasks")
    parser.add_argument("--limit", type=int, default=5, help="samples per task and cell")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="the model's dtype (default: float32)")
    parser.add_argument("--max-gen-toks", type=int, help="tokens generated per answer (default: each task's own)")
    parser.add_argument("--adapter", type=Path, default=ADAPTER, help="the adapter of the lora cells")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rope-param", action="append", default=[], help="KEY=VALUE (JSON) over the defaults")
    args = parser.parse_args()
    import torch  # after the arguments, not at the top: --help answers without it

    args.chosen = loading.parse_rope_params(args.rope_param)
    tasks = args.tasks.split(",")
    folder = smollm2.ensure()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    for cell in args.cells:
        key = cell_key(cell, args)
        if key in done and all(r["samples"] >= args.limit for r in done[key]["records"]):
            print(f"{cell}: done already")
            continue
        started = time.time()
        records = run_cell(folder, cell, tasks, args.limit, args)
        if args.dtype != "bfloat16":
            records = [{**r, "rope_type": f"{r['rope_type']} ({args.dtype})"} for r in records]
        done[key] = {
            "records": records,
            "seconds": round(time.time() - started),
            "threads": torch.get_num_threads(),  # the seconds are those of this many threads
            "command": command(cell, args, records[0].get("rope_parameters")),
        }
        path.write_text(json.dumps(done, indent=1) + "\n")
        print(f"{cell}: " + ", ".join(f"{r['task']} {r['ruler_score']:.2f} ({r['samples']})" for r in records))
        print(f"  {done[key]['seconds']} s", flush=True)
    every = [{k: v for k, v in r.items() if k != "answers"} for cell in done.values() for r in cell["records"]]
    (args.out / "report.md").write_text(ruler_report.tables(every), encoding="utf-8")


if __name__ == "__main__":
    main()
