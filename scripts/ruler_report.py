"""lm-eval's RULER tasks on SmolLM2-135M-Instruct (trained at 8192 tokens) for the model as saved and every method
of README's real-model table, cell by cell, resumable:

    .venv/bin/python scripts/ruler_report.py --limit 5                       # every cell, 5 samples per task
    .venv/bin/python scripts/ruler_report.py --cells yarn:2:16384 none:1:8192 --limit 10

A cell is ``method:factor:length``: the method with ``factor`` (and the parameters ``hf-rope-ext extend`` gives it at
that factor, ``compare.run_parameters``) read at ``length`` tokens; ``lora:4:N`` is the PoSE LoRA of
``examples/smollm2-yarn4-pose-lora`` on its base (its config: yarn x4), unmerged. Each cell runs the tasks through
``hf_rope_ext.eval.ruler`` (lm-eval's builders, HFLM, scoring; the first ``--limit`` of the 500 samples lm-eval builds
for that length) in bfloat16, and is written to ``--out``/results.json at once (a rerun skips the cells there, and
runs a cell again when asked for more samples than it has). ``hf-rope-ext eval --model <smollm2> --ruler TASKS
--rope-type M --factor s --lengths N --limit K --dtype bfloat16`` reproduces one method's cell.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hf_rope_ext.eval import compare, loading, ruler, ruler_report
from hf_rope_ext.eval.runner import label
from hf_rope_ext.store import smollm2

TASKS = ["niah_single_1", "niah_multikey_2"]
# 2x first (where the methods part ways), then L0, then 4x
CELLS = [
    *[f"{m}:2:16384" for m in ("none", "self_extend", "rerope", "yarn")],
    *[f"{m}:2:8192" for m in ("none", "self_extend", "rerope", "yarn")],
    "yarn:4:32768",
    "lora:4:32768",
    "self_extend:4:32768",
    "yarn:4:8192",
    "lora:4:8192",
]
ADAPTER = Path(__file__).resolve().parent.parent / "examples" / "smollm2-yarn4-pose-lora"
COMMAND = (
    "hf-rope-ext eval --model {model} --ruler {tasks} --rope-type {method} --factor {factor} --lengths {length} "
    "--limit {limit} --dtype bfloat16"
)


def run_cell(folder, cell: str, tasks, limit: int) -> list[dict]:
    method, factor, length = cell.split(":")
    factor, length = float(factor), int(length)
    if method == "lora":
        found = ruler.evaluate_path(folder, None, None, {}, tasks, [length], limit, ADAPTER, "bfloat16")
        return [{**r, "rope_type": "yarn x4 + PoSE LoRA", "factor": 4.0} for r in found]
    config = loading.load_config(folder)
    pretrain = loading.pretraining_length(config)
    rope_type = None if method == "none" else method
    params = compare.run_parameters(config, rope_type, factor if rope_type else None, pretrain)
    import torch

    model = loading.load_model(folder, params, dtype=torch.bfloat16)
    tokenizer = loading.load_tokenizer(folder)
    ruler.check(tasks, tokenizer, [length])
    tag = {"rope_type": label(rope_type), "factor": factor if rope_type else None}
    found = ruler.evaluate_ruler(model, tokenizer, folder, tasks, [length], limit, label=tag)
    return [{**r, "rope_parameters": params} for r in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", default=CELLS, help="method:factor:length (default: all, in order)")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated RULER tasks")
    parser.add_argument("--limit", type=int, default=5, help="samples per task and cell")
    parser.add_argument("--out", type=Path, default=Path("runs/ruler-smollm2"))
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    folder = smollm2.ensure()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    for cell in args.cells:
        key = f"{cell}:{args.tasks}"
        if key in done and all(r["samples"] >= args.limit for r in done[key]["records"]):
            print(f"{cell}: done already")
            continue
        started = time.time()
        records = run_cell(folder, cell, tasks, args.limit)
        method, factor, length = cell.split(":")
        command = COMMAND.format(
            model="<smollm2>", tasks=args.tasks, method=method, factor=factor, length=length, limit=args.limit
        )
        if method == "lora":
            command = command.replace(f"--rope-type lora --factor {factor}", f"--adapter examples/{ADAPTER.name}")
        if method == "none":
            command = command.replace(f" --rope-type none --factor {factor}", "")
        done[key] = {"records": records, "seconds": round(time.time() - started), "command": command}
        path.write_text(json.dumps(done, indent=1) + "\n")
        print(f"{cell}: " + ", ".join(f"{r['task']} {r['ruler_score']:.2f} ({r['samples']})" for r in records))
        print(f"  {done[key]['seconds']} s")
    every = [{k: v for k, v in r.items() if k != "answers"} for cell in done.values() for r in cell["records"]]
    (args.out / "report.md").write_text(ruler_report.tables(every), encoding="utf-8")


if __name__ == "__main__":
    main()
